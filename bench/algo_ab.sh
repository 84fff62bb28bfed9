#!/usr/bin/env bash
# Two algorithms of one collective, in one build and one run: smddp_bench
# with SMDDP_ALGO forcing algorithm A, then B, taking turns for REPS rounds
# (each keeps its best time per size, every result checked). Prints per size
# both times and A / B (above 1: B is faster), which is how a new algorithm
# earns its range in the selection table (core/select.c).
#
#   bash bench/algo_ab.sh BUILD KIND ALGO_A ALGO_B [smddp_bench flags]
#
# KIND and the algorithm names are as SMDDP_ALGO takes them (smddp_info
# lists them); the default flags are -p 2 -b 1K -e 64M -f 4 -n 20 -w 3.
# An algorithm that cannot run an op (outside its range, say) is not forced:
# the selection falls back, so compare within the algorithms' ranges.
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: bash bench/algo_ab.sh BUILD KIND ALGO_A ALGO_B [flags]" >&2; exit 2; }
build=$1 kind=$2 a=$3 b=$4
shift 4
flags=("$@")
[ ${#flags[@]} -gt 0 ] || flags=(-p 2 -b 1K -e 64M -f 4 -n 20 -w 3)
bench=$build/bench/smddp_bench
[ -x "$bench" ] || { echo "algo_ab.sh: no $bench; build it first" >&2; exit 2; }
REPS=${REPS:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() { # tag algorithm rep
    SMDDP_ALGO="$kind:$2" "$bench" -o "$kind" "${flags[@]}" -c 1 -F csv | grep -v '^size,' \
        > "$tmp/$1.$3.csv"
}
for rep in $(seq "$REPS"); do
    # Which goes first alternates, so neither always runs on a cooler machine.
    if [ $((rep % 2)) -eq 1 ]; then run a "$a" "$rep"; run b "$b" "$rep"
    else run b "$b" "$rep"; run a "$a" "$rep"; fi
done

python3 - "$tmp" "$kind" "$a" "$b" "${flags[*]}" <<'PY'
import glob, os, sys
d, kind, a_name, b_name, flags = sys.argv[1:6]
def best(tag):
    out = {}
    for p in glob.glob(os.path.join(d, f"{tag}.*.csv")):
        for line in open(p):
            f = line.strip().split(",")  # size, count, type, redop, time_us, algbw, busbw, wrong, skew
            if f[7] != "0":
                sys.exit(f"algo_ab.sh: wrong results in {p}: {line.strip()}")
            size, t = int(f[0]), float(f[4])
            out[size] = min(out.get(size, t), t)
    return out
def fmt(n):
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= s and n % s == 0:
            return f"{n // s} {unit}"
    return f"{n} B"
a, b = best("a"), best("b")
print(f"## {kind} ({flags}): A = {a_name}, B = {b_name}, best of each, us\n")
print("| size | A us | B us | A / B |")
print("|---:|---:|---:|---:|")
for size in sorted(a):
    if size in b:
        print(f"| {fmt(size)} | {a[size]:.1f} | {b[size]:.1f} | {a[size] / b[size]:.2f} |")
PY
