"""Where the compiled CPU kernels are cached in a frozen bundle (the packaged app).

Numba keys a function's cache on its source file: the file's folder names the cache's folder and
its contents stamp the entries. A PyInstaller bundle carries no source files, so none of Numba's
own locators but its user-wide one takes a frozen function, and that one writes into Numba's
folder in the user's cache, named after the folder the app was started from. Before this, the
bundle compiled without a cache instead: 27 s of compiling on every launch on this 2-core CPU,
and 24 s more at the first answer, before the demo said a word.

In a frozen bundle this locator puts the entries in Tandem's own cache folder (NUMBA_CACHE_DIR as
int4_cpu_torch.compiled() sets it: one folder per version of the kernels' sources, pruned), one
folder per executable and module: `bundle/tandem-cli/app.models.kernels_numba/`. Numba names an
entry by its file's base name, the function's name and its first line, so without the module two
functions could share an entry; and the window and the command line, two executables of one
build, each stamp their own (one shared index would be rewritten by each in turn). The stamp is
the mixin's: in a frozen process, a SHA-256 of the executable, which holds the bundle's Python
code, so a new build compiles afresh and the same build loads what it compiled before. Numba's
index also keys each entry on the function's signature and the CPU it was compiled for.

This reaches into Numba's caching module (its locator list has no public hook): where that
changes, install() leaves the bundle compiling without a cache, as before, and says why.

Whatever the process, the cache folder must be one Numba can write (use_folder): where the one
named cannot be (NUMBA_CACHE_DIR, or TANDEM_CACHE/numba, is a file, or read-only), Numba's next
locator wrote 21-32 compiled kernels beside the sources, into the program's own folder, which an
installed app may not own or may share between users.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from pathlib import Path

FOLDER = "bundle"  # under numba.config.CACHE_DIR
TEMPORARY = "tandem-kernels"  # in the system's temporary folder, one per user: where the cache folder cannot be


def frozen() -> bool:
    return bool(getattr(sys, "frozen", False))


def _writable(folder: Path) -> bool:
    """Whether Numba can cache in `folder`: its own test (caching._CacheLocator.ensure_cache_path)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError:
        return False
    return True


def temporary_folder() -> Path:
    """Where the kernels are cached when the cache folder cannot be written: this user's folder in
    the system's temporary folder (Windows gives each user a temporary folder of their own)."""
    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return Path(tempfile.gettempdir()) / f"{TEMPORARY}-{user}"


def _private_temporary() -> Path | None:
    """temporary_folder(), made where it is not there, or None. Cached kernels are code that is
    loaded and run, so a folder another user made, or could write to, is never used."""
    folder = temporary_folder()
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        found = folder.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(found.st_mode):  # a link, or a file
        return None
    if hasattr(os, "getuid") and (found.st_uid != os.getuid() or found.st_mode & 0o077):
        return None
    return folder


def use_folder(wanted: Path) -> str:
    """Point Numba's cache (numba.config.CACHE_DIR) at `wanted` where it can be written there; else
    at this user's temporary folder; else at none (the kernels compile at each start). "" when at
    `wanted`, else a sentence saying where and why, to be said once."""
    from numba.core import config

    wanted = Path(wanted)
    if _writable(wanted):
        config.CACHE_DIR = str(wanted)
        return ""
    advice = "Set NUMBA_CACHE_DIR or TANDEM_CACHE to a folder you can write to."
    temporary = _private_temporary()
    if temporary is not None and _writable(temporary / wanted.name):
        config.CACHE_DIR = str(temporary / wanted.name)
        return f"The compiled CPU kernels are cached in {config.CACHE_DIR}: {wanted} cannot be written. {advice}"
    config.CACHE_DIR = ""
    return (f"The compiled CPU kernels are compiled at each start, not cached: neither {wanted} nor a temporary "
            f"folder can be written. {advice}")


def install() -> str:
    """"" when the kernels can be cached: a folder is set (use_folder) and, in a frozen bundle, its
    locator is first in Numba's list. Else why not: with no folder, Numba's own locators would
    cache beside the sources, in the program's folder."""
    try:
        from numba.core import caching, config
    except ImportError as exc:
        return f"Numba's caching module is not there: {exc}"
    if not config.CACHE_DIR:
        return "no folder to cache them in"
    if not frozen():
        return ""
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)  # its name until 0.59
    locators = getattr(impl, "_locator_classes", None)
    bases = (getattr(caching, "_SourceFileBackedLocatorMixin", None), getattr(caching, "_CacheLocator", None))
    if not isinstance(locators, list) or None in bases:
        return "this Numba's cache has no locator list to add to"
    if any(getattr(cls, "tandem_bundle", False) for cls in locators):
        return ""

    class BundleLocator(*bases):
        """The cache of a function compiled in a frozen bundle, in Tandem's cache folder."""

        tandem_bundle = True

        def __init__(self, py_func, py_file):
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            executable = os.path.splitext(os.path.basename(sys.executable))[0] or "app"
            self._cache_path = os.path.join(config.CACHE_DIR, FOLDER, executable, py_func.__module__ or "module")

        def get_cache_path(self):
            return self._cache_path

        # the mixin's stamp: in a frozen process, a SHA-256 of the executable (hashed once a process)

        @classmethod
        def from_function(cls, py_func, py_file):
            if not frozen() or not config.CACHE_DIR:
                return None
            self = cls(py_func, py_file)
            try:
                self.ensure_cache_path()
            except OSError:  # not writable: compile without a cache, as Numba's own locators do
                return None
            return self

    locators.insert(0, BundleLocator)
    return ""
