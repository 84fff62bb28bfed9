#!/usr/bin/env bash
# Two builds of libsmddp side by side, in one run: smddp_bench of each build,
# taking turns for REPS rounds (each keeps its best time per size), then
# bench/torch_bench.py with each build's Python package first on PYTHONPATH,
# also taking turns. Prints, per collective and size, both times and A's
# time / B's time (above 1: B is faster), so a change can be checked against
# the commit before it on the same machine at the same time.
#
#   bash bench/ab.sh A_BUILD B_BUILD [A_PYPATH B_PYPATH]
#
# A_BUILD, B_BUILD: meson build dirs with bench/smddp_bench. A_PYPATH,
# B_PYPATH: where each build's Python package is installed (for example
# pip install --no-build-isolation --no-deps --target DIR .); without them
# the torch part is skipped.
set -euo pipefail
[ $# -eq 2 ] || [ $# -eq 4 ] || { echo "usage: bash bench/ab.sh A_BUILD B_BUILD [A_PYPATH B_PYPATH]" >&2; exit 2; }
A=$1 B=$2
for b in "$A" "$B"; do
    [ -x "$b/bench/smddp_bench" ] || { echo "ab.sh: no $b/bench/smddp_bench; build it first" >&2; exit 2; }
done
REPS=${REPS:-3}
TORCH_REPS=${TORCH_REPS:-2}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

c_runs() { # build tag rep
    local s=$1/bench/smddp_bench tag=$2 rep=$3
    {
        $s -p 2 -o allreduce -b 8 -e 64M -f 8 -n 20 -w 5 -c 1 -F csv | sed 's/^/allreduce-2,/'
        $s -p 4 -o allreduce -b 4K -e 16M -f 16 -n 10 -w 3 -c 1 -F csv | sed 's/^/allreduce-4,/'
        for o in allgather reduce_scatter broadcast alltoall; do
            $s -p 2 -o $o -b 64K -e 16M -f 16 -n 10 -w 3 -c 1 -F csv | sed "s/^/$o-2,/"
        done
    } | grep -v ',size,' > "$tmp/c.$tag.$rep.csv"
}
for rep in $(seq "$REPS"); do
    # Which build goes first alternates, so neither always runs on a cooler machine.
    if [ $((rep % 2)) -eq 1 ]; then c_runs "$A" a "$rep"; c_runs "$B" b "$rep"
    else c_runs "$B" b "$rep"; c_runs "$A" a "$rep"; fi
done

if [ $# -eq 4 ]; then
    for rep in $(seq "$TORCH_REPS"); do
        for tag in $( [ $((rep % 2)) -eq 1 ] && echo "a b" || echo "b a"); do
            py=$3; [ "$tag" = b ] && py=$4
            mkdir -p "$tmp/t.$tag.$rep"
            PYTHONPATH="$py${PYTHONPATH:+:$PYTHONPATH}" python3 "$here/torch_bench.py" --world 2 \
                --min 8 --max 16M --factor 8 --no-ddp --out "$tmp/t.$tag.$rep" \
                > "$tmp/t.$tag.$rep/log" 2>&1 || true
            [ -s "$tmp/t.$tag.$rep/torch_bench.csv" ] \
                || { echo "ab.sh: torch_bench with $py failed:" >&2; tail -20 "$tmp/t.$tag.$rep/log" >&2; exit 1; }
        done
    done
fi

python3 - "$tmp" "$A" "$B" "$here" <<'PY'
import csv, glob, os, sys
d, a_dir, b_dir = sys.argv[1:4]
sys.path.insert(0, sys.argv[4])
from torch_bench import fmt_size as size
def best_c(tag):
    out = {}
    for p in glob.glob(os.path.join(d, f"c.{tag}.*.csv")):
        for line in open(p):
            f = line.strip().split(",")  # tag, size, count, type, redop, time_us, algbw, busbw, wrong
            key = (f[0], int(f[1]))
            t = float(f[5])
            if f[8] != "0":
                sys.exit(f"ab.sh: wrong results in {p}: {line.strip()}")
            out[key] = min(out.get(key, t), t)
    return out
a, b = best_c("a"), best_c("b")
print(f"## smddp_bench: A = {a_dir}, B = {b_dir} (best of each, us)\n")
print("| collective, ranks | size | A us | B us | A / B |")
print("|---|---:|---:|---:|---:|")
for k in sorted(a, key=lambda k: (k[0], k[1])):
    if k in b:
        print(f"| {k[0]} | {size(k[1])} | {a[k]:.1f} | {b[k]:.1f} | {a[k] / b[k]:.2f} |")
tb = {}
for p in glob.glob(os.path.join(d, "t.*.*", "torch_bench.csv")):
    tag = p.split(os.sep)[-2].split(".")[1]
    for r in csv.DictReader(open(p)):
        key = (tag, r["backend"], r["collective"], int(r["size_bytes"]))
        t = float(r["time_us"])
        tb[key] = min(tb.get(key, t), t)
if tb:
    print(f"\n## torch_bench, 2 ranks (best of each, us; gloo measured in the same runs)\n")
    print("| collective | size | A smddp | B smddp | A / B | gloo (A's runs, B's runs) |")
    print("|---|---:|---:|---:|---:|---:|")
    for (tag, be, coll, n) in sorted(k for k in tb if k[0] == "a" and k[1] == "smddp"):
        kb = ("b", "smddp", coll, n)
        if kb not in tb: continue
        ga, gb = tb.get(("a", "gloo", coll, n)), tb.get(("b", "gloo", coll, n))
        g = f"{ga:.1f}, {gb:.1f}" if ga and gb else ""
        print(f"| {coll} | {size(n)} | {tb[(tag, be, coll, n)]:.1f} | {tb[kb]:.1f} | "
              f"{tb[(tag, be, coll, n)] / tb[kb]:.2f} | {g} |")
PY
