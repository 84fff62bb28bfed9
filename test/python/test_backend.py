"""The torch backend "smddp" against gloo, in 2- and 3-rank jobs on this machine.

Every rank runs the collective with smddp (the default group) and computes the
reference through a gloo group of the same ranks in the same process: gloo
gathers every rank's input and the reduction is redone locally in float64 /
int64. Inputs are small integers, so every result is exact except AVG and
PREMUL_SUM (divisions and scaling), which get a tolerance.

Ranks are spawned processes; each test waits a bounded time and kills
stragglers, so a hang fails the test instead of blocking the run.
"""

import functools
import importlib.metadata
import os
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist


from smddp_support import free_port, requires_smddp, spawn_ranks

pytestmark = requires_smddp

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
TEST_TIMEOUT_S = 25


# ---- harness ---------------------------------------------------------------


def _rank_main(rank, world, fn, port, env, queue):
    try:
        # "{rank}" in a value becomes this rank's number (per-rank host names).
        os.environ.update({k: v.replace("{rank}", str(rank)) for k, v in (env or {}).items()})
        if "TORCH_DISTRIBUTED_DEBUG" in (env or {}):
            dist.set_debug_level_from_env()  # read once, at torch's import
        import smddp  # noqa: F401  (registers the backend)

        dist.init_process_group(
            backend="smddp",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=20),
        )
        gloo = dist.new_group(backend="gloo")
        failures = fn(rank, world, gloo) or []
        dist.barrier(group=gloo)
        dist.destroy_process_group()
        queue.put((rank, failures, None))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, [], traceback.format_exc()))


def run_ranks(fn, world, timeout=TEST_TIMEOUT_S, env=None):
    """Runs fn(rank, world, gloo_group) on world spawned ranks; fails on any failure.

    env: extra environment variables for the ranks (set before smddp loads);
    "{rank}" in a value is replaced by the rank.
    """
    problems = spawn_ranks(_rank_main, world, timeout, (fn, free_port(), env))
    assert not problems, "\n".join(problems[:40])


# ---- reference through gloo -------------------------------------------------


def _data(dtype, rank, n=37, salt=0):
    g = torch.Generator().manual_seed(1000 * salt + 17 * rank + n)
    lo = 0 if dtype == torch.uint8 else -3
    return torch.randint(lo, 4, (n,), generator=g).to(dtype)


def _gather_gloo(t, world, gloo):
    """Every rank's t through gloo, widened to float64 / int64."""
    wide = t.to(torch.float64 if t.is_floating_point() else torch.int64)
    out = [torch.empty_like(wide) for _ in range(world)]
    dist.all_gather(out, wide, group=gloo)
    return torch.stack(out)


def _reduce_local(stack, op, world, factor=None):
    if op == "sum":
        return stack.sum(0)
    if op == "avg":
        return stack.sum(0) / world
    if op == "product":
        return stack.prod(0)
    if op == "min":
        return stack.min(0).values
    if op == "max":
        return stack.max(0).values
    if op == "premul_sum":
        return (stack * factor).sum(0)
    acc = stack[0].clone()
    for row in stack[1:]:
        acc = {"band": acc & row, "bor": acc | row, "bxor": acc ^ row}[op]
    return acc


def _reduce_op(op, factor=None):
    if op == "premul_sum":
        return dist._make_nccl_premul_sum(factor)
    return {
        "sum": dist.ReduceOp.SUM,
        "avg": dist.ReduceOp.AVG,
        "product": dist.ReduceOp.PRODUCT,
        "min": dist.ReduceOp.MIN,
        "max": dist.ReduceOp.MAX,
        "band": dist.ReduceOp.BAND,
        "bor": dist.ReduceOp.BOR,
        "bxor": dist.ReduceOp.BXOR,
    }[op]


def _ops_for(dtype):
    if dtype.is_floating_point:
        return ["sum", "avg", "product", "min", "max", "premul_sum"]
    return ["sum", "product", "min", "max", "band", "bor", "bxor"]


def _compare(failures, what, got, want, exact=True):
    want = want.to(got.dtype)
    if exact:
        ok = torch.equal(got, want)
    else:
        tol = 1e-2 if got.dtype in (torch.float16, torch.bfloat16) else 1e-6
        ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
    if not ok:
        failures.append(f"{what}: got {got.tolist()[:8]}..., want {want.tolist()[:8]}...")


# ---- the collectives ----------------------------------------------------------


