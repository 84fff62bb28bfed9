"""smddp.config: every source of the communication backend, its precedence and its errors.

Like SageMaker's toolkit tests its runner: each test builds the environment
and JSON files it needs in a temporary place, and never reads the real
/opt/ml or the caller's SMDDP_* variables.
"""

import json
import sys

import pytest

from smddp import config
from smddp.config import CommConfig, ConfigError, resolve

HPS_KEY = "sagemaker_communication_backend"


@pytest.fixture
def missing_hps(tmp_path):
    """A hyperparameters path that does not exist, so /opt/ml is never read."""
    return str(tmp_path / "no-such-hyperparameters.json")


def training_env(value):
    return json.dumps({"additional_framework_parameters": {HPS_KEY: value},
                       "hyperparameters": {}})


def test_default_is_auto(missing_hps):
    assert resolve(env={}, hyperparameters_file=missing_hps) == CommConfig("auto", "default")


def test_reads_os_environ_when_no_env_given(monkeypatch, missing_hps):
    monkeypatch.setenv("SMDDP_COMMUNICATION_BACKEND", "nccl")
    assert resolve(hyperparameters_file=missing_hps) == CommConfig(
        "nccl", "SMDDP_COMMUNICATION_BACKEND")


@pytest.mark.parametrize("value", ["auto", "nccl"])
def test_explicit_argument(value, missing_hps):
    cfg = resolve(value, env={}, hyperparameters_file=missing_hps)
    assert cfg == CommConfig(value, "--communication-backend")


def test_env_var(missing_hps):
    cfg = resolve(env={"SMDDP_COMMUNICATION_BACKEND": "nccl"}, hyperparameters_file=missing_hps)
    assert cfg == CommConfig("nccl", "SMDDP_COMMUNICATION_BACKEND")


@pytest.mark.parametrize("value", ["", "   "])
def test_empty_env_var_is_unset(value, missing_hps):
    env = {"SMDDP_COMMUNICATION_BACKEND": value, "SM_TRAINING_ENV": training_env("nccl")}
    assert resolve(env=env, hyperparameters_file=missing_hps).backend == "nccl"


def test_sm_training_env(missing_hps):
    cfg = resolve(env={"SM_TRAINING_ENV": training_env("nccl")}, hyperparameters_file=missing_hps)
    assert cfg.backend == "nccl"
    assert "SM_TRAINING_ENV" in cfg.source and HPS_KEY in cfg.source


def test_sm_training_env_without_the_key_falls_through(missing_hps):
    env = {"SM_TRAINING_ENV": json.dumps({"additional_framework_parameters": {}}),
           "SM_HPS": json.dumps({HPS_KEY: "nccl"})}
    cfg = resolve(env=env, hyperparameters_file=missing_hps)
    assert cfg.backend == "nccl" and cfg.source.startswith("SM_HPS")


def test_sm_hps(missing_hps):
    cfg = resolve(env={"SM_HPS": json.dumps({HPS_KEY: "nccl", "epochs": 3})},
                  hyperparameters_file=missing_hps)
    assert cfg == CommConfig("nccl", f"SM_HPS ({HPS_KEY})")


def test_hyperparameters_file(tmp_path):
    path = tmp_path / "hyperparameters.json"
    # SageMaker's SDK writes every hyperparameter JSON-encoded: "\"nccl\"".
    path.write_text(json.dumps({HPS_KEY: json.dumps("nccl"), "sagemaker_program": '"t.py"'}))
    cfg = resolve(env={}, hyperparameters_file=str(path))
    assert cfg.backend == "nccl"
    assert str(path) in cfg.source


def test_hyperparameters_file_plain_string(tmp_path):
    path = tmp_path / "hyperparameters.json"
    path.write_text(json.dumps({HPS_KEY: "NCCL"}))
    assert resolve(env={}, hyperparameters_file=str(path)).backend == "nccl"


def test_sm_hps_shadows_the_file(tmp_path):
    path = tmp_path / "hyperparameters.json"
    path.write_text(json.dumps({HPS_KEY: "nccl"}))
    cfg = resolve(env={"SM_HPS": "{}"}, hyperparameters_file=str(path))
    assert cfg == CommConfig("auto", "default")


def test_default_hyperparameters_path_is_sagemakers():
    assert config.DEFAULT_HYPERPARAMETERS_FILE == "/opt/ml/input/config/hyperparameters.json"


def test_communication_options_string(missing_hps):
    cfg = resolve(communication_options='{"backend": "nccl"}', env={},
                  hyperparameters_file=missing_hps)
    assert cfg.backend == "nccl" and cfg.source.startswith("--communication-options")


def test_communication_options_file(tmp_path, missing_hps):
    path = tmp_path / "options.json"
    path.write_text('{"backend": " Nccl "}')
    cfg = resolve(communication_options=f"@{path}", env={}, hyperparameters_file=missing_hps)
    assert cfg.backend == "nccl" and str(path) in cfg.source


