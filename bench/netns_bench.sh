#!/usr/bin/env bash
# Benchmarks across "hosts": network namespaces joined by veth pairs and a
# bridge (test/netns/lib.sh), NODES x PER ranks, everything in one run so the
# ratios compare like with like. For each CPU layout in NETNS_BENCH_CPUS
# (default "split shared"; see node_cpus in test/netns/lib.sh):
#   1. smddp_bench allreduce, flat (every rank on the network) against
#      hierarchical (shared memory inside a node), SMDDP_NET_ALGO;
#   2. the same allreduce through Open MPI (smddp_bench_mpi, where built),
#      launched across the namespaces by mpirun with test/netns/ns_rsh;
#   3. bench/torch_bench.py --launched: smddp against gloo through torch, with
#      issue 4's target (64 MiB allreduce >= 2x gloo's algbw).
# split gives each node its own share of the CPUs, as real hosts have cores
# of their own: the layout issue 4's target is judged in. shared lets every
# node use every CPU, so one "host"'s TCP and copies run on the cores of
# another (torch_bench then pins local rank k of every node to the k-th
# CPU); its torch targets are printed but do not fail the run, while a rank
# that fails otherwise still does.
#
#   bench/netns_bench.sh BUILD_DIR [NODES [PER]]     (as root; default 2 x 2)
#
# Prints markdown tables; removes every namespace it made, also on failure,
# and its temporary folder unless a rank failed (then the ranks' logs stay
# there; torch_bench's CSV and plot stay in NETNS_BENCH_OUT/LAYOUT when
# NETNS_BENCH_OUT names a folder).
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
LAYOUTS=${NETNS_BENCH_CPUS:-split shared}
for layout in $LAYOUTS; do
    case $layout in
    split | shared) NS_CPUS=$layout node_cpus 0 "$NODES" >/dev/null || exit 2 ;;
    *) echo "netns_bench: NETNS_BENCH_CPUS takes split and/or shared, not \"$layout\"" >&2; exit 2 ;;
    esac
done
make_nodes "$NODES" || { echo "netns_bench: cannot create namespaces" >&2; exit 1; }
tmp=$(mktemp -d /tmp/smddp-netns-bench.XXXXXX)
world=$((NODES * PER))
echo "# netns_bench: $NODES nodes x $PER ranks (namespaces over veth), $(nproc) CPUs, $(date -u +%F)"
echo

SIZES=(-b 4 -e 64M -f 8)
rc=0

# bench_layout LAYOUT: every benchmark with NS_CPUS=LAYOUT; files $tmp/LAYOUT.*.
bench_layout() {
    local layout=$1 t=$tmp/$1 cpus="" hosts="" bind=()
    NS_CPUS=$layout
    for ((i = 0; i < NODES; i++)); do cpus+="${cpus:+, }node $i: CPUs $(node_cpus "$i" "$NODES")"; done
    echo "# CPU layout \"$layout\": $cpus"
    echo
    for algo in flat hier; do
        NS_ENV=(SMDDP_NET_ALGO=$algo)
        start_ranks "$NODES" "$PER" 600 "$t.c.$algo" "$S" -o allreduce "${SIZES[@]}" -n 10 -w 5 -c 1 -F csv
        wait_ranks || rc=1
    done
    NS_ENV=()
    if [ -x "$M" ] && command -v mpirun >/dev/null; then
        # ns_rsh starts each node's daemon on that node's CPUs; the ranks keep them.
        NS_RSH_CPUS=""
        for ((i = 0; i < NODES; i++)); do
            hosts+="${hosts:+,}$(ns_addr "$i"):$PER"
            NS_RSH_CPUS+="$(ns_addr "$i")=$(node_cpus "$i" "$NODES") "
        done
        [ "$layout" = split ] && bind=(--bind-to none)
        export NS_RSH_CPUS
        # mpirun runs in the first namespace; ns_rsh starts Open MPI's daemon in the others.
        ns_exec 0 taskset -c "$(node_cpus 0 "$NODES")" timeout -s KILL 600 mpirun --allow-run-as-root \
            --host "$hosts" -np "$world" --mca plm_rsh_agent "$ROOT/test/netns/ns_rsh" "${bind[@]}" \
            --mca oob_tcp_if_include eth0 --mca btl_tcp_if_include eth0 --mca btl self,vader,tcp \
            "$M" -o allreduce "${SIZES[@]}" -n 10 -w 2 -c 1 -F csv >"$t.c.mpi.rank0" 2>"$t.mpi.err" ||
            { echo "(Open MPI run failed: $(tail -n 3 "$t.mpi.err"))"; : >"$t.c.mpi.rank0"; }
        unset NS_RSH_CPUS
    else
        : >"$t.c.mpi.rank0"
    fi

    "$PY" - "$t" <<'PY'
import csv, os, sys
t = sys.argv[1]
def load(name):
    p = f"{t}.c.{name}.rank0"
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

    start_ranks "$NODES" "$PER" 900 "$t.torch" "$PY" "$ROOT/bench/torch_bench.py" --launched \
        --max 64M --out "${NETNS_BENCH_OUT:-$tmp}/$layout" ${TORCH_BENCH_ARGS:---no-ddp}
    local trc=0 others=0
    wait_ranks || trc=1
    for ((r = 1; r < ${#RANK_RCS[@]}; r++)); do [ "${RANK_RCS[r]}" = 0 ] || others=1; done
    sed -n '/^# torch_bench/,$p' "$t.torch.rank0"
    if [ $trc != 0 ]; then
        # torch_bench's rank 0 alone exits 1 when a target fails.
        if [ "$layout" = shared ] && [ $others = 0 ] && [ "${RANK_RCS[0]}" = 1 ] &&
            grep -q '^- FAIL' "$t.torch.rank0"; then
            echo "(the shared layout's targets are for comparison: they do not fail the run)"
        else
            rc=1
            echo "a rank exited non-zero (torch_bench does when a speed target fails): the logs stay in $tmp"
        fi
    fi
    echo
}

for layout in $LAYOUTS; do bench_layout "$layout"; done
exit $rc