def _check_allreduce(rank, world, gloo):
    failures = []
    for dtype in FLOATS + INTS:
        for op in _ops_for(dtype):
            factor = 0.5 if op == "premul_sum" else None
            x = _data(dtype, rank, salt=len(op))
            want = _reduce_local(_gather_gloo(x, world, gloo), op, world, factor)
            got = x.clone()
            dist.all_reduce(got, op=_reduce_op(op, factor))
            _compare(failures, f"allreduce {dtype} {op}", got, want,
                     exact=op not in ("avg", "premul_sum"))
        # The same through gloo's own allreduce, for the ops gloo has.
        x = _data(dtype, rank, salt=99)
        ref = x.clone()
        dist.all_reduce(ref, op=dist.ReduceOp.MAX, group=gloo)
        got = x.clone()
        dist.all_reduce(got, op=dist.ReduceOp.MAX)
        _compare(failures, f"allreduce {dtype} max vs gloo", got, ref)
    # bool: logical reductions, against gloo's own (SUM and MAX or, PRODUCT and MIN and).
    for op in ("sum", "product", "min", "max", "band", "bor"):
        x = (torch.arange(64) * (rank + 3) + len(op)) % (rank + 2) == 0
        ref = x.clone()
        dist.all_reduce(ref, op=_reduce_op(op), group=gloo)
        got = x.clone()
        dist.all_reduce(got, op=_reduce_op(op))
        _compare(failures, f"allreduce bool {op} vs gloo", got, ref)
    try:
        dist.all_reduce(torch.ones(4, dtype=torch.bool), op=dist.ReduceOp.AVG)
        failures.append("allreduce of bool with AVG did not raise")
    except (RuntimeError, ValueError) as err:
        if "bool" not in str(err):
            failures.append(f"AVG on bool: the error does not say why: {err}")
    # Asynchronous, with the Future (what DDP's comm hook waits on).
    x = _data(torch.float32, rank, n=1000)
    want = _reduce_local(_gather_gloo(x, world, gloo), "sum", world)
    work = dist.all_reduce(x, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    _compare(failures, "allreduce future then()", fut.wait(), want * 2)
    work.wait()
    _compare(failures, "allreduce async", x, want)
    # A Future first asked for after the work completed: done, with the result.
    x = _data(torch.float32, rank, n=7)
    work = dist.all_reduce(x, async_op=True)
    work.wait()
    fut = work.get_future()
    if not fut.done():
        failures.append("allreduce: the Future asked for after wait() is not done")
    _compare(failures, "allreduce future after wait()", fut.wait()[0],
             _reduce_local(_gather_gloo(_data(torch.float32, rank, n=7), world, gloo), "sum",
                           world))
    if not work.get_future().done():
        failures.append("allreduce: a second get_future() is not done")
    # Sizes 0, 1 and one not a multiple of anything.
    for n in (0, 1, 4099):
        x = _data(torch.float32, rank, n=n)
        want = _reduce_local(_gather_gloo(x, world, gloo), "sum", world)
        dist.all_reduce(x)
        _compare(failures, f"allreduce n={n}", x, want)
    # Non-contiguous: a strided view is reduced in place, the rest untouched.
    base = _data(torch.float32, rank, n=64).reshape(8, 8)
    view = base[:, ::2]
    want = _reduce_local(_gather_gloo(view.contiguous(), world, gloo), "sum", world)
    untouched = base[:, 1::2].clone()
    dist.all_reduce(view)
    _compare(failures, "allreduce non-contiguous", view.contiguous(), want)
    _compare(failures, "allreduce non-contiguous: other columns", base[:, 1::2], untouched)
    # async_op=False reaches the backend as asyncOp: the blocking call has
    # finished when it returns, and it returns no Work (torch's collectives
    # then skip wait()); under torch's in-flight collective registry
    # (torch.compile's wait_tensor) it returns a completed Work instead.
    import torch._C._distributed_c10d as c10d
    from torch._C._distributed_c10d import _set_allow_inflight_collective_as_graph_input

    def blocking_allreduce(salt):
        x = _data(torch.float32, rank, n=5, salt=salt)
        want = _reduce_local(_gather_gloo(x, world, gloo), "sum", world)
        o = c10d.AllreduceOptions()
        o.asyncOp = False
        return dist.group.WORLD.allreduce([x], o), x, want

    def blocking_allgather(salt):
        x = _data(torch.float32, rank, n=5, salt=salt)
        want = torch.cat(_gather_gloo(x, world, gloo).unbind(0))
        out = torch.full((5 * world,), -1.0)
        o = c10d.AllgatherOptions()
        o.asyncOp = False
        return dist.group.WORLD._allgather_base(out, x, o), out, want

    def blocking_reduce_scatter(salt):
        x = _data(torch.float32, rank, n=5 * world, salt=salt)
        want = _reduce_local(_gather_gloo(x, world, gloo), "sum", world)[5 * rank:5 * rank + 5]
        out = torch.full((5,), -1.0)
        o = c10d.ReduceScatterOptions()
        o.asyncOp = False
        return dist.group.WORLD._reduce_scatter_base(out, x, o), out, want

    for name, run in (("allreduce", blocking_allreduce), ("allgather", blocking_allgather),
                      ("reduce_scatter", blocking_reduce_scatter)):
        if not hasattr(c10d.AllreduceOptions(), "asyncOp"):
            break
        work, got, want = run(7)
        if work is not None:
            failures.append(f"blocking {name} returned a Work: {work}")
        _compare(failures, f"blocking {name}, no Work", got, want)
        _set_allow_inflight_collective_as_graph_input(True)
        try:
            work, got, want = run(8)
            if work is None or not work.wait() or not work.is_completed():
                failures.append(f"blocking {name} with in-flight registry: no completed "
                                f"Work ({work})")
            # As torch's own backends' Works do, a waited Work leaves the
            # registry (which would otherwise keep it, and warn at exit).
            if c10d._get_work_registry_size() != 0:
                failures.append(f"blocking {name} with in-flight registry: the waited Work "
                                f"is still registered ({c10d._get_work_registry_size()})")
            _compare(failures, f"blocking {name}, in-flight registry", got, want)
        finally:
            _set_allow_inflight_collective_as_graph_input(False)
    # allreduce_coalesced
    xs = [_data(torch.float32, rank, n=n, salt=5) for n in (3, 10)]
    wants = [_reduce_local(_gather_gloo(x, world, gloo), "sum", world) for x in xs]
    dist.group.WORLD.allreduce_coalesced(xs).wait()
    for x, w in zip(xs, wants):
        _compare(failures, "allreduce_coalesced", x, w)
    return failures


def _check_rooted(rank, world, gloo):
    failures = []
    root = world - 1
    for dtype in FLOATS + INTS:
        x = _data(dtype, rank)
        want = x.clone()
        dist.broadcast(want, src=root, group=gloo)
        got = x.clone()
        dist.broadcast(got, src=root)
        _compare(failures, f"broadcast {dtype}", got, want)

        for op in ("sum", "max"):
            x = _data(dtype, rank, salt=3)
            want = _reduce_local(_gather_gloo(x, world, gloo), op, world)
            got = x.clone()
            dist.reduce(got, dst=1, op=_reduce_op(op))
            if rank == 1:
                _compare(failures, f"reduce {dtype} {op}", got, want)

        x = _data(dtype, rank, n=11)
        stack = _gather_gloo(x, world, gloo)
        outs = [torch.empty_like(x) for _ in range(world)] if rank == 0 else None
        dist.gather(x, outs, dst=0)
        if rank == 0:
            for r in range(world):
                _compare(failures, f"gather {dtype} from {r}", outs[r], stack[r])

        chunks = [_data(dtype, 100 + r, n=7) for r in range(world)]
        got = torch.empty(7, dtype=dtype)
        dist.scatter(got, chunks if rank == root else None, src=root)
        _compare(failures, f"scatter {dtype}", got, chunks[rank])
    return failures


def _check_gather_scatter_family(rank, world, gloo):
    failures = []
    for dtype in FLOATS + INTS:
        x = _data(dtype, rank, n=13)
        stack = _gather_gloo(x, world, gloo)
        outs = [torch.empty_like(x) for _ in range(world)]
        dist.all_gather(outs, x)
        for r in range(world):
            _compare(failures, f"all_gather {dtype} [{r}]", outs[r], stack[r])
        flat = torch.empty(world * 13, dtype=dtype)
        dist.all_gather_into_tensor(flat, x)
        _compare(failures, f"all_gather_into_tensor {dtype}", flat, stack.reshape(-1))

        ops = ["sum", "max"] if dtype in INTS else ["sum", "max", "avg"]
        for op in ops:
            full = _data(dtype, rank, n=5 * world, salt=7)
            want = _reduce_local(_gather_gloo(full, world, gloo), op, world)
            want = want.reshape(world, 5)[rank]
            got = torch.empty(5, dtype=dtype)
            dist.reduce_scatter_tensor(got, full, op=_reduce_op(op))
            _compare(failures, f"reduce_scatter_tensor {dtype} {op}", got, want, exact=op != "avg")
            got = torch.empty(5, dtype=dtype)
            dist.reduce_scatter(got, list(full.reshape(world, 5).unbind(0)), op=_reduce_op(op))
            _compare(failures, f"reduce_scatter {dtype} {op}", got, want, exact=op != "avg")

    # Bool moves as bytes.
    flags = torch.tensor([rank % 2 == 0, True, False])
    outs = [torch.empty_like(flags) for _ in range(world)]
    dist.all_gather(outs, flags)
    for r in range(world):
        _compare(failures, f"all_gather bool [{r}]", outs[r],
                 torch.tensor([r % 2 == 0, True, False]))
    # all_gather_coalesced: one output list per rank, each as long as the inputs
    # (gloo's nesting), with one input, several, and an empty one; gloo alongside.
    for sizes in ((3,), (2, 5, 0, 1)):
        ins = [_data(torch.int32, rank, n=n, salt=13) for n in sizes]
        got = [[torch.full_like(x, -1) for x in ins] for _ in range(world)]
        want = [[torch.full_like(x, -1) for x in ins] for _ in range(world)]
        dist.all_gather_coalesced(got, ins)
        dist.all_gather_coalesced(want, ins, group=gloo)
        for r in range(world):
            for i in range(len(ins)):
                _compare(failures, f"all_gather_coalesced {sizes} [{r}][{i}]", got[r][i],
                         want[r][i])
    # The coalesced forms, called on the process group as FSDP does.
    pg = dist.group.WORLD
    ins = [_data(torch.float32, rank, n=n, salt=11) for n in (4, 9)]
    stacks = [_gather_gloo(x, world, gloo) for x in ins]
    outs = [torch.empty(world * x.numel()) for x in ins]
    pg.allgather_into_tensor_coalesced(outs, ins).wait()
    for o, s in zip(outs, stacks):
        _compare(failures, "allgather_into_tensor_coalesced", o, s.reshape(-1))
    ins = [_data(torch.float32, rank, n=world * n, salt=12) for n in (2, 6)]
    wants = [_reduce_local(_gather_gloo(x, world, gloo), "sum", world).reshape(world, -1)[rank]
             for x in ins]
    outs = [torch.empty(x.numel() // world) for x in ins]
    opts = dist.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    pg.reduce_scatter_tensor_coalesced(outs, ins, opts).wait()
    for o, w in zip(outs, wants):
        _compare(failures, "reduce_scatter_tensor_coalesced", o, w)
    return failures


def _check_alltoall(rank, world, gloo):
    failures = []
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
        # Even split, 2 rows of 3 per peer.
        x = _data(dtype, rank, n=world * 6).reshape(world * 2, 3)
        want = torch.empty_like(x)
        dist.all_to_all_single(want, x, group=gloo)
        got = torch.empty_like(x)
        dist.all_to_all_single(got, x)
        _compare(failures, f"all_to_all_single {dtype}", got, want)

        # Uneven: rank r sends (r + j + 1) % 3 rows to rank j (some are 0).
        in_splits = [(rank + j + 1) % 3 for j in range(world)]
        out_splits = [(j + rank + 1) % 3 for j in range(world)]
        x = _data(dtype, rank, n=sum(in_splits) * 4, salt=2).reshape(-1, 4)
        want = torch.empty(sum(out_splits), 4, dtype=dtype)
        dist.all_to_all_single(want, x, out_splits, in_splits, group=gloo)
        got = torch.empty_like(want)
        dist.all_to_all_single(got, x, out_splits, in_splits)
        _compare(failures, f"all_to_all_single uneven {dtype}", got, want)

        # List form, same sizes (gloo's own form) and then different sizes
        # per peer (gloo refuses those; the data is known by construction).
        ins = [_data(dtype, rank * 10 + j, n=4) for j in range(world)]
        want = [torch.empty(4, dtype=dtype) for _ in range(world)]
        dist.all_to_all(want, ins, group=gloo)
        got = [torch.empty_like(w) for w in want]
        dist.all_to_all(got, ins)
        for j in range(world):
            _compare(failures, f"all_to_all {dtype} from {j}", got[j], want[j])
        ins = [_data(dtype, rank * 10 + j, n=rank + j + 1) for j in range(world)]
        want = [_data(dtype, j * 10 + rank, n=j + rank + 1) for j in range(world)]
        got = [torch.empty_like(w) for w in want]
        dist.all_to_all(got, ins)
        for j in range(world):
            _compare(failures, f"all_to_all uneven {dtype} from {j}", got[j], want[j])
    return failures


def _check_p2p_and_barrier(rank, world, gloo):
    failures = []
    right, left = (rank + 1) % world, (rank - 1) % world
    for dtype in (torch.float32, torch.int32, torch.bfloat16):
        x = _data(dtype, rank, n=100)
        got = torch.empty_like(x)
        reqs = [dist.irecv(got, src=left), dist.isend(x, dst=right)]
        for r in reqs:
            r.wait()
        _compare(failures, f"isend/irecv ring {dtype}", got, _data(dtype, left, n=100))
    # A pending receive must not hold up a later collective.
    if world >= 2:
        got = torch.empty(3)
        if rank == 0:
            req = dist.irecv(got, src=1)
            y = torch.ones(2)
            dist.all_reduce(y)
            req.wait()
            _compare(failures, "recv posted before allreduce", got, torch.full((3,), 7.0))
        else:
            y = torch.ones(2)
            dist.all_reduce(y)
            if rank == 1:
                dist.send(torch.full((3,), 7.0), dst=0)
        _compare(failures, "allreduce behind a pending recv", y, torch.full((2,), float(world)))
    # recv without src (recvAnysource): rank 0 hears from every other rank, in any order.
    if rank == 0:
        senders = []
        for _ in range(world - 1):
            t = torch.zeros(5, dtype=torch.int64)
            src = dist.recv(t)
            senders.append(src)
            _compare(failures, f"recv from any rank: message of rank {src}", t,
                     torch.full((5,), 100 + src, dtype=torch.int64))
        if sorted(senders) != list(range(1, world)):
            failures.append(f"recv from any rank: senders {senders}, expected 1..{world - 1}")
        # Only now may the last rank send its second message: sent earlier, it
        # could overtake another rank's first one and meet a 5-element recv.
        dist.send(torch.zeros(1), dst=world - 1)
        t = torch.zeros(2)
        work = dist.irecv(t)  # no src: the Work names the sender after wait()
        work.wait()
        if work._source_rank() != world - 1 or not torch.equal(t, torch.full((2,), 9.0)):
            failures.append(f"irecv from any rank: rank {work._source_rank()}, data {t}")
    else:
        dist.send(torch.full((5,), 100 + rank, dtype=torch.int64), dst=0)
        if rank == world - 1:
            dist.recv(torch.zeros(1), src=0)
            dist.send(torch.full((2,), 9.0), dst=0)
    for _ in range(3):
        dist.barrier()
    work = dist.barrier(async_op=True)
    work.wait(timeout=timedelta(seconds=10))
    if not work.is_completed():
        failures.append("barrier work not completed after wait()")
    return failures


def _check_tags(rank, world, gloo):
    """send/recv match by tag, as gloo's do: rank 1 waits for rank 0's
    first message with tag 7 before it asks for tag 3, which rank 0 sent
    first; messages with one tag keep their order. With 3 ranks, receives
    from any rank take the message with their tag. Each case runs on smddp
    and on gloo, against the values sent."""
    failures = []

    def pairs(group, n):
        msgs = [(3, _data(torch.float32, 30, n=n)), (7, _data(torch.float32, 70, n=n)),
                (3, _data(torch.float32, 31, n=n)), (7, _data(torch.float32, 71, n=n))]
        got = {}
        if rank == 0:
            works = [dist.isend(t, 1, group=group, tag=tag) for tag, t in msgs]
            for w in works:
                w.wait()
        elif rank == 1:
            first7 = torch.empty(n)
            dist.recv(first7, 0, group=group, tag=7)
            got["first 7"] = first7
            later = [("first 3", 3), ("second 7", 7), ("second 3", 3)]
            bufs = [torch.empty(n) for _ in later]
            works = [dist.irecv(b, 0, group=group, tag=tag) for b, (_, tag) in zip(bufs, later)]
            for w in works:
                w.wait()
            got.update({name: b for b, (name, _) in zip(bufs, later)})
        want = {"first 3": msgs[0][1], "first 7": msgs[1][1], "second 3": msgs[2][1],
                "second 7": msgs[3][1]}
        return got, want

    def any_rank(group):
        if rank == 0:
            a, b = torch.zeros(4), torch.zeros(4)
            w12 = dist.irecv(a, group=group, tag=12)
            w11 = dist.irecv(b, group=group, tag=11)
            w12.wait()
            w11.wait()
            return {"tag 12": (w12._source_rank(), a), "tag 11": (w11._source_rank(), b)}
        if rank in (1, 2):
            if rank == 2:
                time.sleep(0.1)  # tag 11 comes first
            dist.send(torch.full((4,), float(rank)), 0, group=group, tag=10 + rank)
        return {}

    for backend, group in (("smddp", dist.group.WORLD), ("gloo", gloo)):
        for n in (5, 1 << 18):
            got, want = pairs(group, n)
            for name, t in got.items():
                _compare(failures, f"{backend}: {n} floats, {name} message", t, want[name])
        if world >= 3:
            got = any_rank(group)
            for name, src in (("tag 12", 2), ("tag 11", 1)):
                if name in got:
                    s, t = got[name]
                    if s != src:
                        failures.append(f"{backend}: receive from any rank for {name} matched rank {s}")
                    _compare(failures, f"{backend}: receive from any rank for {name}", t,
                             torch.full((4,), float(src)))
        dist.barrier(group=group)
    return failures


def _check_object_collectives(rank, world, gloo):
    """all_gather_object, gather_object, broadcast_object_list and
    scatter_object_list, which torch builds on the collectives (pickled
    objects of different sizes on each rank), against gloo's results."""
    failures = []

    def obj(r):
        return {"rank": r, "name": "x" * (10 * r + 1), "t": torch.arange(r + 2), "nested": [r, (r, str(r))]}

    def same(a, b):
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b

    def run(group):
        out = {}
        gathered = [None] * world
        dist.all_gather_object(gathered, obj(rank), group=group)
        out["all_gather_object"] = gathered
        dst = world - 1
        g = [None] * world if rank == dst else None
        dist.gather_object(obj(rank), g, dst=dst, group=group)
        out["gather_object"] = g
        lst = [obj(1), "from rank 1", 7] if rank == 1 else [None, None, None]
        dist.broadcast_object_list(lst, src=1, group=group)
        out["broadcast_object_list"] = lst
        got = [None]
        dist.scatter_object_list(got, [obj(10 + r) for r in range(world)] if rank == 0 else None,
                                 src=0, group=group)
        out["scatter_object_list"] = got
        return out

    mine, ref = run(dist.group.WORLD), run(gloo)
    want = {"all_gather_object": [obj(r) for r in range(world)],
            "gather_object": [obj(r) for r in range(world)] if rank == world - 1 else None,
            "broadcast_object_list": [obj(1), "from rank 1", 7],
            "scatter_object_list": [obj(10 + rank)]}
    for name in want:
        if not same(mine[name], ref[name]) or not same(mine[name], want[name]):
            failures.append(f"{name}: smddp gave {mine[name]!r}, gloo {ref[name]!r}, "
                            f"expected {want[name]!r}")
    return failures


def _check_coalescing(rank, world, gloo):
    """startCoalescing/endCoalescing: batch_isend_irecv as one batch (a ring
    both ways, as pipeline parallelism exchanges), and _coalescing_manager
    with a device around sends, receives and collectives; every result
    against gloo's on the same ranks (gloo runs them one by one)."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    failures = []
    smddp_pg = dist.group.WORLD
    if not smddp_pg._get_backend(torch.device("cpu")).supports_coalescing:
        return ["the smddp backend does not say it supports coalescing"]
    right, left = (rank + 1) % world, (rank - 1) % world

    def ring(group, n, dtype):
        x, y = _data(dtype, rank, n=n), _data(dtype, rank + 7, n=n)
        from_left, from_right = torch.empty_like(x), torch.empty_like(y)
        ops = [dist.P2POp(dist.isend, x, right, group), dist.P2POp(dist.irecv, from_left, left, group),
               dist.P2POp(dist.isend, y, left, group), dist.P2POp(dist.irecv, from_right, right, group)]
        works = dist.batch_isend_irecv(ops)
        for w in works:
            w.wait()
        return from_left, from_right, len(works)

    for n, dtype in ((5, torch.float32), (1 << 20, torch.float32), (100, torch.int64)):
        got_left, got_right, n_works = ring(smddp_pg, n, dtype)
        want_left, want_right, _ = ring(gloo, n, dtype)
        _compare(failures, f"batch_isend_irecv ring {n} x {dtype} from the left", got_left, want_left)
        _compare(failures, f"batch_isend_irecv ring {n} x {dtype} from the right", got_right, want_right)
        if n_works != 1:
            failures.append(f"batch_isend_irecv returned {n_works} works, not one coalesced work")

    # Sends, receives and a broadcast in one coalesced batch, waited once.
    x, got, b = _data(torch.float32, rank, n=33), torch.empty(33), torch.full((4,), float(rank))
    with _coalescing_manager(smddp_pg, torch.device("cpu"), async_ops=True) as cm:
        dist.isend(x, right)
        dist.irecv(got, left)
        dist.broadcast(b, src=world - 1, async_op=True)
    cm.wait()
    _compare(failures, "coalesced isend/irecv", got, _data(torch.float32, left, n=33))
    _compare(failures, "coalesced broadcast", b, torch.full((4,), float(world - 1)))
    # Synchronous all_reduces under a device's coalescing manager (torch's fast path).
    ts = [_data(torch.float32, rank + i, n=10) for i in range(3)]
    refs = [t.clone() for t in ts]
    with _coalescing_manager(smddp_pg, torch.device("cpu")):
        for t in ts:
            dist.all_reduce(t)
    for t in refs:
        dist.all_reduce(t, group=gloo)
    for i, (t, r) in enumerate(zip(ts, refs)):
        _compare(failures, f"coalesced all_reduce {i}", t, r)
    # allreduce_coalesced of mixed dtypes, which gloo refuses: each tensor summed in its own.
    import torch._C._distributed_c10d as c10d

    mixed = [_data(torch.float32, rank, n=7), _data(torch.int64, rank, n=3),
             _data(torch.bfloat16, rank, n=5)]
    smddp_pg.allreduce_coalesced(mixed, c10d.AllreduceCoalescedOptions()).wait()
    for t in mixed:
        want = t.new_zeros(t.shape)
        for r in range(world):
            want += _data(t.dtype, r, n=t.numel())
        _compare(failures, f"allreduce_coalesced of mixed dtypes: {t.dtype}", t, want)
    # One coalescing at a time.
    smddp_pg._start_coalescing(torch.device("cpu"))
    try:
        smddp_pg._start_coalescing(torch.device("cpu"))
        failures.append("a second startCoalescing was accepted")
    except RuntimeError as err:
        if "coalescing already" not in str(err):
            failures.append(f"second startCoalescing: {err}")
    smddp_pg._end_coalescing(torch.device("cpu")).wait()
    return failures


def _check_groups_and_errors(rank, world, gloo):
    failures = []
    # A sub-group of some ranks, created through the store like any new group.
    members = [0, world - 1]
    sub = dist.new_group(members, backend="smddp")
    if rank in members:
        x = torch.tensor([float(rank + 1)])
        dist.all_reduce(x, group=sub)
        _compare(failures, "new_group allreduce", x, torch.tensor([float(world + 1)]))
        outs = [torch.empty(1) for _ in members]
        dist.all_gather(outs, torch.tensor([float(rank)]), group=sub)
        _compare(failures, "new_group allgather", torch.cat(outs),
                 torch.tensor([float(m) for m in members]))
    # A whole-world second smddp group beside gloo: independent sequences.
    other = dist.new_group(backend="smddp")
    x, y, z = torch.ones(4), torch.ones(4) * 2, torch.ones(4) * 3
    w1 = dist.all_reduce(x, async_op=True)
    w2 = dist.all_reduce(y, group=other, async_op=True)
    dist.all_reduce(z, group=gloo)
    w2.wait()
    w1.wait()
    _compare(failures, "default group", x, torch.full((4,), float(world)))
    _compare(failures, "second smddp group", y, torch.full((4,), 2.0 * world))
    _compare(failures, "gloo group beside", z, torch.full((4,), 3.0 * world))
    if dist.get_backend(other) != "smddp":
        failures.append(f"get_backend(new group) is {dist.get_backend(other)!r}")
    # An unsupported dtype raises a clear error, before anything is issued.
    try:
        dist.all_reduce(torch.empty(3, dtype=torch.bits16))
        failures.append("bits16 allreduce did not raise")
    except RuntimeError as err:
        if "Bits16" not in str(err) and "bits16" not in str(err):
            failures.append(f"bits16 error does not name the dtype: {err}")
        if "float32" not in str(err):
            failures.append(f"bits16 error does not list accepted dtypes: {err}")
    # The group still works after the rejected call.
    x = torch.ones(1)
    dist.all_reduce(x)
    _compare(failures, "allreduce after a rejected call", x, torch.tensor([float(world)]))
    return failures


def _check_split_and_timeout(rank, world, gloo):
    import time
    from datetime import timedelta

    failures = []
    # ProcessGroup.split_group: collective over the parent; non-members get None.
    members = [0, world - 1]
    sub = dist.group.WORLD.split_group(members, timeout=timedelta(seconds=60))
    if (sub is None) == (rank in members):
        failures.append(f"rank {rank}: split_group returned {sub!r}")
    if sub is not None:
        if (sub.rank(), sub.size()) != (members.index(rank), len(members)):
            failures.append(f"split group rank/size {sub.rank()}/{sub.size()}")
        x = torch.tensor([float(rank + 1)])
        sub.allreduce([x]).wait()
        _compare(failures, "split group allreduce", x, torch.tensor([float(world + 1)]))
    # The parent keeps working.
    y = torch.ones(2)
    dist.all_reduce(y)
    _compare(failures, "parent after split", y, torch.full((2,), float(world)))
    # set_timeout applies to later operations: rank 0 waits alone and gives up
    # after 1 s, not the 60 s the group was created with.
    if sub is not None:
        sub.set_timeout(timedelta(seconds=1))
        if rank == 0:
            start = time.monotonic()
            try:
                sub.allreduce([torch.ones(1)]).wait()
                failures.append("allreduce without the peer did not time out")
            except RuntimeError as err:
                took = time.monotonic() - start
                if not 0.9 < took < 5:
                    failures.append(f"1 s timeout fired after {took:.1f} s")
                if "timed out" not in str(err):
                    failures.append(f"timeout error does not say so: {err}")
        else:
            time.sleep(3)
    dist.barrier(group=gloo)
    return failures


@pytest.mark.parametrize("world", [3])
def test_split_group_and_set_timeout(world):
    run_ranks(_check_split_and_timeout, world)


def _check_barrier_timeout(rank, world, gloo):
    import time
    from datetime import timedelta

    failures = []
    if rank == 0:
        # dist.barrier(timeout=...) gives up after its own timeout, as gloo's
        # does, not at the group's (TEST default: minutes).
        start = time.monotonic()
        try:
            dist.barrier(timeout=timedelta(seconds=1))
            failures.append("a barrier without the peer did not time out")
        except RuntimeError as err:
            took = time.monotonic() - start
            if not 0.9 < took < 2.5:
                failures.append(f"the barrier's 1 s timeout fired after {took:.1f} s")
            if "1.000 s" not in str(err):
                failures.append(f"the timeout error does not give the timeout: {err}")
    else:
        time.sleep(3)
        # The barrier's timeout failed it and aborted the group, as the group's own would.
        try:
            dist.barrier()
            failures.append("rank 1's barrier succeeded on a group aborted by a timeout")
        except RuntimeError as err:
            if "timed out" not in str(err):
                failures.append(f"rank 1's barrier error does not say why: {err}")
    dist.barrier(group=gloo)
    return failures


def _check_monitored_barrier(rank, world, gloo):
    """smddp.monitored_barrier names the ranks that did not arrive, as gloo's
    does (same message, checked against gloo's in the same run), and leaves
    the group usable."""
    import time

    import smddp

    failures = []
    late = list(range(1, world))  # every rank but 0 is late once
    errors = {}
    mon = dist.new_group(backend="gloo")  # a failed monitored_barrier breaks a gloo group
    for name, call in (("gloo", lambda: dist.monitored_barrier(mon, timedelta(seconds=1),
                                                               wait_all_ranks=True)),
                       ("smddp", lambda: smddp.monitored_barrier(None, timedelta(seconds=1),
                                                                 wait_all_ranks=True))):
        if rank in late:
            time.sleep(2)
        try:
            call()
            if rank == 0:
                failures.append(f"{name}: monitored_barrier with late ranks passed")
        except RuntimeError as err:
            errors[name] = str(err)
        dist.barrier(group=gloo)
    if rank == 0:
        want = "Ranks " + ", ".join(str(r) for r in late)
        for name in ("gloo", "smddp"):
            if f"{want} failed to pass monitoredBarrier in 1000 ms" not in errors.get(name, ""):
                failures.append(f"{name}'s rank 0 error: {errors.get(name)}")
    elif "failed to pass monitoredBarrier" not in errors.get("smddp", ""):
        failures.append(f"rank {rank} was not told rank 0's verdict: {errors.get('smddp')}")
    # Without wait_all_ranks: the first late rank only.
    if rank == world - 1:
        time.sleep(2)
    try:
        smddp.monitored_barrier(timeout=timedelta(seconds=1))
        if rank == 0:
            failures.append("monitored_barrier with a late rank passed")
    except RuntimeError as err:
        if rank == 0 and f"[Rank 0]: Rank {world - 1} failed to pass monitoredBarrier" not in str(err):
            failures.append(f"without wait_all_ranks: {err}")
    dist.barrier(group=gloo)
    smddp.monitored_barrier()  # everyone on time: passes
    t = torch.ones(2)
    dist.all_reduce(t)
    _compare(failures, "allreduce after a failed monitored_barrier", t, torch.full((2,), float(world)))
    try:
        smddp.monitored_barrier(timeout=timedelta(seconds=0))
        failures.append("a zero timeout was accepted")
    except ValueError as err:
        if "positive" not in str(err):
            failures.append(f"zero timeout: {err}")
    return failures


@pytest.mark.parametrize("world", [2, 3])
def test_monitored_barrier_names_late_ranks(world):
    run_ranks(_check_monitored_barrier, world)


def _fails_in_time(failures, what, call, lo, hi):
    """Runs call(), which must raise DistBackendError after lo to hi seconds;
    returns the error, or None (noted in failures) where it returned."""
    start = time.monotonic()
    try:
        call()
    except dist.DistBackendError as err:
        took = time.monotonic() - start
        if not lo < took < hi:
            failures.append(f"{what}: raised after {took:.1f} s, not within {lo}-{hi} s")
        return err
    failures.append(f"{what} returned without its peers")
    return None


def _check_op_timeouts(rank, world, gloo):
    """Each collective called with options that set a timeout fails after that
    timeout (1 s), not the group's (60 s), naming it, when a peer never
    comes; each on a group of its own, as the timeout aborts the group."""
    import time

    failures = []
    n = world
    cases = {
        "allreduce": lambda pg, o: pg.allreduce([torch.ones(4)], o),
        # async_op=False: libsmddp's blocking call, under the options' timeout;
        # it fails in the call, and returns no Work when it succeeds
        "allreduce_blocking": lambda pg, o: pg.allreduce([torch.ones(4)], o),
        "broadcast": lambda pg, o: pg.broadcast([torch.ones(4)], o),
        "allgather": lambda pg, o: pg.allgather([[torch.empty(4) for _ in range(n)]],
                                                [torch.ones(4)], o),
        "reduce_scatter": lambda pg, o: pg.reduce_scatter([torch.empty(4)],
                                                          [[torch.ones(4) for _ in range(n)]], o),
        "alltoall_base": lambda pg, o: pg.alltoall_base(torch.empty(4 * n), torch.ones(4 * n),
                                                        [], [], o),
        "barrier": lambda pg, o: pg.barrier(o),
    }
    import torch._C._distributed_c10d as c10d

    def blocking_allreduce_options():
        o = c10d.AllreduceOptions()
        if hasattr(o, "asyncOp"):
            o.asyncOp = False
        return o

    options = {
        "allreduce": c10d.AllreduceOptions, "allreduce_blocking": blocking_allreduce_options,
        "broadcast": c10d.BroadcastOptions,
        "allgather": c10d.AllgatherOptions, "reduce_scatter": c10d.ReduceScatterOptions,
        "alltoall_base": c10d.AllToAllOptions, "barrier": c10d.BarrierOptions,
    }
    for name, call in cases.items():
        pg = dist.new_group(backend="smddp", timeout=timedelta(seconds=60))
        if rank != 0:
            continue  # never joins: rank 0's operation must give up after its own timeout
        opts = options[name]()
        opts.timeout = timedelta(seconds=1)
        start = time.monotonic()
        work = None
        try:
            work = call(pg, opts)
            if work is None:
                failures.append(f"{name} without its peers returned no Work and no error")
                continue
            work.wait()
            failures.append(f"{name} without its peers completed")
        except RuntimeError as err:
            took = time.monotonic() - start
            if name == "allreduce_blocking" and hasattr(opts, "asyncOp") and work is not None:
                failures.append(f"{name}: the blocking call returned a Work, and wait() failed")
            if work is None:
                if name != "allreduce_blocking":
                    failures.append(f"{name}: the call itself failed, not its wait(): {err}")
            elif not work.is_completed() or work.is_success() or work.exception() is None:
                failures.append(f"{name}: failed work: is_completed {work.is_completed()}, "
                                f"is_success {work.is_success()}, exception {work.exception()}")
            if not 0.9 < took < 3:
                failures.append(f"{name}: its 1 s timeout fired after {took:.1f} s")
            if "timed out after 1.000 s" not in str(err):
                failures.append(f"{name}: the error does not give its timeout: {err}")
            if f"on group {pg.group_name}" not in str(err):
                failures.append(f"{name}: the error does not name the group "
                                f"{pg.group_name}: {err}")
            if work is None:
                continue
            # A Future first asked for after the failure carries it.
            fut = work.get_future()
            try:
                fut.wait()
                failures.append(f"{name}: the Future of the failed work has a value")
            except RuntimeError as ferr:
                if "timed out after 1.000 s" not in str(ferr):
                    failures.append(f"{name}: the Future's error is not the work's: {ferr}")
    # A blocking dist.all_reduce (run by libsmddp's blocking call, without a
    # request) fails at the group's timeout with the same error.
    dist.barrier(group=gloo)  # rank 0 comes from its timeouts above
    pg = dist.new_group(backend="smddp", timeout=timedelta(seconds=1))
    if rank == 0:
        err = _fails_in_time(failures, "a blocking all_reduce (1 s timeout)",
                             lambda: dist.all_reduce(torch.ones(4), group=pg), 0.9, 3)
        if err and ("timed out after 1.000 s" not in str(err) or pg.group_name not in str(err)):
            failures.append(f"blocking all_reduce: the error does not give its timeout "
                            f"and group: {err}")
        try:
            dist.all_reduce(torch.ones(4), group=pg)
            failures.append("a blocking all_reduce on the failed group completed")
        except dist.DistBackendError:
            pass
    dist.barrier(group=gloo)
    return failures


def _check_abort_hook(rank, world, gloo):
    """torch's abort hooks run once, before a group's first failure is
    reported, on the rank that fails."""
    import time

    failures = []
    pg = dist.new_group(backend="smddp", timeout=timedelta(seconds=60))
    calls = []
    pg.register_abort_hook(1, lambda: calls.append(time.monotonic()))
    pg.register_abort_hook(2, lambda: calls.append("second"))
    pg.register_abort_hook(3, lambda: calls.append("unregistered"))
    pg.unregister_abort_hook(3)
    if rank == 0:
        t = torch.ones(2)
        dist.all_reduce(t, group=pg)  # healthy: no hook
        if calls:
            failures.append(f"abort hooks ran on a healthy group: {calls}")
        opts = dist.distributed_c10d.AllreduceOptions()
        opts.timeout = timedelta(seconds=1)
        work = pg.allreduce([t], opts)
        try:
            work.wait()
            failures.append("the allreduce without its peer completed")
        except RuntimeError:
            if len(calls) != 2:
                failures.append(f"abort hooks ran {len(calls)} times before the error, not 2")
        try:
            dist.all_reduce(t, group=pg)
        except RuntimeError:
            pass
        if len(calls) != 2:
            failures.append(f"abort hooks ran again on a later failure: {calls}")
    else:
        dist.all_reduce(torch.ones(2), group=pg)
        time.sleep(3)  # never joins rank 0's second allreduce
    dist.barrier(group=gloo)
    return failures


@pytest.mark.skipif(not hasattr(dist.ProcessGroup, "register_abort_hook"),
                    reason="this torch's process groups take no abort hooks (torch 2.14 has them)")
def test_abort_hooks_run_before_the_first_failure():
    run_ranks(_check_abort_hook, 2)


def _check_pre_post_hooks(rank, world, gloo):
    """torch's pre/post collective hooks (its flight recorder's and NaN
    check's way in) see every smddp collective, with its work."""
    failures = []
    pg = dist.group.WORLD
    seen = []
    pg.register_pre_hook(1, lambda a: seen.append(("pre", a.name.name, a.op_id)))
    pg.register_post_hook(1, lambda a: seen.append(("post", a.name.name, a.op_id,
                                                    a.work is not None)))
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    dist.all_reduce(t, async_op=True).wait()
    pg.unregister_pre_hook(1)
    pg.unregister_post_hook(1)
    dist.all_reduce(t)
    want = []
    for i, name in enumerate(["ALLREDUCE", "BROADCAST", "ALLREDUCE"]):
        want += [("pre", name, i), ("post", name, i, True)]
    if [x[:2] for x in seen] != [x[:2] for x in want] or any(
            x[0] == "post" and not x[3] for x in seen):
        failures.append(f"hooks saw {seen}")
    return failures


@pytest.mark.skipif(not hasattr(dist.ProcessGroup, "register_pre_hook"),
                    reason="this torch's process groups take no pre/post hooks (torch 2.14 has them)")
def test_pre_and_post_collective_hooks():
    run_ranks(_check_pre_post_hooks, 2)


def _check_gather_single(rank, world, gloo):
    """torch 2.14's gather into one buffer, on the root; every dtype's bytes
    land in rank order."""
    failures = []
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        for root in (0, world - 1):
            x = _data(dtype, rank, n=5)
            out = torch.full((5 * world,), -1).to(dtype) if rank == root else None
            dist.gather_single(x, out, dst=root)  # (tensor, gather_tensor), as torch names them
            if rank == root:
                want = torch.cat([_data(dtype, r, n=5) for r in range(world)])
                _compare(failures, f"gather_single {dtype} to {root}", out, want)
    return failures


@pytest.mark.skipif(not hasattr(dist, "gather_single"),
                    reason="this torch has no gather_single (torch 2.14 has it)")
def test_gather_single():
    run_ranks(_check_gather_single, 3)


def _check_canonical_single(rank, world, gloo):
    """torch 2.14's canonical all_gather_single and reduce_scatter_single (and
    all_to_all_single) on smddp, against gloo's results."""
    failures = []
    for dtype in (torch.float32, torch.int64, torch.bfloat16):
        x = _data(dtype, rank, n=6 * world)
        for name, call, shape in (
                ("all_gather_single", lambda out, g: dist.all_gather_single(out, x[:6], group=g),
                 (6 * world,)),
                ("reduce_scatter_single",
                 lambda out, g: dist.reduce_scatter_single(out, x, group=g), (6,)),
                ("all_to_all_single", lambda out, g: dist.all_to_all_single(out, x, group=g),
                 (6 * world,))):
            got, want = torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)
            call(got, None)
            call(want, gloo)
            _compare(failures, f"{name} {dtype}", got, want)
    return failures


@pytest.mark.skipif(not hasattr(dist, "all_gather_single"),
                    reason="this torch has no all_gather_single (torch 2.14 has it)")
def test_canonical_single_names():
    run_ranks(_check_canonical_single, 3)


def test_each_collective_honours_its_timeout():
    run_ranks(_check_op_timeouts, 2)


def _check_dump_trace(rank, world, gloo):
    import json

    import smddp

    failures = []
    t = torch.ones(5)
    for _ in range(4):
        dist.all_reduce(t)
    dist.broadcast(t, src=1)
    folder = os.environ["SMDDP_TRACE_DIR"]  # set by the test before smddp loaded
    path = smddp.dump_trace()
    if not os.path.basename(path).startswith("smddp-trace-unit_test-smddp_") or \
            not path.endswith(f"-r{rank}.json") or os.path.dirname(path) != folder:
        failures.append(f"default path {path}")
    with open(path) as f:
        trace = json.load(f)
    kinds = [op["kind"] for op in trace["ops"]]
    if kinds[-5:] != ["allreduce"] * 4 + ["broadcast"]:
        failures.append(f"last ops recorded: {kinds[-5:]}")
    last = trace["ops"][-1]
    if (last["root"], last["count"], last["dtype"], last["state"], last["path"]) != \
            (1, 5, "float32", "done", "shm"):
        failures.append(f"the broadcast's entry: {last}")
    if trace["rank"] != rank or trace["size"] != world:
        failures.append(f"header: rank {trace['rank']} size {trace['size']}")
    arrivals = trace.get("arrivals", {})
    if arrivals.get("ops", 0) < 5 or len(arrivals.get("late_ns", [])) != world or \
            any(ns is None or ns < 0 for ns in arrivals["late_ns"]):
        failures.append(f"arrival telemetry in the dump: {arrivals}")
    try:
        smddp.dump_trace(gloo, os.path.join(folder, "gloo.json"))
        failures.append("dump_trace on a gloo group did not raise")
    except RuntimeError as err:
        if "not smddp" not in str(err):
            failures.append(f"dump_trace on gloo: {err}")
    return failures


def test_dump_trace(tmp_path):
    run_ranks(_check_dump_trace, 2,
              env={"SMDDP_TRACE_DIR": str(tmp_path), "SMDDP_JOB_ID": "unit test"})


def _check_stats(rank, world, gloo):
    import time

    import smddp

    failures = []
    t = torch.ones(16)
    dist.barrier()
    before = smddp.stats()
    for _ in range(20):
        if rank == 1:
            time.sleep(0.03)
        dist.all_reduce(t)
    after = smddp.stats()
    late = [a - b for a, b in zip(after["late_s"], before["late_s"])]
    if after["ops"] - before["ops"] != 20:
        failures.append(f"ops went from {before['ops']} to {after['ops']}, not by 20")
    if after["slowest_rank"] != 1:
        failures.append(f"slowest rank {after['slowest_rank']}, not 1: {after}")
    if not 0.48 <= late[1] <= 0.72:
        failures.append(f"rank 1 slept 0.6 s in all; its lateness grew by {late[1]:.3f} s")
    if any(late[r] > 0.06 for r in range(world) if r != 1):
        failures.append(f"ranks other than 1 late by {late}")
    if not 25_000 <= after["skew_us"]["p50"] <= 100_000 or \
            not after["skew_us"]["p50"] <= after["skew_us"]["p99"] <= after["skew_us"]["max"]:
        failures.append(f"skews (us) {after['skew_us']}")
    if after["clock_error_us"] != 0 or after["ranks_covered"] != world:
        failures.append(f"one node: clock error {after['clock_error_us']}, "
                        f"covered {after['ranks_covered']}")
    try:
        smddp.stats(gloo)
        failures.append("stats on a gloo group did not raise")
    except RuntimeError as err:
        if "not smddp" not in str(err):
            failures.append(f"stats on gloo: {err}")
    return failures


def test_stats_names_straggler():
    run_ranks(_check_stats, 3)


def _check_completion_hook(rank, world, gloo):
    import threading

    failures = []
    got, lock = [], threading.Lock()

    def hook(info):
        with lock:
            got.append((info.op_type, info.seq, info.time_started, info.time_finished,
                        info.active_duration))

    pg = dist.new_group(backend="smddp")
    if pg._has_hooks():
        failures.append("a new group says it has hooks")
    pg._register_on_completion_hook(hook)
    if not pg._has_hooks():
        failures.append("_has_hooks() is False after registering one")
    t = torch.ones(8)
    dist.all_reduce(t, group=pg)
    dist.broadcast(t, src=0, group=pg)
    dist.all_reduce(t, group=pg, async_op=True).wait()
    try:
        pg._register_on_completion_hook(hook)
        failures.append("a second completion hook was accepted")
    except RuntimeError as err:
        if "already registered" not in str(err):
            failures.append(f"second hook: {err}")
    dist.destroy_process_group(pg)  # delivers what is queued before it returns
    kinds = [str(k).split(".")[-1] for k, *_ in got]
    if kinds != ["ALLREDUCE", "BROADCAST", "ALLREDUCE"]:
        failures.append(f"hook saw {kinds}")
    seqs = [s for _, s, *_ in got]
    if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
        failures.append(f"sequence numbers {seqs}")
    for _, _, start, end, active in got:
        if not end >= start or active.total_seconds() < 0:
            failures.append(f"times {start} {end} {active}")
            break
    return failures


@pytest.mark.skipif(not hasattr(dist.ProcessGroup, "_register_on_completion_hook"),
                    reason="this torch's process groups take no completion hook")
def test_completion_hook():
    run_ranks(_check_completion_hook, 2)


def _check_group_abort(rank, world, gloo):
    """A rank blocked in a collective whose peer never comes stops at once when
    another of its threads aborts the group (torch's _abort_process_group)."""
    import time

    from torch.distributed.distributed_c10d import _abort_process_group

    failures = []
    sub = dist.new_group(backend="smddp", timeout=timedelta(seconds=20))
    if rank == 1:
        time.sleep(3)  # never joins the allreduce below
        return failures
    work = dist.all_reduce(torch.ones(4), group=sub, async_op=True)
    _expect_aborted_at_once(work, lambda: _abort_process_group(sub), failures)
    return failures


def _expect_aborted_at_once(work, abort, failures):
    """Calls abort() from another thread after 0.5 s: work.wait() must raise at
    once, with an error that names the abort."""
    import threading
    import time

    threading.Timer(0.5, abort).start()
    start = time.monotonic()
    try:
        work.wait()
        failures.append("the aborted allreduce completed")
    except RuntimeError as err:
        took = time.monotonic() - start
        if took > 3:
            failures.append(f"the aborted allreduce raised after {took:.1f} s, not at once")
        if "abort" not in str(err):
            failures.append(f"the error does not say it was aborted: {err}")


def test_abort_process_group_stops_a_waiting_rank():
    run_ranks(_check_group_abort, 2)


def _check_work_abort(rank, world, gloo):
    """Work::abort() on a work whose peer never comes completes it at once with
    an error that says so; the peer's next collective fails naming the abort;
    aborting a completed work changes nothing."""
    import time

    import smddp

    failures = []
    sub = dist.new_group(backend="smddp", timeout=timedelta(seconds=20))
    x = torch.ones(4)
    done = dist.all_reduce(x, group=sub, async_op=True)
    done.wait()
    if (not done.is_success() or done.exception() is not None or len(done.result()) != 1
            or done.result()[0].data_ptr() != x.data_ptr()):
        failures.append(f"completed work: is_success {done.is_success()}, exception "
                        f"{done.exception()}, result {done.result()}")
    smddp.abort_work(done)  # completed: the group goes on
    t = torch.ones(4)
    dist.all_reduce(t, group=sub)
    if t.tolist() != [2.0] * 4:
        failures.append(f"after aborting a completed work, allreduce gave {t.tolist()}")
    if rank == 1:
        time.sleep(2)  # rank 0 aborts its allreduce meanwhile
        try:
            dist.all_reduce(torch.ones(4), group=sub)
            failures.append("rank 1's allreduce succeeded after rank 0 aborted the group")
        except RuntimeError as err:
            if "abort" not in str(err):
                failures.append(f"rank 1's error does not name the abort: {err}")
        return failures
    work = dist.all_reduce(torch.ones(4), group=sub, async_op=True)
    _expect_aborted_at_once(work, lambda: smddp.abort_work(work), failures)
    if not work.is_completed() or work.is_success():
        failures.append(f"aborted work: is_completed {work.is_completed()}, "
                        f"is_success {work.is_success()}")
    smddp.abort_work(work)  # twice: nothing more happens
    return failures


def test_work_abort():
    run_ranks(_check_work_abort, 2)


def _check_destroy_during_calls(rank, world, gloo):
    """destroy_process_group while another thread is issuing collectives on
    the group, blocking (smddp.all_reduce) and async: the destroy waits for
    the call under way, later calls raise that the group is shut down (or,
    on the rank whose peer went first, that the peer left), and nothing
    crashes or hangs."""
    import threading

    import smddp

    failures = []
    sub = dist.new_group(backend="smddp", timeout=timedelta(seconds=10))
    ended = {}

    def calls():
        x = torch.ones(1 << 12)
        n = 0
        try:
            while True:
                smddp.all_reduce(x, group=sub)
                dist.all_reduce(x, group=sub, async_op=True).wait()
                n += 1
        except (RuntimeError, ValueError) as err:
            # torch 2.14's logging wrapper, describing the failed call, raises
            # ValueError (the group is gone); smddp's error is its context.
            ended["error"] = f"{err} / {err.__context__}"
        ended["calls"] = n

    t = threading.Thread(target=calls)
    t.start()
    time.sleep(0.5)
    start = time.monotonic()
    dist.destroy_process_group(sub)
    took = time.monotonic() - start
    t.join(timeout=20)
    if t.is_alive():
        return ["the calling thread still runs 20 s after destroy_process_group"]
    if took > 12:
        failures.append(f"destroy_process_group took {took:.1f} s")
    err = ended.get("error", "")
    if not any(w in err for w in ("shut down", "destroyed its communicator", "abort", "died")):
        failures.append(f"the calling thread ended with {err!r} after {ended.get('calls')} rounds")
    if not ended.get("calls"):
        failures.append("no round completed before the destroy")
    return failures


def test_destroy_while_another_thread_calls():
    run_ranks(_check_destroy_during_calls, 2)


def _check_destroy_from_callback(rank, world, gloo):
    """destroy_process_group from a Future callback of one of the group's own
    works: run by wait() on the calling thread (which is inside the group's
    call), and by libsmddp's thread. Neither hangs; afterwards the group
    refuses new calls, saying it is shut down, and the default group still
    works."""
    failures = []
    for how in ("inside wait", "on libsmddp's thread"):
        sub = dist.new_group(backend="smddp", timeout=timedelta(seconds=20))
        t = torch.ones(1000)
        seen = []

        def destroy(fut, sub=sub, seen=seen):
            try:
                dist.destroy_process_group(sub)
                seen.append("destroyed")
            except Exception as err:  # noqa: BLE001  (reported as a failure below)
                seen.append(f"{type(err).__name__}: {err}")

        work = dist.all_reduce(t, group=sub, async_op=True)
        chained = work.get_future().then(destroy)
        start = time.monotonic()
        if how == "inside wait":
            work.wait()
        else:
            time.sleep(0.5)
        chained.wait()
        if seen != ["destroyed"]:
            failures.append(f"{how}: the callback saw {seen}")
        if time.monotonic() - start > 10:
            failures.append(f"{how}: took {time.monotonic() - start:.1f} s")
        if t[0].item() != world:
            failures.append(f"{how}: the allreduce gave {t[0].item()}, expected {world}")
        backend = sub._get_backend(torch.device("cpu"))
        try:
            backend.allreduce([t]).wait()
            failures.append(f"{how}: the destroyed group still took an allreduce")
        except RuntimeError as err:
            if "shut down" not in str(err):
                failures.append(f"{how}: refused with {err}")
        dist.barrier(group=gloo)
    x = torch.ones(3)
    dist.all_reduce(x)
    if x[0].item() != world:
        failures.append(f"the default group gave {x[0].item()} afterwards")
    return failures


def test_destroy_from_a_works_callback():
    run_ranks(_check_destroy_from_callback, 2)


def _check_profiler_events(rank, world, gloo):
    from torch.profiler import ProfilerActivity, profile

    t = torch.ones(8)
    out = torch.empty(8 * world)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        dist.all_reduce(t)
        dist.all_gather_into_tensor(out, t)
        dist.reduce_scatter_tensor(t, out)
        dist.broadcast(t, src=0)
        dist.barrier()
    names = {e.name for e in prof.events()}
    want = {"smddp:all_reduce", "smddp:_allgather_base", "smddp:_reduce_scatter_base",
            "smddp:broadcast", "smddp:barrier"}
    return [f"profiler events lack {sorted(want - names)}; smddp ones: "
            f"{sorted(n for n in names if 'smddp' in n)}"] if want - names else []


def _check_collectives_timing(rank, world, gloo):
    import time

    failures = []
    t = torch.ones(8)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    try:
        work._get_duration()
        failures.append("_get_duration() without timing enabled did not raise")
    except RuntimeError as err:
        if "enableCollectivesTiming" not in str(err):
            failures.append(f"_get_duration() without timing: {err}")
    dist.group.WORLD._enable_collectives_timing()
    if rank == 1:
        time.sleep(0.2)  # rank 0's allreduce waits for this rank
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    ms = work._get_duration()
    if rank == 0 and not 150 <= ms <= 5000:
        failures.append(f"rank 0 waited about 200 ms for rank 1; getDuration says {ms} ms")
    if rank == 1 and not 0 <= ms < 150:
        failures.append(f"rank 1 arrived last; getDuration says {ms} ms")
    return failures


def test_collectives_timing():
    run_ranks(_check_collectives_timing, 2)


def test_profiler_shows_smddp_ops():
    run_ranks(_check_profiler_events, 2)


def test_barrier_timeout_is_honoured():
    run_ranks(_check_barrier_timeout, 2)


def _check_mismatch_raises(rank, world, gloo):
    import time

    failures = []
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(3 + rank))
        failures.append("allreduce with different counts on different ranks did not raise")
    except RuntimeError as err:
        if "mismatch" not in str(err):
            failures.append(f"mismatch error does not say so: {err}")
    if time.monotonic() - start > 10:
        failures.append("the mismatch took more than 10 s to surface")
    return failures


def test_mismatched_counts_raise_with_check_order():
    # Every collective compares (seq, op, count, dtype, root) at its first
    # wait; SMDDP_CHECK_ORDER=1 adds a barrier so that every rank compares
    # every other before any data moves. Either way both ranks raise.
    run_ranks(_check_mismatch_raises, 2, env={"SMDDP_CHECK_ORDER": "1"})


def _check_direct_calls(rank, world, gloo):
    """smddp.all_reduce and smddp.all_gather_into_tensor (no Work) give torch's results."""
    import warnings

    import smddp

    failures = []
    for dtype in FLOATS + INTS:
        for op in _ops_for(dtype):
            factor = 0.5 if op == "premul_sum" else None
            x = _data(dtype, rank, salt=len(op) + 7)
            want = _reduce_local(_gather_gloo(x, world, gloo), op, world, factor)
            got = x.clone()
            smddp.all_reduce(got, _reduce_op(op, factor))
            _compare(failures, f"smddp.all_reduce {dtype} {op}", got, want,
                     exact=op not in ("avg", "premul_sum"))
    # Default op (SUM) and group; sizes 0, 1 and odd; against gloo's own allreduce.
    for n in (0, 1, 4099):
        x = _data(torch.float32, rank, n=n, salt=3)
        ref = x.clone()
        dist.all_reduce(ref, group=gloo)
        smddp.all_reduce(x)
        _compare(failures, f"smddp.all_reduce n={n} vs gloo", x, ref)
    # A strided view takes the Work path: reduced in place, the rest untouched.
    base = _data(torch.float32, rank, n=64, salt=4).reshape(8, 8)
    view = base[:, ::2]
    want = _reduce_local(_gather_gloo(view.contiguous(), world, gloo), "sum", world)
    untouched = base[:, 1::2].clone()
    smddp.all_reduce(view, group=dist.group.WORLD)
    _compare(failures, "smddp.all_reduce non-contiguous", view.contiguous(), want)
    _compare(failures, "smddp.all_reduce non-contiguous: other columns", base[:, 1::2], untouched)
    # Between asynchronous works of the same group: issue order holds.
    a, b, c = (_data(torch.float32, rank, n=1000, salt=s) for s in (11, 12, 13))
    wants = [_reduce_local(_gather_gloo(t, world, gloo), "sum", world) for t in (a, b, c)]
    wa = dist.all_reduce(a, async_op=True)
    smddp.all_reduce(b)
    wc = dist.all_reduce(c, async_op=True)
    wa.wait()
    wc.wait()
    for name, t, w in (("first async", a, wants[0]), ("direct", b, wants[1]),
                       ("second async", c, wants[2])):
        _compare(failures, f"smddp.all_reduce between works: {name}", t, w)
    # all_gather_into_tensor, against gloo's.
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.uint8):
        for n in (0, 1, 37):
            x = _data(dtype, rank, n=n, salt=5)
            ref = torch.empty(world * n, dtype=dtype)
            dist.all_gather_into_tensor(ref, x, group=gloo)
            got = torch.full((world * n,), 7, dtype=dtype)
            smddp.all_gather_into_tensor(got, x)
            _compare(failures, f"smddp.all_gather_into_tensor {dtype} n={n} vs gloo", got, ref)
    try:
        smddp.all_gather_into_tensor(torch.empty(world * 4 + 1), torch.ones(4))
        failures.append("all_gather_into_tensor with a wrong output size did not raise")
    except RuntimeError as err:
        if "expected world size" not in str(err):
            failures.append(f"wrong output size: the error does not say what is expected: {err}")
    try:
        smddp.all_reduce(torch.ones(2), group=gloo)
        failures.append("smddp.all_reduce on a gloo group did not raise")
    except RuntimeError as err:
        if "not smddp" not in str(err):
            failures.append(f"gloo group: the error does not say why: {err}")
    # A subgroup, and a rank outside it (torch's no-op, with a warning).
    sub = dist.new_group(ranks=[0, 1], backend="smddp")
    x = torch.full((5,), float(rank + 1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        smddp.all_reduce(x, group=sub)
    if rank < 2:
        _compare(failures, "smddp.all_reduce on a subgroup", x, torch.full((5,), 3.0))
    else:
        _compare(failures, "smddp.all_reduce outside the subgroup", x, torch.full((5,), 3.0))
        if not any("not a member" in str(w.message) for w in caught):
            failures.append("smddp.all_reduce outside the group did not warn")
    return failures


def _check_debug_detail(rank, world, gloo):
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL torch wraps smddp in its
    ProcessGroupWrapper: smddp's own calls find the backend inside it, and
    the wrapper's checks catch a mismatch before smddp runs it."""
    import smddp

    failures = []
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    if type(backend).__name__ != "_ProcessGroupWrapper":
        failures.append(f"DETAIL did not wrap the backend: {type(backend).__name__}")
    failures += _check_direct_calls(rank, world, gloo)
    x = torch.ones(1000)
    if not smddp.move_to_pool(x) or not torch.equal(x, torch.ones(1000)):
        failures.append("move_to_pool through the wrapper did not move the tensor")
    if smddp.peer_states() != ["alive"] * world:
        failures.append(f"peer_states through the wrapper: {smddp.peer_states()}")
    if smddp.stats()["ops"] <= 0:
        failures.append(f"stats through the wrapper counted no ops: {smddp.stats()}")
    if not os.path.exists(smddp.dump_trace()):
        failures.append("dump_trace through the wrapper wrote no file")
    try:
        dist.all_reduce(torch.ones(3 + rank))
        failures.append("allreduce with different counts on different ranks did not raise")
    except RuntimeError as err:
        if "Detected mismatch between collectives" not in str(err):
            failures.append(f"the wrapper did not report the mismatch: {err}")
    return failures


def test_debug_detail_wraps_smddp(tmp_path):
    run_ranks(_check_debug_detail, 2,
              env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL", "SMDDP_TRACE_DIR": str(tmp_path)})


NEW_INTS = [torch.int16, torch.uint16, torch.uint32, torch.uint64]
FP8 = [t for t in (getattr(torch, "float8_e4m3fn", None), getattr(torch, "float8_e5m2", None)) if t]
COMPLEX = [torch.complex64, torch.complex128]


def _mine(dtype, rank, n=11, salt=0):
    """Rank rank's input of dtype: small values every dtype holds exactly (every
    rank can make any rank's, so expected results need no communication)."""
    g = torch.Generator().manual_seed(1000 * salt + 17 * rank + n)
    lo = 0 if dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64) else -3
    if dtype in COMPLEX:
        re, im = (torch.randint(-3, 4, (n,), generator=g).double() for _ in range(2))
        return torch.complex(re, im).to(dtype)
    return torch.randint(lo, 4, (n,), generator=g).to(torch.float32 if dtype in FP8 else torch.int64).to(dtype)


def _everyone(dtype, world, n=11, salt=0):
    return [_mine(dtype, r, n, salt) for r in range(world)]


def _same(failures, what, got, want):
    if got.dtype != want.dtype or not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
        failures.append(f"{what}: got {got.tolist()[:6]}..., want {want.tolist()[:6]}...")


def _check_new_dtypes(rank, world, gloo):
    """int16, uint16, uint32, uint64, float8 and complex: every data movement, and
    the reductions torch defines on the CPU, against results every rank computes."""
    import smddp

    failures = []
    root = world - 1
    for dtype in NEW_INTS + FP8 + COMPLEX:
        mine, all_ = _mine(dtype, rank), _everyone(dtype, world)
        # Data movement, through torch.distributed and through the group's
        # methods (which reach the backend with the dtype unchanged).
        got = torch.empty(world * 11, dtype=dtype)
        dist.all_gather_into_tensor(got, mine)
        _same(failures, f"all_gather_into_tensor {dtype}", got, torch.cat(all_))
        outs = [torch.empty(11, dtype=dtype) for _ in range(world)]
        dist.all_gather(outs, mine)
        for r in range(world):
            _same(failures, f"all_gather {dtype} [{r}]", outs[r], all_[r])
        got = torch.empty(world * 11, dtype=dtype)
        dist.group.WORLD._allgather_base(got, mine).wait()
        _same(failures, f"_allgather_base {dtype}", got, torch.cat(all_))
        got = mine.clone()
        dist.broadcast(got, src=root)
        _same(failures, f"broadcast {dtype}", got, all_[root])
        got = mine.clone()
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        dist.group.WORLD.broadcast([got], opts).wait()
        _same(failures, f"ProcessGroup.broadcast {dtype}", got, all_[root])
        rows = [_mine(dtype, rank, n=3 * world, salt=5) for _ in range(1)][0]
        got = torch.empty(3 * world, dtype=dtype)
        dist.all_to_all_single(got, rows)
        want = torch.cat([_mine(dtype, r, n=3 * world, salt=5)[3 * rank:3 * rank + 3]
                          for r in range(world)])
        _same(failures, f"all_to_all_single {dtype}", got, want)
        got = torch.empty(11, dtype=dtype)
        dist.scatter(got, list(torch.stack(all_)) if rank == root else None, src=root)
        _same(failures, f"scatter {dtype}", got, all_[rank])
        outs = [torch.empty(11, dtype=dtype) for _ in range(world)] if rank == root else None
        dist.gather(mine, outs, dst=root)
        if rank == root:
            for r in range(world):
                _same(failures, f"gather {dtype} [{r}]", outs[r], all_[r])
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        got = torch.empty(11, dtype=dtype)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, nxt),
                                       dist.P2POp(dist.irecv, got, prv)])
        for r in reqs:
            r.wait()
        _same(failures, f"isend/irecv {dtype}", got, all_[prv])
        # Reductions.
        stack = torch.stack(all_)
        if dtype in NEW_INTS:
            wide = stack.to(torch.int64)  # small values: no overflow
            wants = {"sum": wide.sum(0), "product": wide.prod(0), "min": wide.min(0).values,
                     "max": wide.max(0).values, "band": _reduce_local(wide, "band", world),
                     "bor": _reduce_local(wide, "bor", world),
                     "bxor": _reduce_local(wide, "bxor", world)}
            for op, want in wants.items():
                got = mine.clone()
                dist.all_reduce(got, op=_reduce_op(op))
                _same(failures, f"all_reduce {dtype} {op}", got, want.to(dtype))
            got = mine.clone()
            smddp.all_reduce(got, dist.ReduceOp.MAX)
            _same(failures, f"smddp.all_reduce {dtype} max", got, wants["max"].to(dtype))
            full = _mine(dtype, rank, n=2 * world, salt=9)
            want = torch.stack(_everyone(dtype, world, n=2 * world, salt=9)).to(torch.int64).sum(0)
            got = torch.empty(2, dtype=dtype)
            dist.reduce_scatter_tensor(got, full)
            _same(failures, f"reduce_scatter_tensor {dtype}", got, want[2 * rank:2 * rank + 2].to(dtype))
        elif dtype in COMPLEX:
            for op, want in (("sum", stack.sum(0)), ("avg", stack.sum(0) / world),
                             ("premul_sum", (stack * 0.5).sum(0))):
                rop = _reduce_op(op, 0.5 if op == "premul_sum" else None)
                for how in ("dist.all_reduce", "ProcessGroup.allreduce", "smddp.all_reduce"):
                    if how == "dist.all_reduce" and op == "premul_sum":
                        continue  # torch's Python refuses PREMUL_SUM on complex
                    got = mine.clone()
                    if how == "dist.all_reduce":
                        dist.all_reduce(got, op=rop)
                    elif how == "ProcessGroup.allreduce":
                        o = dist.AllreduceOptions()
                        o.reduceOp = rop
                        dist.group.WORLD.allreduce([got], o).wait()
                    else:
                        smddp.all_reduce(got, rop)
                    if op == "avg":  # the division rounds as the real parts' AVG does
                        if not torch.allclose(got, want.to(dtype), rtol=1e-6, atol=0):
                            failures.append(f"{how} {dtype} avg: got {got[:4]}, want {want[:4]}")
                    else:
                        _same(failures, f"{how} {dtype} {op}", got, want.to(dtype))
            for how in ("ProcessGroup.allreduce", "smddp.all_reduce"):
                try:
                    if how == "smddp.all_reduce":
                        smddp.all_reduce(mine.clone(), dist.ReduceOp.MAX)
                    else:
                        o = dist.AllreduceOptions()
                        o.reduceOp = dist.ReduceOp.MAX
                        dist.group.WORLD.allreduce([mine.clone()], o).wait()
                    failures.append(f"{how} MAX of {dtype} did not raise")
                except RuntimeError as err:
                    if "not defined on" not in str(err) or "SUM, AVG, PREMUL_SUM" not in str(err):
                        failures.append(f"{how} MAX of {dtype}: the error does not say why: {err}")
        else:  # float8: torch has no addition on the CPU; smddp refuses, saying why
            for how in ("dist.all_reduce", "smddp.all_reduce"):
                try:
                    (dist.all_reduce if how == "dist.all_reduce" else smddp.all_reduce)(mine.clone())
                    failures.append(f"{how} of {dtype} did not raise")
                except RuntimeError as err:
                    if "cannot be reduced" not in str(err) or "allgather" not in str(err):
                        failures.append(f"{how} of {dtype}: the error does not say why: {err}")
    # Mixed dtypes are refused before anything is issued, naming both, including
    # pairs that share a layout (complex64 against float32 (..., 2); two float8s).
    pg = dist.group.WORLD
    cases = [("allgather", lambda: pg._allgather_base(
        torch.empty(2 * world, dtype=torch.float32), torch.ones(1, dtype=torch.complex64)))]
    if len(FP8) == 2:
        cases.append(("allgather fp8", lambda: dist.all_gather_into_tensor(
            torch.empty(world, dtype=FP8[1]), torch.ones(1).to(FP8[0]))))
    cases.append(("reduce_scatter", lambda: pg._reduce_scatter_base(
        torch.empty(1, dtype=torch.complex64), torch.ones(2 * world), dist.ReduceScatterOptions())))
    cases.append(("reduce_scatter list MAX", lambda: dist.reduce_scatter(
        torch.empty(2), [torch.ones(1, dtype=torch.complex64)] * world, op=dist.ReduceOp.MAX)))
    # (torch's all_to_all_single passes complex tensors as their real views; the
    # group's method hands them over as they are.)
    cases.append(("alltoall_base 0-dim complex", lambda: pg.alltoall_base(
        torch.empty((), dtype=torch.complex64), torch.ones((), dtype=torch.complex64), [], [],
        dist.AllToAllOptions())))
    for what, call in cases:
        try:
            call()
            failures.append(f"{what}: mixed or unsplittable tensors did not raise")
        except (RuntimeError, ValueError) as err:
            if not any(w in str(err) for w in ("dtypes", "0-dim", "not defined on")):
                failures.append(f"{what}: the error does not say why: {err}")
    x = torch.ones(2)
    dist.all_reduce(x)  # the group still works after the refusals
    _same(failures, "allreduce after refusals", x, torch.full((2,), float(world)))
    # A conj() view is refused with what to do.
    try:
        smddp.all_reduce(_mine(torch.complex64, rank).conj())
        failures.append("a conj() view did not raise")
    except RuntimeError as err:
        if "resolve_conj" not in str(err):
            failures.append(f"conj() view: the error does not say what to do: {err}")
    return failures


