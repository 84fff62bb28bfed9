"""python -m smddp.trace on recorder files written here by hand: where each
rank stands, the first divergence, lateness, and bad files."""

import json
import os
import re
import subprocess
import sys

import pytest



def _op(seq, kind="allreduce", state="done", count=4096, issued=0, **kw):
    op = {"id": seq + 1, "seq": seq, "kind": kind, "count": count, "dtype": "float32",
          "op": "sum" if kind == "allreduce" else "", "root": -1, "mem": "host", "path": "shm",
          "algo": "", "issued_ns": issued, "started_ns": issued, "finished_ns": issued,
          "state": state, "status": "success" if state == "done" else ""}
    op.update(kw)
    return op


def _write(folder, rank, size, ops, comm="smddp/0", arrivals=None):
    trace = {"format": "smddp-trace", "version": 1, "comm": comm, "rank": rank, "size": size,
             "pid": 1, "capacity": 2000, "recorded": len(ops), "monotonic_ns": 10**12,
             "wall_ns": 10**18, "ops": ops}
    if arrivals is not None:
        trace["arrivals"] = arrivals
    path = os.path.join(folder, f"smddp-trace-job-smddp_0-r{rank}.json")
    with open(path, "w") as f:
        json.dump(trace, f)
    return path


def _run(folder):
    r = subprocess.run([sys.executable, "-m", "smddp.trace", str(folder)],
                       capture_output=True, text=True, timeout=60)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    return r.returncode, r.stdout


def test_one_rank_behind_and_a_dead_one(tmp_path):
    # Ranks 0, 2, 4: in seq 41; rank 3: finished 40, nothing since; rank 1: no file.
    # Rank 2 issued every collective 30 ms after the others.
    for rank in (0, 2, 3, 4):
        late = 30_000_000 if rank == 2 else 0
        ops = [_op(s, issued=s * 100_000_000 + late) for s in range(41)]
        if rank != 3:
            ops.append(_op(41, state="running", issued=41 * 100_000_000 + late))
        _write(tmp_path, rank, 5, ops)
    rc, out = _run(tmp_path)
    assert rc == 0, out
    assert "rank 1: no file" in out
    assert "rank 3: last finished seq 40; has issued nothing since" in out
    assert "rank 0: last finished seq 40; in allreduce seq 41 (4096 x float32 sum), running" in out
    assert "divergence: ranks 0,2,4 in seq 41; rank 3 finished seq 40 and issued nothing since" in out
    assert "latest to issue, over the 41 collective(s) every file holds: rank 2 1230.0 ms" in out


def test_arrival_telemetry_across_files(tmp_path):
    # Two nodes of 2 ranks: each file covers its node's ranks; rank 3 is the slowest.
    skew = {"p50": 30_000_000, "p99": 31_000_000, "max": 32_000_000}
    for rank in range(4):
        node = rank // 2
        late = [None] * 4
        late[2 * node], late[2 * node + 1] = (0, 5_000_000) if node == 0 else (1_000_000, 600_000_000)
        arr = {"ops": 20, "late_ns": late, "skew_ns": skew, "clock_error_ns": 0}
        _write(tmp_path, rank, 4, [_op(s) for s in range(20)], arrivals=arr)
    rc, out = _run(tmp_path)
    assert rc == 0, out
    assert ("slowest to arrive (libsmddp's arrival times, summed): rank 3 0.600 s over 20 "
            "collective(s), rank 1 0.005 s over 20 collective(s), rank 2 0.001 s over 20 "
            "collective(s); skew p50 30000.0 us, p99 31000.0 us, max 32000.0 us") in out


def test_different_operations_at_one_seq(tmp_path):
    _write(tmp_path, 0, 2, [_op(0), _op(1, state="running")])
    _write(tmp_path, 1, 2, [_op(0), _op(1, kind="broadcast", state="running", root=0)])
    rc, out = _run(tmp_path)
    assert rc == 0
    assert ("different operations at seq 1: ranks 0 issued allreduce seq 1 (4096 x float32 sum); "
            "ranks 1 issued broadcast seq 1 (4096 x float32, root 0)") in out


