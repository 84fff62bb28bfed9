"""smddprun: rank mapping, the backend switch, torchrun hand-off, errors, one real run.

Most tests call ``main([... "--dry-run", ...])`` in-process with a clean,
monkeypatched environment and read what it prints; a few run the launcher as
a subprocess to check exit statuses, the exec path and a 2-rank DDP job.
"""

import os
import pathlib
import subprocess
import sys

import pytest

from smddp import config, launcher

ORIGINAL_PACKAGE_DIRS = launcher.package_dirs
# conftest stands in for a package whose compiled part is not built; then the
# real `smddprun` and example cannot start in a subprocess.
STAND_IN_FOR = getattr(sys.modules["smddp"], "STAND_IN_FOR", None)
needs_package = pytest.mark.skipif(
    STAND_IN_FOR is not None, reason=f"the smddp package does not import here: {STAND_IN_FOR}")
PYTHONPATH = str(pathlib.Path(config.__file__).parents[1])
CLEARED_PREFIXES = ("SMDDP_", "OMPI_", "PMIX_", "SLURM_", "SM_", "TORCHELASTIC_")
CLEARED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
           "LD_PRELOAD", "USE_SMDDP_COLLECTIVES")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No launcher, SageMaker or smddp variables from the caller; no libsmddp anywhere."""
    for k in list(os.environ):
        if k.startswith(CLEARED_PREFIXES) or k in CLEARED:
            monkeypatch.delenv(k)
    monkeypatch.setattr(config, "DEFAULT_HYPERPARAMETERS_FILE", str(tmp_path / "no-hps.json"))
    empty = tmp_path / "empty-pkg"
    empty.mkdir()
    monkeypatch.setattr(launcher, "package_dirs", lambda: [str(empty)])


@pytest.fixture
def fake_lib(tmp_path):
    path = tmp_path / "pkg" / "libsmddp.so"
    path.parent.mkdir()
    path.write_bytes(b"\x7fELF not really")
    return path


def dry_run(capsys, *argv):
    """Runs smddprun --dry-run; returns (exit status, {var: value}, command, stdout, stderr)."""
    rc = launcher.main(["--dry-run", *argv])
    out, err = capsys.readouterr()
    env, command = {}, None
    for line in out.splitlines():
        if line.startswith("env: "):
            k, _, v = line[5:].partition("=")
            env[k] = v
        elif line.startswith("command: "):
            command = line[len("command: "):]
    return rc, env, command, out, err


def set_env(monkeypatch, **variables):
    for k, v in variables.items():
        monkeypatch.setenv(k, v)


OMPI = dict(OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_SIZE="4", OMPI_COMM_WORLD_LOCAL_RANK="2",
            OMPI_COMM_WORLD_LOCAL_SIZE="4", PMIX_NAMESPACE="prterun-host-1234@1")


def test_openmpi_wrapper(monkeypatch, capsys):
    set_env(monkeypatch, **OMPI)
    rc, env, command, out, _ = dry_run(capsys, "--communication-backend", "nccl",
                                       "python", "train.py", "--lr", "0.1", "--dry-run")
    assert rc == 0
    assert "mode: openmpi" in out
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                                "MASTER_ADDR")} == dict(RANK="2", WORLD_SIZE="4", LOCAL_RANK="2",
                                                        LOCAL_WORLD_SIZE="4",
                                                        MASTER_ADDR="127.0.0.1")
    assert 20000 <= int(env["MASTER_PORT"]) < 40000
    # Everything after the program, --dry-run included, belongs to the program.
    assert command == "python train.py --lr 0.1 --dry-run"


def test_openmpi_ranks_of_one_job_agree_on_the_port(monkeypatch, capsys):
    ports = set()
    for rank in range(3):
        set_env(monkeypatch, **{**OMPI, "OMPI_COMM_WORLD_RANK": str(rank),
                                "OMPI_COMM_WORLD_LOCAL_RANK": str(rank)})
        ports.add(dry_run(capsys, "python", "t.py")[1]["MASTER_PORT"])
    assert len(ports) == 1
    monkeypatch.setenv("PMIX_NAMESPACE", "prterun-host-999@1")
    assert dry_run(capsys, "python", "t.py")[1]["MASTER_PORT"] not in ports


def test_openmpi_several_nodes_needs_an_address(monkeypatch, capsys):
    set_env(monkeypatch, **{**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
    rc, _, _, _, err = dry_run(capsys, "python", "t.py")
    assert rc == 2 and "MASTER_ADDR" in err and "--master-addr" in err
    rc, env, _, _, _ = dry_run(capsys, "--master-addr", "node7", "--master-port", "4242",
                               "python", "t.py")
    assert rc == 0 and env["MASTER_ADDR"] == "node7" and env["MASTER_PORT"] == "4242"
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.5")
    assert dry_run(capsys, "python", "t.py")[1]["MASTER_ADDR"] == "10.0.0.5"


# The runner's mpirun over two hosts (sagemaker-training 4.4.x): the master
# host's ranks also inherit the container's MASTER_ADDR/MASTER_PORT, the other
# host's ranks get only what mpirun -x passes.
SM_RUNNER = dict(SMDATAPARALLEL_SERVER_ADDR="algo-1", SMDATAPARALLEL_SERVER_PORT="7592",
                 USE_SMDDP_COLLECTIVES="1", FI_PROVIDER="efa")


@pytest.mark.parametrize("container", [dict(MASTER_ADDR="algo-1", MASTER_PORT="7777"), {}])
def test_sagemaker_runner_hosts_meet(monkeypatch, capsys, container):
    set_env(monkeypatch, **{**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "2", **SM_RUNNER, **container})
    rc, env, _, out, _ = dry_run(capsys, "python", "-m", "mpi4py", "train.py")
    assert rc == 0 and "mode: openmpi" in out
    assert env["MASTER_ADDR"] == "algo-1" and env["MASTER_PORT"] == "7592"
    rc, env, _, _, _ = dry_run(capsys, "--master-addr", "n0", "--master-port", "4242", "python")
    assert env["MASTER_ADDR"] == "n0" and env["MASTER_PORT"] == "4242"  # flags still win


def test_sagemaker_address_only_for_mpi_and_slurm(monkeypatch, capsys):
    set_env(monkeypatch, RANK="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511",
            TORCHELASTIC_RUN_ID="x", **SM_RUNNER)
    rc, env, _, _, _ = dry_run(capsys, "python", "t.py")
    assert rc == 0 and env["MASTER_ADDR"] == "127.0.0.1" and env["MASTER_PORT"] == "29511"


@pytest.mark.parametrize("var,value", [("SMDATAPARALLEL_SERVER_PORT", "75x"),
                                       ("MASTER_PORT", "70000")])
def test_bad_port_exits_2(monkeypatch, capsys, var, value):
    set_env(monkeypatch, **OMPI, **{var: value})
    rc, _, _, _, err = dry_run(capsys, "python", "t.py")
    assert rc == 2 and f"{var}={value!r} is not a port" in err and "1-65535" in err


@pytest.mark.parametrize("runner,backend", [("0", "nccl"), ("1", "auto")])
def test_runner_decision_is_honoured(monkeypatch, capsys, fake_lib, runner, backend):
    monkeypatch.setattr(launcher, "package_dirs", lambda: [str(fake_lib.parent)])
    set_env(monkeypatch, **OMPI, USE_SMDDP_COLLECTIVES=runner, SM_TRAINING_ENV=(
        '{"additional_framework_parameters": {"sagemaker_communication_backend": "%s"}}'
        % ("auto" if runner == "0" else "nccl")))
    rc, env, _, out, _ = dry_run(capsys, "python", "t.py")
    assert rc == 0
    assert f"backend: {backend} (configured {backend} by USE_SMDDP_COLLECTIVES={runner})" in out
    assert env["SMDDP_COMMUNICATION_BACKEND"] == backend and env["USE_SMDDP_COLLECTIVES"] == runner
    assert ("LD_PRELOAD" in env) == (backend == "auto")
    other = "auto" if backend == "nccl" else "nccl"
    rc, env, _, out, _ = dry_run(capsys, "--communication-backend", other, "python", "t.py")
    assert rc == 0 and env["SMDDP_COMMUNICATION_BACKEND"] == other


SLURM = dict(SLURM_PROCID="5", SLURM_NTASKS="8", SLURM_LOCALID="1", SLURM_NODEID="2",
             SLURM_NNODES="4", SLURM_TASKS_PER_NODE="2(x4)", SLURM_JOB_ID="4711",
             SLURM_STEP_ID="0", SLURM_JOB_NODELIST="gpu-[007-010]",
             SLURM_LAUNCH_NODE_IPADDR="10.1.1.1")


def test_slurm_wrapper(monkeypatch, capsys):
    set_env(monkeypatch, **SLURM)
    rc, env, command, out, _ = dry_run(capsys, "--communication-backend", "nccl", "--",
                                       "python", "train.py")
    assert rc == 0 and "mode: slurm" in out
    assert env["RANK"] == "5" and env["WORLD_SIZE"] == "8"
    assert env["LOCAL_RANK"] == "1" and env["LOCAL_WORLD_SIZE"] == "2"
    assert env["MASTER_ADDR"] == "gpu-007"
    assert 20000 <= int(env["MASTER_PORT"]) < 40000
    assert command == "python train.py"


def test_slurm_address_fallbacks(monkeypatch, capsys):
    set_env(monkeypatch, **SLURM)
    monkeypatch.delenv("SLURM_JOB_NODELIST")
    assert dry_run(capsys, "python", "t.py")[1]["MASTER_ADDR"] == "10.1.1.1"
    monkeypatch.setenv("SLURM_NNODES", "1")
    assert dry_run(capsys, "python", "t.py")[1]["MASTER_ADDR"] == "127.0.0.1"


def test_slurm_uneven_tasks_per_node(monkeypatch, capsys):
    set_env(monkeypatch, **{**SLURM, "SLURM_TASKS_PER_NODE": "3(x2),1", "SLURM_NTASKS": "7",
                            "SLURM_NNODES": "3"})
    assert dry_run(capsys, "python", "t.py")[1]["LOCAL_WORLD_SIZE"] == "1"


@pytest.mark.parametrize("nodelist,first", [
    ("a", "a"), ("a,b", "a"), ("n[01-04,07],m2", "n01"), ("rack[1-2]-n[03,05]", "rack1-n03"),
    ("x[5]", "x5")])
def test_first_slurm_host(nodelist, first):
    assert launcher.first_slurm_host(nodelist) == first


def test_under_torchrun_keeps_its_variables(monkeypatch, capsys):
    set_env(monkeypatch, RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="2",
            MASTER_ADDR="127.0.0.1", MASTER_PORT="29511", TORCHELASTIC_RUN_ID="x", **OMPI)
    rc, env, _, out, _ = dry_run(capsys, "python", "t.py")
    assert rc == 0 and "mode: torchrun" in out
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["MASTER_PORT"] == "29511"


def test_no_launcher_is_a_world_of_one(capsys):
    rc, env, _, out, _ = dry_run(capsys, "python", "t.py")
    assert rc == 0 and "mode: single" in out
    assert env["RANK"] == "0" and env["WORLD_SIZE"] == "1" and env["MASTER_ADDR"] == "127.0.0.1"
    assert 0 < int(env["MASTER_PORT"]) < 65536


def test_torchrun_mode_command_line(capsys):
    rc, env, command, out, _ = dry_run(capsys, "--nproc-per-node", "2", "--master-port", "29555",
                                       "--communication-backend", "nccl",
                                       "train.py", "--epochs", "1")
    assert rc == 0 and "mode: torchrun-launcher" in out
    assert command.split() == [sys.executable, "-m", "torch.distributed.run",
                               "--nproc-per-node=2", "--master-port=29555", "train.py",
                               "--epochs", "1"]
    assert "RANK" not in env  # torchrun sets the ranks
    assert env["SMDDP_COMMUNICATION_BACKEND"] == "nccl"


def test_torchrun_mode_several_nodes(capsys):
    rc, _, command, _, _ = dry_run(capsys, "--nnodes", "2", "--node-rank", "1",
                                   "--nproc-per-node", "2", "--master-addr", "10.0.0.1",
                                   "--master-port", "29600", "train.py")
    assert rc == 0
    assert command.split() == [sys.executable, "-m", "torch.distributed.run",
                               "--nproc-per-node=2", "--master-port=29600", "--nnodes=2",
                               "--node-rank=1", "--master-addr=10.0.0.1", "train.py"]


@pytest.mark.parametrize("args,says", [
    (["--nnodes", "2", "--nproc-per-node", "2", "t.py"], "--master-addr HOST"),
    (["--nnodes", "2", "--node-rank", "2", "--nproc-per-node", "2", "--master-addr", "a",
      "--master-port", "1", "t.py"], "--node-rank must be in 0 .. --nnodes - 1"),
    (["--nnodes", "2", "python", "t.py"], "go with --nproc-per-node"),
])
def test_several_nodes_usage_errors(capsys, args, says):
    rc, _, _, _, err = dry_run(capsys, *args)
    assert rc == 2 and says in err


def test_torchrun_mode_keeps_a_named_interpreter(capsys):
    rc, _, command, _, _ = dry_run(capsys, "--nproc-per-node", "3", "--", "python3", "-m",
                                   "smddp.examples.train_ddp", "--steps", "2")
    assert rc == 0
    words = command.split()
    assert words[:4] == [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=3"]
    assert words[5:] == ["--no-python", "python3", "-m", "smddp.examples.train_ddp", "--steps",
                         "2"]


def test_auto_with_library_preloads_it(monkeypatch, capsys, fake_lib):
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    rc, env, _, out, err = dry_run(capsys, "--library", str(fake_lib), "python", "t.py")
    assert rc == 0 and err == ""
    assert "backend: auto (configured auto by default)" in out
    assert env["SMDDP_COMMUNICATION_BACKEND"] == "auto"
    assert env["USE_SMDDP_COLLECTIVES"] == "1"
    assert env["LD_PRELOAD"] == f"{fake_lib}:/opt/other.so"


def test_auto_finds_the_library_in_the_package(monkeypatch, capsys, fake_lib):
    versioned = fake_lib.with_name("libsmddp.so.0")
    fake_lib.rename(versioned)
    monkeypatch.setattr(launcher, "package_dirs", lambda: [str(versioned.parent)])
    rc, env, _, _, _ = dry_run(capsys, "--nproc-per-node", "2", "t.py")
    assert rc == 0 and env["LD_PRELOAD"] == str(versioned)
    assert env["USE_SMDDP_COLLECTIVES"] == "1"


def test_package_dirs_come_from_find_spec():
    dirs = ORIGINAL_PACKAGE_DIRS()
    assert str(pathlib.Path(launcher.__file__).resolve().parent) in dirs
    import importlib.util

    assert set(importlib.util.find_spec("smddp").submodule_search_locations) <= set(dirs)


def test_auto_without_library_warns_once_and_falls_back(capsys):
    rc, env, _, out, err = dry_run(capsys, "--nproc-per-node", "2", "t.py")
    assert rc == 0
    assert err.count("libsmddp not found") == 1 and "falling back to nccl" in err
    assert "backend: nccl (configured auto by default)" in out
    assert env["SMDDP_COMMUNICATION_BACKEND"] == "nccl"
    assert env["USE_SMDDP_COLLECTIVES"] == "0"
    assert "LD_PRELOAD" not in env


def test_fallback_warns_on_local_rank_zero_only(monkeypatch, capsys):
    set_env(monkeypatch, **{**OMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "1"})
    rc, env, _, _, err = dry_run(capsys, "python", "t.py")
    assert rc == 0 and err == "" and env["SMDDP_COMMUNICATION_BACKEND"] == "nccl"
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "0")
    assert "libsmddp not found" in dry_run(capsys, "python", "t.py")[4]


def test_nccl_does_not_preload(monkeypatch, capsys, fake_lib):
    monkeypatch.setattr(launcher, "package_dirs", lambda: [str(fake_lib.parent)])
    monkeypatch.setenv("LD_PRELOAD", "/x/libsmddp.so.0:/opt/other.so")
    monkeypatch.setenv("SMDDP_COMMUNICATION_BACKEND", "NCCL")
    rc, env, _, out, err = dry_run(capsys, "python", "t.py")
    assert rc == 0 and err == ""
    assert "backend: nccl (configured nccl by SMDDP_COMMUNICATION_BACKEND)" in out
    assert env["USE_SMDDP_COLLECTIVES"] == "0"
    assert env["LD_PRELOAD"] == "/opt/other.so"  # an inherited libsmddp is dropped


def test_config_sources_reach_the_launcher(monkeypatch, capsys, tmp_path):
    options = tmp_path / "options.json"
    options.write_text('{"backend": "nccl"}')
    rc, env, _, out, _ = dry_run(capsys, "--communication-options", f"@{options}", "python", "t")
    assert rc == 0 and env["SMDDP_COMMUNICATION_BACKEND"] == "nccl" and str(options) in out
    monkeypatch.setenv("SM_TRAINING_ENV",
                       '{"additional_framework_parameters": '
                       '{"sagemaker_communication_backend": "nccl"}}')
    rc, env, _, out, _ = dry_run(capsys, "python", "t")
    assert rc == 0 and "configured nccl by SM_TRAINING_ENV" in out


@pytest.mark.parametrize("argv,env,needle", [
    (["--communication-backend", "mpi"], {}, "'mpi' from --communication-backend"),
    ([], {"SMDDP_COMMUNICATION_BACKEND": "gloo"}, "'gloo' from SMDDP_COMMUNICATION_BACKEND"),
    (["--communication-options", "{bad"], {}, "malformed JSON in --communication-options"),
    ([], {"SM_HPS": "{"}, "malformed JSON in SM_HPS"),
])
def test_bad_config_exits_2_with_the_message(monkeypatch, capsys, argv, env, needle):
    set_env(monkeypatch, **env)
    rc, _, command, _, err = dry_run(capsys, *argv, "python", "t.py")
    assert rc == 2 and command is None
    assert err.startswith("smddprun: error: ") and needle in err
    if "malformed" not in needle:
        assert "'auto' or 'nccl'" in err


def test_usage_errors_exit_2(capsys, tmp_path):
    rc, _, _, _, err = dry_run(capsys)
    assert rc == 2 and "no command" in err
    rc, _, _, _, err = dry_run(capsys, "--library", str(tmp_path / "nope.so"), "python", "t")
    assert rc == 2 and "nope.so" in err
    rc, _, _, _, err = dry_run(capsys, "--nproc-per-node", "0", "t.py")
    assert rc == 2 and "--nproc-per-node" in err


def _subprocess_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(CLEARED_PREFIXES) and k not in CLEARED}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PYTHONPATH, env.get("PYTHONPATH")]))
    env.update(extra)
    return env


@needs_package
def test_bad_value_from_the_command_line_exits_2():
    proc = subprocess.run([sys.executable, "-m", "smddp.launcher", "--communication-backend",
                           "fast", "python", "-c", "pass"], capture_output=True, text=True,
                          env=_subprocess_env(), timeout=60)
    assert proc.returncode == 2
    assert "invalid communication backend 'fast'" in proc.stderr
    assert "'auto' or 'nccl'" in proc.stderr


@needs_package
def test_wrapper_execs_the_command_with_the_mapped_environment():
    code = ("import os; print(*[os.environ.get(k) for k in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', "
            "'MASTER_ADDR', 'SMDDP_COMMUNICATION_BACKEND', 'USE_SMDDP_COLLECTIVES')])")
    proc = subprocess.run([sys.executable, "-m", "smddp.launcher", "--communication-backend",
                           "nccl", sys.executable, "-c", code], capture_output=True, text=True,
                          env=_subprocess_env(**OMPI), timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", "4", "2", "127.0.0.1", "nccl", "0"]


@needs_package
def test_wrapper_names_the_backend_once_per_machine():
    """The log line: local rank 0 names the backend and where the decision came from."""
    lines = []
    for local in ("0", "1"):
        proc = subprocess.run([sys.executable, "-m", "smddp.launcher", sys.executable, "-c",
                               "pass"], capture_output=True, text=True, timeout=60,
                              env=_subprocess_env(**{**OMPI, "OMPI_COMM_WORLD_LOCAL_RANK": local,
                                                     "USE_SMDDP_COLLECTIVES": "0"}))
        assert proc.returncode == 0, proc.stderr
        lines.append(proc.stderr)
    assert lines == ["smddprun: communication backend nccl (configured nccl by "
                     "USE_SMDDP_COLLECTIVES=0)\n", ""]


@needs_package
def test_two_rank_ddp_run_through_torchrun():
    """The quick start's shape under nccl: no library needed, gloo on this CPU machine."""
    proc = subprocess.run(
        [sys.executable, "-m", "smddp.launcher", "--nproc-per-node", "2",
         "--communication-backend", "nccl", "--", sys.executable, "-m",
         "smddp.examples.train_ddp", "--backend", "gloo", "--steps", "3"],
        capture_output=True, text=True, env=_subprocess_env(), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "world size 2" in proc.stdout
    assert "step 3 loss" in proc.stdout
    assert "final loss" in proc.stdout


# smddp.dist.init_process_group: the same configuration, seen from inside a script.

def _free_tcp_url():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _smddp_registered():
    import torch.distributed as dist

    try:
        from smddp import dist as sdist

        sdist.ensure_registered()
    except Exception:
        return False
    return getattr(dist.Backend, "SMDDP", None) is not None


@pytest.mark.parametrize("env,kwargs,expected", [
    ({"SMDDP_COMMUNICATION_BACKEND": "nccl"}, {}, "default"),
    ({"SMDDP_COMMUNICATION_BACKEND": "auto"}, {"backend": "gloo"}, "gloo"),
])
def test_init_process_group_follows_the_config(monkeypatch, env, kwargs, expected):
    import torch
    import torch.distributed as dist

    from smddp import dist as sdist

    set_env(monkeypatch, **env)
    if expected == "default":
        expected = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    backend = sdist.init_process_group(init_method=_free_tcp_url(), rank=0, world_size=1,
                                       **kwargs)
    try:
        assert backend == expected
        assert dist.get_world_size() == 1
    finally:
        dist.destroy_process_group()


def test_init_process_group_says_why_smddp_cannot_load():
    from smddp import dist as sdist

    if _smddp_registered():
        pytest.skip("the smddp backend is built here; nothing to refuse")
    with pytest.raises(sdist.BackendUnavailable, match=r"'auto' \(from default\).*cannot be "
                                                       r"loaded.*--communication-backend nccl"):
        sdist.init_process_group(init_method=_free_tcp_url(), rank=0, world_size=1)


@needs_package
def test_example_refuses_smddp_clearly_when_it_cannot_load():
    if _smddp_registered():
        pytest.skip("the smddp backend is built here; nothing to refuse")
    proc = subprocess.run([sys.executable, "-m", "smddp.examples.train_ddp", "--backend", "smddp",
                           "--steps", "1"], capture_output=True, text=True,
                          env=_subprocess_env(), timeout=60)
    assert proc.returncode == 1
    assert "train_ddp: error: backend='smddp' was asked for" in proc.stderr
    assert "Traceback" not in proc.stderr


@needs_package
def test_elastic_example_shrinks_and_trains_on():
    """smddprun --keep-going: rank 2 of 4 dies at step 5; the survivors shrink and finish."""
    from smddp_support import IMPORT_ERROR

    if IMPORT_ERROR is not None:
        pytest.skip(f"smddp with its compiled shim is not importable ({IMPORT_ERROR})")
    proc = subprocess.run(
        [sys.executable, "-m", "smddp.launcher", "--nproc-per-node", "4", "--keep-going", "--",
         sys.executable, "-m", "smddp.examples.train_elastic", "--steps", "8", "--kill-rank", "2",
         "--kill-step", "5"],
        capture_output=True, text=True, env=_subprocess_env(), timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for step in range(1, 5):
        assert f"step {step} world size 4 loss" in out, out
    assert "shrunk: ranks [2] gone, world size 3" in out, out
    for step in range(5, 9):
        assert f"step {step} world size 3 loss" in out, out
    assert "survivors' parameters identical" in out, out
    assert "smddprun: rank 2 was killed by SIGKILL" in proc.stderr, proc.stderr


def test_keep_going_needs_one_machine():
    proc = subprocess.run([sys.executable, "-m", "smddp.launcher", "--keep-going", "--",
                           sys.executable, "-c", "pass"], capture_output=True, text=True,
                          env=_subprocess_env(), timeout=60)
    assert proc.returncode == 2
    assert "--keep-going goes with --nproc-per-node" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "smddp.launcher", "--keep-going",
                           "--nproc-per-node", "2", "--nnodes", "2", "--master-addr", "h",
                           "--master-port", "1", "--", "true"], capture_output=True, text=True,
                          env=_subprocess_env(), timeout=60)
    assert proc.returncode == 2
    assert "does not go with --nnodes > 1" in proc.stderr
