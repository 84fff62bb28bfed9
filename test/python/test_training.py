"""Training through the torch backend "smddp", against gloo, and its failures.

- DDP: one small MLP trained 20 steps from one seed with smddp and with gloo
  (a gloo group of the same ranks, in the same processes) ends with the same
  parameters, to 1e-6 relative;
- DDP's own allreduce with its buckets from the group (``DDP_DISABLE_COMM_MEM``,
  which creating an smddp group set to 0) on 2 and 3 ranks equals DDP on
  gloo, runs every step "in pools" and leaves the gradients in the pool, also
  under ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` (torch's wrapper around the
  backend; the gloo reference then averages by hand, as torch's gloo DDP
  crashes there); with
  ``DDP_DISABLE_COMM_MEM=1`` set by the user, or across (fake) nodes, the
  buckets are torch's and staged;
- DDP's ``join()`` with uneven inputs (rank r: 4 + 2r batches) on 2 and 3
  ranks equals gloo's: pooled buckets of the ranks still training meet the
  joined ranks' zero buffers in ordinary memory;
- DDP with ``smddp.allreduce_hook`` and torch's buckets (moved into smddp's
  pools by the hook) on 2 and 3 ranks, with and without
  ``gradient_as_bucket_view``, equals DDP on gloo; the flight recorder shows every step's allreduce ran "in pools";
  across (fake) nodes, with no pools, it is an ordinary allreduce; on a gloo
  group the hook equals DDP's built-in allreduce. ``smddp.move_to_pool``
  keeps values and views, does not move a storage twice, and refuses a gloo
  group, an empty tensor and a group without pools;
- FSDP2 (``fully_shard``) on the CPU: smddp's losses and parameters match a
  gloo job's, when FSDP2 runs on the CPU with gloo in this torch;
- failures: a rank SIGKILLed mid-training makes the others raise, naming it,
  within the group's timeout; mismatched counts raise on every rank with
  "mismatch"; a collective after a failure raises at once;
- a DDP sub-group (``new_group``) of ranks 0 and 1 while the default group of
  three ranks is smddp.

Ranks are spawned processes initialised through TCP on 127.0.0.1 with a free
port; the parent waits a bounded time for each rank's report and kills
stragglers, so a hang fails a test instead of blocking the run.
"""

import io
import multiprocessing as mp
import os
import queue as queue_mod
import re
import signal
import socket
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist


from smddp_support import requires_smddp

pytestmark = requires_smddp

STEPS = 20
GROUP_TIMEOUT_S = 30      # timeout of init_process_group in the passing jobs
FAIL_TIMEOUT_S = 10       # timeout of init_process_group in the failure jobs
JOB_TIMEOUT_S = 50        # the parent's bound on a whole job


# ---- harness ----------------------------------------------------------------


def _free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pack(obj):
    """Bytes for the queue: torch's queue reducers would pass tensors as file
    descriptors, which die with the rank that sent them."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _unpack(data):
    return torch.load(io.BytesIO(data), weights_only=False)


def _rank_main(fn, rank, world, port, backend, group_timeout_s, queue, args, env):
    try:
        # "{rank}" in a value becomes this rank's number (per-rank host names).
        for k, v in (env or {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v.replace("{rank}", str(rank))
        if "TORCH_DISTRIBUTED_DEBUG" in (env or {}):
            dist.set_debug_level_from_env()  # read once, at torch's import
        torch.set_num_threads(1)  # 2 cores, up to 3 ranks
        import smddp  # noqa: F401  (registers the backend)

        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=group_timeout_s),
        )
        result = fn(rank, world, *args)
        queue.put((rank, "result", _pack(result)))
        dist.destroy_process_group()
        queue.put((rank, "destroyed", None))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, "error", traceback.format_exc()))


def run_ranks(fn, world, backend="smddp", args=(), group_timeout_s=GROUP_TIMEOUT_S,
              timeout=JOB_TIMEOUT_S, expect=None, env=None):
    """Runs fn(rank, world, *args) on world spawned ranks, `backend` the default group.

    expect: the ranks that must report (default: all); the others may die.
    env: extra environment variables for the ranks ("{rank}" is replaced; None
    unsets one).
    Fails when a rank raised, did not report its result, or did not get
    through destroy_process_group, all within `timeout` seconds in total.
    Returns (results, exitcodes).
    """
    expect = list(range(world)) if expect is None else list(expect)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main,
                         args=(fn, r, world, port, backend, group_timeout_s, queue, args,
                               env))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    results, destroyed, errors = {}, set(), {}
    try:
        while set(expect) - (destroyed | set(errors)):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, kind, payload = queue.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                continue
            if kind == "result":
                results[rank] = _unpack(payload)
            elif kind == "destroyed":
                destroyed.add(rank)
            else:
                errors[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=max(0.1, min(5.0, deadline + 5 - time.monotonic())))
            if p.is_alive():
                p.kill()
                p.join()
    exitcodes = [p.exitcode for p in procs]
    problems = []
    for r in expect:
        if r in errors:
            problems.append(f"rank {r} raised:\n{errors[r]}")
        elif r not in results:
            problems.append(f"rank {r} did not report within {timeout} s")
        elif r not in destroyed:
            problems.append(f"rank {r} hung in destroy_process_group (killed after {timeout} s)")
    assert not problems, "\n".join(problems) + f"\nexit codes: {exitcodes}"
    return results, exitcodes


# ---- the model and its data ----------------------------------------------------


def _make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))


def _batch(step, rank):
    g = torch.Generator().manual_seed(10_000 + 100 * step + rank)
    return torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)


def _train_ddp(group, rank, steps, kill_rank=None, kill_after=None, pooled=False):
    """Trains a DDP model over `group`; returns (params, losses).

    kill_rank SIGKILLs itself after kill_after steps (1 s into the next one, so
    that the others are already waiting for it); the others note the
    time at which their last step completed in _LAST_STEP_DONE. pooled:
    _pooled_model, whose buckets are allreduced two-shot in the pools.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    if pooled:
        model = DDP(_pooled_model(), process_group=group, bucket_cap_mb=0.25)
    else:
        model = DDP(_make_model(), process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        if kill_after is not None and step == kill_after and rank == kill_rank:
            time.sleep(1.0)  # the others are already waiting in this step's allreduce
            os.kill(os.getpid(), signal.SIGKILL)
        x, y = _batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        _LAST_STEP_DONE[0] = time.monotonic()
    return [p.detach().clone() for p in model.module.parameters()], losses


_LAST_STEP_DONE = [0.0]


def _assert_params_close(got, want, what, exact=False):
    assert len(got) == len(want), what
    rtol, atol = (0.0, 0.0) if exact else (1e-6, 1e-7)
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol,
                                   msg=lambda m, i=i: f"{what}, parameter {i}: {m}")


