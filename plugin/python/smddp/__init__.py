"""smddp: libsmddp's collectives as the torch.distributed backend "smddp".

Importing this package registers the backend, so that

    torch.distributed.init_process_group(backend="smddp")

works. After `pip install`, torch imports it by itself through the
`torch.backends` entry point (see smddp_autoload), so scripts need no
`import smddp`.
"""

import os
import sys
from datetime import timedelta

import torch

BACKEND_NAME = "smddp"

__all__ = ["BACKEND_NAME", "is_registered"]

# Why the backend could not be loaded, when this import happened inside
# torch's own import (entry-point autoload) and had to stay silent.
_load_error = None
_OP_NAMES: dict = {}  # torch.distributed.ReduceOp -> the name torch.ops.smddp.all_reduce_ takes


def _torch_initializing() -> bool:
    """True while `import torch` is still running (we are its autoload)."""
    spec = getattr(sys.modules.get("torch"), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _timeout_ms(timeout) -> int:
    """Milliseconds for libsmddp's deadline; -1 lets SMDDP_TIMEOUT decide."""
    if timeout is None:
        return -1
    if isinstance(timeout, timedelta):
        ms = int(timeout.total_seconds() * 1000)
    else:
        ms = int(float(timeout) * 1000)
    return ms if ms > 0 else -1


def _create(dist_backend_opts, backend_options):
    """torch's extended-API creator: one backend per process group.

    dist_backend_opts is a torch._C._distributed_c10d._DistributedBackendOptions
    (store: the group's PrefixStore, group_rank, group_size, timeout: timedelta,
    group_id, global_ranks_in_group); backend_options is unused.
    """
    del backend_options
    from smddp import _C

    _ddp_buckets_from_group()
    return _C.create_backend(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        _timeout_ms(dist_backend_opts.timeout),
        str(getattr(dist_backend_opts, "group_id", "") or ""),
    )


# torch's DDP allocates its gradient buckets with the process group's
# allocateTensor when this is "0" (read each time it builds its buckets).
DDP_COMM_MEM_VAR = "DDP_DISABLE_COMM_MEM"


def _ddp_buckets_from_group() -> None:
    """Lets DDP over smddp put its CPU buckets in the group's pool.

    An smddp backend says it can allocate CPU tensors (supportsTensorAlloc),
    and DDP's Reducer then takes its buckets from allocateTensor, but only
    while DDP_DISABLE_COMM_MEM is "0" (torch's default is "1"). With the
    buckets in the pools, DDP's own allreduce runs in place with nothing
    staged. The variable is set, where it is unset, in a torch built
    without CUDA and XPU only: with them, NCCL's or XCCL's DDP could take
    its buckets from that library's memory pool too. torch reads anything
    but "1" as on; "1" keeps torch's buckets. Child processes inherit it.
    """
    if (DDP_COMM_MEM_VAR not in os.environ and not torch.backends.cuda.is_built()
            and not torch.xpu._is_compiled()):
        os.environ[DDP_COMM_MEM_VAR] = "0"


def is_registered() -> bool:
    """Whether torch.distributed knows the "smddp" backend."""
    import torch.distributed as dist

    return BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {})


def _op_names() -> dict:
    import torch.distributed as dist

    R = dist.ReduceOp
    return {R.SUM: "sum", R.AVG: "avg", R.PRODUCT: "product", R.MIN: "min", R.MAX: "max",
            R.BAND: "band", R.BOR: "bor", R.BXOR: "bxor"}


def _load() -> None:
    """Loads smddp._C, checks it matches the running torch, registers."""
    import torch.distributed as dist

    if not dist.is_available():
        raise ImportError(
            "smddp needs torch.distributed, which this build of torch "
            f"({torch.__version__}) does not have"
        )
    try:
        from smddp import _C
    except ImportError as err:
        raise ImportError(
            f"smddp: cannot load its compiled part smddp._C ({err}); rebuild and "
            "reinstall smddp against the installed torch: "
            "pip install --no-build-isolation ."
        ) from err
    if _C.torch_version != torch.__version__:
        raise ImportError(
            f"smddp._C was built against torch {_C.torch_version}, but torch "
            f"{torch.__version__} is running; rebuild smddp against this torch: "
            "pip install --no-build-isolation --force-reinstall ."
        )
    if not is_registered():
        dist.Backend.register_backend(
            BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"]
        )
    _keep_shrunk_groups_custom()
    _OP_NAMES.update(_op_names())


