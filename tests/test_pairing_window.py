"""Pairing in the window, on tiny random models saved in Hugging Face format: a compatible draft
dropped on its slot loads and drafts; an incompatible one is refused with the differing tokens
named; every kind of bad input gets its message and leaves the pair in use working."""

from __future__ import annotations

import json
import re
import shutil
import threading
from pathlib import Path

import pytest

pytest.importorskip("pytestqt")

from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl  # noqa: E402
from PySide6.QtGui import QDragEnterEvent, QDropEvent  # noqa: E402
from PySide6.QtWidgets import QApplication  # noqa: E402

from app.draft_choice import NO_DRAFT, PROMPT_LOOKUP, DraftChoice
from app.models.resolve import display_name  # noqa: E402
from tests.test_window import LOAD_TIMEOUT_MS, Session, greedy_answer, make_window, wait_until  # noqa: E402

ANSWER_TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def other_vocab(tiny_fields, tmp_path_factory) -> Path:
    """A tiny model whose tokenizer is the others' minus its last 124 tokens."""
    from app.models.gguf_import import import_gguf
    from tests.factories import tiny_llama, write_gguf

    root = tmp_path_factory.mktemp("other")
    fields = {**tiny_fields, "tokens": tiny_fields["tokens"][:900], "types": tiny_fields["types"][:900]}
    kept = set(fields["tokens"])
    fields["merges"] = [m for m in tiny_fields["merges"]
                        if all(p in kept for p in m.split(" ")) and m.replace(" ", "") in kept]
    write_gguf(tiny_llama(3, vocab=900), root / "other.gguf", fields)
    return import_gguf(root / "other.gguf", root / "other")["hf"]


@pytest.fixture(scope="module")
def pairing_session(qapp, tiny_pair, tmp_path_factory):
    session = Session(None, tmp_path_factory.mktemp("pairing"))
    session.window = make_window(session, str(tiny_pair["target"]), draft=NO_DRAFT)
    wait_until(session.window.composer.can_send, LOAD_TIMEOUT_MS)
    yield session
    session.window.close()


def mime_for(texts: list[str]) -> QMimeData:
    mime = QMimeData()
    local = [t for t in texts if Path(t).exists()]
    if local:
        mime.setUrls([QUrl.fromLocalFile(t) for t in local])
    else:
        mime.setText("\n".join(texts))
    return mime


def drag_over(widget, texts: list[str]) -> None:
    mime = mime_for(texts)  # held here: the event does not own it
    event = QDragEnterEvent(widget.rect().center(), Qt.DropAction.CopyAction, mime,
                            Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, event)


def drop_on(widget, texts: list[str]) -> None:
    """What a user's drag and drop delivers: an enter, then the drop."""
    drag_over(widget, texts)
    mime = mime_for(texts)
    event = QDropEvent(QPointF(widget.rect().center()), Qt.DropAction.CopyAction, mime,
                       Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, event)


def banner_count(window) -> int:
    return window.banners.added  # a new message may replace an older one on its topic


def wait_banner(window, before: int) -> str:
    wait_until(lambda: banner_count(window) > before, LOAD_TIMEOUT_MS)
    return window.banners.texts()[-1]


def answer(window, text: str = "Say something"):
    return greedy_answer(window, text)


def test_dragging_over_a_slot_says_whether_it_is_a_model(pairing_session, tiny_pair, tmp_path):
    slot = pairing_session.window.header.draft_slot
    drag_over(slot, [str(tiny_pair["near"])])
    assert slot.property("dropState") == "accept"
    assert slot.caption.text() == "DROP TO USE AS DRAFT"
    QApplication.sendEvent(slot, _leave())
    assert slot.property("dropState") == "" and slot.caption.text() == "DRAFT"
    (tmp_path / "notes.txt").write_text("hello")
    drag_over(slot, [str(tmp_path / "notes.txt")])
    assert slot.property("dropState") == "reject"
    assert "not a model" in slot.detail.text()
    QApplication.sendEvent(slot, _leave())