def _check_list_forms(rank, world, gloo):
    """Every list-form collective with one tensor and several, an empty one
    among them: float32 against gloo's results, complex64 (which gloo's
    gather, scatter and reduce_scatter refuse) against every rank's inputs,
    which each rank can make. The same nesting, the same results."""
    failures = []
    root = world - 1
    for dtype in (torch.float32, torch.complex64):
        local = dtype.is_complex
        for sizes in ((3,), (0,), (2, 0, 5)):
            ins = [_mine(dtype, rank, n=n, salt=20 + i) for i, n in enumerate(sizes)]
            for i, x in enumerate(ins):
                tag = f"{dtype} sizes {sizes} [{i}]"
                of = [_mine(dtype, q, n=x.numel(), salt=20 + i) for q in range(world)]

                def ref(fn, *a, **k):
                    if not local:
                        fn(*a, group=gloo, **k)

                got = [torch.full_like(x, 9) for _ in range(world)]
                want = of if local else [torch.full_like(x, 9) for _ in range(world)]
                dist.all_gather(got, x)
                ref(dist.all_gather, want, x)
                for r in range(world):
                    _same(failures, f"all_gather {tag} [{r}]", got[r], want[r])
                got = [torch.full_like(x, 9) for _ in range(world)] if rank == root else None
                want = (of if local else [torch.full_like(x, 9) for _ in range(world)]) \
                    if rank == root else None
                dist.gather(x, got, dst=root)
                ref(dist.gather, x, want, dst=root)
                if rank == root:
                    for r in range(world):
                        _same(failures, f"gather {tag} [{r}]", got[r], want[r])
                parts = [x + r for r in range(world)] if rank == root else None
                got = torch.full_like(x, 9)
                want = of[root] + rank if local else torch.full_like(x, 9)
                dist.scatter(got, parts, src=root)
                ref(dist.scatter, want, parts, src=root)
                _same(failures, f"scatter {tag}", got, want)
                parts = [x * (r + 1) for r in range(world)]
                got = torch.full_like(x, 9)
                want = sum(o * (rank + 1) for o in of) if local else torch.full_like(x, 9)
                dist.reduce_scatter(got, parts)
                ref(dist.reduce_scatter, want, parts)
                _same(failures, f"reduce_scatter {tag}", got, want)
                parts = [x + r for r in range(world)]
                got = [torch.full_like(x, 9) for _ in range(world)]
                want = [o + rank for o in of] if local else [torch.full_like(x, 9) for _ in range(world)]
                dist.all_to_all(got, parts)
                ref(dist.all_to_all, want, parts)
                for r in range(world):
                    _same(failures, f"all_to_all {tag} [{r}]", got[r], want[r])
            # allreduce_coalesced on the group, as FSDP and DDP call it.
            got = [x.clone() for x in ins]
            dist.group.WORLD.allreduce_coalesced(got).wait()
            if local:
                want = [sum(_mine(dtype, q, n=x.numel(), salt=20 + i) for q in range(world))
                        for i, x in enumerate(ins)]
            else:
                want = [x.clone() for x in ins]
                gloo.allreduce_coalesced(want).wait()
            for i in range(len(ins)):
                _same(failures, f"allreduce_coalesced {dtype} sizes {sizes} [{i}]", got[i], want[i])
    return failures


