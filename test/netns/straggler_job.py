"""One rank of the network-namespace check that a slow rank is named across nodes.

Every rank runs 20 allreduces on an smddp group; the last rank sleeps 30 ms
before each. Each rank then reads smddp.stats() until the arrivals of every
rank, on every node, have been compared, and prints one line with the
slowest rank, its lateness, the skew and the clock error bound. Exits
non-zero when the stats do not name the last rank with 0.6 s of lateness
within 20 %.
"""

import sys
import time

import torch
import torch.distributed as dist

import smddp

OPS, SLEEP_S = 20, 0.030


def main() -> int:
    torch.set_num_threads(1)
    dist.init_process_group(backend="smddp")
    rank, world = dist.get_rank(), dist.get_world_size()
    slow = world - 1
    t = torch.ones(4)
    for _ in range(OPS):
        if rank == slow:
            time.sleep(SLEEP_S)
        dist.all_reduce(t)
    deadline = time.monotonic() + 10
    while True:
        st = smddp.stats()
        if (st["ranks_covered"] == world and st["ops"] >= OPS) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    late = st["late_s"]
    print(f"rank {rank}: stats: slowest rank {st['slowest_rank']}, late_s "
          f"{[None if x is None else round(x, 3) for x in late]}, ops {st['ops']}, skew p50 "
          f"{st['skew_us']['p50']:.0f} us, clock error {st['clock_error_us']:.0f} us, "
          f"ranks covered {st['ranks_covered']}", flush=True)
    dist.barrier()  # every rank has its summary before a node stops sending
    truth = OPS * SLEEP_S
    ok = (st["ranks_covered"] == world and st["slowest_rank"] == slow
          and late[slow] is not None and 0.8 * truth < late[slow] < 1.2 * truth
          and 0 < st["clock_error_us"] < 20000)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