def _leave():
    from PySide6.QtGui import QDragLeaveEvent

    return QDragLeaveEvent()


def test_a_compatible_draft_dropped_on_its_slot_loads_drafts_and_is_tried(pairing_session, tiny_pair):
    window = pairing_session.window
    drop_on(window.header.draft_slot, [str(tiny_pair["near"])])
    wait_until(lambda: window.controller.model.draft == DraftChoice.model(tiny_pair["near"])
               and window.pairing.current.draft == DraftChoice.model(tiny_pair["near"]), LOAD_TIMEOUT_MS)
    assert window.header.draft_slot.name.text() == display_name(tiny_pair["near"])
    # the pair trial runs once and its measured result shows under the draft's name, remembered
    wait_until(lambda: "accepts" in window.header.draft_slot.detail.text(), LOAD_TIMEOUT_MS)
    current = window.pairing.current
    remembered = window.pairing.memory.trial(window.controller.model.backend, *current.named())
    assert remembered is not None and 0 < remembered.acceptance <= 1 and remembered.speedup > 0
    assert window.header.draft_slot.detail.text() == remembered.summary()
    assert window.pairing.memory.recent()[0]["draft"] == DraftChoice.model(tiny_pair["near"])
    stats = answer(window)
    assert stats.drafted > 0 and stats.accepted > 0  # the near copy drafts, and much is accepted


def test_an_incompatible_draft_is_refused_naming_the_tokens(pairing_session, other_vocab):
    window = pairing_session.window
    before, model = banner_count(window), window.controller.model
    drop_on(window.header.draft_slot, [str(other_vocab)])
    message = wait_banner(window, before)
    assert "cannot be paired" in message
    assert "the target has 1,024 tokens and the draft 900" in message
    assert "only in the target:" in message  # and which ones, spaces shown as the side panel shows them
    assert "Ġ" not in message and "'·" in message
    assert window.controller.model is model
    assert window.header.draft_slot.name.text() == model.draft_words()[0]  # the header shows the pair still in use
    assert window.header.draft_slot.detail.text() == window.pairing.trial_text != ""
    assert answer(window).tokens > 0  # the pair in use still answers


