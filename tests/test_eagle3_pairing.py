"""EAGLE-3 heads in pairing (issue 36, item 4): the catalog lists Llama 3.1 8B Instruct with its
EAGLE-3 head published as safetensors; a head named by hub id ("eagle3:<id>", the catalog's, the
Draft slot's) is fetched as an assistant is, checked against the target on its config before its
weights come, and then loads from the hub's cache; the Draft slot offers the heads beside the
target that fit it and the catalog's head for it, with a check on the one in use; "auto" drafts
with a head the pair trials measured faster than prompt lookup beyond both ranges; `models info`
describes a head. Nothing is downloaded from the real hub: a local server stands in for it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from app.draft_choice import AUTO_DRAFT, PROMPT_LOOKUP, DraftChoice, DraftKind  # noqa: E402
from app.models.errors import ModelFileError  # noqa: E402
from tests.eagle3_training import random_head, write_head  # noqa: E402

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
HEAD_ID = "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"
HUB_HEAD = "tandem-tests/eagle3-head"


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


@pytest.fixture(scope="module")
def heads(tiny_pair, tmp_path_factory) -> dict[str, Path]:
    """Beside a link to the tiny target: a head made for it, a head made for a model twice as
    wide, and a plain folder; and the fitting head's config alone (a hub head before its weights)."""
    root = tmp_path_factory.mktemp("beside")
    (root / "target").symlink_to(tiny_pair["target"], target_is_directory=True)
    config = _config(tiny_pair["target"])
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    fits = write_head(random_head(3, hidden, vocab, (0, 1, 2)), root / "tiny-eagle3", layers=(0, 1, 2))
    wide = write_head(random_head(4, hidden * 2, vocab, (0, 1, 2)), root / "wide-eagle3", layers=(0, 1, 2))
    (root / "notes").mkdir()
    (root / "notes" / "config.json").write_text("{}")
    config_only = tmp_path_factory.mktemp("config-only") / "tiny-eagle3"
    config_only.mkdir()
    (config_only / "config.json").write_text((fits / "config.json").read_text())
    return {"target": root / "target", "fits": fits, "wide": wide, "config_only": config_only}


# The catalog

def test_the_catalog_lists_llama_with_its_eagle3_head_published_as_safetensors():
    from app.models.catalog import CATALOG_KINDS, _draft, catalog_head, load_catalog

    assert DraftKind.EAGLE3 in CATALOG_KINDS
    pair = {p.id: p for p in load_catalog("torch")}["llama3.1-8b-eagle3-torch"]
    assert pair.specs == (LLAMA, DraftChoice.eagle3(HEAD_ID)) and pair.draft_kind is DraftKind.EAGLE3
    assert pair.target.gated and pair.target.size_gb == 16.1 and pair.draft.size_gb == 1.9
    assert pair.size_gb == pytest.approx(18.0)
    assert "estimated from the parameter count" in pair.note and "exact total from the hub" in pair.note
    assert catalog_head(LLAMA, DraftKind.EAGLE3).repo == HEAD_ID
    assert catalog_head("Qwen/Qwen3-8B", DraftKind.EAGLE3) is None
    assert _draft({"id": "x", "draft": {"kind": "eagle3", "repo": "a/b", "size_gb": 1}})[1] is DraftKind.EAGLE3
    # the EAGLE authors' own head ships only a pickle: named as refused, never listed
    about = json.loads((Path(__file__).parents[1] / "resources" / "catalog.json").read_text())["about"]
    assert "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B" in about and "pickle" in about
    listed = {m.repo for p in load_catalog() for m in (p.target, p.draft) if m is not None}
    assert not any(repo.startswith("yuhuili/") for repo in listed)


# Sources: what the Draft slot fetches, and what the runner then loads

