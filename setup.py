from setuptools import setup

setup(
    name="fusion-segmenter",
    version="0.1.0",
    description="A fusion segmenter with post-segmentation alias analysis, for PyTorch graphs",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # perf.tools: the fuseg CLI and user tools; perf.benchmarks, perf.gpu: benchmarks; perf.fusions: nvFuser
    # scripts kept as data; perf.experiments: one-off measurements (perf/results/README.md)
    packages=["segmenter", "segmenter.ir", "segmenter.capturing", "segmenter.partition", "segmenter.formats",
              "segmenter.formats.nvfuser", "alias", "runtime", "runtime.backends", "runtime.codegen",
              "runtime.codegen.lowering", "runtime.codegen.opaque", "runtime.codegen.source", "runtime.compiled",
              "runtime.emit", "runtime.machine", "runtime.storage", "perf", "perf.tools", "perf.tools.html",
              "perf.benchmarks", "perf.gpu", "perf.fusions", "perf.experiments", "perf.experiments.reductions",
              "perf.experiments.shapes"],
    package_data={"perf.tools.html": ["page.css", "page.js"]},  # the segmentation page's own CSS and JS, inlined
    py_modules=["fuseg"],  # the name TORCH_LOGS=+fuseg finds (runtime/logs.py)
    install_requires=[
        # CPU machines: install torch==2.13.0 first (a CPU wheel); an open range on a machine
        # without torch would pull a multi-GB CUDA build.
        "torch>=2.10",
        "pandas",
    ],
    extras_require={
        "test": ["pytest", "pytest-xdist", "hypothesis", "transformers", "matplotlib", "expecttest", "ruff",
                 "tlparse", "import-linter", "mypy>=1.10"],  # expecttest: op_db; xdist: -n 2; ruff: tests/test_lint.py;
        # tlparse: tests/test_torch_logs.py; import-linter: tests/test_layers.py (pyproject.toml's contracts);
        # mypy: tests/test_types.py (pyproject.toml's [tool.mypy])
        "cuda": ["cupy-cuda13x"],
        "plot": ["matplotlib"],
        # nvFuser wheels exist only for CPython 3.10 and 3.12.
        "nvfuser": [
            "nvfuser-cu130-torch210==0.2.35.dev20260215; "
            "python_version == '3.10' or python_version == '3.12'",
        ],
    },
    entry_points={
        "console_scripts": ["fuseg = perf.tools.cli:main"],
        "torch_dynamo_backends": ["fuseg = runtime.dynamo:fuseg_backend"],
    },
)