def _keep_shrunk_groups_custom() -> None:
    """torch.distributed.shrink_group registers the shrunk group's backend as
    gloo for the CPU (as NCCL for CUDA), whatever it is. A process group whose
    default backend says gloo but is smddp crashes DDP, which then reads it as
    a ProcessGroupGloo (its logger asks for gloo's thread count). For smddp
    backends, the shrunk group is registered as a custom backend instead, as
    the groups init_process_group and new_group make are."""
    import torch.distributed.distributed_c10d as c10d

    create = getattr(c10d, "_create_shrunk_process_group", None)
    if create is None or getattr(create, "_smddp_keeps_custom", False):
        return

    def create_custom(new_backend, *args, **kwargs):
        pg = create(new_backend, *args, **kwargs)
        try:
            is_smddp = new_backend.name() == BACKEND_NAME
        except Exception:  # noqa: BLE001 - a backend without a name: leave it alone
            is_smddp = False
        if is_smddp:
            custom = c10d.ProcessGroup.BackendType.CUSTOM
            for device in ("cpu", "cuda"):
                try:
                    pg._register_backend(torch.device(device), custom, new_backend)
                except Exception:  # noqa: BLE001 - no CUDA build: the CPU one suffices
                    pass
            pg._set_default_backend(custom)
        return pg

    create_custom._smddp_keeps_custom = True
    c10d._create_shrunk_process_group = create_custom


# A failure to load never makes `import smddp` fail: the launcher, the config
# and the examples live in this package and must run without the compiled
# part (smddprun then falls back to nccl). Inside torch's own import the
# error stays silent (smddp_autoload warns); otherwise it is a warning here,
# and smddp.dist.init_process_group raises it when smddp is asked for.
try:
    _load()
except Exception as _err:  # noqa: BLE001
    _load_error = _err
    if not _torch_initializing():
        import warnings

        warnings.warn(f"the smddp backend is not available: {_err}", RuntimeWarning, stacklevel=2)

from smddp.dist import init_process_group  # noqa: E402  (needs the names above)


def _cpu_backend(group, fn: str):
    """(smddp._C, the CPU backend of group or of the default group) for smddp.<fn>."""
    import torch.distributed as dist

    if _load_error is not None:
        raise RuntimeError(f"the smddp backend is not available: {_load_error}")
    from smddp import _C

    if group is None:
        group = dist.group.WORLD
    if group is None:
        raise RuntimeError(f"smddp.{fn}: torch.distributed is not initialised")
    return _C, group._get_backend(torch.device("cpu"))


def dump_trace(group=None, path=None) -> str:
    """Writes this rank's flight recorder for an smddp group; returns the path.

    The recorder holds the group's last SMDDP_TRACE_BUFFER operations (default
    2000): each one's sequence number, kind, count, dtype, reduction, root or
    peer, path and algorithm, when it was issued, started and finished, and
    how it ended (JSON; ``python -m json.tool`` reads it). group: a process
    group whose CPU backend is smddp (default: the default group). path: the
    file to write; without it, ``$SMDDP_TRACE_DIR/smddp-trace-<job>-<comm>-
    r<rank>.json``, the file libsmddp also writes when the group fails (job:
    SMDDP_JOB_ID, else TORCHELASTIC_RUN_ID, else "job"; comm: "smddp_" and
    torch's name of the group).
    """
    import os

    _C, backend = _cpu_backend(group, "dump_trace")
    return _C.dump_trace(backend, "" if path is None else os.fspath(path))