def test_a_hub_head_is_fetched_like_a_model_then_drafts_as_a_head(heads):
    from app.models.sources import classify, draft_source

    named = classify(f"eagle3:{HUB_HEAD}", "draft")
    assert named.kind == "hub" and named.ref.repo_id == HUB_HEAD  # fetched, not a keyword passed through
    fetched = str(heads["fits"])  # where the download went
    expected = (DraftChoice.eagle3(fetched), DraftChoice.eagle3(HUB_HEAD))  # loads the folder, remembers the id
    assert named.as_draft(fetched) == expected
    assert draft_source(DraftChoice.eagle3(HUB_HEAD)).as_draft(fetched) == expected  # the catalog's, a recent's
    assert classify(HUB_HEAD, "draft").as_draft(fetched) == expected  # a plain link: the folder says it is a head
    local = str(heads["fits"])
    assert classify(local, "draft").as_draft() == (DraftChoice.eagle3(local),) * 2
    assert draft_source(DraftChoice.eagle3(local)).as_draft() == (DraftChoice.eagle3(local),) * 2


def test_a_head_is_checked_against_the_target_on_its_config_before_its_weights(heads):
    from app.models.precheck import PairPart, local_part, precheck_pair

    target = local_part(heads["target"])
    assert precheck_pair(target, local_part(heads["fits"]), "torch") == ""  # no tokenizer asked of a head
    # as the download has it: the config here, the weights' size from the hub's list
    assert precheck_pair(target, PairPart(heads["config_only"], 300_000), "torch") == ""
    with pytest.raises(ModelFileError, match="drafts for a model 128 wide"):
        precheck_pair(target, local_part(heads["wide"]), "torch")


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "hub"


def _pairing(folder: Path, endpoint: str | None = None, draft: DraftChoice = PROMPT_LOOKUP):
    from ui.pairing.controller import PairController
    from ui.pairing.downloads import DownloadStrip

    pairing = PairController(DownloadStrip(), backend="torch", endpoint=endpoint)
    pairing.loaded = SimpleNamespace(folder=folder, backend="torch", device="cpu", weights_bytes=0, draft_bytes=0,
                                     context_length=512, draft=draft)
    return pairing


def test_a_hub_head_downloads_then_the_runner_loads_it_from_the_hub_cache(qtbot, heads, hub_cache):
    from app.runner import Runner
    from tests.fake_hub import FakeHub

    with FakeHub() as server:
        server.add_folder(HUB_HEAD, heads["fits"])
        pairing = _pairing(heads["target"], server.endpoint)
        with qtbot.waitSignal(pairing.request_pair, timeout=30_000) as asked:
            pairing.choose_draft(DraftChoice.eagle3(HUB_HEAD))
    request = asked.args[0]
    folder = Path(request.draft.source)
    assert request.draft.kind is DraftKind.EAGLE3 and hub_cache in folder.parents  # the snapshot, to load
    assert request.named()[1] == DraftChoice.eagle3(HUB_HEAD)  # remembered by the id
    assert any(path.endswith("model.safetensors") for method, path, _ in server.requests if method == "GET")
    # the runner, told the id (the command line, a recent pair), finds the download in the cache
    loaded = Runner().load(heads["target"], "torch", DraftChoice.eagle3(HUB_HEAD), progress=lambda m: None)
    assert loaded.draft == DraftChoice.eagle3(str(folder)) and loaded.draft_words()[0] == "EAGLE-3 head"
    assert loaded.draft_bytes > 0


def test_a_hub_head_for_another_model_is_refused_before_its_weights_come(qtbot, heads, hub_cache):
    from tests.fake_hub import FakeHub

    with FakeHub() as server:
        server.add_folder("tandem-tests/wide-head", heads["wide"])
        pairing = _pairing(heads["target"], server.endpoint)
        with qtbot.waitSignal(pairing.error, timeout=30_000) as said:
            pairing.choose_draft(DraftChoice.eagle3("tandem-tests/wide-head"))
    assert "drafts for a model 128 wide" in said.args[0]
    assert not [path for method, path, _ in server.requests if method == "GET" and path.endswith(".safetensors")]


def test_the_runner_says_a_hub_head_is_not_downloaded_before_loading_anything(tiny_pair, hub_cache):
    from app.runner import Runner

    said, runner = [], Runner()
    with pytest.raises(ModelFileError, match=f"{HUB_HEAD} is not downloaded yet.*Draft slot"):
        runner.load(tiny_pair["target"], "torch", DraftChoice.eagle3(HUB_HEAD), progress=said.append)
    assert runner.target is None and not any(line.startswith("Loading") for line in said)


