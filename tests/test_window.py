"""The minimal window: a message gets a streamed answer from the demo model off the GUI thread."""

from __future__ import annotations

import pytest

from app.engine.events import Finished

pytest.importorskip("pytestqt")


@pytest.fixture
def window(qtbot, demo):
    from ui.main_window import MainWindow

    win = MainWindow(model=str(demo["hf"]), backend="torch", max_tokens=24)
    qtbot.addWidget(win)
    qtbot.waitUntil(lambda: win.send_button.isEnabled(), timeout=60_000)
    yield win
    win.close()  # stops the engine thread, as quitting the app does
    assert not win.thread.isRunning()


def test_message_gets_a_streamed_answer(window, qtbot):
    chunks = []
    window.worker.text.connect(chunks.append)
    window.composer.setPlainText("What is the capital of France?")
    with qtbot.waitSignal(window.worker.finished, timeout=60_000) as blocker:
        qtbot.keyClick(window.composer, "\r")
        assert window.stop_button.isEnabled()  # the GUI thread is free while it streams
    finished: Finished = blocker.args[0]
    assert "Paris" in finished.text
    assert "".join(chunks) == finished.text
    assert finished.text in window.transcript.toPlainText()
    assert window.messages[-1] == {"role": "assistant", "content": finished.text}
    assert window.send_button.isEnabled()


def test_stop_ends_the_answer_early(window, qtbot):
    window.max_tokens = 200
    window.composer.setPlainText("Write a long story about a dragon.")
    window.worker.text.connect(lambda _: window.stop())
    with qtbot.waitSignal(window.worker.finished, timeout=60_000) as blocker:
        window.send()
    assert blocker.args[0].stats.finish_reason == "cancelled"
    assert blocker.args[0].stats.tokens < 200


def test_a_bad_model_path_is_reported_in_the_window(qtbot, tmp_path):
    from ui.main_window import MainWindow

    win = MainWindow(model=str(tmp_path / "nothing-here"), backend="torch")
    qtbot.addWidget(win)
    try:
        qtbot.waitUntil(lambda: "Could not load" in win.transcript.toPlainText(), timeout=30_000)
        assert "no such file or folder" in win.transcript.toPlainText()
        assert not win.send_button.isEnabled()
    finally:
        win.close()
