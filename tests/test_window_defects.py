"""The window's defects of issue 46: a 900 px window folds its chat list to a rail instead of
squeezing it; the chat settings offer "Draft model only" only where the pair drafts with a model;
the rounds list follows a long streaming answer; a status message is not cut by the permanent
fields; a named pipe (or a folder that does not answer) where a data file belongs never keeps
the window from starting (fuzz 9); answers kept in a recovery file at quit are offered back in
the window (fuzz 15); "Tint answers by origin" is remembered. No model is loaded."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QSettings, QSize  # noqa: E402
from PySide6.QtWidgets import QMainWindow  # noqa: E402

from app.draft_choice import PROMPT_LOOKUP, DraftChoice, DraftKind  # noqa: E402
from app.runner import LoadedModel  # noqa: E402

SHOTS = Path("/tmp/shots")
FIFO_ANSWERS_AFTER_S = 6.0  # what the unfixed code waited, at the least, on a named pipe
QUICK_S = 3.0  # a start that reads its data files with a bound takes far less


def _shot(widget, name: str) -> None:
    """For a person to look at."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    widget.grab().save(str(SHOTS / name))


def _resize(qtbot, window, width: int, height: int) -> None:
    window.resize(width, height)
    qtbot.waitUntil(lambda: window.size() == QSize(width, height), timeout=10_000)
    qtbot.wait(50)


@pytest.fixture
def window(offline_window, qtbot):
    w = offline_window()
    qtbot.waitExposed(w)
    qtbot.waitUntil(lambda: w.header.target_slot.name.text() == "No model loaded", timeout=30_000)  # load failed
    for title in ("Planning a trip to Lisbon in May", "A question about Python's GIL"):
        w.store.create_conversation(title)
    w.refresh_conversations()
    return w


# --- a narrow window folds the chat list ---------------------------------------------------


def test_at_900_px_the_chat_list_folds_to_a_rail_and_comes_back_when_the_window_widens(window, qtbot):
    """At 900 x 600 the list was squeezed to about 100 px ("Search c…") beside the chat and the
    panel, and the header's model slots were cut for its sake."""
    w = window
    _resize(qtbot, w, 1400, 900)
    assert w.conversation_list.isVisible() and w.conversation_list.width() >= 200
    chat_at_least = w.splitter.widget(1).width()
    _shot(w, "columns_1400x900.png")

    _resize(qtbot, w, 900, 600)
    squeezed = w.conversation_list.width()
    assert not w.conversation_list.isVisible(), f"the chat list squeezed to {squeezed} px instead of folding"
    assert w.chat_rail.isVisible()  # what opens it again
    assert w.side_panel_host.isVisible()  # the draft activity stays: the list gives way
    chat = w.splitter.widget(1).width()
    assert chat >= 520, f"the chat column kept only {chat} px"
    assert w.chat_rail.width() <= 48
    _shot(w, "columns_900x600.png")

    # the rail's button opens the list; in a narrow window the list and the panel take turns
    w.chat_rail.chats_button.click()
    qtbot.waitUntil(lambda: w.conversation_list.isVisible(), timeout=5000)
    assert w.conversation_list.width() >= 200 and not w.side_panel_host.isVisible()
    assert not w.chat_rail.isVisible() and w.list_action.isChecked()
    qtbot.wait(50)
    _shot(w, "columns_900x600_list.png")
    w.header.side_panel_button.click()  # the panel back: the list folds again
    qtbot.waitUntil(lambda: w.side_panel_host.isVisible(), timeout=5000)
    assert not w.conversation_list.isVisible() and w.chat_rail.isVisible()

    # wide again: both open, the list at a useful width, the chat as wide as before
    _resize(qtbot, w, 1400, 900)
    qtbot.waitUntil(lambda: w.conversation_list.isVisible(), timeout=5000)
    assert w.conversation_list.width() >= 200 and w.side_panel_host.isVisible() and not w.chat_rail.isVisible()
    assert w.splitter.widget(1).width() >= chat_at_least - 10


def test_a_list_the_user_closed_stays_closed_when_the_window_widens(window, qtbot):
    w = window
    _resize(qtbot, w, 900, 600)
    w.list_action.trigger()  # opened (which folds the panel in a window this narrow)
    w.list_action.trigger()  # and closed by the user
    assert not w.conversation_list.isVisible() and w.chat_rail.isVisible()
    _resize(qtbot, w, 1400, 900)
    assert not w.conversation_list.isVisible()  # the user's choice, not narrowing's
    assert w.side_panel_host.isVisible()  # folded by narrowing: back


# --- "Draft model only" -----------------------------------------------------------------------


