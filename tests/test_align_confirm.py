"""Aligning asks first (issue 35, defect 9): the menu's click says how long the job runs and what
it writes, and starts nothing unless the user agrees."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pytestqt")


def test_the_disk_estimate_matches_the_shipped_demo_head(demo):
    from ui.pairing.align_confirm import head_bytes_for

    shipped = Path(__file__).resolve().parent.parent / "resources" / "aligned" / "smollm2-135m-instruct-q4_1"
    written = (shipped / "model.safetensors").stat().st_size
    estimate = head_bytes_for(demo["hf"])
    assert estimate is not None and abs(estimate - written) < 0.05 * written, (estimate, written)
    assert head_bytes_for(shipped) is None  # a folder without a target's config: no figure, not a wrong one


@pytest.mark.parametrize("press_start", [True, False])
def test_the_question_names_time_and_disk_and_only_start_starts(qtbot, monkeypatch, tmp_path, press_start):
    from PySide6.QtWidgets import QMessageBox

    from ui.pairing.align_confirm import confirm_alignment

    shown = {}

    def exec_(box):
        shown["text"] = box.text()
        start = next(b for b in box.buttons() if b.text() == "Start aligning")
        box.clickedButton = lambda: start if press_start else box.button(QMessageBox.StandardButton.Cancel)
        return 0

    monkeypatch.setattr(QMessageBox, "exec", exec_)
    agreed = confirm_alignment(None, "a draft head", "SmolLM2 135M Instruct (demo)", 12.0, 8_412_104, tmp_path)
    assert agreed is press_start
    assert "about 12 minutes" in shown["text"] and "about 8 MB" in shown["text"] and str(tmp_path) in shown["text"]
    assert "nothing is saved" in shown["text"]
