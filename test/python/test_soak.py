"""Soak through torch.distributed: a long random mix of collectives on smddp.

Every rank draws the same sequence from one seed: each step is a random
collective (every one the backend implements, send/recv in a ring included)
with a random dtype, reduction, size, root, and group (the world, or a
subgroup made with new_group), issued with async_op=True; up to four are in
flight at a time and they are waited for in an order that differs per rank.
Each rank computes every rank's inputs itself (seeded generators), so each
result is checked against a reference without another backend. Inputs are
small integers: results are exact, except AVG, which divides.

TEST_SOAK_SEED and TEST_SOAK_OPS change the seed and the length (for a longer
run by hand).
"""

import os
import random

import pytest
import torch
import torch.distributed as dist

from smddp_support import requires_smddp
from test_backend import FAKE_NODES, _reduce_local, run_ranks

pytestmark = requires_smddp

SEED = int(os.environ.get("TEST_SOAK_SEED", "20261201"))
OPS = int(os.environ.get("TEST_SOAK_OPS", "150"))
MAX_INFLIGHT = 4
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
          torch.int8, torch.uint8, torch.int32, torch.int64]
KINDS = ["all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor",
         "reduce_scatter", "reduce_scatter_tensor", "all_to_all_single", "all_to_all",
         "gather", "scatter", "barrier", "send_recv"]
RED = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "product": dist.ReduceOp.PRODUCT,
       "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX, "band": dist.ReduceOp.BAND,
       "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR}


# torch 2.13 renamed these (the old names warn); older ones have only the old names.
ALL_GATHER_TENSOR = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
REDUCE_SCATTER_TENSOR = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _inputs(step, rank, n, dtype, op):
    """Rank's input of step: n small integers (products stay small), as dtype."""
    g = torch.Generator().manual_seed(SEED * 1000003 + step * 101 + rank)
    if op == "product":
        t = torch.tensor([2, -1, 1, 1])[torch.randint(0, 4, (n,), generator=g)]
    else:
        t = torch.randint(-4, 5, (n,), generator=g)
    if dtype == torch.uint8:
        t = t.abs() if op != "product" else torch.ones(n, dtype=torch.int64)
    return t.to(dtype)


def _reduce(stack, op, world):
    """The reference, widened to float64 / int64 (test_backend's reduction)."""
    return _reduce_local(stack.to(torch.float64 if stack.is_floating_point() else torch.int64),
                         op, world)


class Step:
    """One draw of the sequence: the same on every rank."""

    def __init__(self, rng, idx, world):
        self.idx = idx
        self.kind = rng.choice(KINDS)
        self.dtype = rng.choice(DTYPES)
        ops = ["sum", "avg", "product", "min", "max"] if self.dtype.is_floating_point else \
            ["sum", "product", "min", "max", "band", "bor", "bxor"]
        self.op = rng.choice(ops)
        r = rng.random()
        self.n = rng.randint(0, 2) if r < 0.1 else rng.randint(1, 300) if r < 0.5 else \
            rng.randint(300, 40000) if r < 0.9 else rng.randint(40000, 300000)
        self.sub = rng.random() < 0.25
        self.root_draw = rng.randrange(64)
        # all_to_all_single splits: what rank s sends to rank d.
        self.splits = [[rng.randint(0, 64) for _ in range(world)] for _ in range(world)]