def _loaded(draft: DraftChoice) -> LoadedModel:
    return LoadedModel(Path("/models/demo"), "torch", "cpu", "float32", "llama", 8192, 0, 0.0, draft=draft)


def test_draft_model_only_is_offered_only_where_the_pair_drafts_with_a_model(window):
    from app.draft_choice import PAIR_MODEL_ONLY, REQUEST_CHOICES

    drawer, row = window.settings_drawer, REQUEST_CHOICES.index(PAIR_MODEL_ONLY)

    def offered() -> bool:
        item = drawer.drafter.model().item(row)
        return item.isEnabled() and not drawer.drafter.view().isRowHidden(row)

    window._on_loaded(_loaded(PROMPT_LOOKUP))  # prompt lookup: there is no draft model to leave alone
    assert not offered()
    window._on_loaded(_loaded(DraftChoice(DraftKind.NONE)))
    assert not offered()
    window._on_loaded(_loaded(DraftChoice.model("/models/small")))  # a draft model with lookup beside it
    assert offered() and drawer.drafter.itemText(row) == "Draft model only"
    window._on_loaded(_loaded(DraftChoice.self_draft("int4")))
    assert offered()
    # a chat that chose it, opened over a pair without one: shown, and said to have none here
    window._on_loaded(_loaded(PROMPT_LOOKUP))
    drawer.drafter.setCurrentIndex(row)
    assert "this pair has none" in drawer.drafter.currentText()


# --- the rounds list follows the answer ---------------------------------------------------------


