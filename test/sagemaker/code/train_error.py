"""A script that asks SMDDP's older API for something it does not take (a
group that is neither group.WORLD nor a process group): every rank raises
SMDDPUnsupportedError, and SageMaker's toolkit names that class as the
job's failure, having found it in smdistributed.dataparallel.exceptions."""

import torch

import smdistributed.dataparallel.torch.distributed as dist

dist.init_process_group()
dist.all_reduce(torch.ones(1), group="all-ranks")
