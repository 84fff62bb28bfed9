"""What the backend tests share: whether smddp with its compiled shim loads,
and how a test runs ranks.

Tests that need the real backend mark themselves with ``requires_smddp``; in a
checkout without the build they skip and name the import error.
"""

import multiprocessing as mp
import socket
import sys

import pytest


def smddp_import_error():
    """The reason smddp (with smddp._C) cannot be used here, or None."""
    try:
        import smddp  # noqa: F401
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__}: {err}"
    stand_in = getattr(sys.modules.get("smddp"), "STAND_IN_FOR", None)
    if stand_in:
        return stand_in
    try:
        from smddp import _C  # noqa: F401
    except Exception as err:  # noqa: BLE001
        return f"{type(err).__name__}: {err}"
    return None


IMPORT_ERROR = smddp_import_error()
requires_smddp = pytest.mark.skipif(
    IMPORT_ERROR is not None,
    reason=f"smddp with its compiled shim is not importable ({IMPORT_ERROR}); "
    "build it: pip install --no-build-isolation -e . -Cbuild-dir=build-py",
)


def free_port():
    """A TCP port free on 127.0.0.1 now (for a rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn_ranks(target, world, timeout, args=()):
    """Runs target(rank, world, *args, queue) on world spawned processes.

    Each rank puts (rank, [failure, ...], traceback or None) on the queue.
    Waits up to timeout seconds for every report, kills what is left, and
    returns the problems found (empty: every rank reported no failure).
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, *args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(world):
            rank, failures, tb = queue.get(timeout=timeout)
            results[rank] = (failures, tb)
    except Exception:  # noqa: BLE001 - queue.Empty: a rank hung or died
        pass
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    missing = sorted(set(range(world)) - set(results))
    problems = [f"rank {r} did not report within {timeout} s" for r in missing]
    for rank, (failures, tb) in sorted(results.items()):
        if tb:
            problems.append(f"rank {rank} raised:\n{tb}")
        problems += [f"rank {rank}: {f}" for f in failures]
    return problems