def test_the_rounds_list_keeps_the_newest_round_in_view_while_the_user_has_not_scrolled_up(qtbot):
    """Past the first 200 rows (the list lays rows out in batches) the view stopped following:
    the range grew after the append had scrolled down, and the next append took that for the
    user having scrolled up."""
    from tests.test_small_windows import long_rounds
    from ui.panel.rounds_view import RoundsView

    view = RoundsView()
    qtbot.addWidget(view)
    view.resize(400, 300)
    view.show()
    qtbot.waitExposed(view)
    rounds = long_rounds(320)
    view.set_rounds(rounds[:1])

    def newest_in_view() -> bool:
        last = view.visualRect(view.model().index(view.model().rowCount() - 1, 0))
        return last.isValid() and last.bottom() <= view.viewport().height() + 1 and last.top() >= 0

    for r in rounds[1:260]:
        view.append([r])
        qtbot.wait(2)
    qtbot.waitUntil(newest_in_view, timeout=2000)

    bar = view.verticalScrollBar()
    bar.setValue(bar.maximum() // 2)  # the user scrolls up to read: the view stays there
    held = bar.value()
    for r in rounds[260:290]:
        view.append([r])
        qtbot.wait(2)
    qtbot.wait(50)
    assert bar.value() == held and not newest_in_view()

    bar.setValue(bar.maximum())  # back at the bottom: following again
    for r in rounds[290:]:
        view.append([r])
        qtbot.wait(2)
    qtbot.waitUntil(newest_in_view, timeout=2000)


# --- status-bar messages ----------------------------------------------------------------------


def _message_fits(bar) -> bool:
    """The message is drawn whole: it ends left of the first permanent field shown (Qt draws it
    from 6 px in to 2 px before that field)."""
    fields = (bar.loading, bar.pair, bar.device, bar.last_answer, bar.kept, bar.memory)
    shown = [w for w in fields if w.isVisible()]
    right = min((w.x() for w in shown), default=bar.width()) - 2
    return 6 + bar.fontMetrics().horizontalAdvance(bar.currentMessage()) <= right


def test_a_status_message_is_not_cut_by_the_permanent_fields(qtbot):
    from ui.status_bar import StatusBar

    host = QMainWindow()
    qtbot.addWidget(host)
    bar = StatusBar()
    host.setStatusBar(bar)
    host.resize(900, 600)
    host.show()
    qtbot.waitExposed(host)
    bar.show_loaded(LoadedModel(Path("/models/SmolLM2-135M-Instruct-long-name"), "torch", "cpu",
                                "float32", "llama", 8192, 0, 1.0, draft=DraftChoice.self_draft("int4")))
    bar.show_record({"tokens_per_s": 123.4, "drafted": 10, "acceptance": 0.71})
    fields = [label.text() for label in (bar.pair, bar.device, bar.last_answer)]
    message = "The answer kept in the window is now saved in the chat history; nothing was lost."
    bar.showMessage(message)
    qtbot.wait(50)
    assert bar.currentMessage() == message
    qtbot.waitUntil(lambda: _message_fits(bar), timeout=2000)
    assert bar.memory.isVisible()  # the memory figure stays
    _shot(host, "status_message_900.png")

    bar.clearMessage()  # the fields come back with what they said
    qtbot.waitUntil(lambda: all(label.isVisible() for label in (bar.pair, bar.device, bar.last_answer)),
                    timeout=2000)
    assert [label.text() for label in (bar.pair, bar.device, bar.last_answer)] == fields


# --- fuzz 9: data files that never answer ----------------------------------------------------


@contextmanager
def fifo_answered_after(path: Path, seconds: float = FIFO_ANSWERS_AFTER_S):
    """A named pipe at `path` that a writer opens (and closes) after `seconds`: code that waits
    on it then reads an end instead of waiting forever, so the test of it fails, not hangs."""
    os.mkfifo(path)
    stop = threading.Event()

    def writer() -> None:
        if stop.wait(seconds):
            return
        while not stop.is_set():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:  # no reader yet (ENXIO), or set aside (ENOENT)
                pass
            else:
                os.close(fd)
            stop.wait(0.05)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        stop.set()
        thread.join()


def test_a_named_pipe_as_pairs_json_neither_blocks_the_start_nor_is_lost(offline_window, qtbot):
    from app.paths import data_dir

    pairs = data_dir() / "pairs.json"
    with fifo_answered_after(pairs):
        started = time.monotonic()
        w = offline_window()
        took = time.monotonic() - started
        said = " ".join(w.banners.texts())
    assert took < QUICK_S, f"the window took {took:.1f} s to start"
    assert "pairs.json" in said and "named pipe" in said
    (aside,) = data_dir().glob("pairs.damaged-*")  # set aside, not deleted
    assert aside.is_fifo()


def test_a_named_pipe_as_tandem_conf_neither_blocks_the_start_nor_is_lost(qtbot):
    from app.paths import settings_file
    from ui import window_state

    conf = settings_file()
    # QSettings reads its file holding Python's lock: a start that waits on the pipe stops every
    # thread, the one that would answer it too. So first in a process of its own, with a deadline.
    os.mkfifo(conf)
    probe = ("from ui import window_state; settings = window_state.open_settings(); "
             "print(settings.property('tandemNotice'))")
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                              cwd=Path(__file__).resolve().parent.parent,
                              env=os.environ | {"QT_QPA_PLATFORM": "offscreen"})
    except subprocess.TimeoutExpired:
        pytest.fail("reading the settings waited on the named pipe for a minute")
    assert "named pipe" in done.stdout, done.stdout + done.stderr
    for aside in conf.parent.glob("Tandem.damaged-*"):
        aside.unlink()
    with fifo_answered_after(conf):
        started = time.monotonic()
        settings = window_state.open_settings()
        took = time.monotonic() - started
    assert took < QUICK_S, f"reading the settings took {took:.1f} s"
    from ui.main_window import MainWindow

    w = MainWindow(model=str(conf.parent / "no-model"), backend="torch", history_path=conf.parent / "h.sqlite3",
                   settings=settings)
    qtbot.addWidget(w)
    said = " ".join(w.banners.texts())
    assert "Tandem.conf" in said and "named pipe" in said
    (aside,) = conf.parent.glob("Tandem.damaged-*")
    assert aside.is_fifo()
    w.close()
    assert QSettings(str(conf), QSettings.Format.IniFormat).contains("window/geometry")  # remembered again


def test_a_named_pipe_as_the_history_says_what_it_is(offline_window, tmp_path):
    history = tmp_path / "history.sqlite3"
    with fifo_answered_after(history):
        started = time.monotonic()
        w = offline_window(history=history)
        took = time.monotonic() - started
        said = " ".join(w.banners.texts())
    assert took < QUICK_S
    assert "named pipe" in said and "kept in memory only" in said  # not SQLite's "disk I/O error"
    assert history.is_fifo()  # left as it is: it may be the user's
    w.new_chat()  # the window works, over a history in memory
    assert w.store.list_conversations() is not None


def test_a_pairs_json_that_does_not_answer_is_left_alone_and_not_written(tmp_path, monkeypatch):
    """A stalled network folder: the read gives up after the bound, and nothing is written there
    this session (a write would hang the window as well)."""
    from app import data_files
    from app.models.pair_memory import PairMemory

    path = tmp_path / "pairs.json"
    path.write_text('{"recent": []}', encoding="utf-8")
    stalled = threading.Event()
    real_open = data_files.os.open

    def hanging_open(name, flags, *args):
        if Path(name) == path:
            stalled.wait(5)
        return real_open(name, flags, *args)

    monkeypatch.setattr(data_files.os, "open", hanging_open)
    monkeypatch.setattr(data_files, "WAIT_S", 0.3)
    started = time.monotonic()
    memory = PairMemory(path)
    assert time.monotonic() - started < 2
    stalled.set()
    assert memory.notice is not None, "the read waited on the stalled file and found it whole"
    assert "did not answer" in memory.notice and str(path) in memory.notice
    assert memory.add_recent("torch", "/models/a", PROMPT_LOOKUP) is None
    assert path.read_text(encoding="utf-8") == '{"recent": []}' and sorted(tmp_path.iterdir()) == [path]


