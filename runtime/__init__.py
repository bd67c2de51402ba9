"""Runtime: run a segmented, alias-analysed plan as one generated function (runtime/emit/wrapper.py)
whose launches run on plug-in backends (runtime/backends/: generated kernels as C++ on the CPU
and CuPy on CUDA, nvFuser (unverified), torch); the ``torch.compile`` backend "fuseg"
(runtime.dynamo), and the fx partitioner API (runtime.partitioner)."""

from .compiled.program import CompiledProgram, Launch, ModuleProgram, compile_module, compile_program

compile = compile_program  # noqa: A001 - the documented name: runtime.compile(segmented)

__all__ = ["CompiledProgram", "Launch", "ModuleProgram", "compile", "compile_module", "compile_program"]
