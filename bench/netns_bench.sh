#!/usr/bin/env bash
# Benchmarks across "hosts": network namespaces joined by veth pairs and a
# bridge (test/netns/lib.sh), NODES x PER ranks, everything in one run so the
# ratios compare like with like:
#   1. smddp_bench allreduce, flat (every rank on the network) against
#      hierarchical (shared memory inside a node), SMDDP_NET_ALGO;
#   2. the same allreduce through Open MPI (smddp_bench_mpi, where built),
#      launched across the namespaces by mpirun with test/netns/ns_rsh;
#   3. bench/torch_bench.py --launched: smddp against gloo through torch, with
#      issue 4's target (64 MiB allreduce >= 2x gloo's algbw).
#
#   bench/netns_bench.sh BUILD_DIR [NODES [PER]]     (as root; default 2 x 2)
#
# Prints markdown tables; removes every namespace it made, also on failure,
# and its temporary folder unless a rank failed (then the ranks' logs stay
# there; torch_bench's CSV and plot stay when NETNS_BENCH_OUT names a folder).
set -uo pipefail

BUILD=${1:?usage: bench/netns_bench.sh BUILD_DIR [NODES [PER]]}
NODES=${2:-2}
PER=${3:-2}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
S=$BUILD/bench/smddp_bench
M=$BUILD/bench/smddp_bench_mpi
# shellcheck source=test/netns/lib.sh
. "$ROOT/test/netns/lib.sh"
tmp=""
# The temporary folder goes unless a rank failed: then its logs stay for reading.
trap 'ns_cleanup; [ -n "$tmp" ] && [ "${rc:-1}" = 0 ] && rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

[ -x "$S" ] || { echo "netns_bench: $S not found: build first" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "netns_bench: network namespaces need root" >&2; exit 1; }
make_nodes "$NODES" || { echo "netns_bench: cannot create namespaces" >&2; exit 1; }
tmp=$(mktemp -d /tmp/smddp-netns-bench.XXXXXX)
world=$((NODES * PER))
echo "# netns_bench: $NODES nodes x $PER ranks (namespaces over veth), $(nproc) CPUs, $(date -u +%F)"
echo

SIZES=(-b 4 -e 64M -f 8)
rc=0
for algo in flat hier; do
    NS_ENV=(SMDDP_NET_ALGO=$algo)
    start_ranks "$NODES" "$PER" 600 "$tmp/c.$algo" "$S" -o allreduce "${SIZES[@]}" -n 10 -w 5 -c 1 -F csv
    wait_ranks || rc=1
done
NS_ENV=()
if [ -x "$M" ] && command -v mpirun >/dev/null; then
    hosts=""
    for ((i = 0; i < NODES; i++)); do hosts+="${hosts:+,}$(ns_addr "$i"):$PER"; done
    # mpirun runs in the first namespace; ns_rsh starts Open MPI's daemon in the others.
    ns_exec 0 timeout -s KILL 600 mpirun --allow-run-as-root \
        --host "$hosts" -np "$world" --mca plm_rsh_agent "$ROOT/test/netns/ns_rsh" \
        --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0 --mca btl self,vader,tcp \
        "$M" -o allreduce "${SIZES[@]}" -n 10 -w 2 -c 1 -F csv >"$tmp/c.mpi.rank0" 2>"$tmp/mpi.err" ||
        { echo "(Open MPI run failed: $(tail -n 3 "$tmp/mpi.err"))"; : >"$tmp/c.mpi.rank0"; }
else
    : >"$tmp/c.mpi.rank0"
fi

"$PY" - "$tmp" <<'PY'
import csv, os, sys
d = sys.argv[1]
def load(name):
    p = os.path.join(d, f"c.{name}.rank0")
    if not os.path.exists(p) or not os.path.getsize(p):
        return {}
    lines = [l for l in open(p) if l.strip() and not l.startswith("#")]
    return {int(r["size"]): r for r in csv.DictReader(lines)}
flat, hier, mpi = load("flat"), load("hier"), load("mpi")
print("## allreduce, float32 sum, C API (time in us, algbw in GB/s)")
print()
print("| size | flat us | hier us | hier algbw | flat / hier time | MPI us | MPI / hier time |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for s in sorted(hier):
    h, f, m = hier[s], flat.get(s), mpi.get(s)
    ht = float(h["time_us"])
    ft = float(f["time_us"]) if f else float("nan")
    mt = float(m["time_us"]) if m else float("nan")
    print(f"| {s} | {ft:.1f} | {ht:.1f} | {float(h['algbw_gbs']):.3f} | {ft / ht:.2f}x | "
          f"{mt:.1f} | {mt / ht:.2f}x |")
print()
PY

start_ranks "$NODES" "$PER" 900 "$tmp/torch" "$PY" "$ROOT/bench/torch_bench.py" --launched \
    --max 64M --out "${NETNS_BENCH_OUT:-$tmp}" ${TORCH_BENCH_ARGS:---no-ddp}
wait_ranks || rc=1
sed -n '/^# torch_bench/,$p' "$tmp/torch.rank0"
[ $rc = 0 ] || echo "a rank exited non-zero (torch_bench does when a speed target fails): the logs stay in $tmp"
exit $rc
