"""Cancel ends an alignment job within about a second in any step, and writes nothing
(app/align/cancel.py). Issue 35 found Cancel took 8.7 s; measured on the demo, the steps that did
not hear it were checking (5 s), loading the teacher (11 s), the first step of each answering
batch (8 s: the prefill of its prompts), agreement and ranking (loops through the target's whole
head: minutes in a long job), and the pair trial's loads (7 s each).

Two kinds of step: a loop checks `cancelled()` between its units, so it does no more work after a
cancel; one long library call runs on a helper thread that the job leaves behind. Stand-ins for the
long calls block until released, so a job that waited for them would take 30 s here; the loops are
the real ones on the tiny target, with the target's head counted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from app.align import job, teacher_torch
from app.align.cancel import AlignCancelled, never, steps_left_running, until_cancelled
from app.align.head_train_torch import HeadTrainer
from app.align.job import AlignSettings, run
from app.align.teacher_torch import Teacher

QUICK = dict(prompts=16, max_tokens=16, batch=8, steps=3, threads=1, trial=False)
ENDS_WITHIN_S = 10.0  # generous: a job that waited for a blocked stand-in would take BLOCKED_S
BLOCKED_S = 30.0


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny models: one thread is many times faster than OpenMP's two spinning on tiny ops."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _wait_for_steps_left_running() -> None:
    deadline = time.monotonic() + BLOCKED_S
    while steps_left_running() and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def release():
    """Set at the end of a test: a stand-in still blocked ends, and so does its helper thread."""
    event = threading.Event()
    yield event
    event.set()
    _wait_for_steps_left_running()


class Cancel:
    """The job's `cancelled`, and when it was set."""

    def __init__(self):
        self.event, self.at = threading.Event(), None

    def set(self) -> None:
        self.at = self.at or time.perf_counter()
        self.event.set()

    def __call__(self) -> bool:
        return self.event.is_set()

    def is_set(self) -> bool:
        return self.event.is_set()

    def waited(self) -> float:
        return time.perf_counter() - self.at


def _settings(tiny_pair, out: Path, **kw) -> AlignSettings:
    return AlignSettings(target=str(tiny_pair["target"]), out=out, **{**QUICK, **kw})


def _cancel_on_entering(monkeypatch, owner, name: str, cancel: Cancel, block: threading.Event | None = None):
    """`owner.name` cancels the job as it begins (and, with `block`, then waits for it to be set)."""
    real = getattr(owner, name)

    def entered(*args, **kwargs):
        cancel.set()
        if block is not None:
            block.wait(BLOCKED_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, entered)


def _head_passes_after(monkeypatch, cancel: Cancel) -> list[int]:
    """Calls to the target's head once the job is cancelled (appended as they happen)."""
    after: list[int] = []
    real = Teacher.logits

    def counted(self, *args, **kwargs):
        if cancel.is_set():
            after.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Teacher, "logits", counted)
    return after


def test_a_step_gives_its_result_or_its_error():
    assert until_cancelled(lambda: 4, never) == 4
    with pytest.raises(ZeroDivisionError):
        until_cancelled(lambda: 1 / 0, never)
    with pytest.raises(AlignCancelled, match="kept"):  # not started at all once cancelled
        until_cancelled(lambda: pytest.fail("started after the cancel"), lambda: True, "kept")


def test_a_cancel_ends_a_step_stuck_in_one_long_call_at_once(release):
    started = threading.Event()

    def one_long_call():
        started.set()
        release.wait(BLOCKED_S)

    began = time.perf_counter()
    with pytest.raises(AlignCancelled, match="nothing was saved"):
        until_cancelled(one_long_call, started.is_set)
    assert time.perf_counter() - began < ENDS_WITHIN_S
    assert steps_left_running()  # left behind, still in its call; the command leaves without it
    release.set()
    _wait_for_steps_left_running()
    assert not steps_left_running()


