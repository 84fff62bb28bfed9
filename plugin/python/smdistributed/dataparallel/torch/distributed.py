"""The PyTorch API of SageMaker's SMDDP before 1.4, on torch.distributed and smddp.

Scripts written for it run unchanged::

    import smdistributed.dataparallel.torch.distributed as dist
    from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel as DDP

    dist.init_process_group()
    rank, local_rank = dist.get_rank(), dist.get_local_rank()
    model = DDP(model)

Every function keeps SMDDP's documented signature and runs the matching
torch.distributed call on a process group whose backend is libsmddp's
``smddp``, started through ``env://`` from the variables ``smddprun`` sets
(under SageMaker's runner, under mpirun or Slurm, or ``smddprun
--nproc-per-node N``). Where SMDDP accepted only ``group.WORLD``, this also
accepts a torch.distributed process group (``torch.distributed.new_group``),
which smddp serves. Failures raise
:class:`~smdistributed.dataparallel.exceptions.SMDDPError` (a RuntimeError)
with libsmddp's message; what cannot be served raises
:class:`~smdistributed.dataparallel.exceptions.SMDDPUnsupportedError`, saying
what to use instead.
"""

from __future__ import annotations

import functools
import os
import socket
from typing import Any, Callable, List, Optional, Tuple, TypeVar

import torch
import torch.distributed as _td

from smdistributed.dataparallel.exceptions import SMDDPError, SMDDPUnsupportedError

__all__ = [
    "ReduceOp", "all_gather", "all_reduce", "all_to_all_single", "barrier", "broadcast",
    "get_local_rank", "get_local_size", "get_rank", "get_world_size", "group",
    "init_process_group", "is_available", "is_initialized",
]

BACKEND = "smddp"
_F = TypeVar("_F", bound=Callable[..., Any])


class ReduceOp:
    """The reductions of SMDDP's all_reduce, as torch.distributed.ReduceOp values.

    torch's own ReduceOp values (PRODUCT, BAND, BOR, BXOR, premul_sum) are
    accepted as well: smddp serves them all.
    """

    SUM = _td.ReduceOp.SUM
    AVERAGE = _td.ReduceOp.AVG
    MIN = _td.ReduceOp.MIN
    MAX = _td.ReduceOp.MAX


class _World:
    def __repr__(self) -> str:
        return "smdistributed.dataparallel.torch.distributed.group.WORLD"


class group:  # noqa: N801 - SMDDP's name, as torch.distributed.group
    """``group.WORLD``: every rank of the job (the default process group)."""

    WORLD = _World()


def _process_group(g: Any, what: str = "group") -> Optional[_td.ProcessGroup]:
    """torch's process group for SMDDP's group argument (None: the default group)."""
    if g is None or g is group.WORLD:
        return None
    if isinstance(g, _td.ProcessGroup):
        return g
    raise SMDDPUnsupportedError(
        f"{what}={g!r}: smdistributed.dataparallel takes group.WORLD or a process group from "
        "torch.distributed.new_group()")


