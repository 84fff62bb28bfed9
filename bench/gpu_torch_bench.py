"""smddp on CUDA tensors through torch: N ranks sharing GPU 0.

For each rank count (--ranks 2 4) it times all_reduce, all_gather_into_tensor
and reduce_scatter_tensor (fp32) over a range of sizes, checks one result of
each, and prints algbw and busbw (nccl-tests' definitions) beside torch's own
elementwise add on the same GPU in the same run (c = a + b over the same
bytes, counted as 3 N bytes read + written), the memory-bound reference.

    python3 bench/gpu_torch_bench.py --ranks 2 4 --max-bytes 256M
"""

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def parse_bytes(s):
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1].lower(), 1)
    return int(float(s[:-1] if s[-1].isalpha() else s) * mult)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters / 1e3  # seconds


def worker(rank, world, port, sizes, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import smddp  # noqa: F401  (registers the backend)

    torch.cuda.set_device(0)
    dist.init_process_group("smddp", rank=rank, world_size=world)
    dev = torch.device("cuda", 0)
    rows = []
    for op in ["all_reduce", "all_gather", "reduce_scatter"]:
        for total in sizes:
            n = total // 4
            if op != "all_reduce":
                n -= n % world
            block = n // world
            x = torch.full((n,), float(rank + 1), device=dev)
            y = torch.empty(n, device=dev)
            total_sum = world * (world + 1) / 2
            if op == "all_reduce":
                def fn():
                    dist.all_reduce(x)

                def check():
                    x.fill_(rank + 1)
                    fn()
                    return (x == total_sum).all().item()
                factor = 2 * (world - 1) / world
            elif op == "all_gather":
                src = x[:block]

                def fn():
                    dist.all_gather_into_tensor(y, src)

                def check():
                    fn()
                    return all((y[r * block:(r + 1) * block] == r + 1).all().item() for r in range(world))
                factor = (world - 1) / world
            else:
                out = y[:block]

                def fn():
                    dist.reduce_scatter_tensor(out, x)

                def check():
                    fn()
                    return (out == total_sum).all().item()
                factor = (world - 1) / world
            ok = bool(check())
            iters = 10 if total >= 64 << 20 else 30
            dist.barrier()
            t = timed(fn, iters)
            dist.barrier()
            add = None
            if rank == 0:
                a, b = torch.ones(n, device=dev), torch.ones(n, device=dev)
                c = torch.empty(n, device=dev)
                ta = timed(lambda: torch.add(a, b, out=c), iters)
                add = 3 * n * 4 / ta / 1e9
                del a, b, c
            dist.barrier()
            rows.append((op, n * 4, t, n * 4 / t / 1e9, n * 4 / t / 1e9 * factor, add, ok))
            del x, y
    dist.destroy_process_group()
    if rank == 0:
        queue.put(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--min-bytes", default="1M")
    ap.add_argument("--max-bytes", default="256M")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device visible to torch")
        return 0
    sizes, s = [], parse_bytes(args.min_bytes)
    while s <= parse_bytes(args.max_bytes):
        sizes.append(s)
        s *= 4
    print(f"# smddp on CUDA tensors through torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    bad = 0
    for world in args.ranks:
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        t0 = time.time()
        port = free_port()
        procs = [ctx.Process(target=worker, args=(r, world, port, sizes, queue)) for r in range(world)]
        for p in procs:
            p.start()
        rows = queue.get(timeout=600)
        for p in procs:
            p.join(timeout=60)
            bad += p.exitcode != 0
        print(f"\n## {world} ranks on GPU 0 ({time.time() - t0:.0f} s)")
        print(f"{'op':>15} {'bytes':>12} {'time_us':>10} {'algbw_GB/s':>11} {'busbw_GB/s':>11} "
              f"{'torch_add_GB/s':>15} {'busbw/add':>9} {'check':>6}")
        for op, nbytes, t, algbw, busbw, add, ok in rows:
            print(f"{op:>15} {nbytes:>12} {t * 1e6:>10.1f} {algbw:>11.1f} {busbw:>11.1f} "
                  f"{add:>15.1f} {busbw / add:>9.3f} {'ok' if ok else 'WRONG':>6}")
            bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
