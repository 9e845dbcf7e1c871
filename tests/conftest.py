"""Shared fixtures. The demo model comes from the user cache (`make test` provisions it); every
other file a test writes goes to a temporary TANDEM_HOME."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Keep the real model cache (the demo is converted once), but nothing else of the user's.
if "TANDEM_CACHE" not in os.environ:
    from app.paths import cache_dir

    os.environ["TANDEM_CACHE"] = str(cache_dir())



def _real_user_files() -> dict[str, tuple[int, int]]:
    """The real user folders' Tandem files (data: pairs.json, the history; config: Tandem.conf),
    read before anything below points those folders elsewhere: (mtime, size) of each."""
    import platformdirs

    home = os.environ.get("TANDEM_HOME")
    folders = ([Path(home)] if home else
               [Path(platformdirs.user_data_dir("Tandem", appauthor=False)),
                Path(platformdirs.user_config_dir("Tandem", appauthor=False))])
    found = {}
    for folder in folders:
        if folder.is_dir():
            for path in folder.rglob("*"):
                if path.is_file() and "cache" not in path.relative_to(folder).parts[:1]:
                    stat = path.stat()
                    found[str(path)] = (stat.st_mtime_ns, stat.st_size)
    return found


_REAL_USER_FILES = _real_user_files()

# Every other user folder a library might write to (Qt's settings and standard paths, platformdirs,
# huggingface-hub, whose constants are read once at import) points into a private folder before
# anything imports them: recents from test runs were once found in a real pairs.json.
USER_FOLDERS = ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME", "HF_HOME")
_ORIGINAL_FOLDERS = {name: os.environ.get(name) for name in USER_FOLDERS}
_session_home = Path(tempfile.mkdtemp(prefix="tandem-tests-"))
# removed when the process ends: xdist's controlling process imports this file too, and runs no fixture
atexit.register(shutil.rmtree, _session_home, ignore_errors=True)
for _name in USER_FOLDERS:
    os.environ[_name] = str(_session_home / _name.lower())
os.environ.pop("HF_HUB_CACHE", None)
os.environ.pop("HF_TOKEN", None)


@pytest.fixture(scope="session", autouse=True)
def _real_user_folders_untouched():
    """After the whole run, the real user's Tandem files are as they were: recents from test runs
    were once found in a real pairs.json."""
    yield
    before = _REAL_USER_FILES
    for name, value in _ORIGINAL_FOLDERS.items():  # the user's own, to find the real folders again
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    after = _real_user_files()
    changed = sorted(p for p in {*before, *after} if before.get(p) != after.get(p))
    assert not changed, f"the tests wrote to the real user folders: {changed}"


@pytest.fixture(autouse=True)
def _private_home(tmp_path_factory, monkeypatch):
    """Each test its own user data, config and cache folders."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("TANDEM_HOME", str(home))
    for name in USER_FOLDERS:
        monkeypatch.setenv(name, str(home / name.lower()))


@pytest.fixture(scope="session")
def demo() -> dict[str, Path]:
    from app.models.demo import ensure_demo

    return ensure_demo(progress=lambda message: None)


@pytest.fixture(scope="session")
def demo_gguf(demo) -> Path:
    from app.models.demo import find_demo_gguf

    return find_demo_gguf()


@pytest.fixture(scope="session")
def tiny_fields(demo_gguf):
    from tests.factories import tokenizer_fields

    return tokenizer_fields(demo_gguf)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory, tiny_fields) -> dict[str, Path]:
    """Tiny random Llama models sharing one tokenizer, imported through the GGUF path: a target,
    an unrelated draft (almost nothing accepted) and a noisy copy of the target (much accepted):
    {"target": hf folder, "draft": ..., "near": ..., "target_mlx": mlx folder, ...}."""
    from app.models.gguf_import import import_gguf
    from tests.factories import near_copy, tiny_llama, write_gguf

    root = tmp_path_factory.mktemp("tiny")
    near = near_copy(tiny_llama(1))  # the target plus noise: accepts often but not always
    models = {"target": tiny_llama(1), "draft": tiny_llama(2), "near": near}
    folders = {}
    for role, model in models.items():
        path = root / f"{role}.gguf"
        write_gguf(model, path, tiny_fields)
        out = import_gguf(path, root / role, mlx_variants=("mlx",))
        folders[role], folders[f"{role}_mlx"] = out["hf"], out["mlx"]
    return folders


@pytest.fixture(scope="session")
def tiny_q4(tmp_path_factory, tiny_fields):
    """A tiny Llama written as llama.cpp's Q4 files are: linear weights Q4_0, the embedding Q8_0.
    (import folder, what was written)"""
    import gguf

    from app.models.gguf_import import import_gguf
    from tests.factories import tiny_llama, write_gguf

    q = gguf.GGMLQuantizationType
    root = tmp_path_factory.mktemp("q4")
    written = write_gguf(tiny_llama(seed=21), root / "m.gguf", tiny_fields, q.Q4_0, embedding_qtype=q.Q8_0)
    folders = import_gguf(root / "m.gguf", root / "import", mlx_variants=())
    return folders["hf"], written


@pytest.fixture(scope="module")
def service(tiny_pair):
    """The runner service (app/service.py) over the tiny target, its noisy copy drafting, on
    PyTorch: one per test module, closed after it."""
    from app.draft_choice import DraftChoice
    from app.runner import Runner
    from app.service import RunnerService

    runner = Runner()
    runner.load(tiny_pair["target"], "torch", draft=DraftChoice.model(tiny_pair["near"]),
                progress=lambda message: None)
    service = RunnerService(runner)
    yield service
    service.close()


@pytest.fixture(scope="module")
def api_server(service):
    """The OpenAI-compatible server (app/server/) over `service`, on a free loopback port."""
    from app.server.host import ApiServer

    server = ApiServer(service, "127.0.0.1", 0)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def offline_window(qtbot, tmp_path):
    """A window whose model is missing (it fails at once), over a history in tmp_path."""

    def make(history=None, **kwargs):
        from PySide6.QtCore import QSettings

        from ui.main_window import MainWindow

        window = MainWindow(model=str(tmp_path / "no-model"), backend="torch",
                            history_path=history or tmp_path / "history.sqlite3",
                            settings=QSettings(str(tmp_path / "tandem.ini"), QSettings.Format.IniFormat), **kwargs)
        qtbot.addWidget(window)
        window.show()
        return window

    return make
