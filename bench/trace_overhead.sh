#!/usr/bin/env bash
# What the flight recorder costs: smddp_bench's 8 B allreduce latency and
# 16 MiB allreduce bandwidth with the recorder off (SMDDP_TRACE_BUFFER=0)
# and on (the default), taking turns for ROUNDS rounds in one run (which
# goes first alternates), each keeping its best time. Prints both and
# off / on (above 1: on is faster; noise is the spread of rounds).
#
#   bash bench/trace_overhead.sh BUILD_DIR [RANKS]     (default 2 ranks)
set -euo pipefail
BUILD=${1:?usage: bash bench/trace_overhead.sh BUILD_DIR [RANKS]}
RANKS=${2:-2}
ROUNDS=${ROUNDS:-5}
S=$BUILD/bench/smddp_bench
[ -x "$S" ] || { echo "trace_overhead: no $S; build first" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

one() { # tag buffer
    SMDDP_TRACE_BUFFER=$2 "$S" -p "$RANKS" -o allreduce -b 8 -e 8 -n 20000 -w 1000 -c 0 -F csv |
        grep -v -e '^#' -e ',size,' -e '^size' >>"$tmp/$1.small"
    SMDDP_TRACE_BUFFER=$2 "$S" -p "$RANKS" -o allreduce -b 16M -e 16M -n 40 -w 5 -c 0 -F csv |
        grep -v -e '^#' -e ',size,' -e '^size' >>"$tmp/$1.large"
}
for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) -eq 1 ]; then one off 0; one on 2000; else one on 2000; one off 0; fi
done
python3 - "$tmp" "$RANKS" "$ROUNDS" <<'PY'
import sys
tmp, ranks, rounds = sys.argv[1], sys.argv[2], sys.argv[3]
def times(name):
    return [float(l.split(",")[4]) for l in open(f"{tmp}/{name}") if l.strip()]
print(f"# trace_overhead: {ranks} ranks, {rounds} rounds taking turns, "
      f"SMDDP_TRACE_BUFFER=0 (off) against 2000 (on)")
print()
print("| allreduce | off: best us | on: best us | off / on | off: all rounds | on: all rounds |")
print("|---|---:|---:|---:|---|---|")
for size, kind in (("8 B", "small"), ("16 MiB", "large")):
    off, on = times(f"off.{kind}"), times(f"on.{kind}")
    print(f"| {size} | {min(off):.2f} | {min(on):.2f} | {min(off) / min(on):.3f} | "
          f"{', '.join(f'{t:.1f}' for t in off)} | {', '.join(f'{t:.1f}' for t in on)} |")
PY
