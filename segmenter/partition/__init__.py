"""Segmentation: a FusionGraph cut into segments, beside capture and above the IR.

greedy.py (``segment``: the greedy merge of producer/consumer groups), rules.py (which kinds may
share a segment), segments.py (Segment, SegmentedFusion), options.py (SegmenterOptions),
matmul_bias.py (a matmul's bias split off) and explain.py (why segments were cut).

``from segmenter.partition import segment`` keeps working: it is re-exported here.
"""

from .greedy import segment

__all__ = ["segment"]