# ---- 1. DDP: smddp against gloo ---------------------------------------------------


def _ddp_both(rank, world):
    gloo = dist.new_group(backend="gloo")
    smddp_params, smddp_losses = _train_ddp(None, rank, STEPS)  # default group: smddp
    gloo_params, gloo_losses = _train_ddp(gloo, rank, STEPS)
    return {"backend": dist.get_backend(), "smddp": smddp_params, "gloo": gloo_params,
            "smddp_losses": smddp_losses, "gloo_losses": gloo_losses}


# Each rank on its own fake host: DDP's allreduces go through libfabric.
FAKE_NODES = {"SMDDP_HOSTNAME": "fake-node-{rank}", "FI_TCP_IFACE": "lo"}


@pytest.mark.parametrize("world,env", [(2, None), (3, None), (3, FAKE_NODES)],
                         ids=["2", "3", "3-fake-nodes"])
def test_ddp_smddp_equals_gloo(world, env):
    results, _ = run_ranks(_ddp_both, world, env=env)
    for r in range(world):
        res = results[r]
        assert res["backend"] == "smddp"
        _assert_params_close(res["smddp"], res["gloo"], f"rank {r}: smddp vs gloo after {STEPS} steps")
        torch.testing.assert_close(torch.tensor(res["smddp_losses"]), torch.tensor(res["gloo_losses"]),
                                   rtol=1e-6, atol=1e-7)
        # DDP keeps the replicas identical: every rank ends with exactly rank 0's
        # parameters (every rank must get the same allreduce result, bit for bit).
        _assert_params_close(res["smddp"], results[0]["smddp"], f"smddp: rank {r} vs rank 0",
                             exact=True)
    # And training did something.
    assert results[0]["smddp_losses"][-1] < results[0]["smddp_losses"][0]


# ---- 1b. DDP's buckets in the pools: from allocateTensor, or smddp.allreduce_hook ------------


def _trace_algos(rank, what):
    """{algo: count} of the allreduces in this rank's smddp flight recorder."""
    import json

    import smddp

    with open(smddp.dump_trace(path=f"/tmp/smddp-{what}-{os.getpid()}-{rank}.json")) as f:
        trace = json.load(f)
    ops = trace["ops"] if isinstance(trace, dict) else trace
    algos = {}
    for op in ops:
        if op["kind"] == "allreduce":
            algos[op.get("algo")] = algos.get(op.get("algo"), 0) + 1
    return algos


# Whether creating an smddp group sets DDP_DISABLE_COMM_MEM=0 (DDP's buckets from the group).
_SETS_COMM_MEM = not torch.backends.cuda.is_built() and not torch.xpu._is_compiled()


def _pooled_model():
    # Every bucket (at most 0.25 MB; DDP fills them from the last layer)
    # above one-shot's size, which stages in place: each bucket is
    # allreduced two-shot, in place in the pools.
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 8))