def _smddp_errors(fn: _F) -> _F:
    """Runs fn, turning torch.distributed's failures into SMDDPError with their message."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SMDDPError:
            raise
        except (RuntimeError, ValueError) as e:
            if not _td.is_initialized():
                raise SMDDPError(
                    f"{fn.__name__}: smdistributed.dataparallel is not initialised; call "
                    "smdistributed.dataparallel.torch.distributed.init_process_group() first "
                    f"({e})") from e
            raise SMDDPError(f"{fn.__name__}: {e}") from e

    return wrapper  # type: ignore[return-value]


def is_available() -> bool:
    """Whether this process was started as a rank of a distributed job.

    True under smddprun, torchrun, mpirun or Slurm (a rank knows its world
    size) or once the process group exists; False for a script started
    alone, which can then train without calling this package.
    """
    return _td.is_initialized() or any(
        os.environ.get(v) for v in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"))


def is_initialized() -> bool:
    """Whether init_process_group() has run (the default process group exists)."""
    return _td.is_initialized()


def init_process_group(*args: Any, **kwargs: Any) -> None:
    """Joins the job's process group on the smddp backend.

    Called with no arguments, as SMDDP documents it, it reads RANK,
    WORLD_SIZE, MASTER_ADDR and MASTER_PORT (``env://``), which smddprun
    sets for every rank. Arguments are torch.distributed.init_process_group's
    (init_method, timeout, world_size, rank, store, ...); a backend other
    than "smddp" is refused. Calling it again once the group exists on smddp
    does nothing.
    """
    backend = kwargs.pop("backend", None)
    if args:
        if backend is not None:
            raise TypeError("init_process_group() got the backend twice (positional and keyword)")
        backend, args = args[0], args[1:]
    if backend is not None and str(backend).lower() != BACKEND:
        raise SMDDPUnsupportedError(
            f"init_process_group(backend={backend!r}): smdistributed.dataparallel runs on the "
            f"'{BACKEND}' backend only; for another backend call "
            "torch.distributed.init_process_group() directly")
    from smddp import dist as smddp_dist

    smddp_dist.ensure_registered("smdistributed.dataparallel's init_process_group was called")
    if _td.is_initialized():
        current = _td.get_backend()
        if current == BACKEND:
            return
        raise SMDDPError(f"init_process_group: torch.distributed is already initialised with "
                         f"backend {current!r}; smdistributed.dataparallel needs '{BACKEND}'")
    try:
        _td.init_process_group(BACKEND, *args, **kwargs)
    except ValueError as e:  # env:// without a launcher's variables
        raise SMDDPError(
            f"init_process_group: {e}. Start the script with smddprun, which sets them: "
            "`mpirun -np N smddprun python train.py` (as SageMaker's runner does) or "
            "`smddprun --nproc-per-node N train.py`") from e
    except RuntimeError as e:
        raise SMDDPError(f"init_process_group: {e}") from e


@_smddp_errors
def get_world_size(group: Any = group.WORLD) -> int:
    """The number of ranks in group (every rank of every node for group.WORLD)."""
    return _td.get_world_size(_process_group(group))


@_smddp_errors
def get_rank(group: Any = group.WORLD) -> int:
    """This process's rank in group, 0 .. get_world_size(group) - 1."""
    return _td.get_rank(_process_group(group))


def _from_env(*names: str) -> Optional[int]:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


@functools.lru_cache(maxsize=None)
def _local_by_host() -> Tuple[int, int]:
    """(local rank, local size) by host name, one allgather over the world."""
    hosts: List[Optional[str]] = [None] * _td.get_world_size()
    _td.all_gather_object(hosts, socket.gethostname())
    me = _td.get_rank()
    return (sum(h == hosts[me] for h in hosts[:me]), hosts.count(hosts[me]))


@_smddp_errors
def get_local_rank() -> int:
    """This process's rank among the ranks of its machine (0 .. get_local_size() - 1).

    From LOCAL_RANK (smddprun, torchrun), Open MPI's or Slurm's variables;
    started otherwise, the ranks compare host names (a collective: every rank
    must call it then).
    """
    value = _from_env("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
    return value if value is not None else _local_by_host()[0]


@_smddp_errors
def get_local_size() -> int:
    """The number of ranks on this process's machine; found as get_local_rank() finds its rank."""
    value = _from_env("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")
    return value if value is not None else _local_by_host()[1]


def _op(op: Any) -> Any:
    return ReduceOp.SUM if op is None else op


@_smddp_errors
def all_reduce(tensor: torch.Tensor, op: Any = ReduceOp.SUM, group: Any = group.WORLD,
               async_op: bool = False) -> Optional[_td.Work]:
    """Reduces tensor across the group in place (SUM when op is None); every rank
    gets the same bits. Returns a work handle with async_op=True, else None."""
    return _td.all_reduce(tensor, op=_op(op), group=_process_group(group), async_op=async_op)


@_smddp_errors
def broadcast(tensor: torch.Tensor, src: int = 0, group: Any = group.WORLD,
              async_op: bool = False) -> Optional[_td.Work]:
    """Copies rank src's tensor into tensor on every rank of the group."""
    return _td.broadcast(tensor, src=src, group=_process_group(group), async_op=async_op)


@_smddp_errors
def all_gather(tensor_list: List[torch.Tensor], tensor: torch.Tensor, group: Any = group.WORLD,
               async_op: bool = False) -> Optional[_td.Work]:
    """Fills tensor_list[r] with rank r's tensor, on every rank of the group."""
    return _td.all_gather(tensor_list, tensor, group=_process_group(group), async_op=async_op)


@_smddp_errors
def all_to_all_single(output_t: torch.Tensor, input_t: torch.Tensor,
                      output_split_sizes: Optional[List[int]] = None,
                      input_split_sizes: Optional[List[int]] = None, group: Any = group.WORLD,
                      async_op: bool = False) -> Optional[_td.Work]:
    """Scatters input_t's slices (input_split_sizes, default equal) to the ranks of
    the group and gathers theirs into output_t (output_split_sizes)."""
    return _td.all_to_all_single(output_t, input_t, output_split_sizes=output_split_sizes,
                                 input_split_sizes=input_split_sizes,
                                 group=_process_group(group), async_op=async_op)


@_smddp_errors
def barrier(group: Any = group.WORLD, async_op: bool = False) -> Optional[_td.Work]:
    """Returns once every rank of the group has reached it (or, async_op=True, a work
    handle that completes then)."""
    return _td.barrier(group=_process_group(group), async_op=async_op)
