"""Chat turns in the real window without weights: the engine's signals are played by the test
(what the worker emits, in its order), everything else is real: the controller, the history on
disk, the chat view, the banners. Regenerated answers keep their versions; an answer the history
cannot store stays on screen and is saved once the file lets go; the pair that answers is the one
recorded."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QSettings, Qt  # noqa: E402

from app.draft_choice import NO_DRAFT, PROMPT_LOOKUP, DraftChoice  # noqa: E402
from app.chat.history import HistoryStore  # noqa: E402
from app.chat.trace import TurnTrace, trace_round  # noqa: E402
from app.engine.events import Finished, GenerationStats, Round  # noqa: E402
from app.runner import LoadedModel  # noqa: E402
from tests.faults import FailingWrites  # noqa: E402


def pair(name: str, draft: DraftChoice = PROMPT_LOOKUP) -> LoadedModel:
    return LoadedModel(Path(f"/models/{name}"), "torch", "cpu", "float32", "llama", 8192, 10**9, 1.0, draft)


OLD_PAIR, NEW_PAIR = pair("old-target"), pair("new-target", draft=NO_DRAFT)


def second_half(text: str) -> str:
    """The text of an answer's last round, as Engine.answer plays it."""
    return text[len(text) // 2:]


class Engine:
    """Stands in for the worker's thread: records the requests, and plays back an answer."""

    def __init__(self, window):
        self.window, self.requests = window, []
        window.controller.request_generate.disconnect()
        window.controller.request_generate.connect(self.requests.append)

    def answer(self, text: str, loaded: LoadedModel = OLD_PAIR, finish_reason: str = "stop") -> None:
        """What EngineWorker.generate emits for one answer: answering, text, rounds, finished."""
        worker = self.window.worker
        worker.answering.emit(loaded)
        tail = second_half(text)
        rounds = [Round(0, (), 0, (1,), text[: len(text) - len(tail)]), Round(1, (2, 3), 2, (2, 3, 4), tail)]
        worker.text.emit(text)
        worker.rounds.emit([trace_round(r, lambda t: f"<{t}>", 0.1 * i) for i, r in enumerate(rounds)])
        stats = GenerationStats(5, 4, 1, 3, 2, 2, 0.01, 0.1, finish_reason)
        worker.finished.emit(Finished(stats, text))


@pytest.fixture
def chat(qtbot, tmp_path):
    """A window over a history in tmp_path whose model is missing, then told a pair is loaded."""
    from ui.main_window import MainWindow

    window = MainWindow(model=str(tmp_path / "no-model"), backend="torch", history_path=tmp_path / "history.sqlite3",
                        settings=QSettings(str(tmp_path / "tandem.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: any("Could not load" in text for text in window.banners.texts()), timeout=30_000)
    window.controller.model = OLD_PAIR
    window.composer.set_ready(True)
    return window, Engine(window)


def stored(window):
    return window.store.messages(window.controller.current.id)


# Versions


def test_regenerate_keeps_the_versions_and_the_arrows_go_through_them(chat, qtbot):
    window, engine = chat
    traces = []
    window.controller.trace_shown.connect(lambda trace, _whose: traces.append(trace))
    assert window.send("Name a colour")
    engine.answer("Blue is calm.")
    answer = window.chat_view.last_message()
    assert answer.previous_button.isHidden() and answer.version_label.isHidden()  # one version: no arrows

    qtbot.mouseClick(answer.regenerate_button, Qt.MouseButton.LeftButton)
    assert window.controller.busy and not answer.previous_button.isEnabled()  # not while it is written
    engine.answer("Red is bold.", finish_reason="cancelled")
    answer = window.chat_view.last_message()
    assert answer.text == "Red is bold." and answer.status_tag.text() == "Stopped"
    assert answer.version_label.text() == "2/2" and not answer.previous_button.isHidden()
    assert answer.previous_button.isEnabled() and not answer.next_button.isEnabled()
    assert len(window.chat_view.messages()) == 2

    qtbot.mouseClick(answer.previous_button, Qt.MouseButton.LeftButton)  # ‹
    assert answer.text == "Blue is calm." and answer.version_label.text() == "1/2"
    assert answer.status_tag.isHidden()  # version 1 was complete
    assert traces[-1].rounds[-1].text == second_half("Blue is calm.")  # the side panel shows version 1's rounds
    assert stored(window)[-1].content == "Blue is calm."

    window.send("Why?")  # the model reads the version on screen
    assert [m["content"] for m in engine.requests[-1].messages] == ["Name a colour", "Blue is calm.", "Why?"]
    engine.answer("Because.")

    # A restart shows the version that was on screen, and the arrows.
    conv_id = window.controller.current.id
    first_answer = stored(window)[1]
    versions = window.store.versions(first_answer.id)
    assert [(v.content, v.status) for v in versions] == [("Blue is calm.", "complete"), ("Red is bold.", "stopped")]
    assert all(v.stats["tokens"] == 4 and TurnTrace.from_dict(v.trace).rounds for v in versions)
    window.controller.open(None)
    window.controller.open(conv_id)
    again = window.chat_view.messages()[1]
    assert again.text == "Blue is calm." and again.version_label.text() == "1/2"
    qtbot.mouseClick(again.next_button, Qt.MouseButton.LeftButton)  # ›
    assert again.text == "Red is bold." and again.status_tag.text() == "Stopped"
    assert traces[-1].rounds[-1].text == second_half("Red is bold.")


# The history refuses a write mid-answer


def test_a_locked_history_keeps_the_answer_and_saves_it_once_released(chat, qtbot, tmp_path):
    window, engine = chat
    assert window.send("Tell me a fact")
    holder = sqlite3.connect(tmp_path / "history.sqlite3", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another program takes the write lock mid-answer
    try:
        engine.answer("Owls can turn their heads far.")
        shown = window.chat_view.last_message()
        assert shown.text == "Owls can turn their heads far." and shown.status_tag.isHidden()
        assert not window.controller.busy and window.composer.send_button.isEnabled()
        assert any("locked" in text and "saves it as soon as it can" in text for text in window.banners.texts())
        assert stored(window)[-1].content == ""  # not stored yet...
        window.controller.save_unsaved()  # a retry while still locked changes nothing
        assert window.controller.unsaved
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with qtbot.waitSignal(window.controller.saved, timeout=10_000):  # the retry timer saves it
        pass
    assert not window.controller.unsaved and "now saved" in window.status.currentMessage()
    answer = stored(window)[-1]
    assert (answer.content, answer.status) == ("Owls can turn their heads far.", "complete")
    assert answer.stats["tokens"] == 4 and answer.settings["target"] == "old-target"
    assert TurnTrace.from_dict(answer.trace).rounds[-1].text == second_half("Owls can turn their heads far.")


@pytest.mark.parametrize("error, says", [("database or disk is full", "the disk is full"),
                                         ("attempt to write a readonly database", "the data folder is read-only")])
def test_a_full_disk_or_read_only_folder_mid_answer_keeps_the_answer(chat, monkeypatch, tmp_path, error, says):
    window, engine = chat
    assert window.send("Tell me a fact")
    monkeypatch.setattr(window.store, "_db", FailingWrites(window.store._db, sqlite3.OperationalError(error)))
    engine.answer("Octopuses have three hearts.")
    assert window.chat_view.last_message().text == "Octopuses have three hearts."
    assert any(says in text for text in window.banners.texts())
    assert not window.controller.busy and window.composer.send_button.isEnabled()  # the next one can go
    window.controller.save_unsaved()
    assert window.controller.unsaved  # still failing: kept
    assert not window.send("And?") and window.composer.text() == "And?"  # refused, and what was typed stays

    monkeypatch.undo()  # space freed, folder writable again; the next message goes through
    assert window.send("And?")  # and reads the unsaved answer from memory
    assert [m["content"] for m in engine.requests[-1].messages][-2:] == ["Octopuses have three hearts.", "And?"]
    engine.answer("That is all.")
    window.close()  # quitting makes a last try
    with HistoryStore.open(tmp_path / "history.sqlite3") as store:
        conversation = store.list_conversations()[0]
        assert [m.content for m in store.messages(conversation.id)] == [
            "Tell me a fact", "Octopuses have three hearts.", "And?", "That is all."]


def test_an_answer_still_refused_at_quit_is_written_beside_the_history(chat, tmp_path):
    window, engine = chat
    assert window.send("Tell me a fact")
    holder = sqlite3.connect(tmp_path / "history.sqlite3", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # held until after the window has quit
    try:
        engine.answer("Snails can sleep for years.")
        window.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    (kept,) = tmp_path.glob("unsaved-answers-*.json")
    assert kept.stat().st_mode & 0o777 == 0o600
    (answer,) = json.loads(kept.read_text(encoding="utf-8"))
    assert (answer["text"], answer["status"], answer["stats"]["tokens"]) == (
        "Snails can sleep for years.", "complete", 4)


# The pair that answers


def test_the_answer_records_the_pair_that_wrote_it(chat):
    window, engine = chat
    assert window.send("Hello")  # sent while OLD_PAIR is loaded; a new pair loads before it starts
    engine.answer("Hi there.", loaded=NEW_PAIR)
    settings = stored(window)[-1].settings
    assert (settings["target"], settings["draft"]) == ("new-target", "none")
