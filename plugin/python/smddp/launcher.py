"""``smddprun``: start a training command with the job's communication backend.

Two ways, as SageMaker uses its launcher:

* **Per-rank wrapper** under a launcher that already started the processes
  (``mpirun -np 4 smddprun python train.py``, ``srun smddprun ...``, or under
  torchrun). Open MPI and Slurm do not set the variables torch's ``env://``
  rendezvous reads, so this maps theirs to RANK, WORLD_SIZE, LOCAL_RANK,
  LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT (rank 0's host and port from
  SageMaker's ``SMDATAPARALLEL_SERVER_ADDR``/``_PORT`` where its runner set
  them), then execs the command: the wrapper leaves no extra process between
  the launcher and the rank.
* **One-machine launcher** (``smddprun --nproc-per-node 2 train.py ...``): it
  execs torchrun, which already manages processes well, with the resolved
  environment.

Either way the backend is resolved by :mod:`smddp.config` (where SageMaker's
runner decided, from its ``USE_SMDDP_COLLECTIVES``), and one line per machine
on stderr names it and its source. Under ``auto`` it
exports ``SMDDP_COMMUNICATION_BACKEND=auto``, ``USE_SMDDP_COLLECTIVES=1`` and
prepends libsmddp to ``LD_PRELOAD`` (so NCCL-based code's AllReduce is served
by it too); when the library cannot be found it warns once and falls back to
``nccl`` so the job still runs. Under ``nccl`` it exports
``SMDDP_COMMUNICATION_BACKEND=nccl``, ``USE_SMDDP_COLLECTIVES=0`` and preloads
nothing. A bad value exits with status 2 and the reason on stderr.

This module imports neither torch nor the compiled extension: it runs once per
rank before the job starts and must be quick, and it must work where the
extension cannot load (that is when it falls back). The package's
``__init__`` must allow that too, since ``smddp.launcher`` imports it first.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import socket
import sys
from pathlib import Path
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from smddp import config

LIBRARY_GLOBS = ("libsmddp.so", "libsmddp.so.*")
PORT_BASE, PORT_RANGE = 20000, 20000
# Rank 0's host and port as SageMaker's smdataparallel runner passes them.
SM_ADDR_VAR, SM_PORT_VAR = "SMDATAPARALLEL_SERVER_ADDR", "SMDATAPARALLEL_SERVER_PORT"


class LaunchError(Exception):
    """The launch cannot proceed; the message is printed and smddprun exits 2."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="smddprun",
        description="Run a training command with smddp's communication-backend switch, "
        "per rank under mpirun/srun/torchrun or on one machine through torchrun.",
        epilog="examples: mpirun -np 4 smddprun python train.py | "
        "smddprun --nproc-per-node 2 train.py --epochs 1 | "
        "smddprun --nnodes 2 --node-rank 0 --nproc-per-node 8 --master-addr node0 "
        "--master-port 29500 train.py",
    )
    p.add_argument("--communication-backend", metavar="{auto,nccl}",
                   help="auto: smddp's collectives (default); nccl: CUDA collectives through NCCL")
    p.add_argument("--communication-options", metavar="JSON|@FILE",
                   help='a communication_options object, e.g. \'{"backend": "nccl"}\'')
    p.add_argument("--library", metavar="PATH",
                   help="libsmddp to preload under auto (default: the one in the smddp package)")
    p.add_argument("--nproc-per-node", type=int, metavar="N",
                   help="start N ranks on this machine through torchrun")
    p.add_argument("--nnodes", type=int, metavar="N", default=1,
                   help="with --nproc-per-node: machines in the job, each running this same "
                   "command with its own --node-rank (needs --master-addr and --master-port)")
    p.add_argument("--node-rank", type=int, metavar="I", default=0,
                   help="with --nnodes: this machine's index, 0 .. N-1 (0 hosts the rendezvous)")
    p.add_argument("--master-addr", help="rendezvous address (default: MASTER_ADDR, or derived)")
    p.add_argument("--master-port", type=int,
                   help="rendezvous port (default: MASTER_PORT, or derived from the job id)")
    p.add_argument("--keep-going", action="store_true",
                   help="with --nproc-per-node on one machine: start the ranks without "
                   "torchrun, so that a rank that dies does not stop the others (for recovery "
                   "in the job, e.g. torch.distributed.shrink_group); rank 0 hosts the store "
                   "and must survive")
    p.add_argument("--dry-run", action="store_true",
                   help="print the resolved environment and command instead of running it")
    p.add_argument("command", nargs=argparse.REMAINDER,
                   help="the program and its arguments (a .py script in --nproc-per-node mode)")
    return p


