"""Bad data in the files Tandem keeps and the texts dropped on it: the window's settings file,
pairs.json, texts and links dropped on a model slot (moved from tests/test_bad_inputs.py; the
same rule: a clear message, nothing lost, the pair in use kept)."""

from __future__ import annotations

import json
import re

import pytest

from app.draft_choice import NO_DRAFT, PROMPT_LOOKUP
from tests.test_bad_inputs import assert_clear

pytest.importorskip("pytestqt")


# The window's settings file: a damaged value is reset, the others kept

TANDEM_CONF = {
    "geometry a word": "[window]\ngeometry=hello\n",
    "geometry a number": "[window]\ngeometry=12\n",
    "geometry garbage bytes": "[window]\ngeometry=@ByteArray(\\x1\\x2garbage)\n",
    "geometry a list": "[window]\ngeometry=a, b, c\n",
    "splitter a word": "[window]\nsplitter=hello\n",
    "splitter garbage bytes": "[window]\nsplitter=@ByteArray(\\0\\0\\0\\xff)\n",
    "side panel a word": "[window]\nside_panel=banana\n",
    "drawer a number": "[window]\nsettings_drawer=7\n",
    "last chat a word": "[chat]\nlast_conversation=abc\n",
    "last chat beyond 64 bits": "[chat]\nlast_conversation=99999999999999999999999\n",
    # every field in every wrong shape an ini file holds: a number, a list, a point, an invalid
    # value, a blob, a negative or fractional count (Qt reads "@..." back as typed values)
    "geometry a point": "[window]\ngeometry=@Point(1 2)\n",
    "splitter a number": "[window]\nsplitter=3\n",
    "splitter a list": "[window]\nsplitter=a, b\n",
    "side panel a number": "[window]\nside_panel=2\n",
    "side panel a list": "[window]\nside_panel=true, false\n",
    "side panel bytes": "[window]\nside_panel=@ByteArray(true)\n",
    "drawer a word": "[window]\nsettings_drawer=maybe\n",
    "drawer invalid": "[window]\nsettings_drawer=@Invalid()\n",
    "last chat a list": "[chat]\nlast_conversation=1, 2\n",
    "last chat a fraction": "[chat]\nlast_conversation=1.5\n",
    "last chat negative": "[chat]\nlast_conversation=-3\n",
    "last chat a size": "[chat]\nlast_conversation=@Size(1 2)\n",
    "last chat a damaged variant": "[chat]\nlast_conversation=@Variant(\\0\\0\\0\\x7fgarbage)\n",
    "not an ini file": "\x00\x01\x02 binary junk \xff",
    "sections without values": "[window]\n[chat]\n[[[\n",
}


@pytest.mark.parametrize("content", TANDEM_CONF.values(), ids=TANDEM_CONF.keys())
def test_a_damaged_settings_file_is_reset_value_by_value(content, qapp, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QLabel, QMainWindow, QSplitter

    from ui import window_state

    monkeypatch.setenv("TANDEM_HOME", str(tmp_path))
    good = "[other]\nkept=yes\n"  # a value the damage does not touch survives it
    (tmp_path / "Tandem.conf").write_text(good + content, encoding="utf-8", errors="surrogateescape")
    settings = window_state.open_settings()
    window, splitter = QMainWindow(), QSplitter()
    splitter.addWidget(QLabel("chat"))
    window_state.restore_layout(settings, window, splitter)
    assert isinstance(window_state.flag(settings, window_state.SIDE_PANEL, True), bool)
    assert isinstance(window_state.flag(settings, window_state.SETTINGS_DRAWER, False), bool)
    conversation = window_state.last_conversation(settings)
    assert conversation is None or 0 <= conversation < 2**63
    assert settings.value("other/kept") == "yes"
    window_state.save(settings, window, splitter, side_panel=True, drawer=False, conversation_id=4)
    assert window_state.last_conversation(window_state.open_settings()) == 4  # the next start is clean


# pairs.json: bad entries skipped, good ones kept, a damaged file set aside (not deleted)

GOOD = {"backend": "torch", "target": "/models/a", "draft": "ngram", "title": "a + prompt lookup"}
PAIRS = {
    "recent null": ({"recent": None}, []),
    "recent a string": ({"recent": "x"}, []),
    "trials null": ({"recent": "abc", "trials": None}, []),
    "recent a dict": ({"recent": {"a": 1}}, []),
    "entries not dicts": ({"recent": [1, "x", None, [GOOD], GOOD]}, [GOOD]),
    "an entry without a title": ({"recent": [{k: v for k, v in GOOD.items() if k != "title"}]},
                                 [{**GOOD, "title": "/models/a + ngram"}]),
    "an entry with a null target": ({"recent": [{**GOOD, "target": None}, GOOD]}, [GOOD]),
    "an entry with a numeric draft": ({"recent": [{**GOOD, "draft": 4}, GOOD]}, [GOOD]),
    "trials a list": ({"recent": [GOOD], "trials": [1, 2]}, [GOOD]),
    "a trial of words": ({"recent": [GOOD], "trials": {"torch|/models/a|ngram": {
        "acceptance": "high", "speedup": "fast", "tokens_per_pass": 1, "tokens": 1, "measured_at": 0}}}, [GOOD]),
    "a trial of nulls": ({"recent": [GOOD], "trials": {"torch|/models/a|ngram": None}}, [GOOD]),
    "a precision no backend has": ({"recent": [{**GOOD, "precision": "int3"}, GOOD]}, [GOOD]),
    "a precision of the wrong type": ({"recent": [{**GOOD, "precision": 4}, GOOD]}, [GOOD]),
}


@pytest.mark.parametrize("content, kept", PAIRS.values(), ids=PAIRS.keys())
def test_pairs_json_variants_keep_every_good_entry(content, kept, tmp_path):
    from app.models.pair_memory import PairMemory

    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(content))
    memory = PairMemory(path)
    # read typed (app/draft_choice.py); an entry written before precisions were kept: the weights' own
    kept = [{**entry, "draft": PROMPT_LOOKUP, "precision": "auto"} for entry in kept]
    assert memory.recent() == kept
    assert memory.trial("torch", "/models/a", PROMPT_LOOKUP) is None
    assert memory.add_recent("torch", "/models/b", NO_DRAFT, "b + none") is None
    assert PairMemory(path).recent()[1:] == kept  # the new entry first, every good one kept


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe\x00binary", b"[1, 2, 3]", b'"a string"', b"null"],
                         ids=["not JSON", "binary", "a list", "a string", "null"])
