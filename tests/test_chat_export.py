"""File → Export chat as Markdown… (issue 35): every message of the open chat in order, each
answer's version, ending and figures, written whole; a folder that refuses says so in a banner."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from app.chat.export import chat_markdown, file_name


def _message(role, content, **fields):
    return SimpleNamespace(role=role, content=content, status=fields.get("status", "complete"),
                           stats=fields.get("stats"), version=fields.get("version", 0),
                           versions=fields.get("versions", 0))


def test_a_chat_reads_as_markdown_in_order_with_each_answers_figures():
    conversation = SimpleNamespace(title="Prime\nnumbers", system_prompt="Be brief.\nUse Python.")
    messages = [_message("user", "Write is_prime."),
                _message("assistant", "```python\ndef is_prime(n): ...\n```",
                         stats={"tokens": 42, "tokens_per_s": 31.25, "drafted": 20, "acceptance": 0.7},
                         version=2, versions=3),
                _message("user", "Shorter?"), _message("assistant", "Sure", status="stopped")]
    text = chat_markdown(conversation, messages, "SmolLM2 135M Instruct (demo)", now=0)
    assert text.startswith("# Prime numbers\n")
    assert "answers by SmolLM2 135M Instruct (demo)" in text
    assert "> Be brief.\n> Use Python." in text
    order = [text.index(part) for part in ("## You\n\nWrite is_prime.", "def is_prime", "## You\n\nShorter?",
                                           "## Tandem (stopped by you)\n\nSure")]
    assert order == sorted(order)
    assert "## Tandem (version 2 of 3 · 42 tokens at 31.2 tok/s · 70% of drafts accepted)" in text
    assert file_name("What is 2/3? <b>") == "What is 2 3 b.md" and file_name("  ") == "Untitled chat.md"


def test_the_window_exports_the_open_chat(qapp, qtbot, tmp_path, monkeypatch):
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QFileDialog

    from ui.main_window import MainWindow

    settings = QSettings(str(tmp_path / "tandem.ini"), QSettings.Format.IniFormat)
    window = MainWindow(model=str(tmp_path / "no-model"), history_path=tmp_path / "h.sqlite3", settings=settings)
    qtbot.addWidget(window)
    conversation = window.store.create_conversation("Sea facts")
    window.store.add_turn(conversation.id, "Tell me about the sea.", "It is **large**.",
                          stats={"tokens": 5, "tokens_per_s": 9.0})
    window.controller.open(conversation.id)
    asked, chosen = [], {}
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda *args: (asked.append(args[2]), (chosen["path"], ""))[1]))
    folder = tmp_path / "out"
    folder.mkdir()
    chosen["path"] = str(folder / "sea")
    path = window.export_chat()
    assert Path(asked[0]).name == "Sea facts.md"
    assert path == folder / "sea.md"
    text = path.read_text(encoding="utf-8")
    assert "# Sea facts" in text and "Tell me about the sea." in text and "It is **large**." in text
    assert not list(folder.glob(".*partial"))
    chosen["path"] = str(tmp_path / "missing" / "folder" / "sea.md")  # a folder that refuses
    assert window.export_chat() is None
    assert any("could not be exported" in t and "missing" in t for t in window.banners.texts())
    window.close()
