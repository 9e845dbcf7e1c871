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
"""

from __future__ import annotations

import os
import sys

FOLDER = "bundle"  # under numba.config.CACHE_DIR


def frozen() -> bool:
    return bool(getattr(sys, "frozen", False))


def install() -> str:
    """Put the bundle's locator first in Numba's list; "" when done (or not frozen), else why not."""
    if not frozen():
        return ""
    try:
        from numba.core import caching, config
    except ImportError as exc:
        return f"Numba's caching module is not there: {exc}"
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
