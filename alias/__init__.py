"""Post-segmentation alias analysis. Not built yet (see the README's status table)."""

__all__: list[str] = []