def test_a_damaged_pairs_json_is_set_aside_whole_and_started_afresh(raw, tmp_path):
    from app.models.pair_memory import PairMemory

    path = tmp_path / "pairs.json"
    path.write_bytes(raw)
    memory = PairMemory(path)
    assert memory.recent() == []
    aside = list(tmp_path.glob("pairs.damaged-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == raw  # nothing lost: the bytes are kept
    assert memory.add_recent("torch", "/models/b", NO_DRAFT, "b") is None


# Texts and links dropped on a model slot: refused in words, the pair in use and the recents kept

DROPS = {
    "empty": "",
    "spaces": "   ",
    "dot-dot in a hub link": "https://huggingface.co/org/model/blob/main/../../../etc/passwd",
    "dot-dot as the revision": "https://huggingface.co/org/model/tree/..",
    "a dot segment": "https://hf.co/org/./model",
    "5,000 characters": "x" * 5000,
    "a hub link of 5,000 characters": "https://huggingface.co/org/" + "m" * 5000,
    "a long file name": "/tmp/" + "n" * 400 + ".gguf",
    "wrong scheme": "ftp://huggingface.co/org/model",
    "javascript": "javascript:alert(1)",
    "a dataset": "https://huggingface.co/datasets/org/data",
    "the hub's front page": "https://huggingface.co/",
    "an owner alone": "hf.co/org",
    "a missing file link": "file:///nonexistent/model.gguf",
    "a draft keyword as target": "ngram",
    "plain words": "the best model please",
}


@pytest.fixture
def pairing(qtbot, tmp_path):
    from app.models.pair_memory import PairMemory
    from ui.pairing.controller import PairController
    from ui.pairing.downloads import DownloadStrip

    strip = DownloadStrip()
    qtbot.addWidget(strip)
    memory_file = tmp_path / "pairs.json"
    memory_file.write_text(json.dumps({"recent": [GOOD]}))
    controller = PairController(strip, "torch", memory=PairMemory(memory_file), endpoint="http://127.0.0.1:9")
    return controller, memory_file


@pytest.mark.parametrize("text", DROPS.values(), ids=DROPS.keys())
def test_a_bad_drop_is_refused_in_words_and_the_pair_is_kept(text, pairing):
    from app.models.sources import drag_verdict

    controller, memory_file = pairing
    before = memory_file.read_bytes()
    errors = []
    controller.error.connect(errors.append)
    controller.drop("target", [text])
    assert len(errors) == 1
    assert_clear(errors[0])
    assert controller.job is None and controller.current is None  # nothing fetched, nothing replaced
    assert memory_file.read_bytes() == before
    assert drag_verdict(text, "target")  # dragging over already says no


def test_an_address_on_another_host_is_a_server_to_ask_not_a_model_to_fetch(pairing):
    """Any http(s) address but the hub's is a server: the Target slot opens the server dialog with
    it (app/remote/); the Draft slot refuses it in words; the pair in use stays."""
    from app.models.sources import drag_verdict

    controller, memory_file = pairing
    before = memory_file.read_bytes()
    asked, errors = [], []
    controller.ask_remote = lambda address: asked.append(address)  # the dialog, cancelled
    controller.error.connect(errors.append)
    controller.drop("target", ["https://example.com/org/model"])
    assert asked == ["https://example.com/org/model"] and not errors
    controller.drop("draft", ["https://example.com/org/model"])
    assert len(errors) == 1 and "Target slot" in errors[0]
    assert controller.job is None and controller.current is None and memory_file.read_bytes() == before
    assert drag_verdict("https://example.com/v1", "target") == ""
    assert "Target slot" in drag_verdict("https://example.com/v1", "draft")


@pytest.mark.parametrize("args, named", [
    (["--max-tokens", "0"], "--max-tokens"), (["--max-tokens", "-5"], "--max-tokens"),
    (["--max-tokens", "lots"], "--max-tokens"), (["--backend", "cuda"], "--backend"), (["--model", ""], "--model"),
], ids=["window max-tokens 0", "window max-tokens -5", "window max-tokens a word", "window backend unknown",
        "window model empty"])
def test_a_bad_window_option_is_refused_before_the_window_opens(args, named, capsys, monkeypatch):
    import ui.main

    def never(*a, **k):  # an option let through would go on to open the window and wait in its event loop
        raise AssertionError("the window was being opened")

    monkeypatch.setattr(ui.main, "folders_problem", never)  # checked before the window is built
    with pytest.raises(SystemExit) as exit_:
        ui.main.main(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert_clear(re.sub(r"^tandem: error: ", "", err.strip().splitlines()[-1]), named)