def test_all_level(tmp_path):
    for rank in range(2):
        _write(tmp_path, rank, 2, [_op(0), _op(1)])
    rc, out = _run(tmp_path)
    assert rc == 0
    assert "no divergence" in out


def test_bad_files_are_named_and_skipped(tmp_path):
    _write(tmp_path, 0, 2, [_op(0)])
    (tmp_path / "smddp-trace-job-smddp_0-r1.json").write_text("")
    (tmp_path / "smddp-trace-job-smddp_0-r2.json").write_text('{"format": "smddp-trace", "ops": [')
    (tmp_path / "smddp-trace-job-smddp_0-r3.json").write_text('{"something": "else"}')
    rc, out = _run(tmp_path)
    assert rc == 0
    assert "r1.json: empty file" in out
    assert "r2.json: truncated or not JSON" in out
    assert "r3.json: not an smddp flight recorder" in out
    assert "rank 0: last finished seq 0" in out


def test_empty_and_missing_folders(tmp_path):
    rc, out = _run(tmp_path)
    assert rc == 1 and "no readable smddp-trace-*.json" in out
    rc, out = _run(tmp_path / "nope")
    assert rc == 1 and "cannot list it" in out


def test_usage():
    r = subprocess.run([sys.executable, "-m", "smddp.trace"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "usage: python -m smddp.trace DIR" in r.stderr


def test_rank_without_file_seen_by_its_node(tmp_path):
    # Rank 2 was killed before it failed: rank 0's file saw it finish seq 8 and start nothing.
    positions = [{"rank": r, "running": 9 if r < 2 else -1, "finished": 8, "failed": -1,
                  "state": "alive"} for r in range(3)]
    for rank in (0, 1):
        ops = [_op(s) for s in range(9)] + [_op(9, state="running")]
        trace_path = _write(tmp_path, rank, 3, ops)
        with open(trace_path) as f:
            trace = json.load(f)
        trace["positions"] = positions
        with open(trace_path, "w") as f:
            json.dump(trace, f)
    rc, out = _run(tmp_path)
    assert rc == 0, out
    assert ("rank 2: no file (the rank died, or never wrote one); rank 0's file saw it: last "
            "finished seq 8; in no collective") in out
    assert "divergence: ranks 0-1 in seq 9; rank 2 finished seq 8 and issued nothing since" in out


# A real job: train_ddp with a straggler, then with a rank that stops (smddprun, 3 ranks).

def _train_ddp(tmp_path, *flags, env=None):
    from smddp_support import IMPORT_ERROR

    if IMPORT_ERROR is not None:
        pytest.skip(f"smddp with its compiled shim is not importable ({IMPORT_ERROR})")
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("SMDDP_", "TORCHELASTIC_")) and
            k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    keep.update(env or {})
    return subprocess.run([sys.executable, "-m", "smddp.launcher", "--nproc-per-node", "3", "--",
                           sys.executable, "-m", "smddp.examples.train_ddp", *flags],
                          capture_output=True, text=True, env=keep, timeout=240, cwd=tmp_path)


def test_train_ddp_names_its_straggler(tmp_path):
    proc = _train_ddp(tmp_path, "--steps", "20", "--slow-rank", "1", "--slow-ms", "30")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "arrivals (smddp.stats): slowest rank 1," in proc.stdout, proc.stdout


def test_train_ddp_hang_says_where_every_rank_is(tmp_path):
    traces = tmp_path / "traces"  # made by the first dump
    proc = _train_ddp(tmp_path, "--timeout", "5", "--hang-rank", "2", "--hang-step", "5",
                      env={"SMDDP_TRACE_DIR": str(traces)})
    assert proc.returncode != 0
    failed = [line for line in proc.stderr.splitlines() if "train_ddp failed" in line]
    assert failed, proc.stderr
    for line in failed:  # torchrun may stop a rank before it prints; each that did says it
        assert re.search(r"where the ranks are: ranks 0,1: in seq (\d+); rank 2: finished seq "
                         r"(\d+) and has not started seq \1", line), line
    rc, out = _run(traces)
    assert rc == 0, out
    assert re.search(r"divergence: ranks 0-1 in seq (\d+); rank 2 finished seq \d+ and issued "
                     r"nothing since", out), out
