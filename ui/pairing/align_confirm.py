"""Before an alignment starts: what it will take, in time and disk, and a choice to go ahead.
One menu click used to start a 12-minute job that nobody had agreed to."""

from __future__ import annotations

import json
from pathlib import Path

from PySide6.QtWidgets import QMessageBox, QWidget


def head_bytes_for(target_folder: str | Path) -> int | None:
    """What an aligned draft head for this target takes on disk: one decoder layer of the target's
    width, its input projection (2D -> D) and norms, in bfloat16. (The demo's is 8.4 MB, as shipped
    in resources/aligned/.) None where the config cannot say."""
    try:
        config = json.loads((Path(target_folder) / "config.json").read_text(encoding="utf-8"))
        config = config.get("text_config", config)
        d, inner = int(config["hidden_size"]), int(config["intermediate_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads", heads))
        head_dim = int(config.get("head_dim") or d // heads)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    attention = d * (heads + 2 * kv_heads) * head_dim + heads * head_dim * d
    return 2 * (2 * d * d + attention + 3 * d * inner + 4 * d)


def folder_bytes(folder: str | Path) -> int | None:
    try:
        return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())
    except OSError:
        return None


def size_words(n: int | None) -> str:
    if n is None:
        return "a few megabytes to a few gigabytes"
    return f"about {n / 1e6:.0f} MB" if n < 1e9 else f"about {n / 1e9:.1f} GB"


def confirm_alignment(parent: QWidget | None, what: str, target: str, minutes: float, disk: int | None,
                      where: Path) -> bool:
    """Ask before the job starts; True to go ahead."""
    box = QMessageBox(QMessageBox.Icon.Question, "Align the draft",
                      f"Align {what} to {target}?\n\n"
                      f"It runs in the background for about {minutes:g} minutes: the target writes answers and "
                      f"the draft learns from them. Chat goes on meanwhile, more slowly, since they share the "
                      f"processor. It writes {size_words(disk)} to {where}.\n\n"
                      "Cancel stops it at any time, and nothing is saved then. The original draft is kept either way.",
                      QMessageBox.StandardButton.Cancel, parent)
    start = box.addButton("Start aligning", QMessageBox.ButtonRole.AcceptRole)
    box.setDefaultButton(start)
    box.exec()
    return box.clickedButton() is start
