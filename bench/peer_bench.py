#!/usr/bin/env python3
"""smddp against the peers people pick for CPU collectives, in one run, on the same ranks.

    python3 bench/peer_bench.py [-n 2|4] [--dtypes fp32,bf16] [--ops allreduce,allgather]
                                [--min 8] [--max 64M] [--factor 4] [--rounds 3] [--out DIR]

smddp is measured three ways: through torch.distributed (dist.all_reduce,
dist.all_gather_into_tensor's single-tensor form); through its direct calls,
smddp.all_reduce and smddp.all_gather_into_tensor (no Work, no dispatcher); and
the direct calls on tensors the group handed out (backend.allocate_tensor, what
DDP's buckets and FSDP2's buffers use), which the ranks of a node read and write
in place ("smddp-pool"). Each peer is compared with smddp's call of the same
kind on the same buffers: gloo with smddp through torch.distributed;
DeepSpeed's inference_all_reduce and MPI, which are direct calls on a buffer,
with smddp's direct calls. Where smddp is behind, the line that lists those
cases also gives the peer's time against smddp-pool's.

Peers, each measured in the same processes as smddp:
  - gloo: torch.distributed's gloo backend;
  - deepspeed: DeepSpeed's shared-memory allreduce, deepspeed.comm.inference_all_reduce
    (DS_ACCELERATOR=cpu; DeepSpeed builds the op at first use);
  - mpi: Open MPI through mpi4py on the tensors' buffers (numpy views; fp32 only, as
    numpy has no bfloat16).
A peer that is not installed, or fails to start, is skipped with the reason.

The ranks are started by mpirun when mpi4py and mpirun are there (that is what lets
MPI join), else spawned by torch.multiprocessing; each rank pins itself to one CPU
(rank modulo the CPUs it may use) and runs one torch thread. For every op, dtype and
size (--max, --max / --factor, ... down to --min, and --min), the peers take turns in --rounds rounds, each
starting with a different peer; in a round each peer does a checked call (inputs
rank + 1, every element compared with the exact sum or gather), a warmup, then a
timed loop of as many calls as fit --budget seconds. A round's time is the slowest rank's mean; a peer's time is its best
round. The table gives each peer's time and its time / smddp's (above 1: smddp is
faster). From 1 MiB up each size also times a memcpy of that many bytes on every
rank at once (the "memcpy" rows of the CSV): a case where smddp is behind at those
sizes is given in memcpys, smddp's, the peer's and, for a staged allreduce, the
copies its bytes come to (the roofline). Outputs: the table on stdout,
DIR/peer_bench.csv, DIR/peer_bench.png (with matplotlib), and last one line:
    peer_bench: smddp ahead at K of N (peer, size, ranks) cases; skipped peers: ...
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import subprocess
import sys
import time
import traceback

from torch_bench import (all_gather, fmt_size, free_port, parse_size, pin,  # same folder
                         slowest_mean)

# Through torch.distributed; smddp.all_reduce etc.; the same on tensors from the group's pool.
SMDDP = ("smddp", "smddp-direct", "smddp-pool")
PEERS = SMDDP + ("gloo", "deepspeed", "mpi")
# Each peer against smddp's call of the same kind.
REF = {"gloo": "smddp", "deepspeed": "smddp-direct", "mpi": "smddp-direct"}
OPS = ("allreduce", "allgather")
DTYPES = ("fp32", "bf16")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--ranks", type=int, default=2, choices=(2, 4), help="ranks (2 or 4)")
    p.add_argument("--dtypes", default="fp32,bf16", help="fp32 and/or bf16 (default both)")
    p.add_argument("--ops", default="allreduce,allgather", help="allreduce and/or allgather")
    p.add_argument("--peers", default=",".join(REF), help="peers beside smddp")
    p.add_argument("--min", type=parse_size, default=8, help="smallest size in bytes (default 8)")
    p.add_argument("--max", type=parse_size, default=64 << 20, help="largest (default 64M)")
    p.add_argument("--factor", type=int, default=4, help="size step down from --max (default /4)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per size (default 3)")
    p.add_argument("--budget", type=float, default=0.05,
                   help="seconds of timed calls per peer, size and round (default 0.05)")
    p.add_argument("--out", default=".", help="directory for peer_bench.csv/.png (default .)")
    p.add_argument("--spawn", action="store_true", help="never use mpirun (MPI is skipped)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.dtypes = [d for d in a.dtypes.split(",") if d]
    a.ops = [o for o in a.ops.split(",") if o]
    a.peers = [x for x in a.peers.split(",") if x]
    for what, got, ok in (("dtype", a.dtypes, DTYPES), ("op", a.ops, OPS), ("peer", a.peers, tuple(REF))):
        bad = [x for x in got if x not in ok]
        if bad or not got:
            p.error(f"--{what}s: {', '.join(bad) or 'none given'}; accepted: {', '.join(ok)}")
    if a.min < 1 or a.max < a.min or a.factor < 2 or a.rounds < 1:
        p.error("need 1 <= --min <= --max, --factor >= 2, --rounds >= 1")
    return a


def sizes(a) -> list[int]:
    """--max, --max / factor, ... down to --min, and --min itself."""
    out, s = [], a.max
    while s >= a.min:
        out.append(s)
        s //= a.factor
    return sorted(set(out + [a.min]))


# ------------------------------------------------------------------------------ ranks

class Peer:
    """One library's allreduce and allgather on this rank's tensors."""

    def __init__(self, name, allreduce=None, allgather=None, dtypes=DTYPES, alloc=None):
        self.name, self.allreduce, self.allgather, self.dtypes = name, allreduce, allgather, dtypes
        # alloc(count, dtype): this peer's own buffers; None: the ones every peer shares.
        self.alloc = alloc

    def op(self, op):
        return self.allreduce if op == "allreduce" else self.allgather


def make_peers(args, dist, torch, ctl, mpi_comm):
    """The peers this rank can run, and why the others cannot (name -> reason)."""
    peers, skipped = [], {}
    sm = dist.new_group(backend="smddp")
    gl = dist.new_group(backend="gloo")
    gather = all_gather(dist)  # the name torch does not warn about on every call
    peers.append(Peer("smddp", lambda t: dist.all_reduce(t, group=sm),
                      lambda o, i: gather(o, i, group=sm)))
    import smddp
    peers.append(Peer("smddp-direct", lambda t: smddp.all_reduce(t, group=sm),
                      lambda o, i: smddp.all_gather_into_tensor(o, i, group=sm)))
    backend = sm._get_backend(torch.device("cpu"))
    if hasattr(backend, "allocate_tensor"):
        peers.append(Peer("smddp-pool", lambda t: smddp.all_reduce(t, group=sm),
                          lambda o, i: smddp.all_gather_into_tensor(o, i, group=sm),
                          alloc=lambda count, dtype: backend.allocate_tensor(
                              count, dtype=dtype, device=torch.device("cpu"))))
    else:
        skipped["smddp-pool"] = f"torch {torch.__version__} has no Backend.allocate_tensor"
    if "gloo" in args.peers:
        peers.append(Peer("gloo", lambda t: dist.all_reduce(t, group=gl),
                          lambda o, i: gather(o, i, group=gl)))
    if "deepspeed" in args.peers:
        try:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
            import deepspeed
            import deepspeed.comm as dscomm
            deepspeed.init_distributed(dist_backend="gloo", verbose=False)
            fn = getattr(dscomm, "inference_all_reduce", None)
            if fn is None:
                raise RuntimeError(f"deepspeed {deepspeed.__version__} has no "
                                   "deepspeed.comm.inference_all_reduce")
            # DeepSpeed builds and loads its shared-memory op at the first call.
            fn(torch.zeros(4))
            peers.append(Peer("deepspeed", fn, None))
        except Exception as e:  # noqa: BLE001  (any failure skips the peer, with its reason)
            skipped["deepspeed"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    if "mpi" in args.peers:
        if mpi_comm is None:
            skipped["mpi"] = ("mpi4py or mpirun missing, or --spawn" if not args.spawn
                              else "--spawn given")
        else:
            from mpi4py import MPI

            def mpi_allreduce(t):
                mpi_comm.Allreduce(MPI.IN_PLACE, t.numpy())

            def mpi_allgather(o, i):
                mpi_comm.Allgather(i.numpy(), o.numpy())

            peers.append(Peer("mpi", mpi_allreduce, mpi_allgather, ("fp32",)))
    # Every rank must agree on the set of peers: one that failed anywhere is skipped everywhere.
    names = [p.name for p in peers]
    flags = torch.tensor([1 if x in names else 0 for x in PEERS], dtype=torch.int32)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN, group=ctl)
    for i, x in enumerate(PEERS):
        if x in names and not flags[i]:
            skipped.setdefault(x, "failed on another rank")
    peers = [p for p in peers if flags[PEERS.index(p.name)]]
    return peers, skipped


def call(p, op, inp, out):
    """One call of p's op on this rank's buffers (in place for allreduce)."""
    fn = p.op(op)
    return (lambda: fn(inp)) if op == "allreduce" else (lambda: fn(out, inp))


def probe(runnable, op, dt, bufs, rank, dist, torch, ctl, unsupported):
    """Peers whose op takes this dtype on every rank; the others are noted once, with why."""
    ok = []
    for p in runnable:
        why = ""
        inp, out = bufs[p.name]
        try:
            inp.fill_(rank + 1)
            call(p, op, inp, out)()
        except Exception as e:  # noqa: BLE001  (an op a peer lacks is skipped, not fatal)
            why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"
        flag = torch.tensor([0 if why else 1], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=ctl)
        if flag.item():
            ok.append(p)
        else:
            unsupported.setdefault((p.name, op, dt), why or "failed on another rank")
    return ok


# From this size up, each size also times a memcpy of it on every rank at once:
# the roofline a large case behind is measured against.
ROOFLINE_MIN = 1 << 20


def timed_round(args, torch, dist, ctl, go) -> float:
    """One round of go on every rank: a warmup, then enough calls for
    --budget seconds, agreed by every rank; the slowest rank's mean."""
    t0 = time.perf_counter()
    for _ in range(3):
        go()
    est = torch.tensor([(time.perf_counter() - t0) / 3], dtype=torch.float64)
    dist.all_reduce(est, op=dist.ReduceOp.MAX, group=ctl)
    k = max(3, min(2000, int(args.budget / max(est.item(), 1e-7))))
    return slowest_mean(torch, dist, go, k, ctl, ctl)