def _train_pooled(group, rank, bucket_view, hook):
    """_pooled_model under DDP over `group` for 8 steps, with smddp's hook if
    `hook`; returns (params, losses, whether the gradients lie in the pool).
    The gradients DDP hands the optimizer are the buckets' (views of them,
    with gradient_as_bucket_view): pooled when the buckets are."""
    import smddp
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = _pooled_model()
    ddp = DDP(model, process_group=group, bucket_cap_mb=0.25, gradient_as_bucket_view=bucket_view)
    if hook:
        ddp.register_comm_hook(group, smddp.allreduce_hook)
    losses = _train_steps(ddp, rank)
    pooled = all(smddp.move_to_pool(p.grad) and p.grad.data_ptr() == before
                 for p in ddp.parameters() for before in [p.grad.data_ptr()])
    return [p.detach().clone() for p in model.parameters()], losses, pooled


def _train_steps(model, rank, after_backward=None):
    """8 SGD steps (momentum 0.9) of model on rank's batches, after_backward()
    between backward and the optimizer's step; returns the losses."""
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(8):
        x, y = _batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        if after_backward:
            after_backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _train_by_hand(group, rank):
    """_train_pooled's training without DDP: each gradient allreduced over
    `group` and divided by its size, as DDP does; returns the same triple."""
    model = _pooled_model()

    def average():
        for p in model.parameters():
            p.grad.div_(dist.get_world_size(group))
            dist.all_reduce(p.grad, group=group)

    losses = _train_steps(model, rank, average)
    return [p.detach().clone() for p in model.parameters()], losses, False


def _assert_pooled_ddp(results, r, params, losses, pooled):
    """Rank r's smddp DDP (results[r][params], [losses]) equals its gloo DDP,
    bit for bit rank 0's; every step's buckets went through the pools (each
    allreduce "in pools"), or, where not pooled, none did."""
    res = results[r]
    _assert_params_close(res[params], res["gloo"], f"rank {r}: smddp vs gloo")
    torch.testing.assert_close(torch.tensor(res[losses]), torch.tensor(res["gloo_losses"]),
                               rtol=1e-6, atol=1e-7)
    _assert_params_close(res[params], results[0][params], f"rank {r} vs rank 0", exact=True)
    if pooled:
        assert set(res["algos"]) == {"in pools"} and res["algos"]["in pools"] >= 8, res["algos"]
    else:
        assert "in pools" not in res["algos"], res["algos"]


def _ddp_builtin_pooled(rank, world, bucket_view):
    """DDP's built-in allreduce, nothing changed in the script: smddp's group
    creation let DDP take its buckets from the group (allocateTensor)."""

    def train(group):
        return _train_pooled(group, rank, bucket_view, False)

    gloo = dist.new_group(backend="gloo")
    params, losses, pooled = train(None)
    algos = _trace_algos(rank, "ddp-builtin")
    if dist.get_debug_level() == dist.DebugLevel.DETAIL:
        # torch's DDP on gloo crashes under DETAIL (its logger takes the
        # wrapper for a ProcessGroupGloo); the reference trains by hand.
        gloo_params, gloo_losses, gloo_pooled = _train_by_hand(gloo, rank)
    else:
        gloo_params, gloo_losses, gloo_pooled = train(gloo)
    backend = type(dist.group.WORLD._get_backend(torch.device("cpu"))).__name__
    return {"env": os.environ.get("DDP_DISABLE_COMM_MEM"), "backend": backend,
            "params": params, "losses": losses,
            "gloo": gloo_params, "gloo_losses": gloo_losses, "algos": algos,
            "grads_pooled": pooled, "gloo_grads_pooled": gloo_pooled}


@pytest.mark.parametrize("world,bucket_view,env",
                         [(2, True, None), (3, True, None), (2, False, None),
                          (3, True, FAKE_NODES), (2, True, {"DDP_DISABLE_COMM_MEM": "1"}),
                          (2, True, {"SMDDP_SHM_POOL_RESERVE_PCT": "100"}),
                          (2, True, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})],
                         ids=["2", "3", "2-grads-apart", "3-fake-nodes", "2-torch-buckets",
                              "2-shm-reserved", "2-debug-detail"])