def package_dirs() -> List[str]:
    """The smddp package's directories, where the build installs libsmddp."""
    dirs: List[str] = []
    try:
        spec = importlib.util.find_spec("smddp")
    except (ImportError, ValueError):  # a module without a spec stands in for the package
        spec = None
    if spec is not None and spec.submodule_search_locations:
        dirs.extend(spec.submodule_search_locations)
    dirs.append(str(Path(__file__).resolve().parent))
    ext = sys.modules.get("smddp._C")  # an editable install keeps it in the build folder
    if getattr(ext, "__file__", None):
        dirs.append(str(Path(ext.__file__).resolve().parent))
    return list(dict.fromkeys(dirs))


def find_library(explicit: Optional[str] = None) -> Optional[str]:
    """Where libsmddp is, by file name: loading the extension to ask would fail
    in exactly the case this must detect.

    An explicit path must exist. Otherwise look in the installed package's
    directories (``find_spec`` lists them without loading anything) and next
    to this file, which differ in editable installs.
    """
    if explicit:
        if not os.path.isfile(explicit):
            raise LaunchError(f"--library {explicit}: no such file")
        return os.path.abspath(explicit)
    for d in package_dirs():
        for pattern in LIBRARY_GLOBS:
            for f in sorted(Path(d).glob(pattern)):
                if f.is_file():
                    return str(f.resolve())
    return None


def _job_port(env: Mapping[str, str]) -> Optional[int]:
    """A port every rank of one job agrees on, from the launcher's job id.

    The same FNV-1a hash and variables as the core's own derivation
    (core/bootstrap.c), so both choose alike for one job.
    """
    job = next((f"{k}:{env[k]}" for k in ("PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
                                          "SLURM_JOB_ID") if env.get(k)), None)
    if job is None:
        return None
    if env.get("SLURM_STEP_ID"):
        job += "." + env["SLURM_STEP_ID"]
    h = 2166136261
    for b in job.encode():
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return PORT_BASE + h % PORT_RANGE


