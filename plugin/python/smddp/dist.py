"""One-line process-group setup that follows the job's communication backend.

Scripts written for SageMaker's switch should not each repeat "smddp under
auto, torch's defaults under nccl"; :func:`init_process_group` does it with
the same resolution as ``smddprun`` (:mod:`smddp.config`). Under ``smddprun``
that is simply ``SMDDP_COMMUNICATION_BACKEND``, which the launcher exports
after any fallback, so the launcher and the script never disagree.
"""

from __future__ import annotations

from typing import Any

from smddp import config


class BackendUnavailable(RuntimeError):
    """The configuration asks for smddp, but its torch backend cannot load."""


def default_backend(backend: str) -> str:
    """The torch backend string for a resolved communication backend."""
    if backend == "auto":
        return "smddp"
    import torch

    return "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"


def init_process_group(**kwargs: Any) -> str:
    """``torch.distributed.init_process_group`` with the backend chosen by the config.

    Under ``auto`` the backend is ``smddp`` (the package is imported to
    register it); under ``nccl`` it is torch's default, ``cpu:gloo,cuda:nccl``
    where CUDA is available, else ``gloo``. A ``backend`` keyword wins over
    the configuration; every other keyword passes through unchanged.

    Returns:
        The backend string handed to torch.

    Raises:
        smddp.config.ConfigError: the configuration holds a bad value.
        BackendUnavailable: smddp is asked for but cannot load.
    """
    import torch.distributed as dist

    backend = kwargs.pop("backend", None)
    if backend is None:
        cfg = config.resolve()
        backend = default_backend(cfg.backend)
        why = f"the communication backend is 'auto' (from {cfg.source})"
    else:
        why = f"backend={backend!r} was asked for"
    if "smddp" in str(backend).lower():
        ensure_registered(why)
    dist.init_process_group(backend=backend, **kwargs)
    return backend


def ensure_registered(why: str = "the smddp backend was asked for") -> None:
    """Registers the ``smddp`` torch backend, or says clearly why it cannot."""
    import importlib

    import torch.distributed as dist

    try:
        mod = importlib.import_module("smddp")
        if "smddp" not in dist.Backend.backend_list:
            if getattr(mod, "_load_error", None) is not None:
                raise mod._load_error  # the loader's own message (missing _C, torch mismatch)
            importlib.import_module("smddp._C")  # surfaces the loader's own error
            raise ImportError("importing smddp did not register the 'smddp' backend")
    except Exception as e:  # an ImportError, or the shim's own torch-version check
        raise BackendUnavailable(
            f"{why}, but smddp's torch backend cannot be loaded: {e}. Build and install it "
            "(pip install --no-build-isolation .), or choose the nccl configuration "
            "(smddprun --communication-backend nccl)"
        ) from e