def test_ddp_builtin_buckets_in_pools(world, bucket_view, env):
    """Where the user set DDP_DISABLE_COMM_MEM=1, torch's buckets are kept
    (and staged); across nodes there are no pools; where the pool may not
    take /dev/shm (all of it reserved for others), the buckets come from
    ordinary memory and are staged. smddp sets the variable
    only in a torch built without CUDA and XPU: otherwise it stays unset,
    and DDP keeps torch's buckets."""
    # Unset unless the case sets it: smddp must set it itself.
    results, _ = run_ranks(_ddp_builtin_pooled, world, args=(bucket_view,), timeout=120,
                           env={"DDP_DISABLE_COMM_MEM": None, **(env or {})})
    sets = _SETS_COMM_MEM
    user = (env or {}).get("DDP_DISABLE_COMM_MEM")
    # Under DETAIL, torch wraps the backend in its ProcessGroupWrapper, which
    # forwards the bucket allocation; smddp's calls find the backend inside.
    detail = env == {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}
    pooled = (env is None or detail) and sets
    for r in range(world):
        res = results[r]
        assert (res["backend"] == "_ProcessGroupWrapper") == detail, res["backend"]
        assert res["env"] == (user if user is not None else "0" if sets else None), res["env"]
        _assert_pooled_ddp(results, r, "params", "losses", pooled)
        assert res["algos"], res["algos"]
        # The gradients are the buckets' views only with gradient_as_bucket_view.
        assert res["grads_pooled"] == (pooled and bucket_view), res["grads_pooled"]
        # A gloo group allocates no tensors: its DDP keeps torch's buckets.
        assert not res["gloo_grads_pooled"]
    assert results[0]["losses"][-1] < results[0]["losses"][0]


def _ddp_uneven(rank, world):
    """DDP's join() for uneven inputs: rank r has 4 + 2r batches. Ranks that
    ran out shadow the others' allreduces with zero buffers of their own
    (torch's memory) while the others' buckets lie in the pools."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    def train(group):
        model = _pooled_model()
        ddp = DDP(model, process_group=group, bucket_cap_mb=0.25)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        with ddp.join():
            for step in range(4 + 2 * rank):
                x, y = _batch(step, rank)
                opt.zero_grad()
                torch.nn.functional.mse_loss(ddp(x), y).backward()
                opt.step()
        return [p.detach().clone() for p in model.parameters()]

    gloo = dist.new_group(backend="gloo")
    params = train(None)
    algos = _trace_algos(rank, "uneven")
    return {"params": params, "gloo": train(gloo), "algos": algos}


def _ddp_powersgd(rank, world, bucket_mb):
    """DDP with torch's PowerSGD hook, whose Future callbacks issue the next
    allreduces and wait for them. With several buckets, whether a callback
    runs before or after the main thread queues the next bucket depends on
    timing. The gloo reference waits for each bucket inside the hook, so
    that its collectives come in one order (gloo hangs otherwise)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    def waited(state, bucket):
        fut = psgd.powerSGD_hook(state, bucket)
        fut.wait()
        return fut

    def train(group, hook):
        model = _pooled_model()
        ddp = DDP(model, process_group=group, bucket_cap_mb=bucket_mb)
        state = psgd.PowerSGDState(process_group=group, matrix_approximation_rank=1,
                                   start_powerSGD_iter=2, random_seed=0)
        ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        for step in range(8):
            x, y = _batch(step, rank)
            opt.zero_grad()
            torch.nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
        buckets = ddp._get_ddp_logging_data()["rebuilt_bucket_sizes"].count(",") + 1
        return [p.detach().clone() for p in model.parameters()], buckets

    params, buckets = train(None, psgd.powerSGD_hook)
    gloo, _ = train(dist.new_group(backend="gloo"), waited)
    return {"params": params, "gloo": gloo, "buckets": buckets}


@pytest.mark.parametrize("world,bucket_mb", [(2, 25), (2, 0.25), (3, 0.25)],
                         ids=["2-one-bucket", "2-buckets", "3-buckets"])
def test_ddp_powersgd_hook(world, bucket_mb):
    results, _ = run_ranks(_ddp_powersgd, world, args=(bucket_mb,), timeout=120)
    for r in range(world):
        res = results[r]
        assert (res["buckets"] == 1) == (bucket_mb == 25), res["buckets"]
        _assert_params_close(res["params"], res["gloo"], f"rank {r}: smddp vs gloo")
        _assert_params_close(res["params"], results[0]["params"], f"rank {r} vs rank 0",
                             exact=True)
    assert not torch.equal(results[0]["params"][0], _pooled_model()[0].weight.detach())


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_join_uneven_inputs(world):
    results, _ = run_ranks(_ddp_uneven, world, timeout=120)
    for r in range(world):
        res = results[r]
        _assert_params_close(res["params"], res["gloo"], f"rank {r}: smddp vs gloo")
        _assert_params_close(res["params"], results[0]["params"], f"rank {r} vs rank 0",
                             exact=True)
        # Steps where every rank trains run in the pools; the shadowed ones do not.
        assert res["algos"].get("in pools", 0) >= 4 and len(res["algos"]) > 1, res["algos"]


