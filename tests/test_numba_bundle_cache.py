"""The compiled CPU kernels' cache in a frozen bundle (app/models/numba_cache.py), simulated: a
process that says it is frozen, running a function whose source file does not exist."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

ROOT = Path(__file__).resolve().parent.parent

# a function as a bundle holds it: compiled from a source file that is not on disk
PROBE = '''
import json, os, sys
sys.frozen = True
sys.executable = os.environ["PROBE_EXECUTABLE"]
import numba
numba.config.CACHE_DIR = os.environ["PROBE_CACHE"]
from app.models import numba_cache
assert numba_cache.install() == ""
assert numba_cache.install() == ""  # once only
source = "from numba import njit\\n@njit(cache=True)\\ndef triple(x):\\n    return 3 * x\\n"
import types
module = sys.modules["bundled_probe"] = types.ModuleType("bundled_probe")
module.__file__ = "/no/such/folder/bundled_probe.py"
space = module.__dict__
exec(compile(source, module.__file__, "exec"), space)
value = space["triple"](14)
stats = space["triple"].stats
locators = [c.__name__ for c in numba.core.caching.CacheImpl._locator_classes if getattr(c, "tandem_bundle", False)]
print(json.dumps({"value": value, "hits": sum(stats.cache_hits.values()), "locators": locators}))
'''


def _run(script: str, cache: Path, executable: Path, home: Path) -> dict:
    env = {"PROBE_CACHE": str(cache), "PROBE_EXECUTABLE": str(executable), "PYTHONPATH": str(ROOT),
           "HOME": str(home), "XDG_CACHE_HOME": str(home / "cache"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_bundle_caches_its_kernels_in_tandems_folder_per_build(tmp_path):
    cache, home = tmp_path / "numba" / "0123456789ab", tmp_path / "home"
    build = tmp_path / "Tandem" / "tandem"
    build.parent.mkdir()
    build.write_bytes(b"the first build")

    first = _run(PROBE, cache, build, home)
    assert first == {"value": 42, "hits": 0, "locators": ["BundleLocator"]}
    entries = sorted(p.name for p in (cache / "bundle").iterdir())
    assert any(name.endswith(".nbi") for name in entries) and any(name.endswith(".nbc") for name in entries)
    # nothing went to Numba's own folder in the user's cache
    assert not (home / "cache" / "numba").exists()

    # the next launch of the same build loads what the first compiled
    assert _run(PROBE, cache, build, home)["hits"] == 1
    # a new build (another executable) compiles afresh, then is cached in turn
    build.write_bytes(b"the second build, another size")
    assert _run(PROBE, cache, build, home)["hits"] == 0
    assert _run(PROBE, cache, build, home)["hits"] == 1


def test_outside_a_bundle_numba_keeps_its_own_locators(tmp_path):
    script = PROBE.replace("sys.frozen = True\n", "")
    script = script.replace('"/no/such/folder/bundled_probe.py"', repr(str(tmp_path / "bundled_probe.py")))
    (tmp_path / "bundled_probe.py").write_text("# the source, on disk as in a checkout\n")
    got = _run(script, tmp_path / "cache", Path(sys.executable), tmp_path / "home")
    assert got["value"] == 42 and got["locators"] == []


def test_the_kernels_take_the_bundle_locator_when_frozen(tmp_path):
    """The real kernels module, imported in a frozen process, caches through the bundle locator."""
    script = '''
import json, os, sys
sys.frozen = True
import numba
numba.config.CACHE_DIR = os.environ["PROBE_CACHE"]
from app.models import kernels_numba
locator = kernels_numba.matmul._cache._impl.locator
print(json.dumps({"bundle": getattr(type(locator), "tandem_bundle", False), "path": locator.get_cache_path()}))
'''
    got = _run(script, tmp_path / "cache", Path(sys.executable), tmp_path / "home")
    assert got == {"bundle": True, "path": str(tmp_path / "cache" / "bundle")}
