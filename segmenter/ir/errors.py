"""The IR's error: below graph.py, so that what graph.py uses (constants.py) can raise it."""

from __future__ import annotations

__all__ = ["GraphError"]


class GraphError(ValueError):
    """A FusionGraph that breaks an invariant; the message names the node and field."""