def _check_direct_call_fails(rank, world, gloo):
    """A direct call whose peer never comes raises at the group's timeout, as wait() would."""
    import time

    import smddp

    failures = []
    sub = dist.new_group(backend="smddp", timeout=timedelta(seconds=2))
    if rank == 1:
        time.sleep(4)  # never joins
        return failures
    err = _fails_in_time(failures, "smddp.all_reduce (2 s timeout)",
                         lambda: smddp.all_reduce(torch.ones(4), group=sub), 1.5, 4)
    if err and ("ALLREDUCE" not in str(err) or "timed out" not in str(err)):
        failures.append(f"the error does not name the op and the timeout: {err}")
    return failures


def test_direct_call_fails_at_the_timeout():
    run_ranks(_check_direct_call_fails, 2)


# Each check against gloo's result: every op x dtype for allreduce; broadcast,
# reduce, gather, scatter; allgather and reduce_scatter; alltoall with even and
# uneven splits; send/recv and barrier.
COLLECTIVE_CHECKS = {
    "allreduce": _check_allreduce,
    "rooted": _check_rooted,
    "allgather_reduce_scatter": _check_gather_scatter_family,
    "alltoall": _check_alltoall,
    "send_recv_barrier": _check_p2p_and_barrier,
    "coalescing": _check_coalescing,
    "tags": _check_tags,
    "object_collectives": _check_object_collectives,
    "direct_calls": _check_direct_calls,
    "new_dtypes": _check_new_dtypes,
    "list_forms": _check_list_forms,
}


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("name", list(COLLECTIVE_CHECKS))
def test_collectives_against_gloo(name, world):
    run_ranks(COLLECTIVE_CHECKS[name], world)


