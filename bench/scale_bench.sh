#!/usr/bin/env bash
# Start-up at scale on fake nodes: RANKS ranks, 2 per node (SMDDP_HOSTNAME
# per node, the network between nodes on loopback), on this machine, for
# each RANKS given (default 4 8 16 32 64), all in one run:
#   1. smddp_bench --startup: creation and one 8-byte allreduce through the C
#      API (the built-in store), with what start-up cost each rank (most over
#      ranks, and the total, which is the store's load): store calls (during
#      creation, and until the allreduce ended), store bytes, network peers
#      and liveness connections, threads; then the store calls per second
#      while 8-byte allreduces run for 3 s (the straggler telemetry's);
#   2. bench/startup_torch.py: init_process_group and one all_reduce through
#      torch, smddp beside gloo (gloo's ranks talk over loopback as they
#      would across nodes);
#   3. Open MPI (smddp_bench_mpi --startup, where built): MPI_Init and one
#      MPI_Allreduce, between processes forced onto TCP (btl self,tcp), as
#      across nodes.
#   4. many ranks on one node: the allreduce (8 B to 16 MiB) on each count of
#      SCALE_BENCH_LOCAL (default 16) local ranks, smddp_bench -p against Open
#      MPI, two rounds taking turns, the best time of each.
# Every rank waits for a common start time once all are launched (and, for
# torch, connected to its store), so that launching and importing torch are
# not counted. Then a model fitted to all points but the largest, checked on
# the largest, and its predictions for 1,000 and 10,000 ranks.
#
#   bench/scale_bench.sh BUILD_DIR [RANKS ...]
#
# Prints markdown tables. Needs torch and the smddp package installed for
# part 2 (skipped, and said so, without them).
set -uo pipefail