def _issue(step, group, members, me, world_rank):
    """Issues step on group; returns (works, check) where check() gives failures."""
    p = len(members)
    dt, n, op = step.dtype, step.n, step.op
    root = members[step.root_draw % p]          # a global rank
    root_idx = members.index(root)
    if step.kind in ("all_gather", "all_gather_into_tensor", "reduce_scatter",
                     "reduce_scatter_tensor", "all_to_all", "gather", "scatter"):
        n = n // p

    def inp(r, m=n):
        return _inputs(step.idx, r, m, dt, op)

    def want_red(m=n):
        return _reduce(torch.stack([inp(r, m) for r in range(p)]), op, p)

    works, checks = [], []

    def expect(what, got, want):
        want = want.to(got.dtype)
        if op == "avg" and got.is_floating_point():
            tol = 1e-2 if got.dtype in (torch.float16, torch.bfloat16) else 1e-6
            ok = torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)
        else:
            ok = torch.equal(got, want)
        if not ok:
            return [f"step {step.idx} {step.kind} {dt} {op} n={n} on {members}: {what}: "
                    f"got {got.tolist()[:6]}..., want {want.tolist()[:6]}..."]
        return []

    k = step.kind
    if k == "all_reduce":
        x = inp(me)
        works.append(dist.all_reduce(x, op=RED[op], group=group, async_op=True))
        checks.append(lambda: expect("result", x, want_red()))
    elif k == "reduce":
        x = inp(me)
        works.append(dist.reduce(x, dst=root, op=RED[op], group=group, async_op=True))
        if world_rank == root:
            checks.append(lambda: expect("root's result", x, want_red()))
    elif k == "broadcast":
        x = inp(me) if world_rank == root else torch.zeros(n, dtype=dt)
        works.append(dist.broadcast(x, src=root, group=group, async_op=True))
        checks.append(lambda: expect("root's data", x, inp(root_idx)))
    elif k == "all_gather":
        outs = [torch.zeros(n, dtype=dt) for _ in range(p)]
        works.append(dist.all_gather(outs, inp(me), group=group, async_op=True))
        checks.append(lambda: sum((expect(f"from {r}", outs[r], inp(r)) for r in range(p)), []))
    elif k == "all_gather_into_tensor":
        out = torch.zeros(n * p, dtype=dt)
        works.append(ALL_GATHER_TENSOR(out, inp(me), group=group, async_op=True))
        checks.append(lambda: expect("gathered", out, torch.cat([inp(r) for r in range(p)])))
    elif k in ("reduce_scatter", "reduce_scatter_tensor"):
        full = inp(me, n * p)
        out = torch.zeros(n, dtype=dt)
        if k == "reduce_scatter":
            works.append(dist.reduce_scatter(out, list(full.split(n)) if n else
                                             [full[:0]] * p, op=RED[op], group=group,
                                             async_op=True))
        else:
            works.append(REDUCE_SCATTER_TENSOR(out, full, op=RED[op], group=group,
                                                    async_op=True))
        checks.append(lambda: expect("my block", out, want_red(n * p)[me * n:(me + 1) * n]))
    elif k == "all_to_all_single":
        sp = step.splits
        x = inp(me, sum(sp[me][:p]))
        out = torch.zeros(sum(sp[s][me] for s in range(p)), dtype=dt)
        works.append(dist.all_to_all_single(out, x, output_split_sizes=[sp[s][me] for s in range(p)],
                                            input_split_sizes=sp[me][:p], group=group,
                                            async_op=True))

        def check_a2a():
            want = []
            for s in range(p):
                src = inp(s, sum(sp[s][:p]))
                off = sum(sp[s][:me])
                want.append(src[off:off + sp[s][me]])
            return expect("received", out, torch.cat(want))
        checks.append(check_a2a)
    elif k == "all_to_all":
        x = inp(me, n * p)
        outs = [torch.zeros(n, dtype=dt) for _ in range(p)]
        works.append(dist.all_to_all(outs, list(x.split(n)) if n else [x[:0]] * p, group=group,
                                     async_op=True))
        checks.append(lambda: sum((expect(f"from {s}", outs[s], inp(s, n * p)[me * n:(me + 1) * n])
                                   for s in range(p)), []))
    elif k == "gather":
        outs = [torch.zeros(n, dtype=dt) for _ in range(p)] if world_rank == root else None
        works.append(dist.gather(inp(me), gather_list=outs, dst=root, group=group, async_op=True))
        if world_rank == root:
            checks.append(lambda: sum((expect(f"from {r}", outs[r], inp(r)) for r in range(p)), []))
    elif k == "scatter":
        src = list(inp(root_idx, n * p).split(n)) if n else [torch.zeros(0, dtype=dt)] * p
        out = torch.zeros(n, dtype=dt)
        works.append(dist.scatter(out, scatter_list=src if world_rank == root else None,
                                  src=root, group=group, async_op=True))
        checks.append(lambda: expect("my block", out, inp(root_idx, n * p)[me * n:(me + 1) * n]))
    elif k == "barrier":
        works.append(dist.barrier(group=group, async_op=True))
    elif k == "send_recv" and p > 1:
        nxt, prv = members[(me + 1) % p], members[(me - 1) % p]
        out = torch.zeros(n, dtype=dt)
        works.append(dist.irecv(out, src=prv, group=group))
        works.append(dist.isend(inp(me), dst=nxt, group=group))
        checks.append(lambda: expect("from prev", out, inp((me - 1) % p)))
    return works, checks


def _soak(rank, world, gloo):
    rng = random.Random(SEED)
    local = random.Random(SEED * 7 + rank)      # the order of waiting differs per rank
    sub_members = list(range(0, world, 2))      # ranks 0, 2, ...: a subgroup
    sub = dist.new_group(sub_members)
    inflight, failures, kinds = [], [], {}
    for idx in range(OPS):
        step = Step(rng, idx, world)
        on_sub = step.sub and rank in sub_members
        if step.sub and rank not in sub_members:
            continue
        group, members = (sub, sub_members) if on_sub else (None, list(range(world)))
        while inflight and (len(inflight) >= MAX_INFLIGHT or local.random() < 0.3):
            works, checks = inflight.pop(local.randrange(len(inflight)))
            for w in works:
                w.wait()
            for c in checks:
                failures += c()
        me = members.index(rank)
        inflight.append(_issue(step, group, members, me, rank))
        kinds[step.kind] = kinds.get(step.kind, 0) + 1
    for works, checks in inflight:
        for w in works:
            w.wait()
        for c in checks:
            failures += c()
    if len(kinds) < len(KINDS) - 1:
        failures.append(f"the sequence covered only {sorted(kinds)}")
    return failures[:20]


@pytest.mark.parametrize("world", [2, 3])
def test_soak_random_mix(world):
    run_ranks(_soak, world, timeout=120)


def test_soak_random_mix_across_fake_nodes():
    run_ranks(_soak, 3, timeout=120, env=FAKE_NODES)
