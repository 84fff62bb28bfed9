#!/usr/bin/env python3
"""One rank of a start-up measurement through torch.distributed.

    RANK=r WORLD_SIZE=n MASTER_ADDR=... MASTER_PORT=... \\
        python3 bench/startup_torch.py BACKEND GO

Imports torch (and smddp for BACKEND smddp), creates GO.ready.<rank>, waits
for the launcher to write a Unix time AT into GO (once every rank is ready:
importing torch in many processes on few CPUs takes long) and until AT,
then connects to torch's TCPStore, waits there for every rank, and times
init_process_group(BACKEND) on it and one 8-byte all_reduce. Rank 0 prints
"BACKEND,ranks,seconds,store": the slowest rank's time from the moment all
were connected to the end of its all_reduce, and the slowest store
connection (torch's own, the same for every backend: a client that finds
the server not yet listening retries after a pause of seconds) (bench/scale_bench.sh launches it; SMDDP_HOSTNAME places a rank
on a fake node for smddp, gloo ignores it and talks over loopback).
"""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

backend, go = sys.argv[1], sys.argv[2]
if backend == "smddp":
    import smddp  # noqa: F401  (registers the backend)

open(f"{go}.ready.{os.environ['RANK']}", "w").close()
while not os.path.exists(go):
    time.sleep(0.05)
with open(go) as f:
    at = float(f.read())
if time.time() > at:
    sys.exit(f"startup_torch.py: the start time {at:.3f} passed before this rank read it")
time.sleep(at - time.time())
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                      rank == 0, timeout=timedelta(seconds=300))
connected = time.time()
# Every rank connected (a client that found the server not yet listening retries
# after a pause of seconds): the backend's start-up is timed from here.
if store.add("startup/connected", 1) == world:
    store.set("startup/go", "1")
store.wait(["startup/go"])
began = time.time()
dist.init_process_group(backend, store=store, rank=rank, world_size=world)
x = torch.ones(2)
dist.all_reduce(x)
done = time.time()
assert x[0].item() == world, x
# The slowest store connection, and the slowest backend start-up.
took = torch.tensor([connected - at, done - began], dtype=torch.float64)
dist.all_reduce(took, op=dist.ReduceOp.MAX)
if rank == 0:
    print(f"{backend},{world},{took[1].item():.3f},{took[0].item():.3f}", flush=True)
dist.destroy_process_group()
