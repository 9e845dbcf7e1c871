"""A message sent while the model loads (issue 35): taken, said to wait, and sent once the pair
is in; where the load fails it stays in the box, unsent, and the window says so."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("pytestqt")

from app.draft_choice import NO_DRAFT  # noqa: E402
from tests.test_window import LOAD_TIMEOUT_MS, Session, wait_until  # noqa: E402


def _slow_loads(monkeypatch):
    from app.runner import Runner

    real = Runner.load

    def slow(self, *args, **kwargs):
        time.sleep(1.5)  # the user types faster than this pair loads
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Runner, "load", slow)


def test_a_message_sent_while_loading_is_sent_once_the_pair_is_in(qapp, qtbot, tiny_pair, tmp_path, monkeypatch):
    from tests.test_window import make_window

    _slow_loads(monkeypatch)
    window = make_window(Session(None, tmp_path), str(tiny_pair["target"]), draft=NO_DRAFT)
    qtbot.addWidget(window)
    wait_until(lambda: window.composer._loading, LOAD_TIMEOUT_MS)
    assert window.controller.model is None and window.composer.send_button.text() == "Send when loaded"
    window.send("Tell me about the sea.")
    assert window.composer.queued == "Tell me about the sea." and window.composer.queued_label.isVisibleTo(window)
    assert window.composer.edit.isReadOnly() and not window.composer.takes_message()  # one message waits
    with qtbot.waitSignal(window.controller.answer_finished, timeout=LOAD_TIMEOUT_MS):
        pass
    messages = window.store.messages(window.controller.current.id)
    assert [m.role for m in messages] == ["user", "assistant"] and messages[0].content == "Tell me about the sea."
    assert window.composer.queued is None and not window.composer.queued_label.isVisibleTo(window)
    assert window.composer.text() == "" and not window.composer.edit.isReadOnly()
    window.close()


def test_a_message_waiting_for_a_load_that_fails_stays_unsent(qapp, qtbot, tmp_path, monkeypatch):
    from tests.test_window import make_window

    _slow_loads(monkeypatch)
    window = make_window(Session(None, tmp_path), str(tmp_path / "no-model"))
    qtbot.addWidget(window)
    wait_until(lambda: window.composer._loading, LOAD_TIMEOUT_MS)
    window.send("Hello?")
    assert window.composer.queued == "Hello?"
    qtbot.waitUntil(lambda: any("Could not load" in t for t in window.banners.texts()), timeout=LOAD_TIMEOUT_MS)
    assert window.composer.queued is None and window.composer.text() == "Hello?"  # kept to send later
    assert not window.composer.takes_message() and window.composer.send_button.text() == "Send"
    assert window.controller.current is None or not window.store.messages(window.controller.current.id)
    window.close()


def test_a_draft_loading_shows_in_the_draft_slot_with_one_line_of_steps(qapp, qtbot, tiny_pair, tmp_path,
                                                                        monkeypatch):
    """Issue 46: while a draft loaded, the Target slot said "Loading…" (and the pair in use looked
    gone), the composer said "Send", and the top bar's buttons changed names with each step."""
    from app.draft_choice import PROMPT_LOOKUP
    from tests.test_window import make_window
    from ui.worker import PairRequest

    window = make_window(Session(None, tmp_path), str(tiny_pair["target"]), draft=NO_DRAFT)
    qtbot.addWidget(window)
    wait_until(window.composer.can_send, LOAD_TIMEOUT_MS)
    header = window.header
    target_name = header.target_slot.name.text()
    buttons = [header.settings_button.text(), header.side_panel_button.text()]
    _slow_loads(monkeypatch)
    window.pairing.request_pair.emit(PairRequest(str(tiny_pair["target"]), PROMPT_LOOKUP))
    wait_until(lambda: header.draft_slot.name.text() == "Loading…", LOAD_TIMEOUT_MS)
    assert header.target_slot.name.text() == target_name  # the pair in use still answers
    assert window.composer.send_button.text() == "Send when loaded"
    line = window.status.currentMessage()
    assert line.startswith("Loading prompt lookup: step 1, ") and "loading the draft" in line, line
    window.worker.progress.emit("Reading the weights of x: layer 3 of 9 ...")  # a step's own count, in place
    assert "step 2, reading the weights, layer 3 of 9" in window.status.currentMessage()
    window.worker.progress.emit("Reading the weights of x: layer 4 of 9 ...")
    assert "step 2, reading the weights, layer 4 of 9" in window.status.currentMessage()
    assert [header.settings_button.text(), header.side_panel_button.text()] == buttons
    wait_until(lambda: header.draft_slot.name.text() == "prompt lookup", LOAD_TIMEOUT_MS)
    assert header.target_slot.name.text() == target_name and window.composer.send_button.text() == "Send"
    window.close()


def test_a_long_load_says_its_step_and_how_long_it_has_taken():
    from ui.load_progress import LoadSteps

    now = [100.0]
    steps = LoadSteps("demo-Q8_0", "prompt lookup", clock=lambda: now[0])
    checking = steps.step("Checking demo-Q8_0 ...").line
    assert checking == "Loading demo-Q8_0: step 1, checking its files and the memory it needs"
    # the tokenizer (seconds the first time: it imports transformers) is a step of its own
    line = steps.step("Reading the tokenizer of demo-Q8_0 ...").line
    assert line == "Loading demo-Q8_0: step 2, reading its tokenizer"
    # PyTorch's first import, and the kernel's first preparation, are steps of their own too
    assert steps.step("Starting PyTorch ...").line == "Loading demo-Q8_0: step 3, starting PyTorch"
    now[0] += 71
    shown = steps.step("Reading the weights of demo-Q8_0: layer 26 of 30 ...")
    assert shown.line == "Loading demo-Q8_0: step 4, reading the weights, layer 26 of 30 · 1:11"
    assert (shown.slot, shown.words) == ("target", "reading the weights, layer 26 of 30")
    drafting = steps.step("Loading draft prompt lookup ...")
    assert drafting.slot == "draft" and drafting.line.startswith("Loading prompt lookup: step 5, loading the draft")
    # a sentence no step knows is shown as it is, as a step of its own
    converting = steps.step("Converting x.gguf (once) ...").line
    assert converting.startswith("Loading demo-Q8_0: step 6, converting x.gguf (once)")
