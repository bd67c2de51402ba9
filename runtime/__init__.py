"""Runtime: run a segmented, alias-analysed plan. Only the torch backend exists yet (CPU and
CUDA); the CuPy and nvFuser backends, the torch.compile backend and the fx partitioner API are
not built."""

from .program import CompiledProgram, Launch, compile_program

compile = compile_program  # noqa: A001 - the documented name: runtime.compile(segmented)

__all__ = ["CompiledProgram", "Launch", "compile", "compile_program"]
