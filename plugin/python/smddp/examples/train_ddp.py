"""Train a small MLP with DistributedDataParallel on synthetic data.

The quick start's job and the DDP test's model: every rank builds the same
model from ``--seed`` and draws its own deterministic batches, so two runs with
the same arguments and world size must end with the same parameters whatever
backend carries the gradients (that is how smddp is checked against gloo).

    smddprun --nproc-per-node 2 -- python -m smddp.examples.train_ddp
    torchrun --nproc-per-node 2 -m smddp.examples.train_ddp --backend gloo

It reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (``env://``) as
torchrun and smddprun set them; started alone it runs as a world of one.
Rank 0 prints the loss and step time of every step, then ``final loss X``
(the mean over ranks of the last step's loss) and, on smddp, which rank kept
the others waiting (``smddp.stats()``).

Two flags stage the trouble a real job meets, to see what smddp reports:
``--slow-rank R --slow-ms N`` makes rank R take N ms longer for every step
(a straggler); ``--hang-rank R --hang-step S`` stops rank R before step S
for the group's timeout (``--timeout``) + 3 seconds, as a rank stuck in its
data loader would: the others time out, and every rank prints the error,
which says where each rank is.

    SMDDP_TRACE_DIR=/tmp/traces smddprun --nproc-per-node 3 -- \
        python -m smddp.examples.train_ddp --timeout 5 --hang-rank 2 --hang-step 5
    python -m smddp.trace /tmp/traces
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m smddp.examples.train_ddp", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="auto", choices=("auto", "smddp", "gloo"),
                   help="auto: follow the job's communication backend (smddp.dist); default auto")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--dump-params", metavar="FILE",
                   help="rank 0 saves the final parameters here (torch.save of a dict)")
    p.add_argument("--slow-rank", type=int, default=-1, metavar="R",
                   help="this rank sleeps --slow-ms before every step (a straggler)")
    p.add_argument("--slow-ms", type=float, default=30.0)
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="the process group's timeout in seconds (default: torch's)")
    p.add_argument("--hang-rank", type=int, default=-1, metavar="R",
                   help="this rank stops before --hang-step for --timeout + 3 s")
    p.add_argument("--hang-step", type=int, default=5)
    return p.parse_args(argv)


def _single_process_defaults() -> None:
    """Started without a launcher: a world of one on a free local port."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                 ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(port))):
        os.environ.setdefault(k, v)


def init(backend: str, timeout_s: float | None = None) -> str:
    """Joins the process group through env://; returns the torch backend used."""
    from datetime import timedelta

    import torch.distributed as dist

    extra = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
    if backend == "gloo":
        dist.init_process_group(backend="gloo", init_method="env://", **extra)
        return "gloo"
    from smddp import dist as sdist  # noqa: PLC0415 - only the smddp paths need it

    kwargs = {"backend": "smddp"} if backend == "smddp" else {}
    return sdist.init_process_group(init_method="env://", **kwargs, **extra)


def make_model(features: int, hidden: int):
    import torch.nn as nn

    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, 1))


def make_batch(torch, gen, batch: int, features: int, teacher):
    """Inputs and the targets of a fixed random 'teacher' function, from gen."""
    x = torch.randn(batch, features, generator=gen)
    # Scaled so that inputs to tanh and the targets have about unit variance.
    y = torch.tanh(x @ teacher / features**0.5).sum(dim=1, keepdim=True) / teacher.shape[1] ** 0.5
    return x, y


def train(args: argparse.Namespace) -> float:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)

    torch.manual_seed(args.seed)  # same initial model on every rank
    teacher = torch.randn(args.features, 8, generator=torch.Generator().manual_seed(args.seed))
    model = make_model(args.features, args.hidden).to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + rank + 1)  # own data per rank

    loss = torch.zeros((), device=device)
    for step in range(1, args.steps + 1):
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1e3)
        if rank == args.hang_rank and step == args.hang_step:
            time.sleep((args.timeout or 1800) + 3)
        x, y = make_batch(torch, gen, args.batch, args.features, teacher)
        x, y = x.to(device), y.to(device)
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # DDP all-reduces the gradients here
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        ms = (time.perf_counter() - start) * 1e3
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f} time {ms:.2f} ms", flush=True)

    final = loss.detach().clone()
    dist.all_reduce(final)
    final_loss = final.item() / world
    if rank == 0:
        print(f"final loss {final_loss:.6f}", flush=True)
        if dist.get_backend() == "smddp":
            import smddp

            s = smddp.stats()
            late = ", ".join("-" if v is None else f"{v:.3f}" for v in s["late_s"])
            print(f"arrivals (smddp.stats): slowest rank {s['slowest_rank']}, lateness per rank "
                  f"[{late}] s over {s['ops']} collectives, skew p50 {s['skew_us']['p50']:.0f} "
                  f"us, p99 {s['skew_us']['p99']:.0f} us", flush=True)
        if args.dump_params:
            torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()},
                       args.dump_params)
    return final_loss


def main(argv=None) -> int:
    args = parse_args(argv)
    _single_process_defaults()
    from smddp.dist import BackendUnavailable

    try:
        backend = init(args.backend, args.timeout)
    except BackendUnavailable as e:
        print(f"train_ddp: error: {e}", file=sys.stderr)
        return 1
    import torch.distributed as dist

    if dist.get_rank() == 0:
        print(f"backend {backend}, world size {dist.get_world_size()}, steps {args.steps}",
              flush=True)
    try:
        train(args)
    except RuntimeError as err:  # a collective failed: say so on every rank
        print(f"rank {dist.get_rank()}: train_ddp failed: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        dist.destroy_process_group()
        if "gloo" in backend:
            _let_gloo_workers_finish()
    return 0


def _let_gloo_workers_finish() -> None:
    """Gives gloo's worker threads time to drop their last tensors before exit.

    DDP keeps the gloo process group alive after destroy_process_group, so its
    worker threads outlive main(). A worker that drops a tensor once the
    interpreter has begun to finalise dies taking the GIL, and the process
    aborts ("terminate called without an active exception", pytorch issue
    190489). It drops them right after completing the last collective; this
    sleep releases the GIL so that it can.
    """
    time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