def test_communication_options_without_backend_is_default(missing_hps):
    cfg = resolve(communication_options="{}", env={}, hyperparameters_file=missing_hps)
    assert cfg == CommConfig("auto", "default")


def test_precedence_highest_first(tmp_path):
    """Each source beats every one below it: remove them top-down."""
    hps_file = tmp_path / "hyperparameters.json"
    hps_file.write_text(json.dumps({HPS_KEY: "nccl"}))
    options = '{"backend": "auto"}'
    env = {"SMDDP_COMMUNICATION_BACKEND": "auto", "SM_TRAINING_ENV": training_env("nccl"),
           "SM_HPS": json.dumps({HPS_KEY: "auto"})}
    args = dict(communication_options=options, hyperparameters_file=str(hps_file))

    assert resolve("nccl", env=env, **args).source == "--communication-backend"
    assert resolve(env=env, **args) == CommConfig("auto", "SMDDP_COMMUNICATION_BACKEND")
    del env["SMDDP_COMMUNICATION_BACKEND"]
    assert resolve(env=env, **args).source.startswith("SM_TRAINING_ENV")
    assert resolve(env=env, **args).backend == "nccl"
    del env["SM_TRAINING_ENV"]
    assert resolve(env=env, **args) == CommConfig("auto", f"SM_HPS ({HPS_KEY})")
    del env["SM_HPS"]
    assert resolve(env=env, **args).backend == "nccl"
    assert str(hps_file) in resolve(env=env, **args).source
    hps_file.write_text("{}")
    assert resolve(env=env, **args).source.startswith("--communication-options")
    assert resolve(env=env, hyperparameters_file=str(hps_file)) == CommConfig("auto", "default")


def test_lower_sources_are_not_read_once_decided(tmp_path):
    """A malformed file that a higher setting overrides must not fail the job."""
    bad = tmp_path / "hyperparameters.json"
    bad.write_text("{not json")
    env = {"SM_TRAINING_ENV": "{also not json"}
    assert resolve("nccl", env=env, hyperparameters_file=str(bad)).backend == "nccl"
    env["SMDDP_COMMUNICATION_BACKEND"] = "auto"
    assert resolve(env=env, hyperparameters_file=str(bad)).backend == "auto"


@pytest.mark.parametrize("value,expected", [
    ("AUTO", "auto"), ("Nccl", "nccl"), ("  nccl\n", "nccl"), ("\tAuto ", "auto")])
def test_values_are_case_insensitive_and_stripped(value, expected, missing_hps):
    assert resolve(value, env={}, hyperparameters_file=missing_hps).backend == expected
    env = {"SMDDP_COMMUNICATION_BACKEND": value}
    assert resolve(env=env, hyperparameters_file=missing_hps).backend == expected
    env = {"SM_TRAINING_ENV": training_env(value)}
    assert resolve(env=env, hyperparameters_file=missing_hps).backend == expected


def _bad_value_cases(tmp_path):
    hps = tmp_path / "hyperparameters.json"
    hps.write_text(json.dumps({HPS_KEY: "mpi"}))
    opts = tmp_path / "options.json"
    opts.write_text('{"backend": "gloo"}')
    missing = str(tmp_path / "none.json")
    return [
        (dict(backend="smddp", env={}, hyperparameters_file=missing), "--communication-backend",
         "smddp"),
        (dict(env={"SMDDP_COMMUNICATION_BACKEND": "nccl2"}, hyperparameters_file=missing),
         "SMDDP_COMMUNICATION_BACKEND", "nccl2"),
        (dict(env={"SM_TRAINING_ENV": training_env("efa")}, hyperparameters_file=missing),
         "SM_TRAINING_ENV", "efa"),
        (dict(env={"SM_TRAINING_ENV": training_env(3)}, hyperparameters_file=missing),
         "SM_TRAINING_ENV", "3"),
        (dict(env={"SM_HPS": json.dumps({HPS_KEY: None})}, hyperparameters_file=missing),
         "SM_HPS", "None"),
        (dict(env={}, hyperparameters_file=str(hps)), str(hps), "mpi"),
        (dict(communication_options='{"backend": "ucc"}', env={}, hyperparameters_file=missing),
         "--communication-options", "ucc"),
        (dict(communication_options=f"@{opts}", env={}, hyperparameters_file=missing),
         str(opts), "gloo"),
    ]


def test_bad_values_name_the_source_and_accepted_values(tmp_path):
    for kwargs, source, value in _bad_value_cases(tmp_path):
        with pytest.raises(ConfigError) as info:
            resolve(**kwargs)
        message = str(info.value)
        assert source in message, message
        assert value in message, message
        assert "'auto'" in message and "'nccl'" in message, message