BUILD=${1:?usage: bench/scale_bench.sh BUILD_DIR [RANKS ...]}
shift
SIZES=("$@")
[ ${#SIZES[@]} -gt 0 ] || SIZES=(4 8 16 32 64)
PER=2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
S=$BUILD/bench/smddp_bench
M=$BUILD/bench/smddp_bench_mpi
[ -x "$S" ] || { echo "scale_bench: $S not found: build first" >&2; exit 1; }
for n in "${SIZES[@]}"; do
    if ! [[ $n =~ ^[0-9]+$ ]] || [ "$n" -lt "$PER" ] || [ $((n % PER)) -ne 0 ] || [ "$n" -gt 256 ]; then
        echo "scale_bench: RANKS must be even numbers from 2 to 256, not \"$n\"" >&2
        exit 2
    fi
done
tmp=$(mktemp -d /tmp/smddp-scale-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
has_torch=0
$PY -c "import torch, smddp" 2>/dev/null && has_torch=1
rc=0

port() { echo $((20000 + RANDOM % 20000)); }
start_at() { $PY -c "import time; print(time.time() + $1)"; }

# c_startup N: one CSV row from smddp_bench --startup on N ranks.
c_startup() {
    local n=$1 p at pids=()
    p=$(port)
    at=$(start_at "1 + $n * 0.05")
    for ((r = 0; r < n; r++)); do
        RANK=$r WORLD_SIZE=$n LOCAL_WORLD_SIZE=$PER MASTER_ADDR=127.0.0.1 MASTER_PORT=$p \
            SMDDP_HOSTNAME=node$((r / PER)) "$S" --startup "$at" > "$tmp/c.$r" 2> "$tmp/c.$r.err" &
        pids+=($!)
    done
    local bad=0
    for pid in "${pids[@]}"; do wait "$pid" || bad=1; done
    if [ $bad = 1 ]; then
        echo "scale_bench: smddp_bench --startup on $n ranks failed:" >&2
        cat "$tmp"/c.*.err >&2
        return 1
    fi
    tail -n 1 "$tmp/c.0"
}

# torch_startup BACKEND N: "seconds,store" from bench/startup_torch.py on N ranks.
torch_startup() {
    local bk=$1 n=$2 p go pids=()
    p=$(port)
    go=$tmp/go.$bk.$n
    for ((r = 0; r < n; r++)); do
        RANK=$r WORLD_SIZE=$n LOCAL_RANK=$((r % PER)) LOCAL_WORLD_SIZE=$PER MASTER_ADDR=127.0.0.1 \
            MASTER_PORT=$p SMDDP_HOSTNAME=node$((r / PER)) GLOO_SOCKET_IFNAME=lo OMP_NUM_THREADS=1 \
            $PY "$ROOT/bench/startup_torch.py" "$bk" "$go" > "$tmp/t.$r" 2> "$tmp/t.$r.err" &
        pids+=($!)
    done
    # Every rank imported torch: start them together.
    local waited=0
    while [ "$(find "$tmp" -maxdepth 1 -name "go.$bk.$n.ready.*" | wc -l)" -lt "$n" ]; do
        sleep 0.1
        waited=$((waited + 1))
        if [ $waited -gt 3000 ]; then
            echo "scale_bench: $bk ranks not ready after 300 s" >&2
            kill "${pids[@]}" 2>/dev/null
            break
        fi
    done
    start_at 1 > "$go.tmp" && mv "$go.tmp" "$go"
    local bad=0
    for pid in "${pids[@]}"; do wait "$pid" || bad=1; done
    if [ $bad = 1 ]; then
        echo "scale_bench: $bk through torch on $n ranks failed:" >&2
        grep -v "^\[W" "$tmp"/t.*.err | tail -n 20 >&2
        return 1
    fi
    tail -n 1 "$tmp/t.0" | cut -d, -f3-
}

# mpi_startup N: seconds from smddp_bench_mpi --startup on N ranks over TCP.
mpi_startup() {
    local n=$1
    timeout -s KILL 300 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$n" \
        --mca btl self,tcp --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
        "$M" --startup "$(start_at "2 + $n * 0.1")" 2> "$tmp/mpi.err" | tail -n 1 | cut -d, -f2
}

echo "# scale_bench: start-up on fake nodes of $PER ranks (loopback), $(nproc) CPUs, $(date -u +%F)"
echo
printf '%s\n' "ranks,nodes,startup_s,create_s,create_store_ops,store_ops,store_ops_total,store_bytes,store_bytes_total,connections,connections_total,threads,process_threads,steady_store_ops_s,steady_store_ops_s_total" > "$tmp/counts.csv"
echo "ranks,smddp_c,smddp_torch,gloo,mpi" > "$tmp/times.csv"
for n in "${SIZES[@]}"; do
    row=$(c_startup "$n") || { rc=1; continue; }
    echo "$row" >> "$tmp/counts.csv"
    c_s=$(echo "$row" | cut -d, -f3)
    st=""
    gl=""
    if [ $has_torch = 1 ]; then
        st=$(torch_startup smddp "$n") || rc=1
        gl=$(torch_startup gloo "$n") || rc=1
    fi
    mp=""
    if [ -x "$M" ] && command -v mpirun >/dev/null; then
        mp=$(mpi_startup "$n") || mp=""
        [ -n "$mp" ] || { echo "scale_bench: Open MPI on $n ranks failed:" >&2; tail -n 5 "$tmp/mpi.err" >&2; }
    fi
    echo "$n,$c_s,${st%%,*},${gl%%,*},$mp" >> "$tmp/times.csv"
done
[ $has_torch = 1 ] || echo "(torch or the smddp package is not installed: no torch column)"

LOCAL=${SCALE_BENCH_LOCAL:-16}
for n in $LOCAL; do
    for rep in 1 2; do
        "$S" -p "$n" -o allreduce -b 8 -e 16M -f 8 -n 10 -w 3 -c 1 -F csv > "$tmp/local.$n.smddp.$rep" || rc=1
        if [ -x "$M" ] && command -v mpirun >/dev/null; then
            timeout -s KILL 600 mpirun --allow-run-as-root --oversubscribe -np "$n" "$M" -o allreduce \
                -b 8 -e 16M -f 8 -n 10 -w 3 -c 1 -F csv > "$tmp/local.$n.mpi.$rep" 2> /dev/null || rc=1
        fi
    done
done

$PY - "$tmp/counts.csv" "$tmp/times.csv" "$tmp" "$LOCAL" <<'EOF'
import csv, math, sys

counts = list(csv.DictReader(open(sys.argv[1])))
times = list(csv.DictReader(open(sys.argv[2])))

def num(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None

def fmt(v, d=2):
    return "-" if v is None else f"{v:.{d}f}"

print("## Start-up time (s, the slowest rank's, from a common start to the end of its first allreduce)\n")
print("| ranks | smddp (C API) | smddp (torch) | gloo (torch) | gloo / smddp (torch) | Open MPI (TCP) | MPI / smddp (C) |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for t in times:
    c, s, g, m = (num(t[k]) for k in ("smddp_c", "smddp_torch", "gloo", "mpi"))
    print(f"| {t['ranks']} | {fmt(c)} | {fmt(s)} | {fmt(g)} | {fmt(g / s if g and s else None)} "
          f"| {fmt(m)} | {fmt(m / c if m and c else None)} |")

print("\n## What start-up cost each rank (smddp, C API): most on one rank (total over ranks)\n")
print("| ranks | nodes | store calls in creation | store calls to the first op's end | store bytes | network peers + liveness | threads started | threads in the process | store calls/s while allreduces run |")
print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for c in counts:
    print(f"| {c['ranks']} | {c['nodes']} | {c['create_store_ops']} | {c['store_ops']} ({c['store_ops_total']}) "
          f"| {c['store_bytes']} ({c['store_bytes_total']}) | {c['connections']} ({c['connections_total']}) "
          f"| {c['threads']} | {c['process_threads']} | {c['steady_store_ops_s']} ({c['steady_store_ops_s_total']}) |")

import glob, os
for n in sys.argv[4].split():
    def best(lib):
        out = {}
        for path in glob.glob(os.path.join(sys.argv[3], f"local.{n}.{lib}.*")):
            for row in csv.DictReader(open(path)):
                b, t = int(row["size"]), float(row["time_us"])
                out[b] = min(out.get(b, t), t)
        return out
    s, m = best("smddp"), best("mpi")
    if not s:
        continue
    print(f"\n## {n} ranks on one node: allreduce float32 sum, best of two rounds (us)\n")
    print("| size | smddp | Open MPI | MPI time / smddp time |")
    print("|---:|---:|---:|---:|")
    for b in sorted(s):
        mt = m.get(b)
        print(f"| {b} | {s[b]:.1f} | {fmt(mt, 1)} | {fmt(mt / s[b] if mt else None)} |")

# The model. Fitted to every point but the largest; checked on the largest.
pts = [(int(c["ranks"]), c) for c in counts]
if len(pts) >= 3:
    fit, last = pts[:-1], pts[-1]

    def linfit(xs, ys):
        n = len(xs)
        mx, my = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mx) ** 2 for x in xs)
        b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
        return my - b * mx, b

    print("\n## A model of start-up, fitted to the points up to "
          f"{fit[-1][0]} ranks and checked on {last[0]}\n")
    rows = []
    # Per rank: the creation's store calls, against the depth of the rendezvous tree.
    depth = lambda n: math.ceil(math.log(max(n, 2), 8))
    a, b = linfit([depth(n) for n, _ in fit], [float(c["create_store_ops"]) for _, c in fit])
    rows.append(("store calls in creation, most on one rank", "a + b x ceil(log8 N)", a, b,
                 lambda n: a + b * depth(n), float(last[1]["create_store_ops"])))
    # The store's load: the total of every rank's calls to the first op's end.
    a2, b2 = linfit([n for n, _ in fit], [float(c["store_ops_total"]) for _, c in fit])
    rows.append(("store calls, all ranks", "a + b x N", a2, b2, lambda n: a2 + b2 * n,
                 float(last[1]["store_ops_total"])))
    # Time on this machine: every rank's CPU work shares its few CPUs, so it grows with N.
    a3, b3 = linfit([n for n, _ in fit], [float(c["startup_s"]) for _, c in fit])
    rows.append(("start-up time here (s)", "a + b x N", a3, b3, lambda n: a3 + b3 * n,
                 float(last[1]["startup_s"])))
    print(f"| quantity | form | a | b | predicted at {last[0]} | measured at {last[0]} | predicted at 1,000 | at 10,000 |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name, form, a_, b_, f, meas in rows:
        print(f"| {name} | {form} | {a_:.3g} | {b_:.3g} | {f(last[0]):.3g} | {meas:.3g} "
              f"| {f(1000):.3g} | {f(10000):.3g} |")
    print("""
Assumptions: the rendezvous is a tree of fan-out 8, so a rank's store calls in
creation grow with its depth (ceil(log8 N)), and every other creation step
costs a rank a fixed number of calls (its shared memory, its two network
addresses and two neighbours, its liveness port); calls after creation are the
first op's address look-ups and the straggler telemetry's clock ping-pongs,
which a node's first rank makes with at most 4 other nodes. Time is fitted
linearly in N because here N processes share this machine's CPUs; on a real
cluster each node has its own, and the time is the rendezvous's depth in store
round trips plus one process's own set-up (libfabric's initialisation, the
shared-memory segment), which this machine cannot show.""")
EOF
exit $rc
