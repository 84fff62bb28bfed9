"""A training script written against SageMaker SMDDP's API before 1.4, as its
examples did: smdistributed.dataparallel.torch.distributed and its
DistributedDataParallel."""

import smdistributed.dataparallel.torch.distributed as dist
from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel as DDP

import sm_common

dist.init_process_group()

world_size = dist.get_world_size()
rank = dist.get_rank()
local_rank = dist.get_local_rank()
assert 0 <= local_rank < dist.get_local_size() <= world_size
dist.barrier()

model = sm_common.train(lambda m: DDP(m), rank)
sm_common.report(model, "v1")
dist.barrier()
