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
