"""smdistributed.dataparallel: scripts written for SageMaker's SMDDP, on smddp.

The API before SMDDP 1.4 (smdistributed.dataparallel.torch.distributed and its
DistributedDataParallel) is checked in a 2-rank job started the way smddprun
starts ranks (env:// variables only, init_process_group() without
arguments): every function's result against what torch computes, DDP's
gradients against their mean, and the errors that say what to use instead.
The toolkit-facing parts (exceptions, torch_smddp) are checked in-process;
test/sagemaker runs such scripts under SageMaker's real training toolkit.
"""

import importlib
import inspect
import os
import subprocess
import sys
import traceback

import pytest

from smddp_support import free_port, requires_smddp, spawn_ranks

pytestmark = requires_smddp
TIMEOUT_S = 60


def _v1_rank(rank, world, port, queue):
    try:
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                          LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
        queue.put((rank, _v1_checks(rank, world), None))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        queue.put((rank, [], traceback.format_exc()))


def _v1_checks(rank, world):
    import torch
    import torch.distributed as td

    import smdistributed.dataparallel.torch.distributed as dist
    from smdistributed.dataparallel.exceptions import SMDDPError, SMDDPUnsupportedError
    from smdistributed.dataparallel.torch.parallel.distributed import DistributedDataParallel

    bad = []

    def expect(cond, what):
        if not cond:
            bad.append(what)

    def raises(exc, needle, fn, *args, **kwargs):
        try:
            fn(*args, **kwargs)
        except exc as e:
            expect(needle in str(e), f"{fn.__name__}: {type(e).__name__} without {needle!r}: {e}")
            return
        bad.append(f"{fn.__name__}{args}: no {exc.__name__}")

    expect(dist.is_available() and not dist.is_initialized(), "before init")
    raises(SMDDPError, "call smdistributed.dataparallel.torch.distributed.init_process_group()",
           dist.get_rank)
    raises(SMDDPError, "init_process_group() first", DistributedDataParallel,
           torch.nn.Linear(2, 2))
    raises(SMDDPUnsupportedError, "runs on the 'smddp' backend only", dist.init_process_group,
           "nccl")
    dist.init_process_group()
    dist.init_process_group()  # again: nothing to do
    expect(dist.is_initialized() and td.get_backend() == "smddp", f"backend {td.get_backend()}")
    expect((dist.get_rank(), dist.get_world_size()) == (rank, world), "rank, world size")
    expect((dist.get_local_rank(), dist.get_local_size()) == (rank, world), "local rank, size")
    expect(dist.get_rank(dist.group.WORLD) == rank, "get_rank(group.WORLD)")

    expected = {dist.ReduceOp.SUM: 3.0, dist.ReduceOp.AVERAGE: 1.5, dist.ReduceOp.MIN: 1.0,
                dist.ReduceOp.MAX: 2.0, None: 3.0}
    for op, want in expected.items():
        t = torch.full((5,), float(rank + 1))
        ret = dist.all_reduce(t, op=op)
        expect(ret is None and torch.equal(t, torch.full((5,), want)), f"all_reduce {op}: {t}")
    t = torch.full((3,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    expect(torch.equal(t, torch.full((3,), 3.0)), f"all_reduce async: {t}")

    t = torch.arange(4.0) if rank == 1 else torch.zeros(4)
    dist.broadcast(t, src=1)
    expect(torch.equal(t, torch.arange(4.0)), f"broadcast: {t}")
    out = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(out, torch.full((2,), float(rank)))
    expect(all(torch.equal(o, torch.full((2,), float(r))) for r, o in enumerate(out)),
           f"all_gather: {out}")
    inp = torch.tensor([10.0 * rank, 10.0 * rank + 1])
    o = torch.zeros(2)
    dist.all_to_all_single(o, inp)
    expect(torch.equal(o, torch.tensor([float(rank), 10.0 + rank])), f"all_to_all_single: {o}")
    dist.barrier()
    dist.barrier(async_op=True).wait()

    sub = td.new_group([0, 1])  # SMDDP took group.WORLD only; smddp serves sub-groups
    t = torch.ones(2)
    dist.all_reduce(t, group=sub)
    expect(torch.equal(t, torch.full((2,), 2.0)) and dist.get_world_size(sub) == 2, "new_group")
    raises(SMDDPUnsupportedError, "group.WORLD or a process group", dist.all_reduce,
           torch.ones(1), group="world")

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    ddp = DistributedDataParallel(model, broadcast_buffers=False)
    expect(isinstance(ddp, torch.nn.parallel.DistributedDataParallel), "DDP is torch's")
    x = torch.full((4, 3), float(rank + 1))
    ddp(x).sum().backward()
    grad = model.weight.grad.clone()
    # d(sum(w.x + b))/dw = sum of x's rows: 4 (rank + 1) per entry; DDP averages over ranks.
    expect(torch.allclose(grad, torch.full((1, 3), 4.0 * 1.5)), f"DDP gradient {grad}")
    raises(SMDDPUnsupportedError, "no_sync()", DistributedDataParallel, model,
           gradient_accumulation_steps=2)
    td.destroy_process_group()
    return bad


def test_v1_api_in_a_two_rank_job():
    problems = spawn_ranks(_v1_rank, 2, TIMEOUT_S, (free_port(),))
    assert not problems, "\n".join(problems)


def test_init_without_a_launcher_says_how_to_start():
    code = ("import smdistributed.dataparallel.torch.distributed as dist\n"
            "assert not dist.is_available()\n"
            "try:\n    dist.init_process_group()\n"
            "except dist.SMDDPError as e:\n    print(e)\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK",
                        "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stderr
    assert "init_process_group" in out.stdout and "smddprun" in out.stdout


def test_exceptions_module_holds_only_its_own_classes():
    """SageMaker's toolkit takes every class name in it as an error to look for in the output."""
    exceptions = importlib.import_module("smdistributed.dataparallel.exceptions")
    names = [n for n in dir(exceptions) if inspect.isclass(getattr(exceptions, n))]
    assert names == ["SMDDPError", "SMDDPUnsupportedError"]
    assert issubclass(exceptions.SMDDPUnsupportedError, exceptions.SMDDPError)
    assert issubclass(exceptions.SMDDPError, RuntimeError)


def test_torch_smddp_registers_the_backend():
    code = ("import torch.distributed as dist\n"
            "import smdistributed.dataparallel.torch.torch_smddp\n"
            "print('smddp' in dist.Backend.backend_list)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=TIMEOUT_S)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


def test_tensorflow_api_says_what_to_use():
    from smdistributed.dataparallel.exceptions import SMDDPUnsupportedError

    with pytest.raises(SMDDPUnsupportedError, match="PyTorch only.*tf.distribute"):
        importlib.import_module("smdistributed.dataparallel.tensorflow")


def test_sagemaker_finds_the_libraries_under_the_prefix():
    """pip put libsmddp.so and libsmddpcoll.so in <prefix>/lib, where SageMaker's toolkit looks."""
    import ctypes
    import importlib.metadata

    try:
        files = importlib.metadata.files("smddp") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("smddp is not installed as a distribution here (run from the source tree)")
    prefix_lib = os.path.realpath(os.path.join(sys.prefix, "lib"))
    libs = {f.name: f.locate().resolve() for f in files
            if f.name in ("libsmddp.so", "libsmddpcoll.so") and "smddp" not in f.parts}
    if not libs:
        pytest.skip("this smddp install has no <prefix>/lib libraries (an editable install)")
    assert {n: str(p.parent) for n, p in libs.items()} == {
        "libsmddp.so": prefix_lib, "libsmddpcoll.so": prefix_lib}
    coll = ctypes.CDLL(str(libs["libsmddpcoll.so"]))
    smddp_lib = ctypes.CDLL(str(libs["libsmddp.so"]))
    assert coll.smddpcoll_get_version() == smddp_lib.smddp_get_version() > 0
