"""Shared fixtures. The demo model comes from the user cache (`make test` provisions it); every
other file a test writes goes to a temporary TANDEM_HOME."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Keep the real model cache (the demo is converted once), but nothing else of the user's.
if "TANDEM_CACHE" not in os.environ:
    from app.paths import cache_dir

    os.environ["TANDEM_CACHE"] = str(cache_dir())


@pytest.fixture(autouse=True)
def _private_home(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TANDEM_HOME", str(tmp_path_factory.mktemp("home")))


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
    """Two tiny random Llama models sharing one tokenizer, imported through the GGUF path:
    {"target": hf folder, "draft": hf folder, "target_mlx": mlx folder, ...}."""
    from app.models.gguf_import import import_gguf
    from tests.factories import tiny_llama, write_gguf

    root = tmp_path_factory.mktemp("tiny")
    folders = {}
    for role, seed in (("target", 1), ("draft", 2)):
        path = root / f"{role}.gguf"
        write_gguf(tiny_llama(seed), path, tiny_fields)
        out = import_gguf(path, root / role, mlx_variants=("mlx",))
        folders[role], folders[f"{role}_mlx"] = out["hf"], out["mlx"]
    return folders
