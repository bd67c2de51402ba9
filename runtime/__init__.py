"""Runtime: run a segmented, alias-analysed plan: generated kernels (runtime.codegen; CuPy on CUDA,
C++ on the CPU when asked for), nvFuser (runtime.nvfuser_backend, unverified) and torch; the
``torch.compile`` backend "fuseg" (runtime.dynamo), and the fx partitioner API (runtime.partitioner)."""

from .program import CompiledProgram, Launch, ModuleProgram, compile_module, compile_program

compile = compile_program  # noqa: A001 - the documented name: runtime.compile(segmented)

__all__ = ["CompiledProgram", "Launch", "ModuleProgram", "compile", "compile_module", "compile_program"]
