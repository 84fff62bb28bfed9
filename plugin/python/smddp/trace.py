"""Reads the flight recorders of one job and says where every rank was.

    python -m smddp.trace DIR

DIR holds the files libsmddp writes (smddp-trace-<job>-<comm>-r<rank>.json:
on a communicator's failure when SMDDP_TRACE_DIR is set, or on demand with
smddp.dump_trace()). For each communicator it prints:

- one line per rank: the last collective it finished, the one it is in (or
  that it has issued nothing since); for a rank with no file (it died, or
  was killed before it failed), where a file of its node saw it last;
- the first divergence: ranks at different sequence numbers, or different
  operations at one sequence number;
- the slowest ranks: libsmddp's arrival telemetry (each file holds its
  node's: when each rank started each collective, one clock per node),
  summed over every collective since the communicator was made; and the
  ranks that issued collectives latest, over the collectives every file
  holds (wall-clock times, so across nodes as good as the clocks' agreement).

A missing, empty or truncated file is named with what is wrong with it; the
tool never stops on one.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict

P2P = ("send", "recv")


def _describe(op: dict) -> str:
    what = f"{op['kind']} seq {op['seq']} ({op['count']} x {op['dtype']}"
    if op.get("op"):
        what += f" {op['op']}"
    if op.get("root", -1) >= 0:
        what += f", {'peer' if op['kind'] in P2P else 'root'} {op['root']}"
    return what + ")"


def _ranges(ranks: list[int]) -> str:
    """[0, 1, 2, 4, 6, 7] -> "0-2,4,6-7"."""
    out, start, prev = [], None, None
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif r == prev + 1:
            prev = r
        else:
            out.append(f"{start}-{prev}" if prev > start else f"{start}")
            start = prev = r
    if start is not None:
        out.append(f"{start}-{prev}" if prev > start else f"{start}")
    return ",".join(out)


def load(folder: str) -> tuple[dict, list[str]]:
    """{comm: {rank: trace}} from folder's trace files, and what was wrong with others."""
    problems = []
    comms: dict = defaultdict(dict)
    try:
        names = sorted(os.listdir(folder))
    except OSError as err:
        return {}, [f"{folder}: cannot list it ({err.strerror})"]
    for name in names:
        if not (name.startswith("smddp-trace-") and name.endswith(".json")):
            continue
        path = os.path.join(folder, name)
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as err:
            problems.append(f"{name}: cannot read it ({err.strerror})")
            continue
        if not text.strip():
            problems.append(f"{name}: empty file")
            continue
        try:
            trace = json.loads(text)
        except ValueError as err:
            problems.append(f"{name}: truncated or not JSON ({err})")
            continue
        if not isinstance(trace, dict) or trace.get("format") != "smddp-trace" or \
                not isinstance(trace.get("ops"), list) or "rank" not in trace:
            problems.append(f"{name}: not an smddp flight recorder")
            continue
        comms[str(trace.get("comm", "?"))][int(trace["rank"])] = trace
    return comms, problems


def _wall(trace: dict, mono_ns: int) -> int:
    """A monotonic time of trace's rank as wall-clock ns."""
    return int(trace["wall_ns"]) - (int(trace["monotonic_ns"]) - int(mono_ns))


