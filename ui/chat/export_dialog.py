"""File → Export chat as Markdown…: the open chat into a file the user picks (app/chat/export.py
writes the text)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from app.chat.export import chat_markdown, file_name, write_text

SHOWN_MS = 6000


def export_chat(window) -> Path | None:
    """The file written, or None where nothing was (no chat, cancelled, or a folder that refused:
    a banner then says why). The dialog starts in the folder of the last export."""
    conv_id = window.controller.current.id if window.controller.current else None
    if conv_id is None or not window.store.messages(conv_id):
        window.status.showMessage("This chat has no messages to export yet.", SHOWN_MS)
        return None
    conversation = window.store.get_conversation(conv_id)
    start = str(Path(window.draft_panel.export_folder()) / file_name(conversation.title))
    chosen, _ = QFileDialog.getSaveFileName(window, "Export chat as Markdown", start, "Markdown (*.md)")
    if not chosen:
        return None
    path = Path(chosen if chosen.lower().endswith(".md") else chosen + ".md")
    model = window.controller.model
    try:
        write_text(path, chat_markdown(conversation, window.store.messages(conv_id),
                                       model.name if model is not None else ""))
    except OSError as exc:
        window.banners.add(f"The chat could not be exported to {path}: {exc.strerror or exc}. "
                           "Choose another folder.", "error", "export")
        return None
    window.draft_panel.remember_folder(str(path.parent))
    window.status.showMessage(f"Exported “{conversation.title}” to {path}", SHOWN_MS)
    return path
