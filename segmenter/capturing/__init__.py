"""Capture: PyTorch programs and fx graphs -> FusionGraph, above the IR (segmenter/ir/).

from_torch.py (``capture``: torch.export), fx_import.py (``from_fx``: a GraphModule with FakeTensor
values), functionalize.py (graphs that mutate), meta.py (FakeTensor metas of graph values),
dynamo_values.py (dynamo's values in our symbols), metadata_mutation.py, observe.py, outputs.py,
recorded.py (effects a graph records), reference.py (the eager reference run), storages.py and
unbacked.py (data-dependent sizes).

Named ``capturing`` so that ``segmenter.capture`` stays the function (``from segmenter import capture``).
"""
