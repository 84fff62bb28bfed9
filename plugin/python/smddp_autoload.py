"""The `torch.backends` entry point: registers "smddp" when torch is imported.

torch imports this module and calls autoload() near the end of its own
`import torch`; an exception from either would break `import torch` for every
program in the environment. So this module lives outside the smddp package
(loading it runs none of smddp's code) and autoload() turns every failure of
`import smddp`, which registers the backend, into a warning.
"""

import sys


def autoload() -> None:
    """Makes sure smddp is imported and registered; never raises."""
    module = sys.modules.get("smddp")
    spec = getattr(module, "__spec__", None)
    if module is not None and getattr(spec, "_initializing", False):
        # `import smddp` is importing torch, which called us: smddp registers
        # itself once its own import finishes.
        return
    try:
        import smddp

        error = getattr(smddp, "_load_error", None)
    except Exception as err:  # noqa: BLE001 - must never break `import torch`
        error = err
    if error is None:
        return
    # Forget the half-loaded package, so that an explicit `import smddp` later
    # retries and raises the error instead of returning a backend-less module.
    for name in [n for n in sys.modules if n == "smddp" or n.startswith("smddp.")]:
        del sys.modules[name]
    import warnings

    text = (f"smddp: the torch.distributed backend 'smddp' is not available "
            f"({type(error).__name__}: {error}). Set TORCH_DEVICE_BACKEND_AUTOLOAD=0 "
            "to skip this autoload.")
    try:
        warnings.warn(text, RuntimeWarning, stacklevel=2)
    except Exception:  # noqa: BLE001 - warnings turned into errors (python -W error)
        # The warning would have become `import torch`'s exception: say it on
        # stderr instead.
        print(f"warning: {text}", file=sys.stderr)