def stats(group=None) -> dict:
    """Who keeps the others waiting in an smddp group, measured so far.

    For each collective, libsmddp records when each rank arrived (its
    operation started: issued, and the group's earlier operations done). A
    rank's lateness is its arrival minus the first rank's; the skew, the last
    arrival minus the first. Returns a dict:

    - ``ops``: collectives compared;
    - ``late_s``: per group rank, its summed lateness in seconds (None for a
      rank whose arrivals this rank does not see yet: on a group spanning
      nodes, ranks on other nodes until the first comparison across nodes
      arrives, within about 0.2 s of the collectives);
    - ``slowest_rank``: the rank with the most lateness (None before any);
    - ``skew_us``: ``{"p50", "p99"}`` over the last 1024 collectives,
      ``"max"`` and ``"mean"`` over all, in microseconds;
    - ``clock_error_us``: bound on the error between the clocks compared
      (0: ranks of one node share one clock; across nodes, each node's
      offset to the clock of rank 0's node is measured when the group is
      created, within half the shortest round trip through the store);
    - ``ranks_covered``: how many ranks' arrivals are compared.

    group: a process group whose CPU backend is smddp (default: the default
    group). Within a node: no communication, every rank of the node sees
    the same numbers. Across nodes: one read of the store (at most every
    50 ms); every rank sees the same summary, made on rank 0's node from
    the arrivals every node's first rank sends it every 100 ms
    (``SMDDP_STRAGGLER_NODES=0`` turns this off).
    """
    _C, backend = _cpu_backend(group, "stats")
    return _C.stats(backend)


def peer_states(group=None) -> list:
    """What this rank knows of each rank of an smddp group, in group-rank order.

    Each entry is ``"alive"`` (its process runs: a rank of this node; this
    rank itself), ``"gone"`` (its process ended without leaving the group:
    seen on this node, or through the liveness connection to another node),
    ``"left"`` (it destroyed its group) or ``"unknown"`` (on another node,
    not seen to die). Local: no communication. Survivors of a failure use it
    to agree on whom to exclude before ``torch.distributed.shrink_group``.
    """
    _C, backend = _cpu_backend(group, "peer_states")
    return _C.peer_states(backend)


_fast = None  # (smddp._C, torch's _world, ReduceOp.SUM, NON_GROUP_MEMBER), at the first call


def _fast_path():
    global _fast
    if _load_error is not None:
        raise RuntimeError(f"the smddp backend is not available: {_load_error}")
    import torch.distributed.distributed_c10d as c10d
    from smddp import _C

    _fast = (_C, c10d._world, c10d.ReduceOp.SUM, c10d.GroupMember.NON_GROUP_MEMBER)
    return _fast


def _now_group(group, fast, fn: str):
    """group, or the default group; None where this rank is not a member (torch's no-op)."""
    if group is None:
        group = fast[1].default_pg
        if group is None:
            raise RuntimeError(f"smddp.{fn}: torch.distributed is not initialised "
                               "(call init_process_group first)")
    elif isinstance(group, int) and group == fast[3]:
        import warnings

        warnings.warn(f"smddp.{fn}: this rank is not a member of the group; nothing done",
                      stacklevel=3)
        return None
    return group


def _traced(fn: str, a, b, group) -> None:
    """Under torch.compile: the operators torch.ops.smddp.* (registered by
    smddp._C), which the compiler traces, the group by its registered name."""
    import torch.distributed as dist

    if _load_error is not None:
        raise RuntimeError(f"the smddp backend is not available: {_load_error}")
    if group is None:
        group = dist.group.WORLD
    if isinstance(group, int) and group == dist.GroupMember.NON_GROUP_MEMBER:
        return  # not a member: nothing to do, as in eager mode
    name = group.group_name
    if fn == "all_reduce":
        op = "sum" if b is None else _OP_NAMES.get(b)
        if op is None:
            raise ValueError(f"smddp.all_reduce under torch.compile: op {b} is not one of "
                             f"{', '.join(_OP_NAMES.values())}")
        torch.ops.smddp.all_reduce_(a, op, name)
    else:
        torch.ops.smddp.all_gather_into_tensor_out(b, name, out=a)


