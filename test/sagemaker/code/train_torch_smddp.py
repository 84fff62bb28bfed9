"""A training script written as SageMaker's SMDDP documents it for 1.4 and
later: torch.distributed and torch's DDP, the backend registered by importing
smdistributed.dataparallel.torch.torch_smddp."""

import os

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import smdistributed.dataparallel.torch.torch_smddp  # noqa: F401

import sm_common

dist.init_process_group(backend="smddp")
local_rank = int(os.getenv("LOCAL_RANK", -1))
rank = dist.get_rank()

model = sm_common.train(lambda m: DDP(m), rank)
sm_common.report(model, "torch_smddp")
dist.barrier()
dist.destroy_process_group()