@pytest.mark.parametrize("world", [3])
def test_new_group_beside_gloo_and_bad_dtype(world):
    run_ranks(_check_groups_and_errors, world)


# Each rank on its own fake host (SMDDP_HOSTNAME): the communicator spans
# nodes, and every collective goes through libfabric over loopback.
FAKE_NODES = {"SMDDP_HOSTNAME": "fake-node-{rank}", "FI_TCP_IFACE": "lo"}


@pytest.mark.parametrize("name", list(COLLECTIVE_CHECKS))
def test_collectives_across_fake_nodes(name):
    run_ranks(COLLECTIVE_CHECKS[name], 2, env=FAKE_NODES)


def test_tags_across_fake_nodes_3_ranks():
    """Receives from any rank matched by tag, each rank on its own fake node."""
    run_ranks(_check_tags, 3, env=FAKE_NODES)


def test_backend_name_and_registration():
    import smddp

    assert smddp.is_registered()
    assert "smddp" in dist.Backend.backend_list
    from smddp import _C

    assert _C.torch_version == torch.__version__


def test_single_rank_filestore():
    """A world of one through a FileStore: creation through torch's store."""
    with tempfile.TemporaryDirectory() as d:
        code = (
            "import torch, torch.distributed as dist, smddp\n"
            f"dist.init_process_group('smddp', init_method='file://{d}/store', rank=0, world_size=1)\n"
            "x = torch.arange(5.)\n"
            "dist.all_reduce(x)\n"
            "assert x.tolist() == [0., 1., 2., 3., 4.], x\n"
            "assert dist.get_backend() == 'smddp'\n"
            "dist.destroy_process_group()\n"
            "print('ok')\n"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=TEST_TIMEOUT_S)
        assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