def _port(value: Optional[str], name: str) -> Optional[int]:
    """A port from a variable: None when unset or empty, an error when not a port."""
    if value is None or not value.strip():
        return None
    if not value.strip().isdigit() or not 0 < int(value) < 65536:
        raise LaunchError(f"{name}={value!r} is not a port: expected an integer 1-65535")
    return int(value)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def first_slurm_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: ``n[01-04,07],m2`` -> ``n01``."""
    depth, end = 0, len(nodelist)
    for i, c in enumerate(nodelist):
        depth += (c == "[") - (c == "]")
        if c == "," and depth == 0:
            end = i
            break
    return re.sub(r"\[([^\],-]+)[^\]]*\]", r"\1", nodelist[:end])


def _slurm_local_size(env: Mapping[str, str]) -> Optional[int]:
    """Tasks on this node, from SLURM_TASKS_PER_NODE ("2(x3),1") and SLURM_NODEID."""
    counts: List[int] = []
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE", "")
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            counts = []
            break
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    node = int(env.get("SLURM_NODEID", "0") or 0)
    if node < len(counts):
        return counts[node]
    ntasks, nnodes = env.get("SLURM_NTASKS", ""), env.get("SLURM_NNODES", "")
    if ntasks.isdigit() and nnodes.isdigit() and int(nnodes) > 0 and int(ntasks) % int(nnodes) == 0:
        return int(ntasks) // int(nnodes)
    return None


def rank_env(env: Mapping[str, str], args: argparse.Namespace) -> Tuple[str, Dict[str, str]]:
    """(launcher name, RANK/WORLD_SIZE/... for this process) from whoever started it.

    RANK and WORLD_SIZE already set (torchrun, or by hand) win over Open MPI's
    and Slurm's, which only describe the outer allocation in that case.
    """
    out: Dict[str, str] = {}
    if env.get("RANK") and env.get("WORLD_SIZE"):
        mode = "torchrun" if env.get("TORCHELASTIC_RUN_ID") else "preset"
        world = env["WORLD_SIZE"]
        out.update((k, env[k]) for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE") if k in env)
        single_node = env.get("LOCAL_WORLD_SIZE") == world or world == "1"
    elif env.get("OMPI_COMM_WORLD_RANK") and env.get("OMPI_COMM_WORLD_SIZE"):
        mode, world = "openmpi", env["OMPI_COMM_WORLD_SIZE"]
        out["RANK"] = env["OMPI_COMM_WORLD_RANK"]
        out["LOCAL_RANK"] = env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")
        out["LOCAL_WORLD_SIZE"] = env.get("OMPI_COMM_WORLD_LOCAL_SIZE", world)
        single_node = out["LOCAL_WORLD_SIZE"] == world
    elif env.get("SLURM_PROCID") and env.get("SLURM_NTASKS"):
        mode, world = "slurm", env["SLURM_NTASKS"]
        out["RANK"] = env["SLURM_PROCID"]
        out["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
        local = _slurm_local_size(env)
        if local is not None:
            out["LOCAL_WORLD_SIZE"] = str(local)
        single_node = env.get("SLURM_NNODES") == "1" or world == "1" or str(local) == world
    else:
        mode, world, single_node = "single", "1", True
        out.update(RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    out["WORLD_SIZE"] = world

    # SageMaker's runner gives every rank of a job over several hosts rank 0's
    # host and a port (mpirun -x); MASTER_ADDR/MASTER_PORT, when a rank has
    # them, came from its container, and only the master host's ranks do.
    sm_addr = sm_port = None
    if mode in ("openmpi", "slurm"):
        sm_addr, sm_port = env.get(SM_ADDR_VAR), env.get(SM_PORT_VAR)
    addr = args.master_addr or sm_addr or env.get("MASTER_ADDR")
    if not addr and single_node:
        addr = "127.0.0.1"
    elif not addr and mode == "slurm":
        # Rank 0 runs on the step's first node; the node srun ran on may be a
        # login node outside the allocation, so its address comes last.
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        addr = first_slurm_host(nodes) if nodes else env.get("SLURM_LAUNCH_NODE_IPADDR")
    if not addr:
        raise LaunchError(f"{mode} job over several nodes: cannot tell rank 0's address; "
                          "pass --master-addr HOST or export MASTER_ADDR (mpirun -x MASTER_ADDR)")
    port = (args.master_port or _port(sm_port, SM_PORT_VAR)
            or _port(env.get("MASTER_PORT"), "MASTER_PORT") or _job_port(env))
    if not port and mode == "single":
        port = _free_port()
    if not port:
        raise LaunchError(f"{mode} job: no job id to derive a port from; pass --master-port PORT")
    out.update(MASTER_ADDR=addr, MASTER_PORT=str(port))
    if "LOCAL_RANK" in out:  # where scripts written for SageMaker (transformers' Trainer) read it
        out["SMDATAPARALLEL_LOCAL_RANK"] = out["LOCAL_RANK"]
    return mode, out


def backend_env(backend: str, env: Mapping[str, str], library: Optional[str],
                warn: bool) -> Dict[str, str]:
    """The switch's variables; without libsmddp, auto falls back to nccl (warning if warn)."""
    preload = [p for p in re.split(r"[:\s]+", env.get("LD_PRELOAD", "")) if p]
    others = [p for p in preload if not os.path.basename(p).startswith("libsmddp.so")]
    if backend == "auto":
        lib = find_library(library)
        if lib is None:
            if warn:
                print("smddprun: warning: libsmddp not found in the smddp package (pass --library "
                      "PATH); falling back to nccl", file=sys.stderr)
            backend = "nccl"
        else:
            others = [lib] + others
    out = {
        "SMDDP_COMMUNICATION_BACKEND": backend,
        "USE_SMDDP_COLLECTIVES": "1" if backend == "auto" else "0",
    }
    if others != preload:
        out["LD_PRELOAD"] = ":".join(others)
    return out


class Plan(NamedTuple):
    """What smddprun will do: printed by --dry-run, else executed."""

    backend: str  # after any fallback
    config: config.CommConfig  # what the job's configuration asked for, and where
    mode: str  # torchrun-launcher, torchrun, preset, openmpi, slurm, single
    env: Dict[str, str]  # variables smddprun sets
    command: List[str]
    announce: bool = True  # this process says which backend (one per machine)

    def describe(self) -> str:
        """The backend, what configured it and where that came from."""
        return f"{self.backend} (configured {self.config.backend} by {self.config.source})"