def _ddp_hooked(rank, world, bucket_view):
    def train(group, hook):
        return _train_pooled(group, rank, bucket_view, hook)

    gloo = dist.new_group(backend="gloo")
    hooked_params, hooked_losses, grads_pooled = train(None, True)
    algos = _trace_algos(rank, "ddp-hook")
    gloo_params, gloo_losses, _ = train(gloo, False)
    # On a gloo group the hook is an ordinary allreduce.
    gloo_hooked_params, _, _ = train(gloo, True)
    return {"backend": dist.get_backend(), "hooked": hooked_params, "gloo": gloo_params,
            "gloo_hooked": gloo_hooked_params, "hooked_losses": hooked_losses,
            "gloo_losses": gloo_losses, "algos": algos, "grads_pooled": grads_pooled}


@pytest.mark.parametrize("world,bucket_view,env", [(2, False, None), (3, True, None),
                                                    (3, True, FAKE_NODES)],
                         ids=["2", "3-bucket-view", "3-fake-nodes"])
def test_ddp_allreduce_hook_in_pools(world, bucket_view, env):
    """DDP keeps torch's buckets (DDP_DISABLE_COMM_MEM=1, as in a torch with
    CUDA), so the hook must move them. Across nodes there are no pools: the
    hook is an ordinary allreduce."""
    results, _ = run_ranks(_ddp_hooked, world, args=(bucket_view,), timeout=120,
                           env={**(env or {}), "DDP_DISABLE_COMM_MEM": "1"})
    pooled = env is None
    for r in range(world):
        res = results[r]
        _assert_pooled_ddp(results, r, "hooked", "hooked_losses", pooled)
        _assert_params_close(res["gloo_hooked"], res["gloo"], f"rank {r}: hooked gloo vs gloo")
        assert res["grads_pooled"] == (bucket_view and pooled), res["grads_pooled"]
    assert results[0]["hooked_losses"][-1] < results[0]["hooked_losses"][0]


def _move_to_pool(rank, world):
    import smddp

    out = {}
    t = torch.arange(100_000, dtype=torch.float32) + rank
    view = t[10:20]
    before = t.data_ptr()
    out["moved"] = smddp.move_to_pool(t)
    out["new_address"] = t.data_ptr() != before
    out["values_kept"] = torch.equal(t, torch.arange(100_000, dtype=torch.float32) + rank)
    out["view_follows"] = view.data_ptr() == t.data_ptr() + 40 and view[0].item() == 10 + rank
    at = t.data_ptr()
    out["again"] = smddp.move_to_pool(view) and t.data_ptr() == at   # same storage: no copy
    dist.all_reduce(t)
    out["sum_ok"] = torch.equal(t, sum(torch.arange(100_000, dtype=torch.float32) + r
                                       for r in range(world)))
    backend = dist.group.WORLD._get_backend(torch.device("cpu"))
    a = backend.allocate_tensor(1000, dtype=torch.float32, device=torch.device("cpu"))
    at = a.data_ptr()
    out["allocated"] = smddp.move_to_pool(a) and a.data_ptr() == at
    gloo = dist.new_group(backend="gloo")
    g = torch.ones(1000)
    at = g.data_ptr()
    out["gloo"] = smddp.move_to_pool(g, group=gloo) or g.data_ptr() != at
    out["empty"] = smddp.move_to_pool(torch.empty(0))
    out["algos"] = _trace_algos(rank, "move")
    # A tensor in another group's pool moves into this group's.
    other = dist.new_group(backend="smddp")
    at = t.data_ptr()
    out["to_other"] = smddp.move_to_pool(t, group=other) and t.data_ptr() != at
    at = t.data_ptr()
    out["to_other_again"] = smddp.move_to_pool(t, group=other) and t.data_ptr() == at
    dist.all_reduce(t, group=other)
    out["other_sum_ok"] = torch.equal(t, world * sum(torch.arange(100_000, dtype=torch.float32)
                                                     + r for r in range(world)))
    return out


def _pool_full(rank, world):
    import smddp

    big, small = torch.ones(2 << 20), torch.ones(16 << 10)     # 8 MiB, 64 KiB
    return {"big": smddp.move_to_pool(big), "small": smddp.move_to_pool(small),
            "big_again": smddp.move_to_pool(big), "values": bool((big == 1).all())}


def test_move_to_pool():
    results, _ = run_ranks(_move_to_pool, 2)
    for r in range(2):
        res = results[r]
        for k in ("moved", "new_address", "values_kept", "view_follows", "again", "sum_ok",
                  "allocated"):
            assert res[k], (r, k, res)
        assert not res["gloo"] and not res["empty"], res
        assert res["algos"].get("in pools") == 1, res["algos"]
        assert res["to_other"] and res["to_other_again"] and res["other_sum_ok"], res
    # Without pools (SMDDP_SHM_POOL_SIZE=0) nothing moves; the allreduce is staged.
    results, _ = run_ranks(_move_to_pool, 2, env={"SMDDP_SHM_POOL_SIZE": "0"})
    for r in range(2):
        res = results[r]
        assert not res["moved"] and not res["new_address"] and res["sum_ok"], res
        assert "in pools" not in res["algos"], res["algos"]
    # A pool too small for one tensor still takes a smaller one afterwards.
    results, _ = run_ranks(_pool_full, 2, env={"SMDDP_SHM_POOL_SIZE": "1M"})
    for r in range(2):
        assert results[r] == {"big": False, "small": True, "big_again": False, "values": True}, \
            results[r]