def allreduce_hook(process_group, bucket):
    """DDP communication hook: each gradient bucket averaged over the group
    in shared memory, with no copy in or out.

    ``model.register_comm_hook(group, smddp.allreduce_hook)`` (group: the
    DDP model's process group, or None for the default group) in place of
    DDP's built-in allreduce, with its result, the mean over the ranks (up
    to rounding where the world size is not a power of two: the sum is
    divided, not each gradient). Where DDP already takes its buckets from
    the group (DDP_DISABLE_COMM_MEM=0, which creating an smddp group sets
    in a torch without CUDA or XPU), DDP's own allreduce runs in the pools
    and this hook adds nothing; it is for DDP with torch's buckets (a torch
    with CUDA, DDP_DISABLE_COMM_MEM=1, or a torch without that variable). On a
    group whose backend is smddp, the
    first time a CPU bucket comes, its memory moves into the rank's pool
    (``move_to_pool``), where the ranks of a node read and write each
    other's buckets in place (buckets of at most the one-shot size from
    their second allreduce on), so an allreduce moves each byte once instead of staging it
    in and out. On any other group, or where there is no pool (a group
    across nodes, ``SMDDP_SHM_POOL_SIZE=0``, the pool full), it is an
    ordinary allreduce (torch's own hook on other backends).
    """
    import torch.distributed as dist

    group = dist.group.WORLD if process_group is None else process_group
    buf = bucket.buffer()
    if _load_error is None and dist.get_backend(group) == BACKEND_NAME:
        from smddp import _C

        if buf.device.type == "cpu":
            _C.move_to_pool(group, buf)
        op = dist.ReduceOp.AVG  # divided inside the reduction, no pass of its own
    else:  # torch's own allreduce hook: not every backend has AVG
        buf.div_(dist.get_world_size(group))
        op = dist.ReduceOp.SUM
    work = dist.all_reduce(buf, op=op, group=group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def move_to_pool(tensor, group=None) -> bool:
    """Moves a CPU tensor's memory into the shared-memory pool of an smddp
    group; returns whether it lies in one.

    The tensor (and every view of its storage) keeps its values, shape and
    identity; only the memory behind it changes: copied into the pool, the
    old memory freed. Collectives of that group on the ranks of one node
    then read and write it in place instead of staging it. Use it on
    long-lived buffers that are communicated often (DDP's buckets; see
    ``allreduce_hook``) and that nothing reaches through their old address
    (a numpy array over the tensor, a ``data_ptr()`` taken before), with no
    collective under way on it and no other thread using it: the old memory
    is freed at once. Pooled memory is shared, also with processes forked
    afterwards. Returns False, and leaves the tensor alone, where the
    group's backend for the tensor's device is not smddp, the group has no
    pool (across nodes, ``SMDDP_SHM_POOL_SIZE=0``), the tensor is empty or
    not on the CPU, or the pool is full (with a warning). A tensor in
    another group's pool moves into this group's.
    """
    import torch.distributed as dist

    if _load_error is not None:
        raise RuntimeError(f"the smddp backend is not available: {_load_error}")
    from smddp import _C

    return _C.move_to_pool(dist.group.WORLD if group is None else group, tensor)


def all_reduce(tensor, op=None, group=None) -> None:
    """``torch.distributed.all_reduce(tensor, op, group)`` on an smddp group, done on return.

    The same collective and result as torch's synchronous call, for tensor
    parallelism and other small, frequent allreduces (the place of
    DeepSpeed's ``inference_all_reduce``): libsmddp runs it on the calling
    thread, with no Work, Future or dispatcher in between. op: a
    ``torch.distributed.ReduceOp`` (default SUM). group: a process group
    whose backend for the tensor's device is smddp (default: the default
    group). Every rank of the group must call it, in the same order as its
    other collectives on that group. There is no ``async_op``; use
    ``torch.distributed.all_reduce`` for a Work. Errors are those of a
    failed Work's ``wait()``.
    """
    if torch.compiler.is_compiling():
        _traced("all_reduce", tensor, op, group)
        return
    fast = _fast or _fast_path()
    group = _now_group(group, fast, "all_reduce")
    if group is not None:
        fast[0].all_reduce(group, tensor, fast[2] if op is None else op)


def all_gather_into_tensor(output_tensor, input_tensor, group=None) -> None:
    """``torch.distributed.all_gather_into_tensor(output, input, group)`` on an smddp group,
    done on return.

    output_tensor holds world size x input_tensor's elements, rank r's at r x
    numel, as with torch's call. Runs as ``smddp.all_reduce`` does: on the
    calling thread, with no Work, Future or dispatcher.
    """
    if torch.compiler.is_compiling():
        _traced("all_gather_into_tensor", output_tensor, input_tensor, group)
        return
    fast = _fast or _fast_path()
    group = _now_group(group, fast, "all_gather_into_tensor")
    if group is not None:
        fast[0].all_gather_into_tensor(group, output_tensor, input_tensor)


def abort_work(work) -> None:
    """Aborts a Work that has not completed (torch's C++ ``Work::abort()``).

    For a work of an smddp group this aborts the group's communicator, as
    NCCL's works do: a collective cannot be withdrawn from one rank alone.
    The work, and every other pending work of the group, then completes at
    once; its ``wait()`` raises an error that says the group was aborted,
    and the peers' collectives fail naming the abort. A completed work is
    left as it is. Where torch's Work has ``abort()`` in Python, that is
    called; otherwise smddp's module calls the C++ one (for any backend's
    work; a backend that does not implement it raises).
    """
    if hasattr(work, "abort"):
        work.abort()
        return
    if _load_error is not None:
        raise RuntimeError(f"the smddp backend is not available: {_load_error}")
    from smddp import _C

    _C.abort_work(work)


_monitored_barriers: dict = {}  # group name -> calls so far (every rank counts the same)


def monitored_barrier(group=None, timeout=None, wait_all_ranks: bool = False) -> None:
    """torch.distributed.monitored_barrier for a group of any backend, smddp's included.

    torch implements it for gloo only. This one does what gloo's does,
    through the group's store, so the group itself is not touched and stays
    usable after a failure: every rank other than 0 reports to rank 0 and
    waits for its verdict; rank 0 waits for each of them, up to ``timeout``
    in all (default: torch's default_pg_timeout, as torch's), and raises ``RuntimeError("[Rank 0]: Rank
    2 failed to pass monitoredBarrier in 1000 ms")``, naming the first rank
    that did not arrive, or every one with ``wait_all_ranks=True`` ("Ranks 1,
    2 failed ..."), in gloo's words. Unlike gloo's, whose group breaks when
    it fails, the group stays usable. The
    other ranks then raise too, with rank 0's verdict. Every rank of the
    group must call it (the calls are matched by their count).
    """
    import time
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if group is None:
        group = dist.group.WORLD
    if group is None:
        raise RuntimeError("smddp.monitored_barrier: torch.distributed is not initialised")
    if timeout is None:
        timeout = c10d.default_pg_timeout  # as torch's, for every backend but NCCL
    if not isinstance(timeout, timedelta) or timeout.total_seconds() <= 0:
        raise ValueError(f"smddp.monitored_barrier: timeout {timeout!r}; give a positive "
                         "datetime.timedelta")
    ms = int(timeout.total_seconds() * 1000)
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    store = c10d._world.pg_map[group][1]
    n = _monitored_barriers[group.group_name] = _monitored_barriers.get(group.group_name, 0) + 1
    prefix = f"smddp/monitored_barrier/{n}"
    released = f"{prefix}/released"
    if rank != 0:
        store.set(f"{prefix}/arrived/{rank}", "1")
        try:
            store.wait([released], timeout)
        except Exception as err:  # noqa: BLE001 - torch raises DistStoreError (or a RuntimeError)
            raise RuntimeError(f"[Rank {rank}]: rank 0 did not end monitored_barrier within "
                               f"{ms} ms: {err}") from None
        verdict = store.get(released).decode()
        if verdict != "ok":
            raise RuntimeError(f"[Rank {rank}]: monitored_barrier failed on rank 0: {verdict}")
        return
    deadline = time.monotonic() + timeout.total_seconds()
    missing = []
    for r in range(1, world):
        left = max(deadline - time.monotonic(), 0.001)
        try:
            store.wait([f"{prefix}/arrived/{r}"], timedelta(seconds=left))
        except Exception:  # noqa: BLE001 - a timeout: r did not arrive in time
            missing.append(r)
            if not wait_all_ranks:
                break
    if missing:
        # gloo's words: "Rank 3" for the first one, "Ranks 1, 3" with wait_all_ranks.
        who = ("Ranks " + ", ".join(str(r) for r in missing) if wait_all_ranks
               else f"Rank {missing[0]}")
        msg = f"{who} failed to pass monitoredBarrier in {ms} ms"
        store.set(released, msg)
        raise RuntimeError(f"[Rank 0]: {msg}")
    store.set(released, "ok")


__all__ += ["init_process_group", "dump_trace", "stats", "peer_states", "abort_work",
            "monitored_barrier"]
