"""Pairing knows the drafters that live beside or inside a target (issue 18, item 7): a checkpoint
with its own MTP layer is offered "built-in MTP head" and gets it when no draft was chosen, and its
pair trial measures it; a Gemma 4 assistant folder pairs as an assistant, without the tokenizer
check a draft model gets, and a non-Gemma target says why it cannot take one; the catalog lists
pairs whose draft is the target's MTP layer or an assistant."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from app.draft_choice import AUTO_DRAFT, PROMPT_LOOKUP, DraftChoice, DraftKind  # noqa: E402
from app.models.catalog import CATALOG_KINDS, CatalogPair, _draft, load_catalog  # noqa: E402
from app.models.sources import classify, draft_source  # noqa: E402

MTP = DraftChoice(DraftKind.MTP)
# what Runner.load builds a drafter for (AUTO is resolved first; PAIR is a request's, never loaded)
RUNNER_LOADS = {DraftKind.NONE, DraftKind.LOOKUP, DraftKind.MODEL, DraftKind.SELF, DraftKind.AUTO, DraftKind.MTP,
                DraftKind.ASSISTANT, DraftKind.EAGLE3, DraftKind.DFLASH}


@pytest.fixture(scope="module")
def mtp_target(tiny_pair, tmp_path_factory):
    """A tiny Qwen3.5 with random mtp.* weights and the tiny pair's tokenizer."""
    from tests.test_mtp_drafter import _random_mtp_checkpoint

    return _random_mtp_checkpoint(tmp_path_factory.mktemp("heads") / "qwen35-mtp", tiny_pair["target"])


@pytest.fixture(scope="module")
def assistant(tmp_path_factory):
    """A tiny Gemma 4 assistant folder as published: config and weights, no tokenizer."""
    from tests.factories_gemma4 import save_assistant, tiny_assistant

    folder = save_assistant(tiny_assistant(3), tmp_path_factory.mktemp("heads") / "gemma4-assistant")
    assert not any(folder.glob("tokenizer*"))
    return folder


@pytest.fixture(scope="module")
def gemma_target(tmp_path_factory):
    from tests.factories_gemma4 import save_gemma4, tiny_gemma4

    return save_gemma4(tiny_gemma4(1), tmp_path_factory.mktemp("heads") / "gemma4", multimodal=True)


# The catalog

def test_every_catalog_pair_parses_with_a_draft_the_runner_loads_and_positive_sizes():
    pairs = [p for p in load_catalog() if not p.id.startswith("demo")]
    assert len({p.id for p in pairs}) == len(pairs)
    for pair in pairs:
        target, draft = pair.specs
        assert pair.backend in ("mlx", "torch") and "/" in target
        assert draft.kind in RUNNER_LOADS and pair.draft_kind in CATALOG_KINDS
        assert DraftChoice.parse_loadable(str(draft)) == draft  # what recents write reads back the same
        assert pair.target.size_gb > 0 and pair.size_gb >= pair.target.size_gb
        if draft.kind is DraftKind.MTP:  # inside the target's download: nothing more to fetch
            assert pair.draft is None and pair.size_gb == pair.target.size_gb
            assert "mlx-community" not in target  # conversions leave the MTP weights out
        else:
            assert pair.target.size_gb > pair.draft.size_gb > 0 and draft.source == pair.draft.repo


def test_the_catalog_lists_current_pairs_with_their_drafts_on_both_backends():
    for backend in ("torch", "mlx"):
        specs = {p.id: p.specs for p in load_catalog(backend)}
        kinds = {draft.kind for _, draft in specs.values()}
        assert {DraftKind.MTP, DraftKind.ASSISTANT, DraftKind.MODEL} <= kinds
        assert specs[f"qwen3.6-27b-mtp-{backend}"] == ("Qwen/Qwen3.6-27B", MTP)
        assert specs[f"qwen3.5-4b-mtp-{backend}"] == ("Qwen/Qwen3.5-4B", MTP)
        assert specs[f"gemma4-e2b-assistant-{backend}"] == (
            "google/gemma-4-E2B-it", DraftChoice.assistant("google/gemma-4-e2b-it-assistant"))
    torch = {p.id: p for p in load_catalog("torch")}
    assert torch["qwen3-8b-torch"].specs == ("Qwen/Qwen3-8B", DraftChoice.model("Qwen/Qwen3-0.6B"))
    assert torch["qwen3.6-27b-mtp-torch"].size_gb == pytest.approx(55, abs=3)
    assert "exact totals from the hub" in torch["gemma4-e2b-assistant-torch"].note  # its sizes are estimates
    mlx_mtp = next(p for p in load_catalog("mlx") if p.draft_kind is DraftKind.MTP)
    assert "mlx-community" in mlx_mtp.note and "original" in mlx_mtp.note


