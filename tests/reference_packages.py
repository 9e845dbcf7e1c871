"""The published reference code Tandem's ports are checked against, test-only: vLLM's
`speculators` (EAGLE-3) and z-lab's `dflash`, installed by `make` without their dependencies
into .venv/references (speculators pins an older transformers than Tandem's, and its training
side imports `datasets`, `aiohttp` and `hs_connectors`, which its model classes never use: those
three are stood in for by empty modules, only where they are not installed)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from pathlib import Path

import pytest

FOLDER = Path(sys.prefix) / "references"
UNUSED = ("datasets", "aiohttp", "hs_connectors")


class _Empty(importlib.abc.Loader):
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _stand_in
        return module

    def exec_module(self, module):
        pass


def _stand_in(name: str):
    """Any name imported from a stood-in module is a do-nothing class (only the training code would
    call one); its dunders are missing as a module's are (tools that walk sys.modules, such as
    hypothesis, read __file__ and expect a path or nothing)."""
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (), {"__init__": lambda self, *a, **k: None})


class _StandIns(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] not in UNUSED:
            return None
        for finder in sys.meta_path:  # the real package wins where it is installed
            if finder is not self and finder.find_spec(name, path, target) is not None:
                return None
        return importlib.machinery.ModuleSpec(name, _Empty(), is_package=True)


def reference(package: str):
    """The reference package, imported, or the test skipped where `make` has not installed it."""
    if not (FOLDER / package).is_dir():
        pytest.skip(f"{package} is not installed in {FOLDER} (make installs it)")
    if str(FOLDER) not in sys.path:
        sys.path.append(str(FOLDER))
    if not any(isinstance(f, _StandIns) for f in sys.meta_path):
        sys.meta_path.append(_StandIns())
    return importlib.import_module(package)
