"""The Windows package bundles PyTorch's CUDA build; on a PC without an NVIDIA GPU or driver it
must run on the CPU and say so (status bar, self-test line). Forced here on the CPU build by
making torch report a CUDA build with no device."""

from __future__ import annotations

import pytest
import torch

from app.draft_choice import PROMPT_LOOKUP

pytest.importorskip("pytestqt")


@pytest.fixture
def cuda_build_without_gpu(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_a_cuda_build_without_a_gpu_runs_on_the_cpu_and_says_why(cuda_build_without_gpu, tiny_pair, qtbot):
    from app.runner import Runner
    from ui.status_bar import StatusBar

    loaded = Runner().load(tiny_pair["target"], "torch", draft=PROMPT_LOOKUP, progress=lambda m: None)
    assert loaded.device == "cpu" and loaded.device_note == "no NVIDIA GPU or driver found"
    bar = StatusBar()
    qtbot.addWidget(bar)
    bar.show_loaded(loaded)
    assert bar.device.text().startswith("on the CPU with PyTorch (no NVIDIA GPU or driver found) · float32")


def test_the_cpu_build_says_nothing_more(tiny_pair):
    from app.runner import Runner

    if torch.version.cuda is not None:
        pytest.skip("a CUDA build of PyTorch: the CPU build's case cannot be shown here")
    assert Runner().load(tiny_pair["target"], "torch", progress=lambda m: None).device_note == ""


def test_the_self_test_line_names_the_fallback(cuda_build_without_gpu, tiny_pair):
    from app.self_test import self_test

    lines = []
    assert self_test(str(tiny_pair["target"]), "torch", draft=PROMPT_LOOKUP, tokens=8, out=lines.append,
                     progress=lambda m: None) == 0
    assert "torch/cpu (no NVIDIA GPU or driver found)" in lines[0]
