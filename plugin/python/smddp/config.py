"""Which communication backend a job asked for: ``auto`` or ``nccl``.

A SageMaker-style job names its communication backend in several places, and
the launcher (``smddprun``), the ``init_process_group`` helper and the tests
must all read them the same way, so the rule lives here once. Highest first:

1. an explicit argument (``smddprun --communication-backend``);
2. the environment variable ``SMDDP_COMMUNICATION_BACKEND`` (a row of the C
   settings table, so the core reads the same value);
3. ``USE_SMDDP_COLLECTIVES``, the decision SageMaker's training toolkit
   (``sagemaker-training`` 4.4.x, its smdataparallel runner) passes to every
   rank: ``1`` is ``auto``, ``0`` is ``nccl``. The runner exports ``0`` where
   the job asked for nccl or where it did not find the SMDDP libraries, and
   that fallback must hold in the ranks;
4. ``sagemaker_communication_backend`` under ``additional_framework_parameters``
   in ``SM_TRAINING_ENV`` (JSON), where SageMaker puts
   ``distribution={"smdistributed": {"dataparallel": {"communication_options":
   ...}}}``; then the same key in the hyperparameters: ``SM_HPS`` (JSON) or,
   when that is not set, the file ``/opt/ml/input/config/hyperparameters.json``;
5. a ``communication_options`` JSON object, ``{"backend": "auto"}``, given as a
   string or as ``@file`` (``smddprun --communication-options``);
6. the default, ``auto``.

The first source that names a value decides; lower sources are not read, so a
malformed file that an explicit setting overrides cannot fail the job. Values
are case-insensitive and stripped. Anything but ``auto``/``nccl``, and any
malformed JSON in a source that is read, raises :class:`ConfigError` with a
message naming the variable or file.

Pure Python with no torch import: the launcher runs it before any process
exists, and must stay fast under ``mpirun -np 64``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional

BACKENDS = ("auto", "nccl")
DEFAULT_BACKEND = "auto"
ENV_VAR = "SMDDP_COMMUNICATION_BACKEND"
RUNNER_VAR = "USE_SMDDP_COLLECTIVES"
RUNNER_VALUES = {"1": "auto", "0": "nccl"}
HPS_KEY = "sagemaker_communication_backend"
DEFAULT_HYPERPARAMETERS_FILE = "/opt/ml/input/config/hyperparameters.json"

__all__ = [
    "BACKENDS",
    "DEFAULT_HYPERPARAMETERS_FILE",
    "CommConfig",
    "ConfigError",
    "resolve",
]


class ConfigError(ValueError):
    """A configuration source holds a bad value or malformed JSON."""


@dataclass(frozen=True)
class CommConfig:
    """The resolved backend and where it came from (for messages and logs)."""

    backend: str  # "auto" or "nccl"
    source: str  # e.g. "SMDDP_COMMUNICATION_BACKEND", "default"


def _normalize(value: Any, source: str) -> str:
    if isinstance(value, str) and value.strip().lower() in BACKENDS:
        return value.strip().lower()
    accepted = " or ".join(repr(b) for b in BACKENDS)
    raise ConfigError(
        f"invalid communication backend {value!r} from {source}: accepted values are {accepted}"
    )


def _load_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"malformed JSON in {what}: {e}") from None


def _load_object(text: str, what: str) -> Mapping[str, Any]:
    data = _load_json(text, what)
    if not isinstance(data, dict):
        kind = type(data).__name__
        raise ConfigError(f"malformed JSON in {what}: expected an object, got {kind}")
    return data


def _read_file(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ConfigError(f"cannot read {what}: {e.strerror or e}") from None


def _hyperparameter(value: Any) -> Any:
    """SageMaker's SDK JSON-encodes each hyperparameter ("\\"nccl\\""): undo that."""
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            return value
        if isinstance(decoded, str):
            return decoded
    return value


