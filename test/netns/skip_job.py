"""One rank of the network-namespace check that a skipped collective is named.

Every rank runs five allreduces on an smddp group with an 8 s timeout; then
the last rank skips the sixth (it sleeps past the others' timeout), as a rank
stuck in its data loader would. Each other rank must fail in that allreduce
with a message saying where every rank is, the last one included, its
position read on its own node and carried across nodes by the store. Prints
the message; exits non-zero when the allreduce did not fail.
"""

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> int:
    torch.set_num_threads(1)
    dist.init_process_group(backend="smddp", timeout=timedelta(seconds=8))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(4)
    for _ in range(5):
        dist.all_reduce(t)
    if rank == world - 1:
        time.sleep(14)  # past the others' timeout and their reports
        print(f"rank {rank}: skipped the sixth allreduce", flush=True)
        return 0
    try:
        dist.all_reduce(t)
    except RuntimeError as err:
        print(f"rank {rank}: error: {err}", flush=True)
        time.sleep(3)  # the skipping rank is still asleep: nobody leaves before the others report
        return 0
    print(f"rank {rank}: the allreduce without rank {world - 1} did not fail", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
