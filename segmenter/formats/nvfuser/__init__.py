"""nvFuser Python-frontend fusions as FusionGraphs, read as data (Note [a fusion script is data]).

script.py reads the script's syntax (inputs.py its ``inputs = [...]``); importer.py (``from_nvfuser``,
``read_nvfuser``) binds its inputs and builds the graph with build.py, which runs each frontend op
(ops.py, shape_ops.py) as ATen nodes on FakeTensors; sizes.py makes ``-1`` dims symbolic.
"""

from .importer import NvFuserFusion, from_nvfuser, read_nvfuser

__all__ = ["NvFuserFusion", "from_nvfuser", "read_nvfuser"]
