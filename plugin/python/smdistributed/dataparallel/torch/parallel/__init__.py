"""smdistributed.dataparallel.torch.parallel: DistributedDataParallel."""

from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