def test_a_new_target_does_not_keep_a_head_made_for_the_old_one(qapp, heads, tiny_pair):
    from ui.worker import PairRequest

    pairing = _pairing(heads["target"])
    pairing.current = PairRequest(str(heads["target"]), DraftChoice.eagle3(str(heads["fits"])), "torch")
    asked = []
    pairing.request_pair.connect(asked.append)
    pairing.choose("target", str(tiny_pair["near"]))
    assert [(r.target, r.draft) for r in asked] == [(str(tiny_pair["near"]), AUTO_DRAFT)]


# The Draft slot's menu

def test_the_heads_beside_a_target_are_those_that_fit_it(heads):
    from app.models.head_sources import heads_beside

    # not the wide one, not the plain folder
    assert heads_beside(heads["target"]) == [DraftChoice.eagle3(str(heads["fits"]))]
    assert heads_beside(heads["fits"]) == []  # a head beside a head: no target config to fit


def _entries(menu) -> dict:
    return {action.text(): action for action in menu.actions() if action.text().startswith("EAGLE-3 head")}


def test_the_draft_menu_offers_a_head_beside_the_target_and_checks_it_in_use(qapp, heads, tmp_path):
    from PySide6.QtWidgets import QWidget

    from ui.pairing.slot_menu import build_slot_menu

    parent = QWidget()
    pairing = _pairing(heads["target"])
    entries = _entries(build_slot_menu("draft", pairing, parent))
    assert list(entries) == ["EAGLE-3 head: tiny-eagle3 (beside the model)"]
    offered = entries["EAGLE-3 head: tiny-eagle3 (beside the model)"]
    assert offered.isCheckable() and not offered.isChecked()
    asked = []
    pairing.request_pair.connect(asked.append)
    offered.trigger()
    assert [r.draft for r in asked] == [DraftChoice.eagle3(str(heads["fits"]))]
    pairing.loaded.draft = DraftChoice.eagle3(str(heads["fits"]))  # as Runner.load names it
    menu = build_slot_menu("draft", pairing, parent)
    assert _entries(menu)["EAGLE-3 head: tiny-eagle3 (beside the model)"].isChecked()
    lookup = next(a for a in menu.actions() if a.text().startswith("Prompt lookup"))
    assert not lookup.isChecked()
    assert not _entries(build_slot_menu("target", pairing, parent))  # a head is never a target
    _screenshot(menu, tmp_path / "beside.png")


def test_the_draft_menu_offers_the_catalogs_head_for_its_target_and_fetches_it(qtbot, heads, hub_cache, tmp_path):
    from PySide6.QtWidgets import QWidget

    from tests.fake_hub import FakeHub
    from ui.pairing.slot_menu import build_slot_menu
    from ui.worker import PairRequest

    parent = QWidget()
    pairing = _pairing(heads["fits"])  # nothing beside it: only the catalog's head is offered
    pairing.current = PairRequest(str(heads["fits"]), PROMPT_LOOKUP, "torch", target_name=LLAMA)
    entries = _entries(build_slot_menu("draft", pairing, parent))
    assert list(entries) == [f"EAGLE-3 head: {HEAD_ID} (1.9 GB download)"]
    _screenshot(build_slot_menu("draft", pairing, parent), tmp_path / "catalog.png")
    pairing.loaded.folder = heads["target"]  # the head stands in for RedHatAI's: it fits the tiny target
    with FakeHub() as server:
        server.add_folder(HEAD_ID, heads["fits"])
        pairing.endpoint = server.endpoint
        with qtbot.waitSignal(pairing.request_pair, timeout=30_000) as asked:
            entries[f"EAGLE-3 head: {HEAD_ID} (1.9 GB download)"].trigger()
    assert asked.args[0].named()[1] == DraftChoice.eagle3(HEAD_ID)
    pairing.current = asked.args[0]
    pairing.loaded.draft = asked.args[0].draft
    pairing.loaded.folder = heads["fits"]
    menu = build_slot_menu("draft", pairing, parent)
    entries = _entries(menu)
    assert list(entries) == [f"EAGLE-3 head: {HEAD_ID} (downloaded)"]
    assert entries[f"EAGLE-3 head: {HEAD_ID} (downloaded)"].isChecked()
    _screenshot(menu, tmp_path / "catalog-in-use.png")