def _copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _bad_inputs(tiny_pair, root: Path) -> dict[str, tuple[Path | str, str]]:
    """name -> (what is dropped, a phrase its message must contain)."""
    empty = root / "empty"
    empty.mkdir()
    pickled = root / "pickled"
    pickled.mkdir()
    shutil.copy(tiny_pair["target"] / "config.json", pickled / "config.json")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    corrupt = _copy_model(tiny_pair["target"], root / "corrupt")
    weights = corrupt / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes((10**9).to_bytes(8, "little") + data[8:])  # a header longer than the file
    partial = _copy_model(tiny_pair["target"], root / "partial")
    names = json.loads((partial / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (partial / "model.safetensors").read_bytes()[:8], "little")])
    weight_map = {name: "model-00001-of-00002.safetensors" for name in names if name != "__metadata__"}
    (partial / "model.safetensors").rename(partial / "model-00001-of-00002.safetensors")
    first = next(iter(weight_map))
    weight_map[first] = "model-00002-of-00002.safetensors"
    (partial / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    unsupported = _copy_model(tiny_pair["target"], root / "unsupported")
    config = json.loads((unsupported / "config.json").read_text())
    config["model_type"] = "tandem_imaginary"
    (unsupported / "config.json").write_text(json.dumps(config))
    gguf = tiny_pair["target"].parent.parent / "target.gguf"  # what the fixture imported the target from
    truncated = root / "truncated.gguf"
    truncated.write_bytes(gguf.read_bytes()[: gguf.stat().st_size // 2])
    return {
        "a folder with no model": (empty, "no config.json"),
        "pickled weights only": (pickled, "arbitrary code"),
        "a corrupt safetensors header": (corrupt, "model.safetensors"),
        "a partial download": (partial, "model-00002-of-00002.safetensors"),
        "an unsupported architecture": (unsupported, "tandem_imaginary"),
        "a truncated GGUF": (truncated, "truncated"),
        "a text file": (root / "notes.txt", "not a model"),
        "a hub model with no network": ("https://huggingface.co/tandem-tests/not-cached", "network"),
    }


def test_each_bad_input_gets_its_message_and_the_pair_keeps_working(pairing_session, tiny_pair, tmp_path,
                                                                     monkeypatch):
    window = pairing_session.window
    (tmp_path / "notes.txt").write_text("not a model")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    window.pairing.endpoint = "http://127.0.0.1:9"  # nothing listens there: no network
    model = window.controller.model
    for name, (dropped, phrase) in _bad_inputs(tiny_pair, tmp_path).items():
        for role in ("target", "draft"):
            before = banner_count(window)
            slot = window.header.target_slot if role == "target" else window.header.draft_slot
            drop_on(slot, [str(dropped)])
            message = wait_banner(window, before)
            assert phrase.lower() in message.lower(), (name, role, message)
            assert window.controller.model is model, (name, role)
    window.pairing.endpoint = None
    assert window.header.target_slot.name.text() == display_name(model.folder)
    assert answer(window).tokens > 0


def test_a_pair_larger_than_free_memory_is_refused_with_numbers(pairing_session, tiny_pair, monkeypatch):
    window = pairing_session.window
    model = window.controller.model
    monkeypatch.setenv("TANDEM_FREE_MEMORY", "1000")  # bytes: less than the tiny pair needs
    before = banner_count(window)
    drop_on(window.header.target_slot, [str(tiny_pair["draft"])])
    message = wait_banner(window, before)
    assert "This pair does not fit" in message and "weights" in message and "KV cache" in message
    assert "at 512 tokens of context" in message  # the tiny model's whole context
    assert re.search(r"but only \d+ MB of memory \(as TANDEM_FREE_MEMORY says\) is free", message)
    assert window.controller.model is model


def test_two_models_dropped_on_the_window_pair_by_size(tmp_path):
    from app.models.sources import model_size
    from ui.pairing.controller import _by_size

    big, small = tmp_path / "big", tmp_path / "small"
    for folder, size in ((big, 3000), (small, 1000)):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"\0" * size)
    assert model_size(str(big)) == 3000
    assert _by_size([str(small), str(big)]) == (str(big), str(small))


def test_a_hub_link_dropped_downloads_with_progress_then_pairs(pairing_session, tiny_pair, tmp_path, monkeypatch):
    from tests.fake_hub import FakeHub

    window = pairing_session.window
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    strip, shown = window.download_strip, []
    with FakeHub() as server:
        server.add_folder("tandem-tests/near", tiny_pair["near"])
        server.delay_s = 0.01  # slow enough to see the strip
        window.pairing.endpoint = server.endpoint
        strip.total_bar.valueChanged.connect(lambda value: shown.append((strip.isVisible(), value)))
        drop_on(window.header.draft_slot, ["https://huggingface.co/tandem-tests/near"])
        # `loaded` then `paired` arrive from the worker: wait for both
        wait_until(lambda: window.controller.model.draft_words()[0] == "tandem-tests/near"
                   and window.pairing.current.named()[1] == DraftChoice.model("tandem-tests/near"), LOAD_TIMEOUT_MS)
        window.pairing.endpoint = None
    assert shown and all(visible for visible, _ in shown)  # progress was on screen while it ran
    assert not strip.isVisible()  # and gone once done
    assert not any(path.endswith(".bin") for _, path, _ in server.requests)
    assert window.pairing.current.named()[1] == DraftChoice.model("tandem-tests/near")  # remembered by its hub id
    assert answer(window).drafted > 0


def test_a_gated_repo_asks_for_a_token_and_cancel_keeps_the_pair(pairing_session, tiny_pair, tmp_path, monkeypatch):
    from huggingface_hub import constants

    from tests.fake_hub import FakeHub

    window = pairing_session.window
    model = window.controller.model
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    token_file = tmp_path / "hf" / "token"
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(token_file))
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)  # a cancel lands between reads of 10 MB
    asked = []
    monkeypatch.setattr(window.pairing, "ask_token", lambda repo, why: asked.append((repo, why)) or "hf_good")
    with FakeHub() as server:
        server.add_folder("meta/gated", tiny_pair["near"])
        server.gated.add("meta/gated")
        server.tokens.add("hf_good")
        cancel_at = threading.Event()  # the user presses Cancel once the weights are under way
        server.on_sent = lambda name, sent: name == "model.safetensors" and sent > 128 * 1024 and cancel_at.set()
        server.delay_s = 0.05
        window.pairing.endpoint = server.endpoint
        before = banner_count(window)
        drop_on(window.header.draft_slot, ["meta/gated"])
        wait_until(cancel_at.is_set, LOAD_TIMEOUT_MS)
        window.download_strip.cancel_button.click()
        message = wait_banner(window, before)
        server.on_sent = None
        assert asked and asked[0][0] == "meta/gated" and "licence" in asked[0][1]
        assert "Download cancelled" in message and "resumes" in message
        assert not window.download_strip.isVisible()
        assert window.controller.model is model and window.pairing.job is None
        assert not token_file.exists()  # a token is stored only once it has worked
        server.delay_s = 0.0
        drop_on(window.header.draft_slot, ["meta/gated"])  # again: resumes, and this time finishes
        wait_until(lambda: window.pairing.current.named()[1] == DraftChoice.model("meta/gated"), LOAD_TIMEOUT_MS)
        window.pairing.endpoint = None
    assert len(asked) == 2
    assert token_file.read_text() == "hf_good"  # where huggingface-hub reads it
    ranged = [r for method, path, r in server.requests if method == "GET" and path.endswith(".safetensors") and r]
    assert ranged  # the weights resumed from the cancelled part