def _from_sagemaker(env: Mapping[str, str], hyperparameters_file: str) -> Optional[CommConfig]:
    text = env.get("SM_TRAINING_ENV")
    if text:
        training = _load_object(text, "SM_TRAINING_ENV")
        params = training.get("additional_framework_parameters") or {}
        if not isinstance(params, dict):
            raise ConfigError("malformed JSON in SM_TRAINING_ENV: "
                              "additional_framework_parameters is not an object")
        if HPS_KEY in params:
            source = f"SM_TRAINING_ENV (additional_framework_parameters.{HPS_KEY})"
            return CommConfig(_normalize(_hyperparameter(params[HPS_KEY]), source), source)

    text = env.get("SM_HPS")
    if text is not None and text.strip():  # empty, as SM_TRAINING_ENV: no hyperparameters
        hps, where = _load_object(text, "SM_HPS"), "SM_HPS"
    elif os.path.isfile(hyperparameters_file):
        what = f"hyperparameters file {hyperparameters_file}"
        hps, where = _load_object(_read_file(hyperparameters_file, what), what), what
    else:
        return None
    if HPS_KEY in hps:
        source = f"{where} ({HPS_KEY})"
        return CommConfig(_normalize(_hyperparameter(hps[HPS_KEY]), source), source)
    return None


def _from_runner(env: Mapping[str, str]) -> Optional[CommConfig]:
    value = env.get(RUNNER_VAR, "").strip()
    if not value:
        return None
    if value not in RUNNER_VALUES:
        raise ConfigError(f"invalid {RUNNER_VAR}={value!r}: accepted values are '1' (auto: "
                          "smddp's collectives) or '0' (nccl)")
    return CommConfig(RUNNER_VALUES[value], f"{RUNNER_VAR}={value}")


def _from_options(options: str) -> Optional[CommConfig]:
    if options.startswith("@"):
        what = f"--communication-options file {options[1:]}"
        data = _load_object(_read_file(options[1:], what), what)
    else:
        what = "--communication-options"
        data = _load_object(options, what)
    if "backend" not in data:
        return None
    source = f"{what} (backend)"
    return CommConfig(_normalize(data["backend"], source), source)


def resolve(
    backend: Optional[str] = None,
    communication_options: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    hyperparameters_file: Optional[str] = None,
) -> CommConfig:
    """Resolves the communication backend from every source, highest first.

    Args:
        backend: an explicit choice (``--communication-backend``), or None.
        communication_options: a ``communication_options`` JSON object as a
            string, or ``@path`` to a file holding one, or None.
        env: the environment to read; ``os.environ`` when None.
        hyperparameters_file: where SageMaker writes the hyperparameters
            (None: :data:`DEFAULT_HYPERPARAMETERS_FILE`, read at call time); a
            parameter rather than a variable so tests can point it elsewhere
            without inventing an ``SMDDP_*`` setting the core would not know.

    Returns:
        A :class:`CommConfig` with ``backend`` in :data:`BACKENDS`.

    Raises:
        ConfigError: a bad value, malformed JSON, or an unreadable file, in a
            source that was reached.
    """
    env = os.environ if env is None else env
    if hyperparameters_file is None:
        hyperparameters_file = DEFAULT_HYPERPARAMETERS_FILE
    if backend is not None:
        return CommConfig(_normalize(backend, "--communication-backend"), "--communication-backend")
    value = env.get(ENV_VAR, "")
    if value.strip():
        backend, source = _normalize(value, ENV_VAR), ENV_VAR
        runner = env.get(RUNNER_VAR, "").strip()
        if runner and RUNNER_VALUES.get(runner) != backend:
            source += f" (over {RUNNER_VAR}={runner})"  # said wherever the source is shown
        return CommConfig(backend, source)
    found = _from_runner(env) or _from_sagemaker(env, hyperparameters_file)
    if found is None and communication_options is not None:
        found = _from_options(communication_options)
    return found or CommConfig(DEFAULT_BACKEND, "default")