def test_a_catalog_draft_of_a_kind_it_does_not_list_is_refused():
    assert _draft({"id": "x", "draft": {"kind": "mtp"}}) == (None, DraftKind.MTP)
    with pytest.raises(ValueError, match="names no repo"):
        _draft({"id": "x", "draft": {"kind": "mtp", "repo": "a/b", "size_gb": 1}})
    with pytest.raises(ValueError, match="kind self"):
        _draft({"id": "x", "draft": {"kind": "self", "repo": "a/b"}})
    lookup = CatalogPair("x", "torch", "x", load_catalog("torch")[-1].target, None)
    assert lookup.specs[1] == PROMPT_LOOKUP  # a pair without a draft drafts by prompt lookup, as before


# Sources and checks before loading

def test_an_assistant_folder_on_the_draft_slot_is_an_assistant_not_a_draft_model(assistant, tiny_pair):
    assert classify(str(assistant), "draft").as_draft() == (DraftChoice.assistant(str(assistant)),) * 2
    # named by a hub id, fetched to a folder: loaded from the folder, remembered by the id
    hub = classify("google/gemma-4-e2b-it-assistant", "draft")
    assert hub.as_draft(str(assistant)) == (DraftChoice.assistant(str(assistant)),
                                            DraftChoice.assistant("google/gemma-4-e2b-it-assistant"))
    assert draft_source(DraftChoice.assistant(str(assistant))).as_draft()[0].kind is DraftKind.ASSISTANT
    ordinary = str(tiny_pair["near"])
    assert classify(ordinary, "draft").as_draft() == (DraftChoice.model(ordinary),) * 2


def test_an_assistant_dropped_beside_its_target_pairs_as_the_draft(qapp, assistant, gemma_target):
    from ui.pairing.controller import PairController
    from ui.pairing.downloads import DownloadStrip

    pairing = PairController(DownloadStrip(), backend="torch")
    asked = []
    pairing.request_pair.connect(asked.append)
    pairing.drop("window", [str(assistant), str(gemma_target)])  # in either order: the larger is the target
    assert [(r.target, r.draft) for r in asked] == [(str(gemma_target), DraftChoice.assistant(str(assistant)))]


def test_an_assistant_skips_the_tokenizer_check_a_draft_model_gets(assistant, gemma_target, monkeypatch):
    from app.models.precheck import local_part, precheck_pair

    assert precheck_pair(local_part(gemma_target), local_part(assistant), "torch") == ""
    # checked as a draft model, the same folder is refused: it has no tokenizer to compare
    monkeypatch.setattr("app.models.precheck.is_assistant_folder", lambda folder: False)
    with pytest.raises(Exception, match="(?i)tokenizer"):
        precheck_pair(local_part(gemma_target), local_part(assistant), "torch")


def test_auto_pairs_a_checkpoint_with_its_mtp_layer_and_others_with_prompt_lookup(mtp_target, tiny_pair):
    from app.models.pair_memory import same_pair
    from app.runner import auto_draft

    assert auto_draft(mtp_target, "torch") == MTP
    assert auto_draft(tiny_pair["target"], "torch") == PROMPT_LOOKUP
    # recents and trials name an "auto" pair by the draft it stands for
    assert same_pair(str(mtp_target), AUTO_DRAFT)[1] == MTP
    assert same_pair(str(tiny_pair["target"]), AUTO_DRAFT)[1] == PROMPT_LOOKUP


# The Draft slot's menu

def _controller(folder, qapp):
    from ui.pairing.controller import PairController
    from ui.pairing.downloads import DownloadStrip

    pairing = PairController(DownloadStrip(), backend="torch")
    pairing.loaded = SimpleNamespace(folder=folder, backend="torch", device="cpu", weights_bytes=0, draft_bytes=0,
                                     context_length=4096, draft=PROMPT_LOOKUP)
    return pairing