def test_a_hub_pair_is_checked_before_its_weights_are_fetched(pairing_session, other_vocab, tiny_pair, tmp_path,
                                                              monkeypatch):
    from tests.fake_hub import FakeHub

    window = pairing_session.window
    model = window.controller.model
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with FakeHub() as server:
        server.add_folder("tandem-tests/other", other_vocab)
        server.add_folder("tandem-tests/near", tiny_pair["near"])
        window.pairing.endpoint = server.endpoint
        before = banner_count(window)
        drop_on(window.header.draft_slot, ["tandem-tests/other"])  # another tokenizer
        assert "cannot be paired" in wait_banner(window, before)
        monkeypatch.setenv("TANDEM_FREE_MEMORY", "1000")
        before = banner_count(window)
        drop_on(window.header.draft_slot, ["tandem-tests/near"])  # pairs, but does not fit
        assert "This pair does not fit" in wait_banner(window, before)
        window.pairing.endpoint = None
    weights = [path for method, path, _ in server.requests if method == "GET" and path.endswith(".safetensors")]
    assert weights == []  # refused on kilobytes: no weights were downloaded
    configs = [path for method, path, _ in server.requests if method == "GET" and path.endswith("config.json")]
    assert any("other" in p for p in configs) and any("near" in p for p in configs)
    assert window.controller.model is model and not window.download_strip.isVisible()


