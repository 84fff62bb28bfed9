"""Makes smddp's pure-Python modules importable for the tests.

An installed (or editable) smddp wins, so the tests check what users run.
In a bare checkout the source tree's plugin/python is put on sys.path. When
the package itself cannot be imported there because its compiled part
(smddp._C) is not built, the package is stood in for by an empty module whose
path is the source folder: config, launcher, dist and the example are pure
Python and are tested all the same, while tests that start the real
``smddprun``/example in a subprocess are skipped, naming the import error
(the stand-in's ``STAND_IN_FOR`` holds that error).
"""

import importlib
import importlib.machinery
import os
import sys
import types

SOURCE = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plugin", "python"))

PACKAGE_IMPORT_ERROR = None


def _import_package():
    try:
        importlib.import_module("smddp.config")
        return None
    except ImportError as e:
        for name in [m for m in sys.modules if m == "smddp" or m.startswith("smddp.")]:
            del sys.modules[name]
        return e


PACKAGE_IMPORT_ERROR = _import_package()
if PACKAGE_IMPORT_ERROR is not None:
    sys.path.insert(0, SOURCE)
    PACKAGE_IMPORT_ERROR = _import_package()
if PACKAGE_IMPORT_ERROR is not None:
    stand_in = types.ModuleType("smddp", "stand-in: the real package failed to import")
    stand_in.__spec__ = importlib.machinery.ModuleSpec("smddp", None, is_package=True)
    stand_in.__spec__.submodule_search_locations = [os.path.join(SOURCE, "smddp")]
    stand_in.__path__ = stand_in.__spec__.submodule_search_locations
    stand_in.STAND_IN_FOR = f"{type(PACKAGE_IMPORT_ERROR).__name__}: {PACKAGE_IMPORT_ERROR}"
    sys.modules["smddp"] = stand_in


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA device; skipped, saying so, where torch sees none")
