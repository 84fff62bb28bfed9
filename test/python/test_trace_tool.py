"""python -m smddp.trace on recorder files written here by hand: where each
rank stands, the first divergence, lateness, and bad files."""

import json
import os
import subprocess
import sys



def _op(seq, kind="allreduce", state="done", count=4096, issued=0, **kw):
    op = {"id": seq + 1, "seq": seq, "kind": kind, "count": count, "dtype": "float32",
          "op": "sum" if kind == "allreduce" else "", "root": -1, "mem": "host", "path": "shm",
          "algo": "", "issued_ns": issued, "started_ns": issued, "finished_ns": issued,
          "state": state, "status": "success" if state == "done" else ""}
    op.update(kw)
    return op


def _write(folder, rank, size, ops, comm="smddp/0"):
    trace = {"format": "smddp-trace", "version": 1, "comm": comm, "rank": rank, "size": size,
             "pid": 1, "capacity": 2000, "recorded": len(ops), "monotonic_ns": 10**12,
             "wall_ns": 10**18, "ops": ops}
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