def test_the_slot_menus_offer_files_hub_keywords_catalog_and_recent_pairs(pairing_session):
    from ui.pairing.slot_menu import build_slot_menu

    window = pairing_session.window
    texts = {role: [a.text() for a in build_slot_menu(role, window.pairing, window).actions()]
             for role in ("target", "draft")}
    assert texts["target"][:3] == ["Model folder…", ".gguf file…", "Hugging Face model…"]
    assert any(t.startswith("Prompt lookup") for t in texts["draft"])
    assert not any(t.startswith("Prompt lookup") for t in texts["target"])
    menu = build_slot_menu("target", window.pairing, window)
    catalog = next(a.menu() for a in menu.actions() if a.text() == "Known-good pairs")
    entries = [a.text() for a in catalog.actions()]
    assert entries[0].startswith("Demo") and "download" not in entries[0]  # offline, always there
    assert any("Qwen2.5 7B" in e and "GB download" in e for e in entries)  # the torch catalog, with sizes
    recent = next(a.menu() for a in menu.actions() if a.text() == "Recent pairs")
    assert recent.isEnabled() and recent.actions()  # the pairs loaded in this module's tests
    # the choices in use carry a check: the pair in the recents, its way of drafting in the Draft menu
    assert [a.isChecked() for a in recent.actions()].count(True) == 1 and recent.actions()[0].isChecked()
    drafts = {a.text(): a.isChecked() for a in build_slot_menu("draft", window.pairing, window).actions()
              if a.isCheckable()}
    in_use = window.pairing.loaded.draft
    assert sum(drafts.values()) == (1 if in_use in (PROMPT_LOOKUP, NO_DRAFT) else 0), (in_use, drafts)


def test_a_new_target_of_another_family_keeps_the_target_and_drafts_by_lookup(pairing_session, tiny_pair,
                                                                            other_vocab):
    window = pairing_session.window
    drop_on(window.header.draft_slot, [str(tiny_pair["near"])])  # a draft model of the target's family
    wait_until(lambda: window.pairing.current is not None
               and window.pairing.current.draft == DraftChoice.model(tiny_pair["near"]), LOAD_TIMEOUT_MS)
    before = banner_count(window)
    drop_on(window.header.target_slot, [str(other_vocab)])  # (this module's last test: it changes the pair)
    message = wait_banner(window, before)
    assert "does not fit this target, so it drafts with prompt lookup" in message
    wait_until(lambda: window.pairing.current.target == str(other_vocab), LOAD_TIMEOUT_MS)
    assert window.controller.model.draft == PROMPT_LOOKUP and window.pairing.current.draft == PROMPT_LOOKUP
    assert window.header.target_slot.name.text() == display_name(other_vocab)


def test_the_context_length_is_a_setting_per_model_kept_across_loads(pairing_session, monkeypatch):
    from PySide6.QtWidgets import QInputDialog

    from ui.pairing.slot_menu import build_slot_menu

    window = pairing_session.window
    pairing = window.pairing
    own = pairing.loaded.own_context
    assert own == pairing.loaded.context_length == 512  # the tiny model's own, nothing chosen yet

    def choose_in_menu(tokens: int) -> None:
        monkeypatch.setattr(QInputDialog, "getInt", staticmethod(lambda *args: (tokens, True)))
        menu = build_slot_menu("target", pairing, window)
        next(a for a in menu.actions() if a.text().startswith("Context length")).trigger()

    choose_in_menu(300)
    wait_until(lambda: pairing.loaded.context_length == 300, LOAD_TIMEOUT_MS)
    assert pairing.memory.context(pairing.current.named()[0]) == 300  # remembered for this model
    assert window.worker.runner.loaded.context_length == 300  # what fitting and the engine use
    pairing.choose("draft", "ngram")  # the same target loads again with another draft: it keeps its context
    wait_until(lambda: pairing.current.draft == PROMPT_LOOKUP == pairing.loaded.draft, LOAD_TIMEOUT_MS)
    assert pairing.loaded.context_length == 300
    choose_in_menu(own)  # the model's own again: nothing is remembered
    wait_until(lambda: pairing.loaded.context_length == own, LOAD_TIMEOUT_MS)
    assert pairing.memory.context(pairing.current.named()[0]) is None
