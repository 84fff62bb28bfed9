"""Importing this module registers the ``smddp`` backend with torch.distributed.

    import smdistributed.dataparallel.torch.torch_smddp
    torch.distributed.init_process_group(backend="smddp")

as SageMaker's SMDDP 1.4 and later document it. The backend is libsmddp's
(package ``smddp``); where it cannot load, this import fails saying why.
"""

from smddp import dist as _dist

_dist.ensure_registered("smdistributed.dataparallel.torch.torch_smddp was imported")
