"""One rank of the multi-host torch check (started by test/netns/run.sh).

The default group is smddp across every node; a gloo group beside it gives
the reference. Checks allreduce (sum and avg), allgather, reduce_scatter and
broadcast against gloo and send/recv around the ring, then trains a small DDP
model for 10 steps under both from the same seed and compares the
parameters. Exits non-zero on any difference.
"""

import os
import socket
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> int:
    torch.set_num_threads(1)
    dist.init_process_group(backend="smddp", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    bad = []

    def same(what, got, want, exact=True):
        ok = torch.equal(got, want) if exact else torch.allclose(got, want, rtol=1e-6, atol=1e-6)
        if not ok:
            bad.append(f"{what}: {got.flatten()[:5].tolist()} vs {want.flatten()[:5].tolist()}")

    g = torch.Generator().manual_seed(rank)
    for n in (1, 1000, 300001):
        x = torch.randint(-100, 100, (n,), generator=g).float()
        a, b = x.clone(), x.clone()
        dist.all_reduce(a)
        dist.all_reduce(b, group=gloo)
        same(f"allreduce sum n={n}", a, b)
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, op=dist.ReduceOp.AVG)
        dist.all_reduce(b, group=gloo)
        same(f"allreduce avg n={n}", a, b / world, exact=False)
        out_s, out_g = torch.empty(n * world), torch.empty(n * world)
        dist.all_gather_into_tensor(out_s, x)
        dist.all_gather_into_tensor(out_g, x, group=gloo)
        same(f"allgather n={n}", out_s, out_g)
        big = torch.randint(-100, 100, (n * world,), generator=g).float()
        rs_s, ref = torch.empty(n), big.clone()
        dist.reduce_scatter_tensor(rs_s, big)
        dist.all_reduce(ref, group=gloo)
        same(f"reduce_scatter n={n}", rs_s, ref[rank * n:(rank + 1) * n])
        y = x.clone()
        dist.broadcast(y, src=world - 1)
        z = x.clone()
        dist.broadcast(z, src=world - 1, group=gloo)
        same(f"broadcast n={n}", y, z)

    # send/recv around the ring: with 2 ranks per node every other hop crosses nodes.
    for n in (1, 300001):
        out = torch.arange(n, dtype=torch.float32) + 1000 * rank
        got = torch.empty(n)
        reqs = [dist.irecv(got, src=(rank - 1) % world), dist.isend(out, dst=(rank + 1) % world)]
        for r in reqs:
            r.wait()
        same(f"send/recv n={n}", got, torch.arange(n, dtype=torch.float32) + 1000 * ((rank - 1) % world))

    # recv without src: rank 0 takes every other rank's message, from its node and the others.
    if rank == 0:
        heard = []
        for _ in range(world - 1):
            got = torch.empty(300001)
            src = dist.recv(got)
            heard.append(src)
            same(f"recv from any rank (rank {src})", got,
                 torch.arange(300001, dtype=torch.float32) + 1000 * src)
        if sorted(heard) != list(range(1, world)):
            bad.append(f"recv from any rank heard from {heard}")
    else:
        dist.send(torch.arange(300001, dtype=torch.float32) + 1000 * rank, dst=0)

    def model():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))

    nets = {"smddp": DDP(model()), "gloo": DDP(model(), process_group=gloo)}
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.05) for k, m in nets.items()}
    for step in range(10):
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x, t = torch.randn(16, 64, generator=gen), torch.randn(16, 8, generator=gen)
        for k, m in nets.items():
            opts[k].zero_grad()
            nn.functional.mse_loss(m(x), t).backward()
            opts[k].step()
    for (name, p), q in zip(nets["smddp"].named_parameters(), nets["gloo"].parameters()):
        same(f"DDP parameter {name}", p.detach(), q.detach(), exact=False)

    dist.barrier(group=gloo)
    dist.destroy_process_group()
    for line in bad:
        print(f"rank {rank}: {line}", file=sys.stderr)
    print(f"rank {rank} of {world} on {os.environ.get('SMDDP_HOSTNAME') or socket.gethostname()}: "
          f"{'FAILED' if bad else 'ok'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
