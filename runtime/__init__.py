"""Runtime: compiled programs on torch, CuPy and nvFuser. Not built yet; the reference
semantics of a graph live in ``segmenter.reference``."""

__all__: list[str] = []
