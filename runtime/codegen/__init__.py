"""One kernel generator, two targets: CUDA source for CuPy, C++ for the machine's compiler.

``lower_segment`` turns a POINTWISE, REDUCTION or NORMALIZATION segment into a ``Kernel`` (its
parameters and a body of index math and per-element expressions), or raises ``Declined`` with
the reason; ``Kernel.source("cuda" | "cpu")`` wraps the same body for either target.
"""

from . import calibrate  # noqa: F401 - registers the measuring of the thread thresholds (thresholds.measured_by)
from .lowering.lower import Kernel, Param, lower_segment
from .source.ctypes_ import Declined

__all__ = ["Declined", "Kernel", "Param", "lower_segment"]
