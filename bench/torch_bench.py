#!/usr/bin/env python3
"""Benchmark the PyTorch backend "smddp" against gloo in one run.

    python3 bench/torch_bench.py [--world 2] [--min 8] [--max 64M] [--iters N]
                                 [--warmup W] [--time S] [--target-time S]
                                 [--latency-calls N] [--out DIR] [--ddp/--no-ddp]
                                 [--ddp-steps 40]

Spawns ``--world`` ranks on this machine (TCP rendezvous on 127.0.0.1, a free
port), each pinned to its own CPU (as mpirun does) with one torch thread. The
default group is smddp; a gloo group of the same ranks is created beside it, so
both backends are measured in the same processes, interleaved size by size.

For allreduce (fp32 sum), all_gather_single and reduce_scatter_single (or,
on a torch without them, all_gather_into_tensor and reduce_scatter_tensor) at
every size (``--min`` .. ``--max``, x4 steps anchored at ``--max``, plus
``--min``, 4 KiB and 16 MiB when in range) it reports the time per op (us; the
slowest rank's mean over the timed iterations, after a warmup and a barrier)
and algbw/busbw with nccl-tests' factors: allreduce 2(n-1)/n,
allgather/reduce_scatter (n-1)/n, where size is the whole gathered (resp.
scattered) buffer. Large sizes get fewer iterations (``--time`` seconds per
size and backend, at most ``--iters``); the allreduce size a bandwidth target
judges (64 MiB across nodes, else 16 MiB) gets ``--target-time`` seconds per
backend, in rounds that alternate the backends.

Before the sizes, every rank copies 16 MiB at once with Tensor.copy_: the
memory reference, measured in this run, printed with the 16 MiB allreduce as a
multiple of it (this machine's memory speed varies several-fold between hosts
of the same kind, and shared-memory collectives follow it; gloo over loopback
TCP follows it less).

Then the small-message latency: ``--latency-calls`` 8 B allreduces through
dist.all_reduce, each timed on its own, p50 and p90 (smddp, gloo, smddp with
async_op=True and an immediate wait(), smddp's process group called
directly, which leaves out torch's Python wrapper, its backend object, which
leaves out the dispatcher too, and smddp.all_reduce, which leaves out the
Work too), with torch's fake backend beside them: dist.all_reduce and the
process group on a group that communicates nothing, torch's own share of
every call.

Then pipeline parallelism's ring exchange (batch_isend_irecv to the next
rank and from the previous, then wait) at 8 B, 64 KiB, 1 MiB and 16 MiB,
smddp beside gloo.

Outputs: a markdown table on stdout with both backends and the ratio
(gloo time / smddp time), DIR/torch_bench.csv and DIR/torch_bench.png (busbw vs
size, log-log; needs matplotlib). Then DDP on a communication-heavy model
(~25M parameters: Linear(2048, 2048) layers, small batch) under smddp (as
a script gets it: its buckets in smddp's pools where torch has no CUDA or XPU)
and gloo from the same seed, steps alternating between them, a third DDP
over smddp with torch's buckets (DDP_DISABLE_COMM_MEM=1: staged), a fourth
whose comm hook communicates nothing (the floor set by compute, the
optimizer and DDP's own bucket copies), a fifth whose hook copies each
bucket once (the memory reference: the least traffic an allreduce of the
bucket needs) and a sixth over smddp with smddp.allreduce_hook (torch's
buckets moved into smddp's pools by the hook), each step's models in a
shuffled order (the same on every rank), mean step time without the first 3
steps. Then FSDP2 (fully_shard) on the same
model over smddp with torch's buffers, over smddp with its all-gather and
reduce-scatter buffers from the group (allocate_tensor: smddp's pools), and
over gloo, steps alternating in a shuffled order. Last, the speed targets with PASS/FAIL.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import socket
import sys
import tempfile
import time

COLLECTIVES = ("allreduce", "allgather", "reduce_scatter")
BACKENDS = ("smddp", "gloo")
MIN_ITERS = 3
TARGET_ROUNDS = 4


def target_size(nodes: int) -> int:
    """The allreduce size whose bandwidth a speed target judges (see report)."""
    return 64 << 20 if nodes > 1 else 16 << 20


# ----------------------------------------------------------------------------- args

def parse_size(text: str) -> int:
    t = text.strip().upper().rstrip("B")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    return int(float(t) * mult)


def fmt_size(n: int) -> str:
    for suffix, m in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= m and n % m == 0:
            return f"{n // m} {suffix}iB"
    return f"{n} B"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=2, help="ranks to spawn (default 2)")
    p.add_argument("--min", type=parse_size, default=8, help="smallest size (default 8)")
    p.add_argument("--max", type=parse_size, default=64 << 20, help="largest size (default 64M)")
    p.add_argument("--factor", type=int, default=4, help="size step (default x4)")
    p.add_argument("--iters", type=int, default=200,
                   help="most timed iterations per size and backend, per round at the "
                        "--target-time size (fewer for large sizes; default 200)")
    p.add_argument("--warmup", type=int, default=5, help="warmup iterations (default 5)")
    p.add_argument("--time", type=float, default=0.3,
                   help="target seconds of timed iterations per size and backend (default 0.3)")
    p.add_argument("--target-time", type=float, default=2.0,
                   help="seconds of timed iterations per backend for the allreduce size a "
                        "bandwidth target judges (64 MiB across nodes, else 16 MiB), in %d "
                        "rounds alternating the backends (default 2)" % TARGET_ROUNDS)
    p.add_argument("--latency-calls", type=int, default=10000,
                   help="8 B allreduce calls timed one by one for the p50 latency "
                        "(default 10000; 0 skips)")
    p.add_argument("--out", default=".", help="directory for torch_bench.csv/.png (default .)")
    p.add_argument("--ddp", action=argparse.BooleanOptionalAction, default=True,
                   help="also time DDP training steps (default on)")
    p.add_argument("--ddp-steps", type=int, default=40, help="DDP steps per backend (default 40)")
    p.add_argument("--ddp-layers", type=int, default=6, help="Linear(2048, 2048) layers (default 6)")
    p.add_argument("--ddp-batch", type=int, default=8, help="samples per rank (default 8)")
    p.add_argument("--no-pin", action="store_true", help="do not pin ranks to CPUs")
    p.add_argument("--launched", action="store_true",
                   help="the ranks were started by a launcher (torchrun, smddprun, mpirun, "
                        "test/netns): take RANK, WORLD_SIZE, MASTER_ADDR/PORT from the "
                        "environment, pin by LOCAL_RANK; rank 0 reports")
    a = p.parse_args(argv)
    if a.launched:
        a.world = int(os.environ.get("WORLD_SIZE", "0"))
    if a.world < 1 or a.min < 1 or a.max < a.min or a.factor < 2:
        p.error("need --world >= 1, 1 <= --min <= --max, --factor >= 2")
    return a


def sizes_for(lo: int, hi: int, factor: int) -> list[int]:
    sizes = {lo}
    s = hi
    while s >= lo:
        sizes.add(s)
        s //= factor
    for must in (4 << 10, 16 << 20):
        if lo <= must <= hi:
            sizes.add(must)
    return sorted(sizes)


# ----------------------------------------------------------------------------- ranks

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin(rank: int) -> str:
    cpus = sorted(os.sched_getaffinity(0))
    cpu = cpus[rank % len(cpus)]
    os.sched_setaffinity(0, {cpu})
    return str(cpu)


def bus_factor(coll: str, n: int) -> float:
    if n <= 1:
        return 1.0
    return 2.0 * (n - 1) / n if coll == "allreduce" else (n - 1) / n


def all_gather(dist):
    """all_gather_single where torch has it (2.13 deprecates the older name)."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def reduce_scatter(dist):
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def make_op(torch, dist, coll: str, size: int, n: int, group):
    """Returns (op, bytes) for one collective on `size` bytes in fp32."""
    count = max(1, size // 4)
    if coll != "allreduce":
        count = max(n, (count + n - 1) // n * n)    # divisible among the ranks
    nbytes = count * 4
    if coll == "allreduce":
        buf = torch.zeros(count, dtype=torch.float32)

        def op():
            dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=group)
    elif coll == "allgather":
        inp = torch.zeros(count // n, dtype=torch.float32)
        out = torch.empty(count, dtype=torch.float32)
        gather = all_gather(dist)                   # looked up once, not in the timed loop

        def op():
            gather(out, inp, group=group)
    else:
        inp = torch.zeros(count, dtype=torch.float32)
        out = torch.empty(count // n, dtype=torch.float32)
        scatter = reduce_scatter(dist)

        def op():
            scatter(out, inp, op=dist.ReduceOp.SUM, group=group)
    return op, nbytes


def check(torch, dist, groups: dict, rank: int, n: int) -> dict:
    """Quick correctness check of each collective on each backend."""
    res = {}
    for be, g in groups.items():
        try:
            a = torch.full((1024,), float(rank + 1))
            dist.all_reduce(a, group=g)
            ok = bool(torch.all(a == n * (n + 1) / 2))
            out = torch.empty(n * 4)
            all_gather(dist)(out, torch.full((4,), float(rank)), group=g)
            ok &= bool(torch.equal(out, torch.arange(n).float().repeat_interleave(4)))
            o = torch.empty(4)
            reduce_scatter(dist)(o, torch.arange(n * 4).float(), group=g)
            ok &= bool(torch.equal(o, n * torch.arange(rank * 4, rank * 4 + 4).float()))
            res[be] = "ok" if ok else "WRONG RESULT"
        except Exception as e:  # noqa: BLE001
            res[be] = f"error: {e}"
    return res


def copy_reference(torch, dist, ctl, nbytes: int = 16 << 20, iters: int = 50) -> float:
    """Slowest rank's mean seconds for Tensor.copy_ of `nbytes` of fp32, every
    rank copying at once: this machine's memory speed, measured in this run,
    against which the collectives' times can be compared across machines."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    for _ in range(5):
        dst.copy_(src)
    dist.barrier(group=ctl)
    t0 = time.perf_counter()
    for _ in range(iters):
        dst.copy_(src)
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctl)
    return t.item()


def time_collective(torch, dist, args, coll, size, n, group, ctl, seconds):
    """Slowest rank's mean seconds per op over about `seconds` of iterations,
    iterations, bytes; NaN and 0 iterations on error."""
    try:
        op, nbytes = make_op(torch, dist, coll, size, n, group)
        dist.barrier(group=group)
        op()                                        # first call: lazy setup
        t0 = time.perf_counter()
        w = max(1, args.warmup)
        for _ in range(w):
            op()
        est = (time.perf_counter() - t0) / w
        err = 0.0
    except Exception as e:  # noqa: BLE001
        print(f"[rank {dist.get_rank()}] {coll} {size}: {e}", file=sys.stderr)
        est, err, nbytes = 1.0, 1.0, max(4, size)
    # Agree on the iteration count (and on whether anybody failed).
    t = torch.tensor([est, err], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctl)
    if t[1].item() > 0:
        return float("nan"), 0, nbytes, float("nan")
    iters = int(min(args.iters, max(MIN_ITERS, seconds / max(t[0].item(), 1e-9))))
    before = skew_reading(group)
    sec = slowest_mean(torch, dist, op, iters, ctl, group)
    return sec, iters, nbytes, skew_between(before, skew_reading(group))


def skew_reading(group):
    """smddp's (collectives compared, summed skew in us) for an smddp group, else None."""
    try:
        import smddp

        s = smddp.stats(group)
    except Exception:  # noqa: BLE001  (a gloo group, or smddp without stats)
        return None
    return s["ops"], s["skew_us"]["mean"] * s["ops"]


def skew_between(a, b) -> float:
    """Mean skew (us: last rank's arrival minus the first's) of the collectives between two
    readings; NaN where there is none (gloo)."""
    if a is None or b is None or b[0] <= a[0]:
        return float("nan")
    return (b[1] - a[1]) / (b[0] - a[0])


def slowest_mean(torch, dist, op, iters, ctl, start_group) -> float:
    """Seconds per call over iters calls of op, the ranks starting together after
    a barrier on start_group; the slowest rank's mean (MAX over ctl)."""
    dist.barrier(group=start_group)
    t0 = time.perf_counter()
    for _ in range(iters):
        op()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctl)
    return t.item()


RING_SIZES = (8, 64 << 10, 1 << 20, 16 << 20)


def ring_exchange(torch, dist, groups, ctl, rank, n) -> dict:
    """Pipeline parallelism's exchange: every rank isends to the next and irecvs
    from the previous in one batch_isend_irecv (a coalesced batch on smddp),
    then waits; us per exchange, the slowest rank's mean, each backend in turn,
    the result checked once per size."""
    out = {}
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    for size in RING_SIZES:
        send = torch.full((max(1, size // 4),), float(rank))
        recv = torch.empty_like(send)
        for be in BACKENDS:
            g = groups[be]

            def go(g=g):
                for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, nxt, group=g),
                                                 dist.P2POp(dist.irecv, recv, prv, group=g)]):
                    w.wait()

            recv.fill_(-1)
            go()
            ok = bool((recv == prv).all())
            t0 = time.perf_counter()
            for _ in range(3):
                go()
            est = torch.tensor([(time.perf_counter() - t0) / 3], dtype=torch.float64)
            dist.all_reduce(est, op=dist.ReduceOp.MAX, group=ctl)
            iters = max(5, min(2000, int(0.3 / max(est.item(), 1e-7))))
            sec = slowest_mean(torch, dist, go, iters, ctl, ctl)
            bad = torch.tensor([0 if ok else 1])
            dist.all_reduce(bad, group=ctl)
            out.setdefault(be, {})[size] = {"us": sec * 1e6, "wrong": int(bad.item())}
    return out


def latency(torch, dist, args, groups, ctl) -> dict:
    """p50 and p90 (us) of single 8 B allreduce calls, each timed on its own.

    The slowest rank's percentile counts. Rounds alternate the backends. For
    smddp (and the fake backend) also the process group called straight from
    Python (without torch.distributed's Python wrapper), and smddp's backend
    object (without the dispatcher too): its allreduce and the Work's wait,
    through pybind11.
    """
    import smddp

    n = args.latency_calls
    t = torch.ones(2)
    ways = {be: (lambda g=g: dist.all_reduce(t, group=g)) for be, g in groups.items()}
    ways["smddp, async_op=True then wait()"] = \
        lambda: dist.all_reduce(t, group=groups["smddp"], async_op=True).wait()
    opts = dist.AllreduceOptions()
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = False
        # Without torch.distributed's Python wrapper: the ProcessGroup (its
        # dispatcher op, then the backend), and the backend object alone.
        world = groups["smddp"]
        # As torch.distributed's own calls: a backend that finished in C++
        # returns no Work to wait for.
        def wait(work):
            if work is not None:
                work.wait()

        ways["smddp process group, called directly"] = lambda: wait(world.allreduce([t], opts))
        backend = world._get_backend(torch.device("cpu"))
        ways["smddp backend, called directly"] = lambda: wait(backend.allreduce([t], opts))
    ways["smddp.all_reduce"] = lambda: smddp.all_reduce(t, group=groups["smddp"])
    # torch's fake backend communicates nothing and completes every work at
    # once: dist.all_reduce on it is what torch's side of a call costs.
    try:
        from torch.testing._internal.distributed import fake_pg  # noqa: F401  (registers "fake")
        fake = dist.new_group(backend="fake")
        ways["fake"] = lambda: dist.all_reduce(t, group=fake)
        if hasattr(opts, "asyncOp"):
            ways["fake process group, called directly"] = lambda: wait(fake.allreduce([t], opts))
    except Exception as e:  # noqa: BLE001  (the reference row is left out, with why)
        print(f"torch_bench: no fake-backend row: {type(e).__name__}: {e}", file=sys.stderr)
    samples = {w: [] for w in ways}
    for rnd in range(2):
        for w in (list(ways) if rnd == 0 else list(ways)[::-1]):
            f = ways[w]
            for _ in range(200):
                f()
            dist.barrier(group=ctl)
            ts = samples[w]
            clock = time.perf_counter_ns
            for _ in range(n // 2):
                a = clock()
                f()
                ts.append(clock() - a)
    out = {}
    for w, ts in samples.items():
        ts.sort()
        q = torch.tensor([ts[len(ts) // 2] / 1e3, ts[len(ts) * 9 // 10] / 1e3], dtype=torch.float64)
        dist.all_reduce(q, op=dist.ReduceOp.MAX, group=ctl)
        out[w] = {"p50": q[0].item(), "p90": q[1].item(), "calls": len(ts)}
    return out


def linear_stack(torch, args):
    """The DDP and FSDP2 model: args.ddp_layers x (Linear(2048, 2048), ReLU), seeded."""
    import torch.nn as nn

    torch.manual_seed(0)
    layers = []
    for _ in range(args.ddp_layers):
        layers += [nn.Linear(2048, 2048), nn.ReLU()]
    return nn.Sequential(*layers)


def step_order(names, step: int) -> list:
    """The models' order in one step: shuffled, from a seed every rank shares.

    A model's step runs in the caches and memory the one before it left
    (its dirty lines written back, its buffers evicted); in a fixed order
    each model always follows the same one, which biased the comparison
    (a DDP measured 2-7 points further over the floor first in the step
    than last; bench/RESULTS.md). Shuffled, every model
    follows each of the others alike.
    """
    import random

    order = list(names)
    random.Random(step).shuffle(order)
    return order


def step_means(args, times: dict) -> tuple[int, dict]:
    """Steps left out (the first 3 of more than 3), and each model's mean step over the rest."""
    skip = 3 if args.ddp_steps > 3 else 0
    return skip, {k: sum(t[skip:]) / len(t[skip:]) for k, t in times.items()}


POOLED_DDP = "smddp, allreduce_hook"  # DDP over smddp with smddp.allreduce_hook
STAGED_DDP = "smddp, torch's buckets"  # DDP_DISABLE_COMM_MEM=1: buckets staged


def run_ddp(torch, dist, args, groups, ctl, rank):
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model():
        return linear_stack(torch, args)

    def no_comm(state, bucket):
        fut = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    # The memory reference: each bucket copied once (read it, write a copy),
    # nothing communicated. Any allreduce of a bucket in place reads it and
    # writes the result over it, so this is the least memory traffic one
    # costs, measured inside the same DDP step as the backends.
    copies = {}

    def copy_once(state, bucket):
        b = bucket.buffer()
        c = copies.get((bucket.index(), b.numel()))
        if c is None:
            c = copies[(bucket.index(), b.numel())] = torch.empty_like(b)
        c.copy_(b)
        fut = torch.futures.Future()
        fut.set_result(b)
        return fut

    import smddp

    ddps, opts = {}, {}
    # DDP's own work without communication, and smddp's hook (the buckets
    # moved into its pools: allreduced in place, no staging).
    hooks = {"no comm": (no_comm, "gloo"), "one copy": (copy_once, "gloo"),
             POOLED_DDP: (smddp.allreduce_hook, "smddp")}
    # DDP takes its buckets from the group's allocateTensor (smddp's pools)
    # unless DDP_DISABLE_COMM_MEM is "1"; creating the smddp group set it to "0"
    # where torch has no CUDA or XPU; the Reducer reads it whenever it builds its
    # buckets (at construction and when it rebuilds them in step 2), so it is
    # set before each model's steps. The hook's DDP and STAGED_DDP keep
    # torch's buckets.
    comm_mem = os.environ.get(smddp.DDP_COMM_MEM_VAR, "1")

    def buckets_for(be):
        os.environ[smddp.DDP_COMM_MEM_VAR] = "1" if be in (STAGED_DDP, POOLED_DDP) else comm_mem

    for be, g in (list(groups.items()) + [(STAGED_DDP, groups["smddp"])] +
                  [(h, groups[hooks[h][1]]) for h in hooks]):
        buckets_for(be)
        m = DDP(model(), process_group=g)
        if be in hooks:
            m.register_comm_hook(g if be == POOLED_DDP else None, hooks[be][0])
        ddps[be] = m
        opts[be] = torch.optim.SGD(m.parameters(), lr=1e-3)
    nparams = sum(p.numel() for p in ddps["smddp"].parameters())
    gen = torch.Generator().manual_seed(1000 + rank)
    times = {be: [] for be in ddps}
    for step in range(args.ddp_steps):
        x = torch.randn(args.ddp_batch, 2048, generator=gen)
        for be in step_order(ddps, step):       # alternate: same load for all
            m, opt = ddps[be], opts[be]
            buckets_for(be)
            dist.barrier(group=ctl)
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)   # keep the grads: no 100 MB re-allocation
            loss = m(x).square().mean()
            loss.backward()
            opt.step()
            dt = time.perf_counter() - t0
            t = torch.tensor([dt], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctl)
            times[be].append(t.item())
    # Same seed, same data: the parameters must match across backends.
    os.environ[smddp.DDP_COMM_MEM_VAR] = comm_mem
    diff = max((a - b).abs().max().item() for be in ("smddp", STAGED_DDP, POOLED_DDP) for a, b in
               zip(ddps[be].parameters(), ddps["gloo"].parameters()))
    # Compute-only time of one step (no DDP), for the breakdown.
    plain = model()
    comp = []
    for _ in range(7):
        x = torch.randn(args.ddp_batch, 2048, generator=gen)
        t0 = time.perf_counter()
        plain.zero_grad(set_to_none=False)
        plain(x).square().mean().backward()
        comp.append(time.perf_counter() - t0)
    t = torch.tensor([sorted(comp)[len(comp) // 2]], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctl)
    # The communication alone: one smddp allreduce of all the gradients, the
    # bytes DDP reduces per step. Where each rank has one CPU, no backend can
    # hide this under compute, so floor + this is the step to compare with.
    grads = torch.zeros(nparams)
    alone = []
    for _ in range(7):
        dist.barrier(group=ctl)
        t0 = time.perf_counter()
        dist.all_reduce(grads, group=groups["smddp"])
        alone.append(time.perf_counter() - t0)
    a = torch.tensor([sorted(alone)[len(alone) // 2]], dtype=torch.float64)
    dist.all_reduce(a, op=dist.ReduceOp.MAX, group=ctl)
    return {"params": nparams, "times": times, "param_maxdiff": diff, "compute_only": t.item(),
            "allreduce_alone": a.item(), "comm_mem": comm_mem}


def run_fsdp(torch, dist, args, groups, ctl, rank):
    """FSDP2 steps of the DDP model over smddp (torch's buffers, then the group's
    pools for the all-gather and reduce-scatter buffers) and gloo, alternating."""
    import torch.nn as nn
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    def model(group, pooled):
        m = linear_stack(torch, args)
        mesh = DeviceMesh.from_group(group, "cpu")
        for layer in m:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        if pooled:
            for sub in m.modules():
                if hasattr(sub, "set_allocate_memory_from_process_group_for_comm"):
                    sub.set_allocate_memory_from_process_group_for_comm(True)
        return m

    kinds = {"smddp": (groups["smddp"], False), "smddp, pooled buffers": (groups["smddp"], True),
             "gloo": (groups["gloo"], False)}
    models = {k: model(g, pooled) for k, (g, pooled) in kinds.items()}
    optims = {k: torch.optim.SGD(m.parameters(), lr=1e-3) for k, m in models.items()}
    gen = torch.Generator().manual_seed(2000 + rank)
    times = {k: [] for k in models}
    for step in range(args.ddp_steps):
        x = torch.randn(args.ddp_batch, 2048, generator=gen)
        for k in step_order(models, step):
            dist.barrier(group=ctl)
            t0 = time.perf_counter()
            optims[k].zero_grad(set_to_none=False)
            models[k](x).square().mean().backward()
            optims[k].step()
            t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctl)
            times[k].append(t.item())
    diff = max((a.full_tensor() - b.full_tensor()).abs().max().item() for a, b in
               zip(models["smddp, pooled buffers"].parameters(), models["gloo"].parameters()))
    import smddp
    with tempfile.TemporaryDirectory() as d:
        with open(smddp.dump_trace(groups["smddp"], os.path.join(d, "trace.json"))) as f:
            trace = json.load(f)
    ops = trace["ops"] if isinstance(trace, dict) else trace
    pooled = sorted({op["kind"] for op in ops if "in pools" in (op.get("algo") or "")})
    return {"times": times, "param_maxdiff": diff, "in_pools": pooled}


def worker(rank: int, args, port: int | None, result_path: str | None) -> None:
    where = int(os.environ.get("LOCAL_RANK", rank)) if args.launched else rank
    cpu = pin(where) if not args.no_pin else "any"
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    n = args.world
    init = f"tcp://127.0.0.1:{port}" if port else "env://"
    dist.init_process_group(backend="smddp", init_method=init, rank=rank, world_size=n)
    gloo = dist.new_group(backend="gloo")
    ctl = dist.new_group(backend="gloo")        # for agreeing on counts and results
    groups = {"smddp": dist.group.WORLD, "gloo": gloo}
    res = {"world": n, "cpus": {}, "rows": [], "check": check(torch, dist, groups, rank, n)}
    cpus = [None] * n
    dist.all_gather_object(cpus, cpu, group=ctl)
    res["cpus"] = cpus
    nodes = [None] * n
    dist.all_gather_object(nodes, os.environ.get("SMDDP_HOSTNAME") or socket.gethostname(),
                           group=ctl)
    res["nodes"] = len(set(nodes))
    # Pre-warm both backends (first-touch, lazy setup) so the first size is not penalised.
    for be in BACKENDS:
        for coll in COLLECTIVES:
            op, _ = make_op(torch, dist, coll, 4096, n, groups[be])
            for _ in range(20):
                op()
    res["copy16"] = copy_reference(torch, dist, ctl)
    if args.latency_calls > 0:
        res["latency"] = latency(torch, dist, args, groups, ctl)
    res["ring"] = ring_exchange(torch, dist, groups, ctl, rank, n)
    dist.barrier(group=ctl)
    t_start = time.perf_counter()
    for size in sizes_for(args.min, args.max, args.factor):
        for coll in COLLECTIVES:
            # The size a bandwidth target judges: longer, in rounds that
            # alternate the backends (and which goes first), so that a few
            # slow iterations or minutes of a busier host do not decide it.
            judged = coll == "allreduce" and size == target_size(res["nodes"])
            rounds = TARGET_ROUNDS if judged else 1
            seconds = args.target_time / rounds if judged else args.time
            acc = {be: [0.0, 0, 0, []] for be in BACKENDS}
            failed = set()
            for rnd in range(rounds):
                for be in BACKENDS if rnd % 2 == 0 else BACKENDS[::-1]:
                    if be in failed:
                        continue
                    sec, iters, nbytes, skew = time_collective(torch, dist, args, coll, size, n,
                                                               groups[be], ctl, seconds)
                    acc[be][3].append(skew)
                    if not iters:                   # every rank saw the failure
                        failed.add(be)
                        acc[be][0] = float("nan")
                    acc[be][0] += sec * iters
                    acc[be][1] += iters
                    acc[be][2] = nbytes
            for be in BACKENDS:
                total, iters, nbytes, skews = acc[be]
                skews = [s for s in skews if s == s]
                res["rows"].append({"backend": be, "collective": coll, "size": nbytes,
                                    "iters": iters, "sec": total / iters if iters else total,
                                    "skew_us": sum(skews) / len(skews) if skews else None})
        if rank == 0:
            print(f"  .. {fmt_size(size)} done ({time.perf_counter() - t_start:.1f} s)",
                  file=sys.stderr, flush=True)
    if args.ddp:
        res["ddp"] = run_ddp(torch, dist, args, groups, ctl, rank)
        res["fsdp"] = run_fsdp(torch, dist, args, groups, ctl, rank)
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(res, f)
    dist.barrier(group=ctl)
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- report

def report(args, res: dict, wall: float) -> int:
    n = res["world"]
    rows = res["rows"]
    for r in rows:
        sec = r["sec"]
        r["time_us"] = sec * 1e6
        r["algbw"] = r["size"] / sec / 1e9 if sec and sec == sec else float("nan")
        r["busbw"] = r["algbw"] * bus_factor(r["collective"], n)
    by = {(r["backend"], r["collective"], r["size"]): r for r in rows}

    nodes = res.get("nodes", 1)
    print(f"# torch_bench: smddp vs gloo, {n} ranks on {nodes} node(s), fp32, "
          f"pinned CPUs {res['cpus']}, "
          f"torch {res.get('torch', '?')}")
    print(f"correctness check: {res['check']}")
    print(f"load average at start {res.get('load0')}, at end {res.get('load1')} "
          f"({os.cpu_count()} CPUs)")
    copy16 = res.get("copy16")
    ar16 = by.get(("smddp", "allreduce", 16 << 20))
    if copy16:
        print(f"memory reference: every rank copying 16 MiB at once (Tensor.copy_) takes "
              f"{copy16 * 1e6:.1f} us ({(16 << 20) / copy16 / 1e9:.2f} GB/s per rank)"
              + (f"; smddp's 16 MiB allreduce = {ar16['sec'] / copy16:.2f} such copies"
                 if ar16 and ar16["sec"] == ar16["sec"] else ""))
    print()
    for coll in COLLECTIVES:
        name = {"allreduce": "allreduce (sum)",
                "allgather": "allgather (all_gather_single, or all_gather_into_tensor)",
                "reduce_scatter": "reduce_scatter (reduce_scatter_single, or "
                                  "reduce_scatter_tensor; sum)"}[coll]
        print(f"## {name}")
        print()
        print("| size | smddp us | smddp skew us | smddp algbw GB/s | smddp busbw GB/s | gloo us "
              "| gloo algbw GB/s | gloo busbw GB/s | gloo/smddp time |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        sizes = sorted({r["size"] for r in rows if r["collective"] == coll})
        for s in sizes:
            a, b = by.get(("smddp", coll, s)), by.get(("gloo", coll, s))
            ratio = b["time_us"] / a["time_us"] if a and b else float("nan")
            skew = f"{a['skew_us']:.1f}" if a and a.get("skew_us") is not None else "-"
            print(f"| {fmt_size(s)} | {a['time_us']:.1f} | {skew} | {a['algbw']:.3f} | {a['busbw']:.3f} "
                  f"| {b['time_us']:.1f} | {b['algbw']:.3f} | {b['busbw']:.3f} | {ratio:.2f}x |")
        print()

    ring = res.get("ring")
    if ring:
        print("## ring exchange (batch_isend_irecv: isend to the next rank, irecv from the "
              "previous, then wait; us per exchange, the slowest rank's mean)")
        print()
        print("| size | smddp us | gloo us | gloo/smddp time |")
        print("|---:|---:|---:|---:|")
        for size in sorted(ring["smddp"], key=int):
            a, b = ring["smddp"][size], ring["gloo"][size]
            flag = lambda r: " WRONG" if r["wrong"] else ""
            print(f"| {fmt_size(int(size))} | {a['us']:.1f}{flag(a)} | {b['us']:.1f}{flag(b)} "
                  f"| {b['us'] / a['us']:.2f}x |")
        print()

    lat = res.get("latency")
    if lat:
        print(f"## 8 B allreduce, one call at a time: p50 and p90 of {lat['smddp']['calls']} "
              f"calls (us; the slowest rank's), backends alternating")
        print()
        print("| call | p50 us | p90 us |")
        print("|---|---:|---:|")
        for w, q in lat.items():
            name = f"{w} (allreduce + wait)" if "directly" in w else f"dist.all_reduce, {w}"
            if "async_op" in w:
                name = "dist.all_reduce(async_op=True).wait(), smddp"
            elif w == "smddp.all_reduce":
                name = "smddp.all_reduce (no Work, no dispatcher)"
            elif w == "fake":
                name = "dist.all_reduce, torch's fake backend (no communication: torch's own cost)"
            print(f"| {name} | {q['p50']:.2f} | {q['p90']:.2f} |")
        print()

    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "torch_bench.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["backend", "collective", "size_bytes", "iters", "time_us",
                    "algbw_GBps", "busbw_GBps", "world", "skew_us"])
        for r in rows:
            skew = "" if r.get("skew_us") is None else f"{r['skew_us']:.3f}"
            w.writerow([r["backend"], r["collective"], r["size"], r["iters"],
                        f"{r['time_us']:.3f}", f"{r['algbw']:.6f}", f"{r['busbw']:.6f}", n, skew])
    print(f"CSV: {csv_path}")
    png_path = os.path.join(args.out, "torch_bench.png")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(9, 6))
        styles = {"smddp": "-", "gloo": "--"}
        marks = {"allreduce": "o", "allgather": "s", "reduce_scatter": "^"}
        for be in BACKENDS:
            for coll in COLLECTIVES:
                pts = sorted((r["size"], r["busbw"]) for r in rows
                             if r["backend"] == be and r["collective"] == coll
                             and r["busbw"] == r["busbw"] and r["busbw"] > 0)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], styles[be],
                            marker=marks[coll], label=f"{be} {coll}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.set_title(f"torch.distributed busbw, {n} ranks, fp32: smddp vs gloo")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(png_path, dpi=110)
        print(f"PNG: {png_path}")
    except ImportError:
        print("PNG: skipped (matplotlib not installed; pip install matplotlib)")

    targets = []

    def ratio(coll, size):
        a, b = by.get(("smddp", coll, size)), by.get(("gloo", coll, size))
        if not a or not b:
            return None
        return b["time_us"] / a["time_us"]      # gloo time / smddp time

    r64 = ratio("allreduce", 64 << 20)
    # Issue 4's layout: several ranks on each of several nodes. With one rank
    # per node smddp and gloo both run the same 2-rank ring: no target there.
    if nodes > 1 and n > nodes and r64 is not None:
        targets.append(("allreduce 64 MiB across nodes: algbw >= 2x gloo's (issue 4)", r64 >= 2,
                        f"smddp algbw = {r64:.2f}x gloo's"))
    r16 = ratio("allreduce", 16 << 20)
    if nodes == 1 and r16 is not None:
        targets.append((f"allreduce 16 MiB algbw >= 5x gloo's", r16 >= 5,
                        f"smddp algbw = {r16:.2f}x gloo's"))
    for s in (8, 4 << 10):
        r = ratio("allreduce", s)
        if nodes == 1 and r is not None:
            targets.append((f"allreduce {fmt_size(s)} latency <= 0.1x gloo's", 1 / r <= 0.1,
                            f"smddp time = {1 / r:.3f}x gloo's "
                            f"({by[('smddp', 'allreduce', s)]['time_us']:.1f} us vs "
                            f"{by[('gloo', 'allreduce', s)]['time_us']:.1f} us)"))
    if lat and nodes == 1 and n == 2:
        p50 = lat["smddp"]["p50"]
        floor = (f"; torch's fake backend, which communicates nothing, {lat['fake']['p50']:.2f} us"
                 if "fake" in lat else "")
        targets.append(("allreduce 8 B p50 <= 4 us through dist.all_reduce (issue 22)", p50 <= 4,
                        f"p50 {p50:.2f} us (gloo {lat['gloo']['p50']:.2f} us{floor})"))
        if "smddp.all_reduce" in lat:
            p50 = lat["smddp.all_reduce"]["p50"]
            targets.append(("allreduce 8 B p50 <= 4 us through smddp.all_reduce (issue 22)",
                            p50 <= 4, f"p50 {p50:.2f} us"))
    if "ddp" in res:
        d = res["ddp"]
        skip, mean = step_means(args, d["times"])
        print()
        print(f"## DDP: {args.ddp_layers} x Linear(2048, 2048), {d['params'] / 1e6:.1f}M params "
              f"({d['params'] * 4 / 2**20:.0f} MiB of fp32 gradients), batch {args.ddp_batch}/rank, "
              f"{args.ddp_steps} steps, mean without the first {skip}")
        print()
        print("| backend | mean step ms | min ms | max ms |")
        print("|---|---:|---:|---:|")
        for be in d["times"]:
            t = d["times"][be][skip:]
            print(f"| {be} | {mean[be] * 1e3:.1f} | {min(t) * 1e3:.1f} | {max(t) * 1e3:.1f} |")
        print()
        r = mean["smddp"] / mean["gloo"]
        print(f"DDP step time smddp/gloo = {r:.3f}; DDP with a comm hook that communicates "
              f"nothing / gloo = {mean['no comm'] / mean['gloo']:.3f} (no backend can go "
              f"below that); forward+backward alone (no DDP) = "
              f"{d['compute_only'] * 1e3:.1f} ms; max |param smddp - param gloo| (every "
              f"smddp DDP) after "
              f"{args.ddp_steps} steps = {d['param_maxdiff']:.3g}")
        print(f"The smddp DDP ran with DDP_DISABLE_COMM_MEM={d.get('comm_mem', '?')} "
              f"(\"0\": DDP's buckets from the group's allocateTensor, in smddp's pools); "
              f"\"{STAGED_DDP}\" with \"1\" (torch's buckets, staged), as did the "
              f"allreduce_hook's DDP (the hook moves them into the pool)")
        over = mean["smddp"] / mean["no comm"] - 1
        pooled = mean[POOLED_DDP] / mean["no comm"] - 1 if POOLED_DDP in mean else None
        staged = mean[STAGED_DDP] / mean["no comm"] - 1 if STAGED_DDP in mean else None
        alone = d.get("allreduce_alone")
        if alone:
            hook = "" if pooled is None else f", smddp with allreduce_hook +{pooled * 100:.1f}%"
            if staged is not None:
                hook += f", smddp with torch's buckets +{staged * 100:.1f}%"
            print(f"DDP step time over the floor (the no-comm DDP): smddp +{over * 100:.1f}%"
                  f"{hook}, gloo +{(mean['gloo'] / mean['no comm'] - 1) * 100:.1f}%; one smddp "
                  f"allreduce of all {d['params'] * 4 / 2**20:.0f} MiB of gradients alone "
                  f"takes {alone * 1e3:.1f} ms = {alone / mean['no comm'] * 100:.1f}% of the "
                  f"floor's step (a rank with one CPU cannot hide it under compute)")
        if "one copy" in mean:
            ref = mean["one copy"] / mean["no comm"] - 1
            print(f"Memory reference: DDP with a hook that copies each bucket once and "
                  f"communicates nothing (the least memory traffic an allreduce of the "
                  f"bucket needs: read it, write the result) is +{ref * 100:.1f}% over the "
                  f"floor; smddp's overhead is {over / ref:.2f}x that" if ref > 0 else
                  f"Memory reference: one copy of each bucket measured +{ref * 100:.1f}% "
                  f"over the floor (within the noise)")
        if nodes == 1:
            targets.append(("DDP step time <= 0.7x gloo's", r <= 0.7, f"smddp/gloo = {r:.3f}"))
            targets.append(("DDP step time <= 1.1x the floor's (issue 22), DDP's own allreduce",
                            over <= 0.1, f"+{over * 100:.1f}%"))
            if pooled is not None:
                targets.append(("DDP step time <= 1.1x the floor's (issue 22), "
                                "smddp.allreduce_hook", pooled <= 0.1, f"+{pooled * 100:.1f}%"))
    if "fsdp" in res:
        d = res["fsdp"]
        skip, mean = step_means(args, d["times"])
        print()
        print(f"## FSDP2: the same model, each Linear and the root fully_shard'ed, "
              f"{args.ddp_steps} steps, mean without the first {skip}")
        print()
        print("| FSDP2 over | mean step ms | min ms | max ms | / gloo's |")
        print("|---|---:|---:|---:|---:|")
        for k, t in d["times"].items():
            t = t[skip:]
            print(f"| {k} | {mean[k] * 1e3:.1f} | {min(t) * 1e3:.1f} | {max(t) * 1e3:.1f} | "
                  f"{mean[k] / mean['gloo']:.3f} |")
        print()
        print(f"Pooled buffers (set_allocate_memory_from_process_group_for_comm): step time "
              f"{mean['smddp, pooled buffers'] / mean['smddp']:.3f}x smddp's with torch's "
              f"buffers; collectives that ran in the pools: {', '.join(d['in_pools']) or 'none'}; "
              f"max |param pooled - param gloo| after {args.ddp_steps} steps = "
              f"{d['param_maxdiff']:.3g}")
    print()
    print("## Speed targets")
    print()
    fails = 0
    for name, ok, detail in targets:
        fails += not ok
        print(f"- {'PASS' if ok else 'FAIL'}: {name}: {detail}")
    if not targets:
        print(f"(none for {n} rank(s) on {nodes} node(s): the targets are for one node, or "
              f"several ranks on each of several nodes)")
    print()
    print(f"wall time {wall:.1f} s")
    return 1 if fails else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if "smddp" not in dist.Backend.backend_list:
        import smddp  # noqa: F401  (registers the backend if autoload is off)
    t0 = time.perf_counter()
    load0 = tuple(round(x, 2) for x in os.getloadavg())
    if args.launched:
        rank = int(os.environ["RANK"])
        path = os.path.join(tempfile.gettempdir(), f"torch_bench.{os.getpid()}.json")
        worker(rank, args, None, path if rank == 0 else None)
        if rank != 0:
            return 0
        with open(path) as f:
            res = json.load(f)
        os.unlink(path)
        res["torch"] = torch.__version__
        res["load0"] = load0
        res["load1"] = tuple(round(x, 2) for x in os.getloadavg())
        return report(args, res, time.perf_counter() - t0)
    port = free_port()
    fd, result_path = tempfile.mkstemp(prefix="torch_bench.", suffix=".json")
    os.close(fd)
    try:
        print(f"torch_bench: {args.world} ranks, sizes {fmt_size(args.min)}..{fmt_size(args.max)}, "
              f"port {port}", file=sys.stderr, flush=True)
        mp.spawn(worker, args=(args, port, result_path), nprocs=args.world, join=True)
        with open(result_path) as f:
            res = json.load(f)
    finally:
        os.unlink(result_path)
    res["torch"] = torch.__version__
    res["load0"] = load0
    res["load1"] = tuple(round(x, 2) for x in os.getloadavg())
    return report(args, res, time.perf_counter() - t0)


if __name__ == "__main__":
    sys.exit(main())