def _screenshot(menu, path: Path) -> None:
    """The menu as it shows (for a person to look at: TANDEM_MENU_SHOTS names a folder to keep them)."""
    menu.popup(menu.parentWidget().mapToGlobal(menu.parentWidget().rect().topLeft()))
    image = menu.grab()
    keep = os.environ.get("TANDEM_MENU_SHOTS")
    image.save(str(Path(keep) / path.name if keep else path))
    menu.hide()
    assert not image.isNull()


# "auto"

def _trial(speedup: float, low: float, high: float):
    from app.models.pair_memory import TrialResult

    return TrialResult(acceptance=0.5, speedup=speedup, tokens_per_pass=2.0, tokens=40, measured_at=0.0,
                       low=low, high=high)


def test_auto_drafts_with_a_head_measured_faster_than_prompt_lookup_beyond_both_ranges(heads, tmp_path):
    from app.models.pair_memory import PairMemory, measured_head

    target, head = str(heads["target"]), DraftChoice.eagle3(str(heads["fits"]))
    memory = PairMemory(tmp_path / "pairs.json")
    assert measured_head("torch", target, memory) is None  # nothing measured
    memory.set_trial("torch", target, AUTO_DRAFT, _trial(1.3, 1.2, 1.4))  # "auto" while it meant prompt lookup
    memory.set_trial("torch", target, head, _trial(1.5, 1.35, 1.6))  # the ranges overlap: no claim
    assert measured_head("torch", target, memory) is None
    memory.set_trial("torch", target, head, _trial(1.8, 1.6, 1.9))
    assert measured_head("torch", target, memory) == head
    assert measured_head("mlx", target, memory) is None  # measured on the other backend only
    memory.set_trial("torch", target, PROMPT_LOOKUP, _trial(1.8, 1.7, 2.0))  # lookup's own trial rules
    assert measured_head("torch", target, memory) is None


def test_auto_finds_a_hub_targets_trials_by_its_id_and_skips_a_head_no_longer_here(heads, tmp_path, hub_cache):
    from app.models.pair_memory import PairMemory, measured_head

    snapshot = hub_cache / "models--meta-llama--Llama-3.1-8B-Instruct" / "snapshots" / "0123abcd"
    memory = PairMemory(tmp_path / "pairs.json")
    memory.set_trial("torch", LLAMA, PROMPT_LOOKUP, _trial(1.1, 1.0, 1.2))
    memory.set_trial("torch", LLAMA, DraftChoice.eagle3(HEAD_ID), _trial(2.5, 2.2, 2.8))  # not downloaded
    assert measured_head("torch", str(snapshot), memory) is None
    memory.set_trial("torch", LLAMA, DraftChoice.eagle3(str(heads["fits"])), _trial(2.0, 1.9, 2.1))
    assert measured_head("torch", str(snapshot), memory) == DraftChoice.eagle3(str(heads["fits"]))


def test_auto_loads_the_measured_head(heads):
    from app.models.pair_memory import PairMemory
    from app.runner import Runner, auto_draft

    target, head = str(heads["target"]), DraftChoice.eagle3(str(heads["fits"]))
    assert auto_draft(target, "torch") == PROMPT_LOOKUP  # unchanged until a trial says otherwise
    memory = PairMemory()  # the window's own file (a private one per test)
    memory.set_trial("torch", target, PROMPT_LOOKUP, _trial(1.2, 1.1, 1.3))
    memory.set_trial("torch", target, head, _trial(1.9, 1.7, 2.0))
    assert auto_draft(target, "torch") == head
    loaded = Runner().load(target, "torch", AUTO_DRAFT, progress=lambda m: None)
    assert loaded.draft == head


# models info

def test_models_info_describes_a_head(heads, capsys):
    from app.cli import main

    assert main(["models", "info", str(heads["fits"])]) == 0
    said = capsys.readouterr().out
    assert "tiny-eagle3: EAGLE-3 head (speculators layout), 1 llama decoder layer 64 wide" in said
    assert "reading the states entering the target's layers 0, 1, 2" in said
    assert f"--draft eagle3:{heads['fits']}" in said and "Unrecognized model" not in said
