"""Train on when a rank dies: the survivors shrink the group and go on.

The model, data and optimiser of ``train_ddp``. ``--kill-rank R`` SIGKILLs
itself before step ``--kill-step S``. The other ranks fail in that step's
gradient allreduce, agree on who is gone, shrink the default group
(``torch.distributed.shrink_group``), rebuild DDP on it and train to the end.
Every step prints the world size and the loss (rank 0 of the group); at the
end every survivor's parameters are compared.

    smddprun --nproc-per-node 4 --keep-going -- \\
        python -m smddp.examples.train_elastic --kill-rank 2 --kill-step 5

``--keep-going`` makes smddprun start the ranks itself: torchrun would stop
every rank when one dies. Rank 0 hosts the rendezvous store, so the rank that
dies must be another one.

Agreeing on who is gone: each survivor registers in the store under the
failure's generation, and waits until every rank of the group has either
registered or is known to be gone (``smddp.peer_states``: its process ended).
A rank that is only slow registers late and is kept; a rank that is neither
registered nor gone after ``--agree-timeout`` seconds fails the job rather
than be excluded by mistake.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from smddp.examples.train_ddp import _single_process_defaults, init, make_batch, make_model


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m smddp.examples.train_elastic", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--kill-rank", default="", metavar="R[,R...]",
                   help="these ranks SIGKILL themselves before --kill-step (not 0: it hosts the "
                   "store)")
    p.add_argument("--kill-step", type=int, default=5)
    p.add_argument("--slow-rank", type=int, default=-1, metavar="R",
                   help="this rank sleeps --slow-s before --kill-step: slow, not dead, it must "
                   "be kept")
    p.add_argument("--slow-s", type=float, default=3.0)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="the group's timeout, seconds")
    p.add_argument("--agree-timeout", type=float, default=30.0,
                   help="how long survivors wait for every rank to register or be gone")
    return p.parse_args(argv)


def agree_on_gone(store, generation: int, timeout_s: float) -> list[int]:
    """The group ranks that are gone, as every survivor sees them (see the module doc)."""
    import smddp
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    store.set(f"elastic/{generation}/alive/{rank}", "1")
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [r for r in range(world)
                 if store.check([f"elastic/{generation}/alive/{r}"])]
        states = smddp.peer_states()
        gone = [r for r in range(world) if r not in alive and states[r] in ("gone", "left")]
        waiting = [r for r in range(world) if r not in alive and r not in gone]
        if not waiting:
            return gone
        if time.monotonic() > deadline:
            raise RuntimeError(f"train_elastic: ranks {waiting} neither registered nor are known "
                               f"to be gone after {timeout_s} s; not excluding a rank that may "
                               "only be slow")
        time.sleep(0.05)


def train(args: argparse.Namespace, store) -> dict:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    start_rank = dist.get_rank()
    torch.manual_seed(args.seed)
    teacher = torch.randn(args.features, 8, generator=torch.Generator().manual_seed(args.seed))
    model = make_model(args.features, args.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + start_rank + 1)
    ddp = DDP(model)
    generation, step = 0, 1
    while step <= args.steps:
        if start_rank in args.kill_ranks and step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if start_rank == args.slow_rank and step == args.kill_step and generation == 0:
            time.sleep(args.slow_s)
        x, y = make_batch(torch, gen, args.batch, args.features, teacher)
        try:
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()  # the gradients' allreduce fails when a rank has died
            total = loss.detach().clone()
            dist.all_reduce(total)
        except RuntimeError as err:
            t0 = time.monotonic()
            first_line = str(err).splitlines()[0][:160]
            print(f"rank {start_rank}: step {step} failed: {first_line}", flush=True)
            gone = agree_on_gone(store, generation, args.agree_timeout)
            generation += 1
            dist.shrink_group(gone, shrink_flags=1)  # SHRINK_ABORT: the old group is done
            ddp = DDP(model)  # every survivor holds the same parameters: no step was taken
            if dist.get_rank() == 0:
                print(f"shrunk: ranks {gone} gone, world size {dist.get_world_size()} "
                      f"({time.monotonic() - t0:.2f} s to agree and shrink)", flush=True)
            continue  # the same step again, on the survivors
        opt.step()
        if dist.get_rank() == 0:
            print(f"step {step} world size {dist.get_world_size()} "
                  f"loss {total.item() / dist.get_world_size():.6f}", flush=True)
        step += 1
    # Every survivor must hold the same parameters.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    mine = flat.clone()
    dist.broadcast(flat, src=0)
    same = torch.tensor([int(torch.equal(flat, mine))])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    if dist.get_rank() == 0:
        print(f"final world size {dist.get_world_size()}; survivors' parameters "
              f"{'identical' if same.item() else 'DIFFER'}", flush=True)
    return {"identical": bool(same.item())}


def main(argv=None) -> int:
    args = parse_args(argv)
    _single_process_defaults()
    try:
        args.kill_ranks = {int(r) for r in args.kill_rank.split(",") if r.strip()}
    except ValueError:
        print(f"train_elastic: error: --kill-rank {args.kill_rank!r}: give ranks like 2 or 2,3",
              file=sys.stderr)
        return 2
    if 0 in args.kill_ranks:
        print("train_elastic: error: --kill-rank 0 would take the rendezvous store down; pick "
              "another rank", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    init("auto", args.timeout)
    if dist.get_backend() != "smddp":
        print(f"train_elastic: error: the backend is {dist.get_backend()}; shrinking needs "
              "smddp (communication backend auto)", file=sys.stderr)
        return 2
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 0:
        print(f"backend smddp, world size {dist.get_world_size()}, steps {args.steps}", flush=True)
    try:
        result = train(args, store)
    finally:
        dist.destroy_process_group()
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