# ---- 2. FSDP2 on the CPU ------------------------------------------------------------


def _fsdp_train(rank, world, steps):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    model = _make_model()
    fully_shard(model[0], mesh=mesh)
    fully_shard(model[2], mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = _batch(step, rank)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    full = [p.full_tensor().detach().clone() for p in model.parameters()]
    return {"backend": dist.get_backend(), "losses": losses, "params": full}


def _fsdp_with_gloo(world, steps):
    """(None, gloo's results) when FSDP2 trains on the CPU with gloo here, else (why not, None)."""
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except Exception as err:  # noqa: BLE001
        return f"torch {torch.__version__} has no FSDP2 fully_shard: {type(err).__name__}: {err}", None
    try:
        return None, run_ranks(_fsdp_train, world, backend="gloo", args=(steps,))[0]
    except AssertionError as err:
        return f"FSDP2 does not train on the CPU with gloo in torch {torch.__version__}: {err}", None


def test_fsdp2_smddp_matches_gloo():
    world, steps = 2, 5
    why_not, gloo = _fsdp_with_gloo(world, steps)
    if why_not is not None:
        pytest.skip(why_not)
    results, _ = run_ranks(_fsdp_train, world, args=(steps,))
    for r in range(world):
        assert results[r]["backend"] == "smddp"
        torch.testing.assert_close(torch.tensor(results[r]["losses"]),
                                   torch.tensor(gloo[r]["losses"]), rtol=1e-6, atol=1e-7)
        _assert_params_close(results[r]["params"], gloo[r]["params"],
                             f"FSDP2 rank {r}: smddp vs gloo after {steps} steps")


# ---- 3. failures --------------------------------------------------------------------


def _killed_mid_training(rank, world, kill_rank, kill_after, pooled):
    """kill_rank dies after kill_after DDP steps; the others must raise."""
    try:
        _train_ddp(None, rank, STEPS, kill_rank=kill_rank, kill_after=kill_after, pooled=pooled)
        return {"raised": None}
    except RuntimeError as err:
        raised_after = time.monotonic() - _LAST_STEP_DONE[0]
        msg = f"{type(err).__name__}: {err}"
    algos = _trace_algos(rank, "killed")
    # (c) the group is aborted: the next collective raises at once.
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        after = None
    except RuntimeError as err:
        after = f"{type(err).__name__}: {err}"
    return {"raised": msg, "raised_after": raised_after, "algos": algos,
            "next": after, "next_after": time.monotonic() - start}


@pytest.mark.parametrize("world,kill_rank,pooled", [(2, 1, False), (3, 1, False), (3, 0, False),
                                                    (3, 2, True)],
                         ids=["2-1", "3-1", "3-0", "3-2-in-pools"])
def test_rank_killed_mid_training_raises_naming_it(world, kill_rank, pooled):
    """kill_rank 0 also takes torch's TCPStore (hosted by rank 0) down with
    it. The peers read and write the dead rank's buckets in place in the
    pools (two-shot from the first step with the larger model)."""
    kill_after = 3
    survivors = [r for r in range(world) if r != kill_rank]
    start = time.monotonic()
    results, exitcodes = run_ranks(_killed_mid_training, world,
                                   args=(kill_rank, kill_after, pooled),
                                   group_timeout_s=FAIL_TIMEOUT_S, expect=survivors,
                                   timeout=FAIL_TIMEOUT_S + 25)
    assert exitcodes[kill_rank] == -signal.SIGKILL, exitcodes
    for r in survivors:
        res = results[r]
        print(f"rank {r}: raised {res.get('raised_after', 0):.2f} s after its last step: "
              f"{res['raised']}\n  next collective, {res.get('next_after', 0):.3f} s: {res.get('next')}")
        assert res["raised"] is not None, f"rank {r} trained {STEPS} steps without its peer"
        assert f"rank {kill_rank}" in res["raised"], f"rank {r}: {res['raised']}"
        # Within the group's timeout (a little slack for a loaded 2-core machine).
        assert res["raised_after"] < FAIL_TIMEOUT_S + 2, (r, res["raised_after"], res["raised"])
        assert res["next"] is not None, f"rank {r}: a collective after the failure succeeded"
        assert res["next_after"] < 2, (r, res["next_after"], res["next"])
        # DDP's buckets lie in the pools where smddp sets DDP_DISABLE_COMM_MEM
        # (a torch without CUDA and XPU): the small model's one bucket runs in
        # the pools from its second step, the larger model's from the first.
        assert ("in pools" in res["algos"]) == _SETS_COMM_MEM, res["algos"]
    assert time.monotonic() - start < FAIL_TIMEOUT_S + 25


def _stalled_rank(rank, world, stall_rank, stall_s):
    """stall_rank stops issuing for stall_s (> the group timeout) after 3 DDP steps."""
    _train_ddp(None, rank, 3)
    if rank == stall_rank:
        time.sleep(stall_s)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(10))
        msg = None
    except RuntimeError as err:
        msg = f"{type(err).__name__}: {err}"
    return {"raised": msg, "took": time.monotonic() - start}