def report(comm: str, traces: dict) -> list[str]:
    size = max(int(t.get("size", 0)) for t in traces.values())
    lines = [f"communicator {comm}: {len(traces)} of {size} rank(s) wrote a recorder"]
    status = {}   # rank -> (last finished seq, op in flight or None, first failed op or None)
    seen = {}     # rank -> (whose file, its entry in "positions"): ranks of the same node
    for src, t in sorted(traces.items()):
        for p in t.get("positions") or []:
            if isinstance(p, dict) and isinstance(p.get("rank"), int) and p["rank"] not in seen:
                seen[p["rank"]] = (src, p)
    for rank in range(size):
        t = traces.get(rank)
        if t is None:
            line = f"  rank {rank}: no file (the rank died, or never wrote one)"
            if rank in seen:
                src, p = seen[rank]
                fin, run = int(p.get("finished", -1)), int(p.get("running", -1))
                where = f"last finished seq {fin}" if fin >= 0 else "finished no collective"
                where += f"; in seq {run}" if run >= 0 else "; in no collective"
                if p.get("state") in ("gone", "left"):
                    where += f" ({'process gone' if p['state'] == 'gone' else 'left'})"
                line += f"; rank {src}'s file saw it: {where}"
                status[rank] = (fin if fin >= 0 else None,
                                {"seq": run, "state": "running"} if run >= 0 else None, None)
            lines.append(line)
            continue
        coll = [op for op in t["ops"] if op.get("kind") not in P2P]
        done = [op for op in coll if op.get("state") in ("done", "failed")]
        pending = [op for op in coll if op.get("state") in ("queued", "running")]
        last = max((op["seq"] for op in done), default=None)
        inflight = min(pending, key=lambda op: op["seq"]) if pending else None
        failed = [op for op in done if op.get("state") == "failed"]
        status[rank] = (last, inflight, failed[0] if failed else None)
        where = f"last finished seq {last}" if last is not None else "finished no collective"
        if inflight:
            where += f"; in {_describe(inflight)}, {inflight['state']}"
        elif failed:
            where += f"; {_describe(failed[0])} failed: {failed[0].get('status', '')}"
        else:
            where += "; has issued nothing since"
        if len(t["ops"]) >= int(t.get("capacity", 0)) > 0:
            where += f" (recorder full: oldest kept id {t['ops'][0]['id']})"
        lines.append(f"  rank {rank}: {where}")

    # The first divergence: where ranks stand, then what they issued at one seq.
    at = defaultdict(list)   # (seq, in it?) -> ranks
    for rank, (last, inflight, failed) in status.items():
        if inflight:
            at[(inflight["seq"], True)].append(rank)
        else:
            at[(last if last is not None else -1, False)].append(rank)
    if len(at) > 1:
        parts = []
        for (seq, inside), ranks in sorted(at.items(), key=lambda kv: (-kv[0][0], not kv[0][1])):
            who = f"rank{'s' if len(ranks) > 1 else ''} {_ranges(ranks)}"
            if inside:
                parts.append(f"{who} in seq {seq}")
            elif seq >= 0:
                parts.append(f"{who} finished seq {seq} and issued nothing since")
            else:
                parts.append(f"{who} finished no collective")
        lines.append("  divergence: " + "; ".join(parts))
    by_seq = defaultdict(dict)
    for rank, t in traces.items():
        for op in t["ops"]:
            if op.get("kind") not in P2P:
                by_seq[op["seq"]][rank] = op
    differ = False
    for seq in sorted(by_seq):
        kinds = defaultdict(list)
        for rank, op in by_seq[seq].items():
            kinds[(op["kind"], op["count"], op["dtype"], op.get("op", ""), op.get("root", -1))].append(rank)
        if len(kinds) > 1:
            parts = [f"ranks {_ranges(r)} issued {_describe(by_seq[seq][r[0]])}"
                     for _, r in sorted(kinds.items(), key=lambda kv: min(kv[1]))]
            lines.append(f"  different operations at seq {seq}: " + "; ".join(parts))
            differ = True
            break
    if len(at) <= 1 and not differ:
        lines.append("  no divergence: every rank stands at the same collective")

    # Lateness as libsmddp measured it: per rank, from the file that compared the most ops.
    best = {}  # rank -> (ops, late_ns)
    skew = None
    for t in traces.values():
        arr = t.get("arrivals")
        if not isinstance(arr, dict):
            continue
        ops = int(arr.get("ops", 0))
        for r, ns in enumerate(arr.get("late_ns") or []):
            if ns is not None and ops > best.get(r, (-1, 0))[0]:
                best[r] = (ops, int(ns))
        if ops and (skew is None or ops > skew[0]):
            skew = (ops, arr.get("skew_ns", {}))
    if best and skew:
        worst = sorted(best.items(), key=lambda kv: -kv[1][1])[:3]
        s = skew[1]
        lines.append("  slowest to arrive (libsmddp's arrival times, summed): " +
                     ", ".join(f"rank {r} {ns / 1e9:.3f} s over {ops} collective(s)"
                               for r, (ops, ns) in worst) +
                     f"; skew p50 {s.get('p50', 0) / 1e3:.1f} us, p99 "
                     f"{s.get('p99', 0) / 1e3:.1f} us, max {s.get('max', 0) / 1e3:.1f} us")
        unseen = sorted(set(range(size)) - set(best))
        if unseen:
            lines[-1] += f" (ranks {_ranges(unseen)}: no file covers them)"

    # Lateness: per collective held by every file, issue time minus the earliest.
    common = [s for s, ops in by_seq.items() if len(ops) == len(traces) > 1]
    if common:
        late = defaultdict(int)
        for s in common:
            times = {r: _wall(traces[r], op["issued_ns"]) for r, op in by_seq[s].items()}
            first = min(times.values())
            for r, t in times.items():
                late[r] += t - first
        worst = sorted(late.items(), key=lambda kv: -kv[1])[:3]
        lines.append(f"  latest to issue, over the {len(common)} collective(s) every file holds: " +
                     ", ".join(f"rank {r} {ns / 1e6:.1f} ms" for r, ns in worst))
    return lines


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] in ("-h", "--help"):
        print("usage: python -m smddp.trace DIR  (a folder of smddp-trace-*.json files)",
              file=sys.stderr)
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    folder = args[0]
    comms, problems = load(folder)
    for p in problems:
        print(f"smddp.trace: {p}")
    if not comms:
        print(f"smddp.trace: no readable smddp-trace-*.json in {folder}")
        return 1
    for comm in sorted(comms):
        print("\n".join(report(comm, comms[comm])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
