"""A value made once per key in a process, shared by threads (the thread thresholds, the vector
width: each resolved the first time a kernel asks, perhaps on a build thread)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Any

__all__ = ["once"]


def once(table: dict[Hashable, Any], key: Hashable, lock: threading.Lock, make: Callable[[], Any]) -> Any:
    """``table[key]``, made by ``make()`` where absent: one maker per key (under ``lock``), and no
    lock taken once it is there."""
    got = table.get(key)
    if got is not None:
        return got
    with lock:
        got = table.get(key)
        if got is None:
            got = table[key] = make()
    return got
