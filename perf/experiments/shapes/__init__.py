"""One-off measurements of what a new shape costs under ``backend="fuseg"`` (issue 41), each
``python -m perf.experiments.shapes.NAME``: class_crossing (a prompt crossing a power of two,
against a checkout), second_length_parts (where the second prompt length's time goes).
perf/experiments/__init__.py names their records."""

__all__: list[str] = []