def build(args: argparse.Namespace, env: Mapping[str, str]) -> Plan:
    """Resolves everything from parsed arguments and an environment, without side effects."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise LaunchError("no command given (usage: smddprun [options] [--] program args...)")
    cfg = config.resolve(args.communication_backend, args.communication_options, env)
    if args.nproc_per_node is not None:
        if args.nproc_per_node < 1:
            raise LaunchError("--nproc-per-node must be at least 1")
        if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
            raise LaunchError(f"--node-rank must be in 0 .. --nnodes - 1 (got --nnodes "
                              f"{args.nnodes} --node-rank {args.node_rank})")
        addr = args.master_addr or env.get("MASTER_ADDR")
        port = args.master_port or env.get("MASTER_PORT")
        if args.keep_going:
            if args.nnodes != 1:
                raise LaunchError("--keep-going starts the ranks of one machine; it does not "
                                  "go with --nnodes > 1")
            run = [sys.executable] + command if command[0].endswith(".py") else command
            switch = backend_env(cfg.backend, env, args.library, warn=True)
            local = {"WORLD_SIZE": str(args.nproc_per_node),
                     "LOCAL_WORLD_SIZE": str(args.nproc_per_node),
                     "MASTER_ADDR": addr or "127.0.0.1",
                     "MASTER_PORT": str(port or _free_port())}
            return Plan(switch["SMDDP_COMMUNICATION_BACKEND"], cfg, "keep-going",
                        {**local, **switch}, run)
        if args.nnodes > 1 and not (addr and port):
            raise LaunchError("--nnodes > 1: every machine must name the same rendezvous; pass "
                              "--master-addr HOST (node 0's address) and --master-port PORT")
        run = [sys.executable, "-m", "torch.distributed.run",
               f"--nproc-per-node={args.nproc_per_node}", f"--master-port={port or _free_port()}"]
        if args.nnodes > 1:
            run += [f"--nnodes={args.nnodes}", f"--node-rank={args.node_rank}"]
        if addr:
            run.append(f"--master-addr={addr}")
        # A .py script runs under torchrun's python; anything else verbatim,
        # so `python -m pkg` keeps the interpreter the user named.
        run += command if command[0].endswith(".py") else ["--no-python"] + command
        switch = backend_env(cfg.backend, env, args.library, warn=True)
        return Plan(switch["SMDDP_COMMUNICATION_BACKEND"], cfg, "torchrun-launcher",
                    switch, run)
    if args.nnodes != 1 or args.node_rank != 0:
        raise LaunchError("--nnodes and --node-rank go with --nproc-per-node (under mpirun or "
                          "srun, the launcher places the ranks)")
    if args.keep_going:
        raise LaunchError("--keep-going goes with --nproc-per-node (smddprun starts the ranks)")
    mode, ranks = rank_env(env, args)
    warn = ranks.get("LOCAL_RANK", env.get("LOCAL_RANK", "0")) == "0"  # once per node
    switch = backend_env(cfg.backend, env, args.library, warn=warn)
    return Plan(switch["SMDDP_COMMUNICATION_BACKEND"], cfg, mode, {**ranks, **switch},
                command, announce=warn)


def _run_keep_going(plan: Plan, env: Dict[str, str]) -> int:
    """Starts WORLD_SIZE ranks of plan.command and waits for every one.

    A rank killed by a signal is reported and does not stop the others. The
    exit status is the first non-zero status of a rank that exited, else 0
    when at least one rank exited normally, else 1.
    """
    import signal
    import subprocess

    n = int(plan.env["WORLD_SIZE"])
    procs = []
    try:
        for r in range(n):
            procs.append(subprocess.Popen(plan.command, env={**env, "RANK": str(r),
                                                             "LOCAL_RANK": str(r)}))
    except OSError as e:
        for p in procs:
            p.kill()
        print(f"smddprun: error: cannot run {plan.command[0]}: {e.strerror or e}",
              file=sys.stderr)
        return 127
    status, finished = 0, 0
    try:
        for r, p in enumerate(procs):
            rc = p.wait()
            if rc < 0:
                name = signal.Signals(-rc).name if -rc in signal.valid_signals() else -rc
                print(f"smddprun: rank {r} was killed by {name}; the other ranks went on",
                      file=sys.stderr, flush=True)
                continue
            finished += 1
            if rc != 0 and status == 0:
                status = rc
    except KeyboardInterrupt:
        for p in procs:
            p.send_signal(signal.SIGINT)
        for p in procs:
            p.wait()
        return 130
    return status if finished else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``smddprun`` console script; execs, or returns an exit status."""
    args = _parser().parse_args(argv)
    env = dict(os.environ)
    try:
        plan = build(args, env)
    except (config.ConfigError, LaunchError) as e:
        print(f"smddprun: error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(f"backend: {plan.describe()}")
        print(f"mode: {plan.mode}")
        for k in sorted(plan.env):
            print(f"env: {k}={plan.env[k]}")
        print("command: " + shlex.join(plan.command))
        return 0
    if plan.announce:
        print(f"smddprun: communication backend {plan.describe()}", file=sys.stderr)
    env.update(plan.env)
    sys.stdout.flush()
    sys.stderr.flush()
    if plan.mode == "keep-going":
        return _run_keep_going(plan, env)
    try:
        os.execvpe(plan.command[0], plan.command, env)
    except OSError as e:
        print(f"smddprun: error: cannot run {plan.command[0]}: {e.strerror or e}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