def copy_time(args, torch, dist, ctl, size: int) -> float:
    """A copy of `size` bytes between two tensors of this rank, every rank at
    once (they share the memory system, as in a collective), best of
    --rounds rounds, as the peers are timed."""
    src = torch.ones(size, dtype=torch.uint8)
    dst = torch.zeros(size, dtype=torch.uint8)
    return min(timed_round(args, torch, dist, ctl, lambda: dst.copy_(src))
               for _ in range(args.rounds))


# Bytes through each rank's memory per byte of a P-rank allreduce that
# smddp's direct call stages (two-shot), not counting reads of lines the
# rank has just written: the peers' pieces of its input into staging
# (2 (P-1) / P: read and written), the reduction of its piece (P reads of
# 1/P and one write of 1/P into staging), that piece written to its
# output (1/P, from the cache), the peers' pieces copied out (2 (P-1) / P):
# (5P - 2) / P, which a memcpy (a read and a write of each byte) moves in
# (5P - 2) / (2P) copies: 2 for 2 ranks. In pools each rank reads every
# byte once and writes every byte once: 1 copy.
def staged_allreduce_copies(ranks: int) -> float:
    return (5 * ranks - 2) / (2 * ranks)


def run_rank(args, rank, n, port, mpi_comm) -> None:
    pin(rank)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(n), LOCAL_RANK=str(rank), LOCAL_SIZE=str(n),
                      LOCAL_WORLD_SIZE=str(n))
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    if "smddp" not in dist.Backend.backend_list:
        import smddp  # noqa: F401  (registers the backend if autoload is off)
    dist.init_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n)
    ctl = dist.new_group(backend="gloo")
    peers, skipped = make_peers(args, dist, torch, ctl, mpi_comm)
    tdtype = {"fp32": torch.float32, "bf16": torch.bfloat16}
    rows, unsupported = [], {}
    for op in args.ops:
        for dt in args.dtypes:
            es = 4 if dt == "fp32" else 2
            for size in sizes(args):
                count = max(1, size // es)
                inp = torch.zeros(count, dtype=tdtype[dt])
                out = torch.zeros(count * n, dtype=tdtype[dt])
                runnable = [p for p in peers if p.op(op) and dt in p.dtypes]
                bufs = {p.name: ((p.alloc(count, tdtype[dt]), p.alloc(count * n, tdtype[dt]))
                                 if p.alloc else (inp, out)) for p in runnable}
                runnable = probe(runnable, op, dt, bufs, rank, dist, torch, ctl, unsupported)
                best = {p.name: float("inf") for p in runnable}
                wrong = {p.name: 0 for p in runnable}
                for rnd in range(args.rounds):
                    order = runnable[rnd % len(runnable):] + runnable[:rnd % len(runnable)]
                    for p in order:
                        inp, out = bufs[p.name]
                        go = call(p, op, inp, out)
                        # The checked call: exact for fp32 and bf16 (small integers).
                        inp.fill_(rank + 1)
                        go()
                        if op == "allreduce":
                            ok = bool((inp == n * (n + 1) // 2).all())
                        else:
                            want = torch.arange(1, n + 1, dtype=tdtype[dt]).repeat_interleave(count)
                            ok = bool(torch.equal(out, want))
                        wrong[p.name] += 0 if ok else 1
                        inp.zero_()
                        best[p.name] = min(best[p.name], timed_round(args, torch, dist, ctl, go))
                for p in runnable:
                    bad = torch.tensor([wrong[p.name]], dtype=torch.int64)
                    dist.all_reduce(bad, group=ctl)
                    rows.append((op, dt, n, size, p.name, best[p.name] * 1e6, int(bad.item())))
                if size >= ROOFLINE_MIN:
                    rows.append((op, dt, n, size, "memcpy",
                                 copy_time(args, torch, dist, ctl, size) * 1e6, 0))
    if rank == 0:
        for (name, op, dt), why in sorted(unsupported.items()):
            skipped.setdefault(name, "")
            skipped[name] = (skipped[name] + "; " if skipped[name] else "") + f"{op} {dt}: {why}"
        report(args, rows, skipped, [p.name for p in peers])
    dist.barrier(group=ctl)
    dist.destroy_process_group()


# ------------------------------------------------------------------------------ report

def roofline(args, by, op, dt, s, p) -> str:
    """A case behind against the memcpy measured in the same run: smddp's and
    the peer's times in copies of the size, and for a staged allreduce the
    copies its bytes come to."""
    cp, me, peer = by.get((op, dt, s, "memcpy")), by.get((op, dt, s, REF[p])), by.get((op, dt, s, p))
    if not cp or not me or not peer:
        return ""
    text = (f"roofline: a memcpy of {fmt_size(s)} took {cp[5]:.1f} us here; {REF[p]} "
            f"{me[5] / cp[5]:.2f} memcpys, {p} {peer[5] / cp[5]:.2f}")
    if op == "allreduce" and REF[p] == "smddp-direct":
        text += (f"; staged, smddp moves {staged_allreduce_copies(args.ranks):.2f} memcpys' "
                 f"bytes per rank, in pools 1")
    return text


def report(args, rows, skipped, present) -> None:
    os.makedirs(args.out, exist_ok=True)
    csv_path = os.path.join(args.out, "peer_bench.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["op", "dtype", "ranks", "size_bytes", "peer", "time_us", "wrong_results"])
        for r in rows:
            w.writerow([r[0], r[1], r[2], r[3], r[4], f"{r[5]:.2f}", r[6]])
    by = {(r[0], r[1], r[3], r[4]): r for r in rows}
    others = [p for p in REF if p in present]
    ahead = total = 0
    behind = []
    for op in args.ops:
        for dt in args.dtypes:
            cols = [p for p in others if any((op, dt, s, p) in by for s in sizes(args))]
            print(f"\n## {op}{' (sum)' if op == 'allreduce' else ''}, {dt}, {args.ranks} ranks "
                  f"(us per call, best of {args.rounds} rounds; peer / smddp: above 1, smddp is "
                  f"faster; smddp = dist.{'all_reduce' if op == 'allreduce' else 'all_gather_into_tensor'}, "
                  f"smddp-direct = smddp.{'all_reduce' if op == 'allreduce' else 'all_gather_into_tensor'}; "
                  f"{', '.join(f'{p} against {REF[p]}' for p in cols)})\n")
            head = ("| size | " + " | ".join(SMDDP) + " | "
                    + " | ".join(f"{p} | {p} / {REF[p]}" for p in cols) + " |")
            print(head)
            print("|---:|" + "---:|" * len(SMDDP) + "---:|---:|" * len(cols))
            for s in sizes(args):
                mine = {m: by.get((op, dt, s, m)) for m in SMDDP}
                if not any(mine.values()):
                    continue
                cells = [fmt_size(s)] + [
                    (f"{r[5]:.1f}" + (" WRONG" if r[6] else "")) if r else "" for r in mine.values()]
                for p in cols:
                    r, me = by.get((op, dt, s, p)), mine[REF[p]]
                    if not r or not me:
                        cells += [f"{r[5]:.1f}" if r else "", ""]
                        continue
                    ratio = r[5] / me[5]
                    cells += [f"{r[5]:.1f}" + (" WRONG" if r[6] else ""), f"{ratio:.2f}"]
                    total += 1
                    if ratio >= 1 and not me[6]:
                        ahead += 1
                    else:
                        pool = mine.get("smddp-pool") if REF[p] == "smddp-direct" else None
                        notes = []
                        if pool and not pool[6]:
                            notes.append(f"against smddp-pool {r[5] / pool[5]:.2f}")
                        notes.append(roofline(args, by, op, dt, s, p))
                        behind.append(f"{p} {op} {dt} {fmt_size(s)}: {ratio:.2f}"
                                      + (f" ({'; '.join(x for x in notes if x)})"
                                         if any(notes) else ""))
                print("| " + " | ".join(cells) + " |")
    print(f"\nCSV: {csv_path}")
    plot(args, rows)
    if behind:
        print("\nsmddp behind: " + "; ".join(behind))
    skip = "; ".join(f"{k} ({v})" for k, v in sorted(skipped.items())) or "none"
    print(f"\npeer_bench: smddp ahead at {ahead} of {total} (peer, size, ranks) cases; "
          f"skipped peers: {skip}")


def plot(args, rows) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no matplotlib: no plot)")
        return
    combos = [(o, d) for o in args.ops for d in args.dtypes]
    fig, axes = plt.subplots(1, len(combos), figsize=(6 * len(combos), 4.5), squeeze=False)
    for ax, (op, dt) in zip(axes[0], combos):
        for p in PEERS:
            pts = sorted((r[3], r[5]) for r in rows if r[0] == op and r[1] == dt and r[4] == p)
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel("us per call")
        ax.set_title(f"{op} {dt}, {args.ranks} ranks")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    path = os.path.join(args.out, "peer_bench.png")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"PNG: {path}")


# ------------------------------------------------------------------------------ launch

def spawned(rank, args, port):
    try:
        run_rank(args, rank, args.ranks, port, None)
    except Exception:
        traceback.print_exc()
        raise


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:  # under mpirun
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        run_rank(args, comm.Get_rank(), comm.Get_size(), args.port, comm)
        return 0
    port = free_port()
    have_mpi = False
    if not args.spawn and "mpi" in args.peers and shutil.which("mpirun"):
        try:
            import mpi4py  # noqa: F401
            have_mpi = True
        except ImportError:
            pass
    print(f"peer_bench: {args.ranks} ranks, {fmt_size(args.min)}..{fmt_size(args.max)}, "
          f"{'mpirun' if have_mpi else 'spawned'}", flush=True)
    if have_mpi:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
               "-np", str(args.ranks), sys.executable, os.path.abspath(__file__), "--worker",
               "--port", str(port)] + [x for x in (argv if argv is not None else sys.argv[1:])]
        return subprocess.call(cmd)
    import torch.multiprocessing as mp
    mp.spawn(spawned, args=(args, port), nprocs=args.ranks, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
