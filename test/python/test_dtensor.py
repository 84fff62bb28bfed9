"""DTensor and tensor parallelism on the CPU over smddp, each job run again over gloo.

- distribute_tensor and redistribute: Shard(0) -> Replicate -> Shard(1), and
  Partial -> Replicate (an allreduce), on a 1-D mesh of 3 ranks;
- a tensor-parallel MLP (parallelize_module, ColwiseParallel then
  RowwiseParallel) on 2 ranks: output and gradients equal the unsharded
  module's, computed on one rank;
- FSDP2 (fully_shard) over the "dp" dimension of a 2 x 2 mesh whose "tp"
  dimension runs the same tensor-parallel MLP, 3 training steps;
- FSDP2 with its all-gather and reduce-scatter buffers from the group
  (`allocate_tensor`: smddp's pools), 2 ranks, 3 steps; smddp's flight
  recorder must show those collectives ran in the pools;
- functional collectives (torch.distributed._functional_collectives) inside a
  torch.compile'd function.

Every job runs with the default group on smddp, then on gloo, in fresh ranks;
the results must agree (exactly where no floating-point sum differs in order,
else to 1e-5).
"""

import pytest
import torch
import torch.distributed as dist

from smddp_support import requires_smddp
from test_training import run_ranks

pytestmark = requires_smddp

try:
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    HAVE_DTENSOR = True
except ImportError:  # an older torch
    HAVE_DTENSOR = False

needs_dtensor = pytest.mark.skipif(not HAVE_DTENSOR,
                                   reason=f"torch {torch.__version__} has no public DTensor")


def _both(fn, world, args=(), timeout=120):
    """fn's results on every rank with smddp, then with gloo, as (smddp, gloo)."""
    smddp_res, _ = run_ranks(fn, world, args=args, timeout=timeout)
    gloo_res, _ = run_ranks(fn, world, backend="gloo", args=args, timeout=timeout)
    for r in range(world):
        assert smddp_res[r]["backend"] == "smddp" and gloo_res[r]["backend"] == "gloo"
    return smddp_res, gloo_res


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))


# ---- distribute_tensor and redistribute ----------------------------------------------


