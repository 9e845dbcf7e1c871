"""What a daily user reads in the window: loading and first-start words, status figures per chat,
banners (moved from tests/test_window_parts.py, which kept the window's other parts)."""

from __future__ import annotations


import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QSettings, Qt, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication, QMessageBox  # noqa: E402

from app.draft_choice import NO_DRAFT, PROMPT_LOOKUP, DraftChoice  # noqa: E402
from app.engine.events import GenerationStats  # noqa: E402

# What a daily user reads: loading and first-start words, status figures per chat, banners


def test_the_first_start_names_the_model_and_its_draft_in_a_users_words(qtbot, tmp_path, monkeypatch):
    """The runner says "Loading gguf with PyTorch ..."; the window says what loads, in the names the user
    knows, and the status bar says "Loading …" (not "No model loaded") meanwhile."""
    import threading

    from app.runner import LoadedModel, Runner
    from ui.main_window import MainWindow

    folder = tmp_path / "smollm2-135m-instruct" / "gguf"  # where app/models/demo.py imports the demo
    release = threading.Event()

    def load(self, spec, backend=None, draft=NO_DRAFT, precision="auto", progress=print, context=None):
        progress("Loading gguf with PyTorch ...")  # what Runner.load reports for the demo
        release.wait(30)
        return LoadedModel(folder, "torch", "cpu", "4-bit GGUF (int4 g32 from Q4_1 x210; float32 from F32 x61)",
                           "llama", 8192, 208_000_000, 1.2, PROMPT_LOOKUP, "", 0)

    monkeypatch.setattr(Runner, "load", load)
    window = MainWindow(model="demo", backend="torch", history_path=tmp_path / "history.sqlite3",
                        settings=QSettings(str(tmp_path / "tandem.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    try:
        # one line with the load's step (ui/load_progress.py), naming the demo as the user knows it
        loading = "Loading SmolLM2 135M Instruct (demo): step 2, building it with PyTorch"
        qtbot.waitUntil(lambda: window.status.currentMessage() == loading, timeout=10_000)
        assert window.status.pair.text() == "Loading …"
        assert window.chat_view.greeting_hint.text() == loading
        release.set()
        qtbot.waitUntil(window.composer.can_send, timeout=10_000)
        assert window.status.pair.text() == "SmolLM2 135M Instruct (demo) · draft: prompt lookup"
        assert window.status.device.text() == "on the CPU with PyTorch · 4-bit GGUF"
        assert window.chat_view.greeting_hint.text().startswith(
            "SmolLM2 135M Instruct (demo) is ready on the CPU with PyTorch and drafts by copying from the chat "
            "(prompt lookup).")
        assert window.header.target_slot.name.text() == "SmolLM2 135M Instruct (demo)"
        assert window.header.target_slot.detail.text() == "4-bit GGUF · on the CPU with PyTorch"
        assert window.header.draft_slot.name.text() == "prompt lookup"
        assert window.settings_drawer.drafter.itemText(0) == "The pair's draft (prompt lookup)"
        for text in (window.status.pair.text(), window.status.device.text(), window.chat_view.greeting_hint.text()):
            assert not any(word in text for word in ("/gguf", "ngram", " torch", "gguf on", "int4 g32"))
    finally:
        release.set()
        window.close()


def test_switching_chats_shows_the_opened_chats_last_answer_figures(offline_window, tmp_path):
    window = offline_window()
    fast = window.store.create_conversation("fast")
    window.store.add_turn(fast.id, "Hi", "Hello!", stats={"tokens": 3, "tokens_per_s": 41.5, "drafted": 4,
                                                          "acceptance": 0.75})
    plain = window.store.create_conversation("plain")
    window.store.add_turn(plain.id, "Hi", "Hello!", stats={"tokens": 3, "tokens_per_s": 12.0, "drafted": 0,
                                                           "acceptance": 0.0})
    empty = window.store.create_conversation("empty")
    window.refresh_conversations()
    window.status.show_stats(GenerationStats(5, 20, 10, 19, 30, 18, 0.1, 1.0, "stop"))  # an answer just now
    assert window.status.last_answer.text() == "19.0 tok/s · 60% accepted"
    window._open(fast.id)
    assert window.status.last_answer.text() == "41.5 tok/s · 75% accepted"
    window._open(plain.id)
    assert window.status.last_answer.text() == "12.0 tok/s"
    window._open(empty.id)
    assert window.status.last_answer.text() == ""
    window.new_chat()
    assert window.status.last_answer.text() == ""


def test_banners_do_not_pile_up_one_per_topic_a_few_at_most_each_closable(offline_window, tmp_path, qtbot):
    window = offline_window()
    qtbot.waitUntil(lambda: any("Could not load" in text for text in window.banners.texts()), timeout=30_000)
    for name in ("first", "second", "third"):  # the same kind of message, three times
        window.pairing.choose("target", str(tmp_path / name))
    about_models = [t for t in window.banners.texts() if "no such file" in t or "Could not load" in t]
    assert len(about_models) == 1 and "third" in about_models[0]  # the newest replaced its twins
    from ui.banner import MAX_SHOWN
    for n in range(MAX_SHOWN + 2):
        window.banners.add(f"Message {n}", "warning", f"topic {n}")
    shown = window.banners.texts()
    assert len(shown) == MAX_SHOWN and shown[-1] == f"Message {MAX_SHOWN + 1}"
    banner = window.banners.banners()[0]
    qtbot.mouseClick(banner.close_button, Qt.MouseButton.LeftButton)
    assert banner.label.text() not in window.banners.texts() and banner.isHidden()
    assert len(window.banners.texts()) == MAX_SHOWN - 1


def tooltip_width(text: str) -> int:
    """How wide Qt lays out a plain-text tooltip: each line on its own, unwrapped (QTipLabel wraps only
    rich text, or a line wider than the whole screen), in the tooltip font."""
    from PySide6 import QtGui
    from PySide6.QtGui import QFontMetrics
    from PySide6.QtWidgets import QToolTip

    assert not QtGui.Qt.mightBeRichText(text), text
    metrics = QFontMetrics(QToolTip.font())
    return max(metrics.horizontalAdvance(line) for line in text.split("\n"))


def test_no_tooltip_in_the_settings_drawer_is_wider_than_a_reading_width(qtbot):
    from PySide6.QtWidgets import QWidget

    from ui.chat.settings_drawer import SettingsDrawer

    drawer = SettingsDrawer()
    qtbot.addWidget(drawer)
    tips = {w.toolTip() for w in [drawer, *drawer.findChildren(QWidget)] if w.toolTip()}
    assert any(tip.startswith("Randomness.") for tip in tips)  # the temperature's, 1,470 px on one line before
    widths = {tip.split("\n")[0]: tooltip_width(tip) for tip in tips}
    assert max(widths.values()) <= 500, widths


def test_known_good_pairs_too_large_for_free_memory_are_marked_and_asked_about(offline_window, qtbot, monkeypatch):

    from ui.pairing.slot_menu import build_slot_menu

    monkeypatch.setenv("TANDEM_FREE_MEMORY", "20GB")  # a 23 GB CPU machine, less what else runs
    window = offline_window()
    qtbot.waitUntil(lambda: any("Could not load" in text for text in window.banners.texts()), timeout=30_000)
    chosen = []
    monkeypatch.setattr(window.pairing, "choose_catalog", chosen.append)
    menu = build_slot_menu("target", window.pairing, window)
    catalog = next(a.menu() for a in menu.actions() if a.text() == "Known-good pairs")
    items = {a.text().split(" — ")[0]: a for a in catalog.actions()}
    large, small = items["Qwen2.5 32B Instruct + 0.5B"], items["SmolLM2 1.7B Instruct + 135M"]
    assert large.text().endswith("too large for this computer") and "too large" not in small.text()
    assert "about 71.8 GB of memory, but 20.0 GB of memory" in large.toolTip().replace("\n", " ")
    asked = []

    def answer(button_text):
        box = QApplication.activeModalWidget()
        asked.append(box.text() if isinstance(box, QMessageBox) else None)
        next(b for b in box.buttons() if b.text() == button_text).click()

    QTimer.singleShot(0, lambda: answer("Cancel"))
    large.trigger()
    assert asked and "71.8 GB" in asked[0] and chosen == []  # nothing fetched
    QTimer.singleShot(0, lambda: answer("Try anyway"))
    large.trigger()
    assert [pair.id for pair in chosen] == ["qwen2.5-32b-torch"]
    small.trigger()  # fits: no question
    assert len(asked) == 2 and [pair.id for pair in chosen] == ["qwen2.5-32b-torch", "smollm2-1.7b-torch"]


def test_recent_pairs_are_named_as_a_user_knows_them_once_each(offline_window, qtbot, tmp_path):
    from app.models.pair_memory import PairMemory
    from ui.pairing.slot_menu import build_slot_menu

    demo_cache = tmp_path / "cache" / "models" / "smollm2-135m-instruct"  # the demo's cache folders
    demo_folder, reference = str(demo_cache / "gguf"), str(demo_cache / "hf")
    llama = str(tmp_path / "models" / "Llama-3.2-1B-Instruct")
    memory = PairMemory(tmp_path / "pairs.json")
    for target, draft in (("demo:float32", "auto"), ("demo", "auto"), ("Qwen/Qwen2.5-0.5B-Instruct", "ngram"),
                          (llama, "none"), (reference, "self:int4"),  # the float32 reference again, by its folder
                          (demo_folder, "ngram")):  # the demo again, named by its folder
        memory.add_recent("torch", target, DraftChoice.parse(draft), f"{target} + {draft}")
    window = offline_window()
    window.pairing.memory = PairMemory(tmp_path / "pairs.json")
    menu = build_slot_menu("target", window.pairing, window)
    recent = next(a.menu() for a in menu.actions() if a.text() == "Recent pairs")
    assert [a.text() for a in recent.actions()] == [
        "Demo: SmolLM2 135M + prompt lookup", "Demo: SmolLM2 135M in float32 + the same model in 4-bit",
        "Llama-3.2-1B-Instruct alone", "Qwen/Qwen2.5-0.5B-Instruct + prompt lookup"]
    assert demo_folder in recent.actions()[0].toolTip().replace("\n", "")  # the whole path, in the tooltip
    assert llama in recent.actions()[2].toolTip().replace("\n", "")
    chosen = []
    window.pairing.choose_recent = chosen.append
    recent.actions()[0].trigger()
    assert chosen[0]["target"] == demo_folder and chosen[0]["draft"] == PROMPT_LOOKUP


def test_a_pair_refused_for_memory_offers_to_load_in_4bit(qtbot, tmp_path, monkeypatch):
    """The refusal's banner has a "Load in 4-bit" button when the runner says the pair fits at
    int4; the button loads the same pair at that precision, through the worker."""
    from app.models.memory import NotEnoughMemory
    from app.runner import LoadedModel, Runner
    from ui.main_window import MainWindow

    asked = []

    def load(self, spec, backend=None, draft=NO_DRAFT, precision="auto", progress=print, context=None):
        asked.append(precision)
        if precision == "auto":
            raise NotEnoughMemory("This pair does not fit: ... In 4-bit the pair fits.", fits_at="int4")
        return LoadedModel(tmp_path / "Big-Model", "torch", "cpu", "int4 (g32, float32 head)", "llama", 8192,
                           4_000_000_000, 1.0, PROMPT_LOOKUP, "", 0)

    monkeypatch.setattr(Runner, "load", load)
    window = MainWindow(model=str(tmp_path / "Big-Model"), backend="torch", history_path=tmp_path / "h.sqlite3",
                        settings=QSettings(str(tmp_path / "tandem.ini"), QSettings.Format.IniFormat))
    qtbot.addWidget(window)
    try:
        qtbot.waitUntil(lambda: window.banners.get("pairing") is not None
                        and bool(window.banners.get("pairing").actions), timeout=10_000)
        banner = window.banners.get("pairing")
        assert "Could not load the model. This pair does not fit" in banner.label.text()
        assert [b.text() for b in banner.actions] == ["Load in 4-bit"]
        banner.actions[0].click()
        qtbot.waitUntil(window.composer.can_send, timeout=10_000)
        assert asked == ["auto", "int4"]
        assert window.status.device.text() == "on the CPU with PyTorch · int4"
        assert window.banners.get("pairing") is None  # taken: the banner went
    finally:
        window.close()