# --- fuzz 15: answers kept in a recovery file come back ----------------------------------------


def _history_with_an_empty_answer(path: Path) -> tuple[int, int]:
    from app.chat.history import HistoryStore

    with HistoryStore.open(path) as store:
        conversation = store.create_conversation("Tell me a fact")
        answer_id = store.begin_answer(conversation.id, "Tell me a fact")
    return conversation.id, answer_id


def _recovered(conv_id: int, answer_id: int, text: str) -> dict:
    return {"conv_id": conv_id, "answer_id": answer_id, "version": None, "text": text, "status": "complete",
            "record": {"temperature": 0.0}, "stats": {"tokens": 6}, "trace": None, "thinking": ""}


def test_an_answer_kept_in_a_recovery_file_is_offered_back_and_restored_into_its_chat(
        offline_window, qtbot, tmp_path, monkeypatch):
    from app.chat import recovery
    from app.chat.history import HistoryStore

    history = tmp_path / "history.sqlite3"
    conv_id, answer_id = _history_with_an_empty_answer(history)
    kept, _ = recovery.write_recovery([_recovered(conv_id, answer_id, "Snails can sleep for years.")], history)
    assert kept.parent == tmp_path
    # another history's file in the same folder is not this window's to offer
    other, _ = recovery.write_recovery([_recovered(1, 1, "not ours")], tmp_path / "elsewhere" / "history.sqlite3")

    w = offline_window(history=history)
    assert any(str(kept) in text for text in w.banners.texts()), "the recovery file is not mentioned"
    banner = w.banners.get("recovery")
    assert banner is not None and str(kept) in banner.label.text()
    opened = []
    monkeypatch.setattr("ui.recovery_offer.QDesktopServices.openUrl", lambda url: opened.append(url) or True)
    assert str(other) not in " ".join(w.banners.texts())
    buttons = {button.text(): button for button in banner.actions}
    assert set(buttons) == {"Restore", "Open"} and banner.close_button.text() == "Dismiss"
    qtbot.waitExposed(w)
    qtbot.wait(100)
    _shot(w, "recovery_banner.png")

    buttons["Open"].click()
    assert [url.toLocalFile() for url in opened] == [str(kept)]
    assert w.banners.get("recovery") is banner  # still offered

    buttons["Restore"].click()
    assert w.banners.get("recovery") is None
    assert w.controller.current.id == conv_id  # its chat, opened
    assert "Snails can sleep for years." in w.chat_view.plain_text()
    assert not kept.exists() and other.exists()  # the history holds it now
    w.close()
    with HistoryStore.open(history) as store:
        answer = store.messages(conv_id)[-1]
    assert (answer.content, answer.status, answer.stats) == ("Snails can sleep for years.", "complete", {"tokens": 6})
    other.unlink()


def test_a_dismissed_recovery_file_stays_and_is_not_offered_again(offline_window, qtbot, tmp_path):
    from app.chat import recovery

    history = tmp_path / "history.sqlite3"
    conv_id, answer_id = _history_with_an_empty_answer(history)
    kept, _ = recovery.write_recovery([_recovered(conv_id, answer_id, "Owls can turn their heads far.")], history)
    w = offline_window(history=history)
    offered = w.banners.get("recovery")
    assert offered is not None and str(kept) in offered.label.text()
    offered.close_button.click()
    assert w.banners.get("recovery") is None and kept.exists()
    w.close()
    again = offline_window(history=history)
    assert again.banners.get("recovery") is None
    assert kept.exists()


# --- "Tint answers by origin" -----------------------------------------------------------------


def test_tint_answers_by_origin_is_remembered_after_a_restart(offline_window, qtbot):
    w = offline_window()
    assert not w.draft_panel.tint_box.isChecked()
    w.draft_panel.tint_box.setChecked(True)
    w.close()
    again = offline_window()
    assert again.draft_panel.tint_box.isChecked() and again.chat_view.tint is not None
    again.draft_panel.tint_box.setChecked(False)
    again.close()
    assert not offline_window().draft_panel.tint_box.isChecked()
