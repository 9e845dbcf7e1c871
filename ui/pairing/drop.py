"""What a drag carries, as the texts app.models.sources.classify understands: local paths for
files and folders, URLs as they are (a link dragged from a browser), or plain text."""

from __future__ import annotations

from PySide6.QtCore import QMimeData


def mime_texts(mime: QMimeData) -> list[str]:
    if mime.hasUrls():
        found = [url.toLocalFile() if url.isLocalFile() else url.toString() for url in mime.urls()]
        return [text for text in found if text]
    if mime.hasText():
        # a browser dragging a link may give text with several lines (the URL, then a title)
        lines = [line.strip() for line in mime.text().splitlines() if line.strip()]
        return lines[:1]
    return []
