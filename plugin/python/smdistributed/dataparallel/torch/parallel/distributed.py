"""SMDDP's DistributedDataParallel (the API before 1.4): torch's, on the smddp group.

A subclass of torch.nn.parallel.DistributedDataParallel, so everything that
checks for torch's DDP (checkpointing, Lightning, accelerate) sees one;
gradients are averaged over the ranks, no_sync() accumulates, as torch's.
Where SMDDP documented limits (broadcast_buffers unsupported, group.WORLD
only), libsmddp has none: both work.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.distributed as _td

from smdistributed.dataparallel.exceptions import SMDDPError, SMDDPUnsupportedError
from smdistributed.dataparallel.torch.distributed import _process_group

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    """Wraps module so that its gradients are averaged across the ranks in backward.

    Args as SMDDP documents them: module; device_ids and output_device for a
    module on one CUDA device; broadcast_buffers; process_group (group.WORLD,
    None, or a torch.distributed process group); bucket_cap_mb (default 25).
    Further keywords go to torch's DistributedDataParallel
    (find_unused_parameters, gradient_as_bucket_view, ...).
    """

    def __init__(self, module: torch.nn.Module, device_ids: Optional[Sequence[Any]] = None,
                 output_device: Any = None, broadcast_buffers: bool = True,
                 process_group: Any = None, bucket_cap_mb: Optional[float] = None,
                 **kwargs: Any) -> None:
        if "gradient_accumulation_steps" in kwargs:
            raise SMDDPUnsupportedError(
                "DistributedDataParallel(gradient_accumulation_steps=...) is not supported (SMDDP "
                "dropped it in 1.4): accumulate under `with model.no_sync():` instead")
        if not _td.is_initialized():
            raise SMDDPError(
                "DistributedDataParallel needs the process group: call "
                "smdistributed.dataparallel.torch.distributed.init_process_group() first")
        super().__init__(module, device_ids=device_ids, output_device=output_device,
                         broadcast_buffers=broadcast_buffers,
                         process_group=_process_group(process_group, "process_group"),
                         bucket_cap_mb=bucket_cap_mb, **kwargs)