def test_the_draft_menu_offers_the_built_in_mtp_head_only_for_a_target_that_has_one(qapp, mtp_target, tiny_pair):
    from PySide6.QtWidgets import QWidget

    from ui.pairing.slot_menu import build_slot_menu

    parent = QWidget()
    with_head = _controller(mtp_target, qapp)
    actions = {a.text(): a for a in build_slot_menu("draft", with_head, parent).actions()}
    offered = [text for text in actions if text.startswith("Built-in MTP head")]
    assert len(offered) == 1
    asked = []
    with_head.request_pair.connect(asked.append)
    actions[offered[0]].trigger()
    assert [request.draft for request in asked] == [MTP]
    without = _controller(tiny_pair["target"], qapp)
    texts = [a.text() for a in build_slot_menu("draft", without, parent).actions()]
    assert not any("MTP" in text for text in texts) and any(t.startswith("Prompt lookup") for t in texts)
    assert not any("MTP" in a.text() for a in build_slot_menu("target", with_head, parent).actions())


# The pair trial

def test_the_pair_trial_measures_an_mtp_pair(mtp_target):
    from app.pair_trial import run_trial
    from app.runner import Runner

    runner = Runner()
    loaded = runner.load(mtp_target, "torch", AUTO_DRAFT, progress=lambda m: None)
    assert loaded.draft == MTP and loaded.draft_bytes > 0
    result = run_trial(runner, prompts=("Say the list 1, 2, 3, 1, 2, 3 again.",), tokens=16)
    assert result is not None
    assert 0 <= result.acceptance <= 1 and result.speedup > 0 and result.tokens > 0
    assert result.tokens_per_pass >= 1  # every pass commits at least the target's own token


# The window

@pytest.fixture(scope="module")
def heads_session(qapp, mtp_target, tmp_path_factory):
    from tests.test_window import LOAD_TIMEOUT_MS, Session, make_window, wait_until

    session = Session(None, tmp_path_factory.mktemp("heads-window"))
    session.window = make_window(session, str(mtp_target), draft=AUTO_DRAFT)  # no draft chosen
    wait_until(session.window.composer.can_send, LOAD_TIMEOUT_MS)
    yield session
    session.window.close()


def test_a_dropped_mtp_target_drafts_with_its_head_and_is_tried(heads_session):
    from tests.test_window import LOAD_TIMEOUT_MS, wait_until

    window = heads_session.window
    assert window.controller.model.draft == MTP
    assert window.header.draft_slot.name.text() == "built-in MTP head"
    wait_until(lambda: "accepts" in window.header.draft_slot.detail.text(), LOAD_TIMEOUT_MS)
    remembered = window.pairing.memory.trial("torch", *window.pairing.current.named())
    assert remembered is not None and remembered.summary() == window.header.draft_slot.detail.text()


def test_an_assistant_dropped_beside_a_non_gemma_target_gets_the_loaders_message(heads_session, assistant):
    from tests.test_pairing_window import banner_count, drop_on, wait_banner

    window = heads_session.window
    before, model = banner_count(window), window.controller.model
    drop_on(window.header.draft_slot, [str(assistant)])
    message = wait_banner(window, before)
    assert "Could not load" in message and "drafts only for a Gemma 4 model" in message
    assert "qwen3_5" in message  # the loaded target's kind, named
    assert window.controller.model is model and window.controller.model.draft == MTP  # the pair in use stays


def test_a_new_target_without_mtp_falls_back_and_one_with_it_gets_its_head_again(heads_session, mtp_target,
                                                                                   tiny_pair):
    from tests.test_pairing_window import drop_on
    from tests.test_window import LOAD_TIMEOUT_MS, wait_until

    window = heads_session.window
    drop_on(window.header.target_slot, [str(tiny_pair["target"])])  # no MTP layer: not refused for the head
    wait_until(lambda: window.controller.model.folder == tiny_pair["target"], LOAD_TIMEOUT_MS)
    assert window.controller.model.draft == PROMPT_LOOKUP
    drop_on(window.header.target_slot, [str(mtp_target)])
    # `loaded` (the controller's model) comes before `paired`, which records the recent pair
    wait_until(lambda: window.controller.model.folder == mtp_target and window.pairing.loaded is not None
               and window.pairing.loaded.folder == mtp_target, LOAD_TIMEOUT_MS)
    assert window.controller.model.draft == MTP
    assert window.pairing.memory.recent()[0]["title"].endswith("+ built-in MTP head")