def _redistribute(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(world * 4 * 5, dtype=torch.float32).reshape(world * 4, 5)
    rows = distribute_tensor(full, mesh, [Shard(0)])
    replicated = rows.redistribute(mesh, [Replicate()])
    cols = replicated.redistribute(mesh, [Shard(1)])
    partial = DTensor.from_local(torch.full((3,), float(rank + 1)), mesh, [Partial()])
    summed = partial.redistribute(mesh, [Replicate()])
    return {
        "backend": dist.get_backend(),
        "rows": rows.to_local().clone(),
        "replicated": replicated.to_local().clone(),
        "cols": cols.to_local().clone(),
        "cols_full": cols.full_tensor().clone(),
        "summed": summed.to_local().clone(),
    }


@needs_dtensor
def test_distribute_and_redistribute():
    world = 3
    sm, gl = _both(_redistribute, world)
    full = torch.arange(world * 4 * 5, dtype=torch.float32).reshape(world * 4, 5)
    for r in range(world):
        torch.testing.assert_close(sm[r]["rows"], full[4 * r:4 * r + 4], rtol=0, atol=0)
        torch.testing.assert_close(sm[r]["replicated"], full, rtol=0, atol=0)
        torch.testing.assert_close(sm[r]["cols_full"], full, rtol=0, atol=0)
        torch.testing.assert_close(sm[r]["summed"], torch.full((3,), 6.0), rtol=0, atol=0)
        for k in ("rows", "replicated", "cols", "cols_full", "summed"):
            torch.testing.assert_close(sm[r][k], gl[r][k], rtol=0, atol=0, msg=f"rank {r} {k}")


# ---- a tensor-parallel MLP ------------------------------------------------------------


def _tp_mlp(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    model = parallelize_module(_mlp(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    torch.manual_seed(1)
    x = torch.randn(4, 8)
    out = model(x)
    out.sum().backward()
    grads = [p.grad.full_tensor().clone() for p in model.parameters()]
    return {"backend": dist.get_backend(), "out": out.detach().clone(), "grads": grads}


@needs_dtensor
def test_tensor_parallel_mlp():
    world = 2
    sm, gl = _both(_tp_mlp, world)
    ref = _mlp()
    torch.manual_seed(1)
    x = torch.randn(4, 8)
    out = ref(x)
    out.sum().backward()
    for r in range(world):
        torch.testing.assert_close(sm[r]["out"], out.detach(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(sm[r]["out"], gl[r]["out"], rtol=1e-5, atol=1e-6)
        for i, p in enumerate(ref.parameters()):
            torch.testing.assert_close(sm[r]["grads"][i], p.grad, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(sm[r]["grads"][i], gl[r]["grads"][i], rtol=1e-5, atol=1e-6)


# ---- FSDP2 x TP on a 2 x 2 mesh -------------------------------------------------------


def _train(model, steps, seed, shape):
    """SGD steps of model on batches of shape seeded by seed; the losses and full parameters."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + seed)
        x, y = torch.randn(*shape, generator=g), torch.randn(*shape, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.full_tensor().detach().clone() for p in model.parameters()]


def _fsdp_tp(rank, world, steps):
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(_mlp(), mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    # One batch per dp rank.
    losses, params = _train(model, steps, mesh["dp"].get_local_rank(), (4, 8))
    return {"backend": dist.get_backend(), "losses": losses, "params": params}


@needs_dtensor
def test_fsdp2_with_tensor_parallel_on_a_2x2_mesh():
    world, steps = 4, 3
    sm, gl = _both(_fsdp_tp, world, args=(steps,), timeout=180)
    for r in range(world):
        torch.testing.assert_close(torch.tensor(sm[r]["losses"]), torch.tensor(gl[r]["losses"]),
                                   rtol=1e-5, atol=1e-6)
        for a, b in zip(sm[r]["params"], gl[r]["params"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        # Every rank holds the same full parameters.
        for a, b in zip(sm[r]["params"], sm[0]["params"]):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert sm[0]["losses"][-1] < sm[0]["losses"][0]


# ---- FSDP2 with its buffers in smddp's pools -------------------------------------------


def _fsdp_pooled(rank, world, steps):
    import json

    import smddp
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(3)])
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    # Every FSDP module asks the group for its all-gather and reduce-scatter buffers.
    for m in model.modules():
        if hasattr(m, "set_allocate_memory_from_process_group_for_comm"):
            m.set_allocate_memory_from_process_group_for_comm(True)
    losses, params = _train(model, steps, rank, (8, 64))
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    out = {"backend": dist.get_backend(), "losses": losses, "params": params,
           "supports": backend.supports_tensor_alloc(torch.device("cpu"))}
    if out["backend"] == "smddp":
        with open(smddp.dump_trace(path=f"/tmp/smddp-fsdp-pooled-{rank}.json")) as f:
            trace = json.load(f)
        ops = trace["ops"] if isinstance(trace, dict) else trace
        out["in_pools"] = sorted({op["kind"] for op in ops if op.get("algo") == "in pools"})
        # A pooled tensor outlives the group: it is packed after destroy_process_group.
        t = backend.allocate_tensor(1000, dtype=torch.float32, device=torch.device("cpu"))
        t.fill_(rank + 1)
        dist.all_reduce(t)
        out["pooled"] = t
    return out


@needs_dtensor
def test_fsdp2_with_buffers_in_pools():
    world, steps = 2, 3
    sm, gl = _both(_fsdp_pooled, world, args=(steps,), timeout=180)
    for r in range(world):
        assert sm[r]["supports"] and not gl[r]["supports"]
        torch.testing.assert_close(torch.tensor(sm[r]["losses"]), torch.tensor(gl[r]["losses"]),
                                   rtol=1e-5, atol=1e-6)
        for a, b in zip(sm[r]["params"], gl[r]["params"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        # FSDP's all-gathers and reduce-scatters ran in place in the pools.
        assert {"allgather", "reduce_scatter"} <= set(sm[r]["in_pools"]), sm[r]["in_pools"]
        assert torch.equal(sm[r]["pooled"], torch.full((1000,), 3.0))
    assert sm[0]["losses"][-1] < sm[0]["losses"][0]


# ---- functional collectives under torch.compile --------------------------------------


def _compiled_funcol(rank, world):
    import torch.distributed._functional_collectives as funcol

    group = dist.group.WORLD

    @torch.compile(fullgraph=True)
    def step(x):
        y = funcol.all_reduce(x * 2, "sum", group)
        z = funcol.all_gather_tensor(y + 1, 0, group)
        return funcol.reduce_scatter_tensor(z, "sum", 0, group)

    x = torch.arange(6, dtype=torch.float32) + rank
    return {"backend": dist.get_backend(), "out": step(x).clone()}


def test_functional_collectives_under_compile():
    world = 2
    sm, gl = _both(_compiled_funcol, world, timeout=300)
    # all_reduce: 2 x (the sum over ranks of arange + rank), then + 1; gathered
    # along dim 0 (world copies) and reduce-scattered: world x that, on every rank.
    base = sum(torch.arange(6, dtype=torch.float32) + r for r in range(world)) * 2 + 1
    for r in range(world):
        torch.testing.assert_close(sm[r]["out"], gl[r]["out"], rtol=0, atol=0)
        torch.testing.assert_close(sm[r]["out"], base * world, rtol=0, atol=0)


# ---- smddp's direct calls under torch.compile -----------------------------------------


def _compiled_direct_calls(rank, world):
    import smddp

    def step(x, out):
        y = x * 2
        smddp.all_reduce(y)
        smddp.all_reduce(y, dist.ReduceOp.MAX)
        smddp.all_gather_into_tensor(out, y + 1)
        return out * 3

    compiled = torch.compile(step, fullgraph=True)  # no graph break: torch.ops.smddp.*
    x = torch.arange(4, dtype=torch.float32) + rank
    out_c, out_e = torch.empty(4 * world), torch.empty(4 * world)
    got_c = compiled(x, out_c)
    got_e = step(x, out_e)
    return {"backend": dist.get_backend(), "compiled": (got_c.clone(), out_c.clone()),
            "eager": (got_e.clone(), out_e.clone())}


def test_direct_calls_under_compile():
    world = 2
    res, _ = run_ranks(_compiled_direct_calls, world, timeout=300)
    # x * 2 summed over ranks, + 1, gathered world times: the same on every rank.
    y = sum(torch.arange(4, dtype=torch.float32) + r for r in range(world)) * 2 + 1
    want_out = y.repeat(world)
    for r in range(world):
        for how in ("compiled", "eager"):
            got, out = res[r][how]
            torch.testing.assert_close(out, want_out, rtol=0, atol=0, msg=f"rank {r} {how} out")
            torch.testing.assert_close(got, want_out * 3, rtol=0, atol=0, msg=f"rank {r} {how}")