def test_stalled_rank_times_out_naming_it():
    # A rank that is alive but never arrives: the others give up after the
    # group's timeout, naming it; the late rank then finds the group aborted.
    world, stall_rank, stall_s = 2, 1, FAIL_TIMEOUT_S + 2
    results, _ = run_ranks(_stalled_rank, world, args=(stall_rank, stall_s),
                           group_timeout_s=FAIL_TIMEOUT_S, timeout=FAIL_TIMEOUT_S + 35)
    for r in range(world):
        res = results[r]
        print(f"rank {r}: raised in {res['took']:.3f} s: {res['raised']}")
        assert res["raised"] is not None, f"rank {r}: the allreduce succeeded"
    waiter = results[1 - stall_rank]
    assert re.search(rf"rank(\(s\))? {stall_rank}\b", waiter["raised"]), waiter["raised"]
    assert FAIL_TIMEOUT_S - 1 < waiter["took"] < FAIL_TIMEOUT_S + 2, waiter
    assert results[stall_rank]["took"] < 2, results[stall_rank]


def _mismatched_counts(rank, world):
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(10 + rank))
        msg = None
    except RuntimeError as err:
        msg = f"{type(err).__name__}: {err}"
    took = time.monotonic() - start
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
        after = None
    except RuntimeError as err:
        after = f"{type(err).__name__}: {err}"
    return {"raised": msg, "took": took, "next": after, "next_after": time.monotonic() - start}


def test_mismatched_counts_raise_on_every_rank():
    # No SMDDP_CHECK_ORDER: every collective checks its peers' (seq, op, count, ...).
    assert "SMDDP_CHECK_ORDER" not in os.environ
    world = 2
    results, _ = run_ranks(_mismatched_counts, world, group_timeout_s=FAIL_TIMEOUT_S,
                           timeout=FAIL_TIMEOUT_S + 25)
    for r in range(world):
        res = results[r]
        print(f"rank {r}: raised in {res['took']:.3f} s: {res['raised']}\n"
              f"  next collective, {res['next_after']:.3f} s: {res['next']}")
        assert res["raised"] is not None, f"rank {r}: counts 10 and 11 did not raise"
        assert "mismatch" in res["raised"], f"rank {r}: {res['raised']}"
        assert res["took"] < FAIL_TIMEOUT_S, (r, res["took"])
        assert res["next"] is not None, f"rank {r}: a collective after the mismatch succeeded"
        assert res["next_after"] < 2, (r, res["next_after"], res["next"])


# ---- 4. a DDP sub-group beside the default smddp group ---------------------------------


def _ddp_subgroup(rank, world):
    members = [0, 1]
    sub = dist.new_group(members)                    # smddp, like the default group
    sub_gloo = dist.new_group(members, backend="gloo")
    out = {"backend": dist.get_backend()}
    if rank in members:
        out["sub_backend"] = dist.get_backend(sub)
        out["smddp"], _ = _train_ddp(sub, rank, STEPS)
        out["gloo"], _ = _train_ddp(sub_gloo, rank, STEPS)
    # The default group still works with every rank, afterwards.
    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x)
    out["world_sum"] = x
    return out


def test_ddp_on_new_group_subset():
    world = 3
    results, _ = run_ranks(_ddp_subgroup, world)
    for r in range(world):
        res = results[r]
        assert res["backend"] == "smddp"
        torch.testing.assert_close(res["world_sum"], torch.full((5,), 6.0), rtol=0, atol=0)
    for r in (0, 1):
        res = results[r]
        assert res["sub_backend"] == "smddp"
        _assert_params_close(res["smddp"], res["gloo"], f"sub-group rank {r}: smddp vs gloo")
        _assert_params_close(res["smddp"], results[0]["smddp"], f"sub-group rank {r} vs rank 0",
                             exact=True)


# ---- recovery: shrink_group ---------------------------------------------------