@pytest.mark.parametrize("owner, name", [
    (HeadTrainer, "agreement"),  # its first call: the agreement before training
    (Teacher, "rank"),
    (HeadTrainer, "round_to_saved"),  # the start of measuring: the agreement after is next
], ids=["agreement", "rank", "measuring"])
def test_a_cancel_in_a_loop_through_the_head_stops_it_before_its_next_sequence(tiny_pair, tmp_path, monkeypatch,
                                                                                owner, name):
    cancel = Cancel()
    _cancel_on_entering(monkeypatch, owner, name, cancel)
    after = _head_passes_after(monkeypatch, cancel)
    with pytest.raises(AlignCancelled, match="nothing was saved"):
        run(_settings(tiny_pair, tmp_path), cancelled=cancel)
    _wait_for_steps_left_running()  # the loop's own thread, had it gone on
    assert after == []  # the loop heard the cancel before its first pass through the head
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("owner, name", [
    (job, "check"),  # the files read and hashed: 5 s for the demo
    (Teacher, "__init__"),  # the weights: 11 s for the demo
    (teacher_torch, "collect"),  # each batch's first step is its prompts' prefill: 8 s
    (Teacher, "rank"),
], ids=["checking", "loading", "answering", "rank"])
def test_a_cancel_ends_the_job_without_waiting_for_a_long_call(tiny_pair, tmp_path, monkeypatch, owner, name,
                                                               release):
    cancel = Cancel()
    _cancel_on_entering(monkeypatch, owner, name, cancel, block=release)
    with pytest.raises(AlignCancelled, match="nothing was saved"):
        run(_settings(tiny_pair, tmp_path), cancelled=cancel)
    assert cancel.waited() < ENDS_WITHIN_S
    assert list(tmp_path.iterdir()) == []


def test_a_cancel_while_saving_leaves_no_draft_and_no_partial_folder(tiny_pair, tmp_path, monkeypatch):
    cancel = Cancel()
    _cancel_on_entering(monkeypatch, job, "_write", cancel)  # heard after the files, before the rename
    with pytest.raises(AlignCancelled, match="nothing was saved"):
        run(_settings(tiny_pair, tmp_path), cancelled=cancel)
    assert list(tmp_path.iterdir()) == []


def test_a_cancel_in_the_pair_trials_load_keeps_the_saved_draft_unmeasured(tiny_pair, tmp_path, monkeypatch,
                                                                           release):
    from app.runner import Runner

    cancel = Cancel()
    _cancel_on_entering(monkeypatch, Runner, "load", cancel, block=release)
    result = run(_settings(tiny_pair, tmp_path, trial=True), cancelled=cancel)
    assert cancel.waited() < ENDS_WITHIN_S
    assert result.trial_before is None and result.trial_after is None
    assert any("trial was cancelled" in note for note in result.notes)
    assert [p.name for p in tmp_path.iterdir()] == [result.folder.name]  # the draft is whole, and kept
    assert "trial" not in json.loads((result.folder / "manifest.json").read_text())


def test_a_trial_cut_short_by_a_cancel_is_not_recorded_as_measured(tiny_pair, tmp_path, monkeypatch):
    """run_trial gives None when cancelled: the "after" trial was stored as 0% accepted, 1.0x."""
    from app import pair_trial
    from app.models.pair_memory import TrialResult
    from app.runner import Runner

    cancel = Cancel()
    trials = iter([TrialResult(0.3, 1.1, 1.4, 100, 1.0), None])

    def trial(runner, cancelled=never, *args, **kwargs):
        found = next(trials)
        if found is None:
            cancel.set()
        return found

    monkeypatch.setattr(Runner, "load", lambda self, *args, **kwargs: None)
    monkeypatch.setattr(pair_trial, "run_trial", trial)
    result = run(_settings(tiny_pair, tmp_path, trial=True), cancelled=cancel)
    assert result.trial_after is None and any("trial was cancelled" in note for note in result.notes)
    assert "trial" not in json.loads((result.folder / "manifest.json").read_text())


def test_the_jobs_process_ends_soon_after_sigterm_with_nothing_saved(tiny_pair, tmp_path):
    """As the window runs it (ui/pairing/align_job.py): `tandem-cli align --json-progress`, SIGTERM."""
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, TANDEM_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    child = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "align", "--target", str(tiny_pair["target"]), "--prompts", "64",
         "--max-tokens", "64", "--batch", "8", "--steps", "100000", "--threads", "1", "--no-trial",
         "--json-progress", "--out", str(out)],
        cwd=Path(job.__file__).resolve().parents[2], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True)
    watchdog = threading.Timer(120, child.kill)  # a child that never ends fails the test, not the suite
    watchdog.start()
    events, sent = [], None
    try:
        for line in child.stdout:
            events.append(json.loads(line))
            if sent is None and events[-1].get("phase") == "answering":
                child.send_signal(signal.SIGTERM)
                sent = time.perf_counter()
        code = child.wait(ENDS_WITHIN_S)
    finally:
        watchdog.cancel()
        if child.poll() is None:
            child.kill()
    assert sent is not None, events
    assert time.perf_counter() - sent < ENDS_WITHIN_S
    assert code == 3 and events[-1] == {"event": "cancelled", "message": "Alignment cancelled: nothing was saved."}
    assert list(out.iterdir()) == []
