"""A restart brings back the pair in use: the window started twice over the same data folder loads
the last pair again (its draft, precision and context), unless the command line names a model or
draft; a remembered pair that no longer loads says why and the demo loads instead."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from app.draft_choice import AUTO_DRAFT, PROMPT_LOOKUP  # noqa: E402
from app.paths import data_dir  # noqa: E402
from tests.test_window import LOAD_TIMEOUT_MS, Session, wait_until  # noqa: E402


def _start(session: Session, qtbot, model, draft):
    from app.chat.settings import ChatSettings
    from ui.main_window import MainWindow

    window = MainWindow(model=model, draft=draft, backend="torch", history_path=session.history,
                        settings=session.settings(), chat_defaults=ChatSettings(temperature=0.0, max_tokens=8))
    qtbot.addWidget(window)
    window.show()
    return window


def test_a_restart_loads_the_last_pair_with_its_draft_precision_and_context(qapp, qtbot, tiny_pair, demo, tmp_path):
    session = Session(None, tmp_path)
    target = tmp_path / "target"
    shutil.copytree(tiny_pair["target"], target)
    first = _start(session, qtbot, str(target), PROMPT_LOOKUP)
    wait_until(first.composer.can_send, LOAD_TIMEOUT_MS)
    first.pairing.set_context(300)
    wait_until(lambda: getattr(first.pairing.loaded, "context_length", 0) == 300, LOAD_TIMEOUT_MS)
    first.close()
    stored = json.loads((data_dir() / "pairs.json").read_text())["recent"][0]
    assert stored["precision"] == "auto" and stored["draft"] == "ngram"

    # neither a model nor a draft named: the last pair, as it was
    again = _start(session, qtbot, None, None)
    wait_until(lambda: again.pairing.loaded is not None, LOAD_TIMEOUT_MS)
    loaded = again.pairing.loaded
    assert Path(loaded.folder) == target and loaded.draft == PROMPT_LOOKUP
    assert loaded.context_length == 300 and again.pairing.current.context == 300
    assert "prompt lookup" in again.header.draft_slot._shown[0].lower()
    again.close()

    # a model named on the command line wins over the memory
    named = _start(session, qtbot, str(tiny_pair["near"]), None)
    wait_until(lambda: named.pairing.loaded is not None, LOAD_TIMEOUT_MS)
    assert Path(named.pairing.loaded.folder) == Path(tiny_pair["near"]) and named.pairing.current.draft == AUTO_DRAFT
    named.close()

    # the last pair is now the near model's; once its folder is gone the demo loads, and a banner says why
    gone = tmp_path / "near"
    shutil.copytree(tiny_pair["near"], gone)
    moved = _start(session, qtbot, str(gone), PROMPT_LOOKUP)
    wait_until(lambda: moved.pairing.loaded is not None, LOAD_TIMEOUT_MS)
    moved.close()
    shutil.rmtree(gone)
    fallback = _start(session, qtbot, None, None)
    wait_until(lambda: fallback.pairing.loaded is not None, LOAD_TIMEOUT_MS)
    assert fallback.pairing.current.target == "demo"
    said = " ".join(fallback.banners.texts())
    assert "The pair you used last" in said and "could not be loaded" in said and "loads the demo" in said
    fallback.close()


def test_recent_pairs_keep_their_precision_and_refuse_a_bad_one(tmp_path):
    from app.models.pair_memory import PairMemory

    memory = PairMemory(tmp_path / "pairs.json")
    assert memory.last_pair() is None
    memory.add_recent("torch", "/models/a", PROMPT_LOOKUP, precision="int4")
    memory.add_recent("mlx", "/models/b", AUTO_DRAFT)
    again = PairMemory(tmp_path / "pairs.json")
    assert again.last_pair()["target"] == "/models/b" and again.last_pair()["precision"] == "auto"
    assert again.last_pair("torch")["precision"] == "int4" and again.last_pair("torch")["draft"] == PROMPT_LOOKUP
    data = json.loads((tmp_path / "pairs.json").read_text())
    data["recent"][0]["precision"] = "int3"
    del data["recent"][1]["precision"]  # what files written before precisions were kept hold
    (tmp_path / "pairs.json").write_text(json.dumps(data))
    read = PairMemory(tmp_path / "pairs.json")
    assert read.last_pair()["target"] == "/models/a" and read.last_pair()["precision"] == "auto"
    assert "precision is" in read.notice and "int3" in read.notice


def test_a_recent_pairs_precision_goes_with_that_load_only(qtbot, tiny_pair, tmp_path):
    """A recent pair at int4 whose folder is gone loads nothing; the next choice loads at its
    own precision, not the int4 left over from the failed one."""
    from ui.pairing.controller import PairController
    from ui.pairing.downloads import DownloadStrip

    strip = DownloadStrip()
    qtbot.addWidget(strip)
    pairing = PairController(strip, backend="torch")
    asked = []
    pairing.request_pair.connect(asked.append)
    pairing.choose_recent({"target": str(tmp_path / "gone"), "draft": PROMPT_LOOKUP, "precision": "int4"})
    assert asked == []
    pairing.choose_known(str(tiny_pair["target"]), PROMPT_LOOKUP)
    assert [r.precision for r in asked] == ["auto"]
    pairing.choose_recent({"target": str(tiny_pair["target"]), "draft": PROMPT_LOOKUP, "precision": "int4"})
    assert [r.precision for r in asked] == ["auto", "int4"]
