"""The backend on CUDA tensors: 2 and 4 ranks sharing GPU 0.

Every rank runs the collective with smddp on a CUDA tensor and recomputes the
reference through a gloo group on CPU copies of every rank's input (exact
for these small integers, except AVG). Skips, saying so, where torch sees no
GPU: these run on GPU machines (bench/gpu_check.sh) and are collected, then
skipped, everywhere else.
"""

import pytest
import torch
import torch.distributed as dist

from smddp_support import requires_smddp
from test_backend import run_ranks

pytestmark = [
    pytest.mark.gpu,
    requires_smddp,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="no CUDA device visible to torch: GPU tests run on GPU machines only"),
]

GPU_TIMEOUT_S = 120


def _inputs(dtype, rank, n, salt):
    g = torch.Generator().manual_seed(7919 * salt + 31 * rank + n)
    return torch.randint(-3, 4, (n,), generator=g).to(dtype)


def _all_inputs(dtype, world, n, salt):
    return [_inputs(dtype, r, n, salt) for r in range(world)]


def _check_collectives(rank, world, gloo):
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    failures = []

    def expect(name, got, want, atol=0.0):
        got = got.cpu()
        if got.dtype != want.dtype or got.shape != want.shape or not torch.allclose(
                got.double(), want.double(), atol=atol, rtol=0):
            failures.append(f"{name}: got {got[:6].tolist()}..., want {want[:6].tolist()}...")

    # The gloo group must see the same inputs: it is the reference's transport.
    probe = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(probe, group=gloo)
    assert probe.item() == world * (world - 1) // 2

    for dtype in [torch.float32, torch.bfloat16, torch.float16, torch.int32]:
        for n in [37, 300001]:
            xs = _all_inputs(dtype, world, n, 1)
            stack = torch.stack([x.double() for x in xs])
            for op, want in [(dist.ReduceOp.SUM, stack.sum(0)), (dist.ReduceOp.MAX, stack.max(0).values),
                             (dist.ReduceOp.MIN, stack.min(0).values)]:
                t = xs[rank].to(dev)
                dist.all_reduce(t, op=op)
                expect(f"all_reduce {op} {dtype} n={n}", t, want.to(dtype))
            if dtype.is_floating_point:
                t = xs[rank].to(dev)
                dist.all_reduce(t, op=dist.ReduceOp.AVG)
                expect(f"all_reduce AVG {dtype}", t, (stack.sum(0) / world).to(dtype),
                       atol=1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6)

            # all_gather_into_tensor / reduce_scatter_tensor / all_gather list
            out = torch.empty(world * n, dtype=dtype, device=dev)
            dist.all_gather_into_tensor(out, xs[rank].to(dev))
            expect(f"all_gather_into_tensor {dtype}", out, torch.cat(xs))
            outs = [torch.empty(n, dtype=dtype, device=dev) for _ in range(world)]
            dist.all_gather(outs, xs[rank].to(dev))
            for r in range(world):
                expect(f"all_gather[{r}] {dtype}", outs[r], xs[r])
            big = _all_inputs(dtype, world, world * n, 2)
            rs = torch.empty(n, dtype=dtype, device=dev)
            dist.reduce_scatter_tensor(rs, big[rank].to(dev))
            want = torch.stack([b.double() for b in big]).sum(0)[rank * n:(rank + 1) * n]
            expect(f"reduce_scatter_tensor {dtype}", rs, want.to(dtype))

            # broadcast, reduce, all_to_all_single (equal splits)
            t = xs[rank].to(dev)
            dist.broadcast(t, src=world - 1)
            expect(f"broadcast {dtype}", t, xs[world - 1])
            t = xs[rank].to(dev)
            dist.reduce(t, dst=0)
            if rank == 0:
                expect(f"reduce {dtype}", t, stack.sum(0).to(dtype))
            a2a = torch.empty(world * n, dtype=dtype, device=dev)
            dist.all_to_all_single(a2a, big[rank].to(dev))
            expect(f"all_to_all_single {dtype}", a2a,
                   torch.cat([b[rank * n:(rank + 1) * n] for b in big]))

    # A non-contiguous tensor is staged and written back on the stream.
    m = torch.arange(12, dtype=torch.float32, device=dev).reshape(3, 4).t()
    dist.all_reduce(m)
    expect("all_reduce non-contiguous", m,
           (torch.arange(12, dtype=torch.float32).reshape(3, 4).t() * world))

    # async: the work's wait() orders the current stream after the collective.
    t = torch.full((1 << 20,), float(rank + 1), device=dev)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    s = t.sum()  # on the current stream, after the collective
    expect("async all_reduce then sum", s.reshape(1),
           torch.tensor([float(world * (world + 1) // 2 * (1 << 20))]))
    fut = dist.all_reduce(torch.ones(8, device=dev), async_op=True).get_future()
    val = fut.wait()[0]
    expect("future value", val, torch.full((8,), float(world)))
    torch.cuda.synchronize()
    return failures


def _check_ddp(rank, world, gloo):
    """DDP on the GPU with smddp against the same model trained on the CPU with gloo."""
    torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    cpu_model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    cpu_model.load_state_dict(model.state_dict())
    gpu = torch.nn.parallel.DistributedDataParallel(model.cuda(0))
    ref = torch.nn.parallel.DistributedDataParallel(cpu_model, process_group=gloo)
    opt_g = torch.optim.SGD(gpu.parameters(), lr=0.05)
    opt_c = torch.optim.SGD(ref.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(10):
        x, y = torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)
        for mdl, opt, xx, yy in [(gpu, opt_g, x.cuda(0), y.cuda(0)), (ref, opt_c, x, y)]:
            opt.zero_grad()
            torch.nn.functional.mse_loss(mdl(xx), yy).backward()
            opt.step()
    failures = []
    for (name, a), b in zip(gpu.module.named_parameters(), ref.module.parameters()):
        if not torch.allclose(a.detach().cpu(), b.detach(), rtol=1e-4, atol=1e-5):
            failures.append(f"DDP parameter {name} differs: max diff "
                            f"{(a.detach().cpu() - b.detach()).abs().max().item()}")
    return failures


def _check_send_recv(rank, world, gloo):
    """send/recv on CUDA tensors (staged through host memory): a ring posted
    receive first, without waiting in between; a receive without a source."""
    del gloo
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    failures = []
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for n in [1, 1 << 20]:
        out = torch.full((n,), float(rank + 1), device=dev) * 2  # written on the stream just now
        inc = torch.zeros(n, device=dev)
        rw = dist.irecv(inc, src=prv)
        sw = dist.isend(out, dst=nxt)
        rw.wait()
        sw.wait()
        if not torch.equal(inc.cpu(), torch.full((n,), float(prv + 1) * 2)):
            failures.append(f"ring n={n}: got {inc[:4].tolist()} from rank {prv}")
        if rank == 0:
            for _ in range(world - 1):
                w = dist.irecv(inc)
                w.wait()
                src = w._source_rank()
                if not torch.equal(inc.cpu(), torch.full((n,), float(src + 1) * 2)):
                    failures.append(f"recv without a source n={n}: {inc[:4].tolist()} from {src}")
        else:
            dist.send(out, dst=0)
        dist.barrier()
    torch.cuda.synchronize()
    return failures


@pytest.mark.parametrize("world", [2, 3])
def test_cuda_send_recv(world):
    run_ranks(_check_send_recv, world, timeout=GPU_TIMEOUT_S)


@pytest.mark.parametrize("world", [2, 4])
def test_cuda_collectives(world):
    run_ranks(_check_collectives, world, timeout=GPU_TIMEOUT_S)


def test_cuda_ddp_matches_gloo_on_cpu():
    run_ranks(_check_ddp, 2, timeout=GPU_TIMEOUT_S)


def _check_mixed_devices(rank, world, gloo):
    """A CPU input with a CUDA output (or the reverse) is refused on every
    rank with a clear error, before anything is issued: once it reached
    libsmddp as host memory and was written from the host."""
    del gloo
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    failures = []
    n = 4
    cases = {
        "all_gather_into_tensor cpu->cuda":
            lambda: dist.all_gather_into_tensor(torch.zeros(n * world, device=dev), torch.ones(n)),
        "reduce_scatter_tensor cuda->cpu":
            lambda: dist.reduce_scatter_tensor(torch.zeros(n), torch.ones(n * world, device=dev)),
    }
    for name, call in cases.items():
        try:
            call()
            failures.append(f"{name}: no error")
        except (RuntimeError, ValueError) as err:
            # torch may refuse it first; smddp's own refusal must say why
            if "smddp" in str(err) and "different devices" not in str(err):
                failures.append(f"{name}: the error does not say what is wrong: {err}")
    x = torch.ones(n, device=dev)
    dist.all_reduce(x)  # the group still works
    if not torch.equal(x.cpu(), torch.full((n,), float(world))):
        failures.append(f"allreduce after the refused calls: {x.tolist()}")
    return failures


def test_cuda_mixed_devices_refused():
    run_ranks(_check_mixed_devices, 2, timeout=GPU_TIMEOUT_S)
