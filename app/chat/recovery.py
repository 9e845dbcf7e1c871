"""Answers the history refused, kept in a file when Tandem quits, where a file still fits, and
offered back the next time the window opens over the same history.

The history's own folder comes first (the user looks there), then Tandem's cache folder, then
the system's temporary folder: a full disk often holds only one of them. Each file is written
whole under a temporary name and renamed, so a disk that fills mid-write leaves no empty or
half file that looks like a recovery (one once did: created, then ENOSPC, then nothing in it).

A file's name ends in a tag of the history it belongs to (the cache and temporary folders are
shared by every history, a test's included), so a window offers only its own history's answers.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from app import data_files
from app.json_fields import is_whole

PREFIX = "unsaved-answers-"
# unsaved-answers-20250101-120000[-<tag>].json: the tag is missing in files from before tags
NAME = re.compile(rf"{PREFIX}\d{{8}}-\d{{6}}(?:-(?P<tag>[0-9a-f]{{12}}))?\.json")
MAX_FILE_BYTES = 64 * 2**20  # answers of a session: far less


def recovery_folders(history_path: Path) -> list[Path]:
    from app.paths import cache_dir

    folders = [history_path.parent]
    try:
        folders.append(cache_dir())
    except OSError:  # the cache folder cannot be made either
        pass
    folders.append(Path(tempfile.gettempdir()))
    return list(dict.fromkeys(folders))


def write_recovery(answers: list[dict], history_path: Path) -> tuple[Path | None, list[str]]:
    """(the file the answers went to, or None; why each folder tried before it refused)."""
    data = json.dumps(answers, ensure_ascii=False, indent=1).encode("utf-8")
    name = f"{PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{history_tag(history_path)}.json"
    refused = []
    for folder in recovery_folders(history_path):
        target = folder / name
        partial = folder / f".{name}.partial"
        try:
            fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # readable by the user only
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(partial, target)
            return target, refused
        except OSError as exc:
            refused.append(f"{folder}: {exc.strerror or exc}")
            try:
                partial.unlink()
            except OSError:
                pass
    return None, refused


def history_tag(history_path: Path) -> str:
    """Twelve hex digits that tell one history file from another (its absolute path, hashed)."""
    return hashlib.sha256(str(Path(history_path).absolute()).encode("utf-8", "surrogatepass")).hexdigest()[:12]


def find_recoveries(history_path: Path) -> list[Path]:
    """The recovery files of this history, newest first: in the folders write_recovery uses, those
    tagged with this history, and beside the history also untagged ones (written before tags). A
    folder that does not answer within data_files' bound is passed over."""
    tag = history_tag(history_path)

    def listed() -> list[Path]:
        found = []
        for folder in recovery_folders(history_path):
            try:
                names = os.listdir(folder)
            except OSError:
                continue
            for name in names:
                match = NAME.fullmatch(name)
                if match and (match["tag"] == tag or match["tag"] is None and folder == history_path.parent):
                    found.append(folder / name)
        return found

    try:
        found = data_files.within(None, listed, "the folders of unsaved answers")
    except OSError:
        return []
    return sorted(found, key=lambda path: path.name[len(PREFIX):len(PREFIX) + 15], reverse=True)


@dataclass(frozen=True)
class RecoveredAnswer:
    """One answer of a recovery file: what ChatController's finish_answer call was to store."""

    conv_id: int
    answer_id: int
    version: int | None
    text: str
    status: str
    record: dict | None
    stats: dict | None
    trace: dict | None
    thinking: str


def read_recovery(path: Path) -> list[RecoveredAnswer]:
    """The answers in a recovery file. DataFileError (an OSError) where it cannot be read, and
    ValueError, in words, where it holds no answers as write_recovery writes them."""
    try:
        items = json.loads(data_files.read_text(path, limit=MAX_FILE_BYTES))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text") from exc
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"{path} is not JSON") from exc
    if not isinstance(items, list) or not items:
        raise ValueError(f"{path} holds no list of answers")
    return [_answer(item, number, path) for number, item in enumerate(items, 1)]


def _answer(item, number: int, path: Path) -> RecoveredAnswer:
    def field(name, check, default=None):
        value = item.get(name, default)
        if not check(value):
            raise ValueError(f"answer {number} of {path} has no usable “{name}”")
        return value

    if not isinstance(item, dict):
        raise ValueError(f"answer {number} of {path} is not an object")
    return RecoveredAnswer(
        conv_id=field("conv_id", is_whole), answer_id=field("answer_id", is_whole),
        version=field("version", lambda v: v is None or is_whole(v)), text=field("text", lambda v: isinstance(v, str)),
        status=field("status", lambda v: isinstance(v, str)),
        record=field("record", lambda v: v is None or isinstance(v, dict)),
        stats=field("stats", lambda v: v is None or isinstance(v, dict)),
        trace=field("trace", lambda v: v is None or isinstance(v, dict)),
        thinking=field("thinking", lambda v: isinstance(v, str), ""),
    )


def restore(store, answers: list[RecoveredAnswer]) -> list[int]:
    """Write the answers into `store` (an open HistoryStore) where they belong; the ids of their
    chats, in order. HistoryError where one has no place there any more (its chat deleted): the
    answers before it are written, and the file stays for the user to read."""
    from app.chat.history import HistoryError

    chats = []
    for answer in answers:
        try:  # by id: an answer in a branch out of view (an edited question's) is still its chat's
            found = store.message(answer.answer_id)
        except HistoryError:
            found = None
        if found is None or found.conversation_id != answer.conv_id or found.role != "assistant":
            raise HistoryError("The answer could not be put back: its chat is no longer in the history "
                               "(it was deleted, or the history was replaced).")
        store.finish_answer(answer.answer_id, answer.text, answer.status, answer.record, answer.stats, answer.trace,
                            version=answer.version, thinking=answer.thinking)
        if answer.conv_id not in chats:
            chats.append(answer.conv_id)
    return chats