def _entry_point_installed():
    return any(ep.name == "smddp" for ep in importlib.metadata.entry_points(group="torch.backends"))


@pytest.mark.skipif(not _entry_point_installed(),
                    reason="smddp is not pip-installed: no torch.backends entry point")
def test_import_torch_alone_registers_smddp():
    code = (
        "import sys, torch, torch.distributed as dist\n"
        "assert 'smddp' in dist.Backend.backend_list, dist.Backend.backend_list\n"
        "assert 'smddp' in sys.modules\n"
        "print('ok')\n"
    )
    env = dict(os.environ)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    out = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code],
                         capture_output=True, text=True, timeout=TEST_TIMEOUT_S, env=env,
                         cwd=tempfile.gettempdir())
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.skipif(not _entry_point_installed(),
                    reason="smddp is not pip-installed: no torch.backends entry point")
@pytest.mark.parametrize("crash,signal_number", [("ctypes.string_at(0)", 11),
                                                 ("os.abort()", 6)])
def test_import_torch_keeps_the_crash_exit_codes(crash, signal_number, tmp_path):
    """With smddp autoloaded, a crash is still the signal it was (libfabric's
    dependencies, loaded with it, install handlers that exit 1 instead)."""
    code = f"import ctypes, os, sys, torch\nassert 'smddp' in sys.modules\n{crash}\n"
    env = dict(os.environ)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=TEST_TIMEOUT_S, env=env, cwd=tmp_path)
    assert out.returncode == -signal_number, (out.returncode, out.stderr[-2000:])
    assert list(tmp_path.iterdir()) == [], "a crash handler left files behind"


