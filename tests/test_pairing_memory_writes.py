"""A pair that loads but cannot be remembered (pairs.json on a full or read-only folder) still
works, and the window says why it was not remembered."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from app.draft_choice import DraftChoice  # noqa: E402
from app.models.pair_memory import PairMemory, TrialResult  # noqa: E402
from app.runner import LoadedModel  # noqa: E402
from ui.pairing.controller import PairController  # noqa: E402
from ui.pairing.downloads import DownloadStrip  # noqa: E402
from ui.worker import PairRequest  # noqa: E402


SMALL = DraftChoice.model("/models/small")
BIG = LoadedModel(Path("/models/big"), "torch", "cpu", "float32", "llama", 2048, 10, 1.0, SMALL)


def _pairing(qtbot, memory: PairMemory) -> tuple[PairController, list]:
    """A pairing controller and the trials it asks for."""
    strip = DownloadStrip()
    qtbot.addWidget(strip)
    pairing, trials = PairController(strip, "torch", memory), []
    pairing.request_trial.connect(trials.append)
    return pairing, trials


def test_a_pair_that_cannot_be_remembered_says_so(qtbot, tmp_path, monkeypatch):
    memory = PairMemory(tmp_path / "pairs.json")

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_full)
    monkeypatch.setattr(Path, "write_bytes", disk_full)
    pairing, trials = _pairing(qtbot, memory)
    errors = []
    pairing.error.connect(errors.append)
    request = PairRequest("/models/big", SMALL)
    pairing.on_paired(request, BIG)
    assert trials == [request]  # the pair is in use all the same
    assert len(errors) == 1 and "pairs.json" in errors[0]
    pairing.on_trial_done(request, TrialResult(0.8, 1.5, 3.0, 100, 0.0))
    assert len(errors) == 2
    assert pairing.trial_text.startswith("accepts 80%")


def test_a_pair_loaded_while_the_previous_pairs_trial_runs_ends_that_trial(qtbot, tmp_path):
    """The worker drops an unfinished trial unreported when a new pair loads; a new pair with a
    remembered trial left `trial_running` on for good (the window waited on it)."""
    memory = PairMemory(tmp_path / "pairs.json")
    pairing, trials = _pairing(qtbot, memory)
    shown = []
    pairing.trial_shown.connect(shown.append)
    head = DraftChoice.head("/models/head")
    first = PairRequest("/models/big", SMALL)
    pairing.on_paired(first, BIG)
    assert pairing.trial_running and trials == [first]
    memory.set_trial("torch", "/models/big", head, TrialResult(0.64, 1.4, 2.5, 120, 1.0))
    pairing.on_paired(PairRequest("/models/big", head), BIG)
    assert not pairing.trial_running and trials == [first]  # remembered: not measured again
    assert shown[-1].startswith("accepts 64%")
    pairing.on_trial_done(first, TrialResult(0.8, 1.5, 3.0, 100, 0.0))  # a late report of the old pair
    assert not pairing.trial_running and shown[-1].startswith("accepts 64%")
