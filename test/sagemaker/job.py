"""The files SageMaker writes for a training job, and the checks on what its ranks left.

    python3 job.py config DIR --hosts algo-1,algo-2 --current algo-1 --program P
                          --source SRC [--backend auto|nccl] [--per-host 2]
    python3 job.py check JOB WORK

config writes DIR/opt_ml/input/config/{hyperparameters,resourceconfig,
inputdataconfig}.json as SageMaker does for a PyTorch estimator with
distribution={"smdistributed": {"dataparallel": {"enabled": True}}} (each
hyperparameter JSON-encoded, as the Python SDK sends them), the job's code
under DIR/opt_ml/input/source, and DIR/hosts (/etc/hosts). check reads what job JOB left in WORK/JOB (each
host's log, exit status and evidence files, see code/sm_common.py), prints
"PASS JOB: ..." or "FAIL JOB: why" and exits 0 or 1.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import sys

INSTANCE = "ml.c5.4xlarge"  # a CPU instance: no GPU, no EFA


def write_config(a: argparse.Namespace) -> None:
    hosts = a.hosts.split(",")
    cfg = os.path.join(a.dir, "opt_ml", "input", "config")
    os.makedirs(cfg, exist_ok=True)
    for sub in ("model", "output/data", "input/data"):
        os.makedirs(os.path.join(a.dir, "opt_ml", sub), exist_ok=True)
    source = os.path.join(a.dir, "opt_ml", "input", "source")
    shutil.rmtree(source, ignore_errors=True)
    shutil.copytree(a.source, source, ignore=shutil.ignore_patterns("__pycache__"))
    hps = {
        "sagemaker_program": a.program,
        "sagemaker_submit_directory": "/opt/ml/input/source",
        "sagemaker_container_log_level": 20,
        "sagemaker_job_name": f"smddp-test-{os.path.basename(a.dir)}",
        "sagemaker_region": "us-west-2",
        "sagemaker_distributed_dataparallel_enabled": True,
        "sagemaker_instance_type": INSTANCE,
        "sagemaker_distributed_dataparallel_custom_mpi_options": "",
        # No GPUs here: the runner's default, one rank per GPU, would be 1.
        "sagemaker_mpi_num_of_processes_per_host": a.per_host,
    }
    if a.backend:
        hps["sagemaker_communication_backend"] = a.backend
    group = "homogeneousCluster"
    resource = {"current_host": a.current, "current_instance_type": INSTANCE,
                "current_group_name": group, "hosts": hosts,
                "instance_groups": [{"instance_group_name": group, "instance_type": INSTANCE,
                                     "hosts": hosts}],
                "network_interface_name": "eth0"}
    for name, data in (("hyperparameters.json", {k: json.dumps(v) for k, v in hps.items()}),
                       ("resourceconfig.json", resource), ("inputdataconfig.json", {})):
        with open(os.path.join(cfg, name), "w") as f:
            json.dump(data, f, indent=1)
    with open(os.path.join(a.dir, "hosts"), "w") as f:
        f.write("127.0.0.1 localhost\n")
        for host, addr in zip(hosts, a.addrs.split(",")):
            f.write(f"{addr} {host}\n")


STEPS = 6  # code/sm_common.py: DDP allreduces at least once per step
LINE = "smddprun: communication backend {} (configured {} by {})"
EFA_WARNING = "FI_PROVIDER=efa, but this machine has no EFA device"


class Job:
    """What one job left: each host's log and exit status, each rank's evidence."""

    def __init__(self, work: str, name: str) -> None:
        self.dir = os.path.join(work, name)
        self.hosts = sorted(d for d in os.listdir(self.dir)
                            if os.path.isdir(os.path.join(self.dir, d)))
        self.logs = {h: _read(os.path.join(self.dir, f"{h}.log")) for h in self.hosts}
        self.rcs = {h: _read(os.path.join(self.dir, f"{h}.rc")).strip() for h in self.hosts}
        self.ranks = []
        for h in self.hosts:
            for path in glob.glob(os.path.join(self.dir, h, "opt_ml/output/data/evidence-r*.json")):
                with open(path) as f:
                    self.ranks.append(json.load(f))
        self.ranks.sort(key=lambda r: r["rank"])
        master = self.logs.get("algo-1", "")
        self.command = next((ln for ln in master.splitlines() if ln.startswith("mpirun ")), "")
        self.output = "".join(self.logs.values())


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _common(job: Job, world: int) -> list:
    """Problems every job must not have: failed hosts, missing ranks, ranks that disagree."""
    bad = [f"{h} exited {job.rcs[h] or '(no status)'}" for h in job.hosts if job.rcs[h] != "0"]
    if "Reporting training SUCCESS" not in job.logs.get("algo-1", ""):
        bad.append("the toolkit did not report training SUCCESS on algo-1")
    if not job.command.endswith(".py") or " smddprun /opt/conda/bin/python3 -m mpi4py " not in \
            job.command:
        bad.append(f"the runner's command is not mpirun ... smddprun python -m mpi4py SCRIPT: "
                   f"{job.command!r}")
    if [r["rank"] for r in job.ranks] != list(range(world)):
        bad.append(f"evidence from ranks {[r['rank'] for r in job.ranks]}, expected 0-{world - 1}")
    for r in job.ranks:
        if r["world"] != world or r["backend"] != "smddp" or not r["params_agree"]:
            bad.append(f"rank {r['rank']}: world {r['world']}, backend {r['backend']}, "
                       f"parameters agree across ranks: {r['params_agree']}")
    return bad


def _backend(job: Job, backend: str, source: str) -> list:
    """The backend every rank runs under, the preload that goes with it, the log line."""
    bad = []
    use = "1" if backend == "auto" else "0"
    for r in job.ranks:
        env = r["env"]
        preloaded = "libsmddp.so" in (env["LD_PRELOAD"] or "")
        if env["SMDDP_COMMUNICATION_BACKEND"] != backend or env["USE_SMDDP_COLLECTIVES"] != use \
                or preloaded != (backend == "auto"):
            bad.append(f"rank {r['rank']}: SMDDP_COMMUNICATION_BACKEND="
                       f"{env['SMDDP_COMMUNICATION_BACKEND']}, USE_SMDDP_COLLECTIVES="
                       f"{env['USE_SMDDP_COLLECTIVES']}, LD_PRELOAD={env['LD_PRELOAD']}")
        if r.get("trace_kinds", {}).get("allreduce", 0) < STEPS:
            bad.append(f"rank {r['rank']}: libsmddp's flight recorder holds "
                       f"{r.get('trace_kinds')}: fewer allreduces than DDP's {STEPS} steps")
    line = LINE.format(backend, backend, source)
    if job.output.count(line) != len(job.hosts):
        bad.append(f"{job.output.count(line)} lines {line!r}, expected one per host")
    return bad


def _failure(job: Job) -> list:
    """The job fails, and the toolkit names the error class smdistributed.dataparallel raised."""
    bad = []
    if job.rcs.get("algo-1") in ("0", ""):
        bad.append(f"algo-1 exited {job.rcs.get('algo-1') or '(no status)'}, expected a failure")
    if "Reporting training FAILURE" not in job.output:
        bad.append("the toolkit did not report training FAILURE")
    if not re.search(r"sagemaker-training-toolkit ERROR +SMDDPUnsupportedError", job.output):
        bad.append("the toolkit did not name SMDDPUnsupportedError as the failure")
    return bad


def check(name: str, work: str) -> list:
    job = Job(work, name)
    if name == "error":
        return _failure(job)
    bad = []
    if "smdistributed.dataparallel not found" in job.output:
        bad.append("the toolkit did not find smdistributed.dataparallel.exceptions")
    bad += _common(job, 4 if name == "two-hosts" else 2)
    if name in ("auto", "v1", "two-hosts", "nccl", "no-libs"):
        backend = "nccl" if name in ("nccl", "no-libs") else "auto"
        decision = f"USE_SMDDP_COLLECTIVES={'0' if backend == 'nccl' else '1'}"
        if f"-x {decision}" not in job.command:
            bad.append(f"the runner's command lacks -x {decision}")
        missing = "Missing library /opt/conda/lib/libsmddp.so for SMDDP collective"
        if (missing in job.output) != (name == "no-libs"):
            bad.append(f"the runner {'did not say' if name == 'no-libs' else 'said'} "
                       f"{missing!r}")
        bad += _backend(job, backend, decision)
    if name == "v1":
        auto = Job(work, "auto").ranks
        if any(r["style"] != "v1" for r in job.ranks) or not auto or \
                job.ranks[0]["params_sha256"] != auto[0]["params_sha256"]:
            bad.append("the v1-API script did not end with the torch_smddp script's parameters")
    if name == "two-hosts":
        for key in ("SMDATAPARALLEL_SERVER_ADDR=algo-1", "SMDATAPARALLEL_SERVER_PORT=7592"):
            if f"-x {key}" not in job.command:
                bad.append(f"the runner's command lacks -x {key}")
        for r in job.ranks:
            if (r["env"]["MASTER_ADDR"], r["env"]["MASTER_PORT"]) != ("algo-1", "7592") or \
                    sorted(set(r["hosts"])) != ["algo-1", "algo-2"] or \
                    r["env"]["FI_PROVIDER"] != "efa" or r["fi_provider_now"] is not None:
                bad.append(f"rank {r['rank']} on {r['host']}: rendezvous "
                           f"{r['env']['MASTER_ADDR']}:{r['env']['MASTER_PORT']}, hosts "
                           f"{r['hosts']}, FI_PROVIDER {r['env']['FI_PROVIDER']} -> "
                           f"{r['fi_provider_now']}")
        if job.output.count(EFA_WARNING) != 1:
            bad.append(f"{job.output.count(EFA_WARNING)} warnings {EFA_WARNING!r}, expected one")
    if name == "toolkit-5":
        if "USE_SMDDP_COLLECTIVES" in job.command:
            bad.append("sagemaker-training 5 exported USE_SMDDP_COLLECTIVES")
        # 5.x decides nothing: smddprun resolves the job's configuration (default auto).
        bad += _backend(job, "auto", "default")
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="job.py")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("config")
    c.add_argument("dir")
    c.add_argument("--hosts", required=True)
    c.add_argument("--addrs", required=True, help="each host's address, in --hosts' order")
    c.add_argument("--current", required=True)
    c.add_argument("--program", required=True)
    c.add_argument("--source", required=True)
    c.add_argument("--backend")
    c.add_argument("--per-host", type=int, default=2)
    k = sub.add_parser("check")
    k.add_argument("job")
    k.add_argument("work", help="the folder with one folder per job")
    a = p.parse_args(argv)
    if a.cmd == "config":
        write_config(a)
        return 0
    bad = check(a.job, a.work)
    if bad:
        print(f"FAIL {a.job}: " + "; ".join(bad))
        print(f"  logs: {os.path.join(a.work, a.job)}/algo-*.log")
        return 1
    job = Job(a.work, a.job)
    if a.job == "error":
        why = next((ln.split("SMDDPUnsupportedError:", 1)[1].strip() for ln in
                    job.output.splitlines() if "exceptions.SMDDPUnsupportedError:" in ln), "")
        print(f"PASS {a.job}: the job failed; the toolkit reports SMDDPUnsupportedError ({why})")
        return 0
    ranks = job.ranks
    print(f"PASS {a.job}: {len(ranks)} ranks on {sorted({r['host'] for r in ranks})}, backend "
          f"smddp, {ranks[0]['env']['SMDDP_COMMUNICATION_BACKEND']} communication, "
          f"allreduces in libsmddp {[r.get('trace_kinds', {}).get('allreduce') for r in ranks]}, "
          f"parameters {ranks[0]['params_sha256'][:16]} on every rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