def _libfabric_loaded(expected, rank, world, gloo):
    """Runs an allreduce, then checks whether libfabric is in this process."""
    del gloo
    t = torch.ones(8)
    dist.all_reduce(t)
    loaded = [ln.split()[-1] for ln in open("/proc/self/maps") if "libfabric" in ln]
    if t[0].item() != world:
        return [f"allreduce gave {t[0].item()}"]
    if bool(loaded) != expected:
        return [f"libfabric loaded: {loaded[0]}" if loaded else "libfabric is not loaded"]
    return []


def test_one_node_group_does_not_load_libfabric():
    run_ranks(functools.partial(_libfabric_loaded, False), 2)


def test_group_across_nodes_loads_libfabric():
    """The converse, so that the check above could fail: 2 fake nodes open it."""
    run_ranks(functools.partial(_libfabric_loaded, True), 2,
              env={"SMDDP_HOSTNAME": "node{rank}", "FI_TCP_IFACE": "lo"})


@pytest.mark.skipif(not _entry_point_installed(),
                    reason="smddp is not pip-installed: no torch.backends entry point")
def test_broken_smddp_package_does_not_break_import_torch(tmp_path):
    # A package that fails to import, found first on the path: `import torch`
    # still works, warns naming the error, and "smddp" is not registered.
    broken = tmp_path / "smddp"
    broken.mkdir()
    (broken / "__init__.py").write_text("def broken(:\n")
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import torch, torch.distributed as dist\n"
        "msgs = [str(w.message) for w in caught]\n"
        "assert any('SyntaxError' in m and 'smddp' in m for m in msgs), msgs\n"
        "assert 'smddp' not in dist.Backend.backend_list\n"
        "print('ok')\n"
    )
    env = dict(os.environ)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    env["PYTHONPATH"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=TEST_TIMEOUT_S, env=env, cwd=tempfile.gettempdir())
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


@pytest.mark.skipif(not _entry_point_installed(),
                    reason="smddp is not pip-installed: no torch.backends entry point")
def test_broken_smddp_package_under_warnings_as_errors(tmp_path):
    # `python -W error` turns the autoload's warning into an exception, which
    # torch would raise from `import torch`: the message goes to stderr instead.
    broken = tmp_path / "smddp"
    broken.mkdir()
    (broken / "__init__.py").write_text("def broken(:\n")
    code = "import torch\nprint('ok')\n"
    env = dict(os.environ)
    env.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
    env["PYTHONPATH"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                         text=True, timeout=TEST_TIMEOUT_S, env=env, cwd=tempfile.gettempdir())
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]
    assert "SyntaxError" in out.stderr and "smddp" in out.stderr, out.stderr[-3000:]