def _malformed_cases(tmp_path):
    hps = tmp_path / "hyperparameters.json"
    hps.write_text('{"sagemaker_communication_backend": ')
    opts = tmp_path / "options.json"
    opts.write_text("{'backend': 'auto'}")
    missing = str(tmp_path / "none.json")
    return [
        (dict(env={"SM_TRAINING_ENV": "{not json"}, hyperparameters_file=missing),
         "SM_TRAINING_ENV"),
        (dict(env={"SM_HPS": "[1, 2"}, hyperparameters_file=missing), "SM_HPS"),
        (dict(env={}, hyperparameters_file=str(hps)), str(hps)),
        (dict(communication_options="backend=auto", env={}, hyperparameters_file=missing),
         "--communication-options"),
        (dict(communication_options=f"@{opts}", env={}, hyperparameters_file=missing), str(opts)),
    ]


def test_malformed_json_names_the_variable_or_file_and_the_parse_error(tmp_path):
    for kwargs, where in _malformed_cases(tmp_path):
        with pytest.raises(ConfigError) as info:
            resolve(**kwargs)
        message = str(info.value)
        assert "malformed JSON" in message and where in message, message
        # json's own error text, with its position, e.g. "Expecting value: line 1 column 2"
        assert "line 1 column" in message, message


@pytest.mark.parametrize("env_text,where", [
    ('["auto"]', "SM_TRAINING_ENV"), ('"nccl"', "SM_HPS")])
def test_json_that_is_not_an_object(env_text, where, missing_hps):
    with pytest.raises(ConfigError, match=f"malformed JSON in {where}.*object"):
        resolve(env={where: env_text}, hyperparameters_file=missing_hps)


def test_unreadable_options_file_names_the_file(tmp_path, missing_hps):
    path = tmp_path / "missing-options.json"
    with pytest.raises(ConfigError, match="missing-options.json"):
        resolve(communication_options=f"@{path}", env={}, hyperparameters_file=missing_hps)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_no_torch_import_at_module_import():
    """config and launcher run before any rank exists: they must not pull in torch.

    The package's __init__ (which registers the backend) is bypassed on
    purpose, so this checks these two modules and nothing else.
    """
    import pathlib
    import subprocess

    pkg = pathlib.Path(config.__file__).parent
    code = ("import sys, types; m = types.ModuleType('smddp'); m.__path__ = [%r]; "
            "sys.modules['smddp'] = m; import smddp.config, smddp.launcher; "
            "print('torch' in sys.modules, 'smddp._C' in sys.modules)" % str(pkg))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stderr


def test_empty_sm_hps_is_no_hyperparameters(tmp_path):
    # As an empty SM_TRAINING_ENV: skipped (it used to fail as malformed JSON),
    # so the hyperparameters file still counts.
    path = tmp_path / "hyperparameters.json"
    path.write_text(json.dumps({HPS_KEY: "nccl"}))
    assert resolve(env={"SM_HPS": ""}, hyperparameters_file=str(path)).backend == "nccl"
    assert resolve(env={"SM_HPS": "  "}, hyperparameters_file=str(tmp_path / "none")) == \
        CommConfig("auto", "default")


# SageMaker's runner (sagemaker-training 4.4.x) passes its decision to every rank.

@pytest.mark.parametrize("value,backend", [("1", "auto"), ("0", "nccl"), (" 0 ", "nccl")])
def test_runner_decision(value, backend, missing_hps):
    env = {"USE_SMDDP_COLLECTIVES": value, "SM_TRAINING_ENV": training_env(
        "nccl" if backend == "auto" else "auto")}
    cfg = resolve(env=env, hyperparameters_file=missing_hps)
    assert cfg == CommConfig(backend, f"USE_SMDDP_COLLECTIVES={value.strip()}")


def test_runner_decision_yields_to_explicit_settings(missing_hps):
    env = {"USE_SMDDP_COLLECTIVES": "0"}
    assert resolve("auto", env=env, hyperparameters_file=missing_hps) == CommConfig(
        "auto", "--communication-backend")
    env["SMDDP_COMMUNICATION_BACKEND"] = "auto"
    assert resolve(env=env, hyperparameters_file=missing_hps) == CommConfig(
        "auto", "SMDDP_COMMUNICATION_BACKEND (over USE_SMDDP_COLLECTIVES=0)")
    env["SMDDP_COMMUNICATION_BACKEND"] = "nccl"  # agreeing: nothing to say
    assert resolve(env=env, hyperparameters_file=missing_hps) == CommConfig(
        "nccl", "SMDDP_COMMUNICATION_BACKEND")


@pytest.mark.parametrize("value", ["yes", "2", "auto"])
def test_runner_decision_bad_value(value, missing_hps):
    with pytest.raises(ConfigError, match=rf"USE_SMDDP_COLLECTIVES='{value}'.*'1' \(auto.*'0' "
                                          r"\(nccl\)"):
        resolve(env={"USE_SMDDP_COLLECTIVES": value}, hyperparameters_file=missing_hps)


def test_empty_runner_decision_is_unset(missing_hps):
    env = {"USE_SMDDP_COLLECTIVES": "", "SM_TRAINING_ENV": training_env("nccl")}
    assert resolve(env=env, hyperparameters_file=missing_hps).backend == "nccl"
