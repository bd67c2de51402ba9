"""Runtime: run a segmented, alias-analysed plan (torch backend, CPU or CUDA), the
``torch.compile`` backend "fuseg" (runtime.dynamo), and the fx partitioner API
(runtime.partitioner). The CuPy and nvFuser backends are not built yet."""

from .program import CompiledProgram, Launch, ModuleProgram, compile_module, compile_program

compile = compile_program  # noqa: A001 - the documented name: runtime.compile(segmented)

__all__ = ["CompiledProgram", "Launch", "ModuleProgram", "compile", "compile_module", "compile_program"]