def _shrink_after_death(rank, world, kill_rank):
    """kill_rank dies; the survivors catch the failure, shrink, and check every
    collective on the shrunk group against a gloo group of the same ranks."""
    t = torch.ones(8)
    dist.all_reduce(t)
    if rank == kill_rank:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        dist.all_reduce(t)
        return {"failed": "an allreduce with a dead rank succeeded"}
    except RuntimeError:
        pass
    pg = dist.shrink_group([kill_rank], shrink_flags=1)  # SHRINK_ABORT
    new_rank, new_world = dist.get_rank(), dist.get_world_size()
    x = torch.arange(6, dtype=torch.float32) + new_rank
    dist.all_reduce(x)
    took = time.monotonic() - start
    gloo = dist.new_group(backend="gloo")
    bad = []

    def same(what, got, want):
        if not torch.equal(got, want):
            bad.append(f"{what}: {got.tolist()} vs {want.tolist()}")

    want = torch.arange(6, dtype=torch.float32) + new_rank
    dist.all_reduce(want, group=gloo)
    same("all_reduce", x, want)
    y = torch.arange(4, dtype=torch.float32) * (new_rank + 1)
    got, ref = torch.empty(4 * new_world), torch.empty(4 * new_world)
    dist.all_gather_into_tensor(got, y)
    dist.all_gather_into_tensor(ref, y, group=gloo)
    same("all_gather", got, ref)
    big = torch.arange(4 * new_world, dtype=torch.float32) + new_rank
    rs, full = torch.empty(4), big.clone()
    dist.reduce_scatter_tensor(rs, big)
    dist.all_reduce(full, group=gloo)
    same("reduce_scatter", rs, full[4 * new_rank:4 * (new_rank + 1)])
    b, c = y.clone(), y.clone()
    dist.broadcast(b, src=new_world - 1)
    dist.broadcast(c, src=new_world - 1, group=gloo)
    same("broadcast", b, c)
    a2a, a2a_ref = torch.empty(4 * new_world), torch.empty(4 * new_world)
    src = torch.arange(4 * new_world, dtype=torch.float32) + 100 * new_rank
    dist.all_to_all_single(a2a, src)
    dist.all_to_all_single(a2a_ref, src, group=gloo)
    same("all_to_all", a2a, a2a_ref)
    dist.barrier()
    return {"failed": "; ".join(bad) or None, "world": new_world, "rank": new_rank,
            "seconds": took, "pg_is_default": pg == dist.group.WORLD}


@pytest.mark.skipif(not hasattr(dist, "shrink_group"), reason="this torch has no shrink_group")
@pytest.mark.parametrize("world,kill_rank", [(3, 2), (4, 1)])
def test_shrink_group_after_a_death(world, kill_rank):
    survivors = [r for r in range(world) if r != kill_rank]
    results, exitcodes = run_ranks(_shrink_after_death, world, args=(kill_rank,),
                                   group_timeout_s=FAIL_TIMEOUT_S, expect=survivors,
                                   timeout=FAIL_TIMEOUT_S + 40)
    assert exitcodes[kill_rank] == -signal.SIGKILL, exitcodes
    for r in survivors:
        res = results[r]
        print(f"rank {r}: death to first collective on the shrunk group {res['seconds']:.3f} s")
        assert res["failed"] is None, f"rank {r}: {res['failed']}"
        assert res["world"] == world - 1 and res["rank"] == r - (r > kill_rank), (r, res)
        assert res["pg_is_default"], f"rank {r}: the shrunk group is not the default group"


def _shrink_subgroup_after_death(rank, world):
    """In a sub-group of ranks 0-2, rank 2 dies; 0 and 1 shrink the sub-group
    and use it; rank 3, outside it, is not involved."""
    sub = dist.new_group([0, 1, 2])
    if rank == 3:
        time.sleep(4)
        return {"failed": None}
    t = torch.ones(4)
    dist.all_reduce(t, group=sub)
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        dist.all_reduce(t, group=sub)
        return {"failed": "an allreduce with a dead rank succeeded"}
    except RuntimeError:
        pass
    small = dist.shrink_group([2], group=sub, shrink_flags=1)
    x = torch.full((4,), float(rank + 1))
    dist.all_reduce(x, group=small)
    ok = torch.equal(x, torch.full((4,), 3.0)) and small.size() == 2
    return {"failed": None if ok else f"after the shrink: {x.tolist()} on {small.size()} ranks"}


@pytest.mark.skipif(not hasattr(dist, "shrink_group"), reason="this torch has no shrink_group")
def test_shrink_group_of_a_subgroup():
    results, exitcodes = run_ranks(_shrink_subgroup_after_death, 4, expect=[0, 1, 3],
                                   group_timeout_s=FAIL_TIMEOUT_S, timeout=FAIL_TIMEOUT_S + 40)
    assert exitcodes[2] == -signal.SIGKILL, exitcodes
    for r in (0, 1, 3):
        assert results[r]["failed"] is None, f"rank {r}: {results[r]['failed']}"
