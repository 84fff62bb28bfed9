"""What the backend tests share: whether smddp with its compiled shim loads.

Tests that need the real backend mark themselves with ``requires_smddp``; in a
checkout without the build they skip and name the import error.
"""

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
