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
import json, os, sys, types
sys.frozen = True
sys.executable = os.environ["PROBE_EXECUTABLE"]
import numba
numba.config.CACHE_DIR = os.environ["PROBE_CACHE"]
from app.models import numba_cache
assert numba_cache.install() == ""
assert numba_cache.install() == ""  # once only
values, hits = [], 0
# two modules with a file of the same name and a function of the same name on the same line,
# the same bytecode: Numba's entry names and its bytecode key cannot tell them apart
for name, add in (("first.probe", 1), ("second.probe", 2)):
    module = sys.modules[name] = types.ModuleType(name)
    module.__file__ = "/no/such/folder/" + name.split(".")[0] + "/probe.py"
    source = "from numba import njit\\n@njit(cache=True)\\ndef f(x):\\n    return x + %d\\n" % add
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    values.append(module.f(40))
    hits += sum(module.f.stats.cache_hits.values())
locators = [c.__name__ for c in numba.core.caching.CacheImpl._locator_classes if getattr(c, "tandem_bundle", False)]
print(json.dumps({"values": values, "hits": hits, "locators": locators}))
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
    assert first == {"values": [41, 42], "hits": 0, "locators": ["BundleLocator"]}
    for module in ("first.probe", "second.probe"):
        entries = [p.name for p in (cache / "bundle" / "tandem" / module).iterdir()]
        assert any(name.endswith(".nbi") for name in entries) and any(name.endswith(".nbc") for name in entries)
    # nothing went to Numba's own folder in the user's cache
    assert not (home / "cache" / "numba").exists()

    # the next launch of the same build loads what the first compiled, each module its own
    assert _run(PROBE, cache, build, home) == {"values": [41, 42], "hits": 2, "locators": ["BundleLocator"]}
    # the build's other executable keeps its own entries and leaves the first one's alone
    other = build.with_name("tandem-cli")
    other.write_bytes(b"the same build's command line")
    assert _run(PROBE, cache, other, home)["hits"] == 0
    assert _run(PROBE, cache, build, home)["hits"] == 2
    assert _run(PROBE, cache, other, home)["hits"] == 2
    # a new build (the executable rewritten) compiles afresh, then is cached in turn
    build.write_bytes(b"the second build, another size")
    assert _run(PROBE, cache, build, home)["hits"] == 0
    assert _run(PROBE, cache, build, home) == {"values": [41, 42], "hits": 2, "locators": ["BundleLocator"]}


def test_outside_a_bundle_numba_keeps_its_own_locators(tmp_path):
    script = PROBE.replace("sys.frozen = True\n", "").replace('"/no/such/folder/"', repr(f"{tmp_path}/"))
    for folder in ("first", "second"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "probe.py").write_text("# the source, on disk as in a checkout\n")
    got = _run(script, tmp_path / "cache", Path(sys.executable), tmp_path / "home")
    assert got["values"] == [41, 42] and got["locators"] == []


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
    assert got == {"bundle": True, "path": str(tmp_path / "cache" / "bundle" / Path(sys.executable).stem
                                               / "app.models.kernels_numba")}


def test_an_unwritable_cache_folder_falls_back_to_numbas_own(tmp_path):
    """A bundle whose cache folder cannot be made (a file stands where it should be) still runs its
    kernels, right: the bundle locator steps aside and Numba's user-wide one caches them."""
    blocked = tmp_path / "numba"
    blocked.write_text("a file, not a folder")
    build, home = tmp_path / "tandem", tmp_path / "home"
    build.write_bytes(b"a build")
    assert _run(PROBE, blocked / "0123456789ab", build, home) == {
        "values": [41, 42], "hits": 0, "locators": ["BundleLocator"]}
    assert (home / "cache" / "numba").is_dir() and blocked.read_text() == "a file, not a folder"
    assert _run(PROBE, blocked / "0123456789ab", build, home)["values"] == [41, 42]
