"""DFlash block drafters in pairing (issue 36, item 4), as EAGLE-3 heads are
(tests/test_eagle3_pairing.py): the catalog lists Qwen3 8B with z-lab's DFlash drafter; a drafter
named by hub id ("dflash:<id>", the catalog's, the Draft slot's) is fetched as a model is, checked
against the target on its config before its weights come, and then loads from the hub's cache;
the Draft slot offers the drafters beside the target that fit it (beside EAGLE-3 heads) and the
catalog's drafter for it, with a check on the one in use; "auto" drafts with a drafter the pair
trials measured faster than prompt lookup beyond both ranges, the fastest of both kinds;
`models info` describes a drafter; the help names hub ids. Nothing is downloaded from the real
hub: a local server stands in for it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from app.draft_choice import AUTO_DRAFT, PROMPT_LOOKUP, DraftChoice, DraftKind  # noqa: E402
from app.models.errors import ModelFileError  # noqa: E402
from tests.dflash_training import draft_config, spec, write_drafter  # noqa: E402

QWEN = "Qwen/Qwen3-8B"
DRAFTER_ID = "z-lab/Qwen3-8B-DFlash-b16"
HUB_DRAFTER = "tandem-tests/dflash-drafter"


def _config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())


def _drafter(target_config: dict, folder: Path, hidden: int) -> Path:
    """A random drafter reading the output of the target's layer 0 (the state entering its layer 1)."""
    import torch

    from app.engine.backends.dflash_torch import DFlashModules, layer_config

    config = draft_config(hidden=hidden, vocab=target_config["vocab_size"], layers=(0,),
                          target_layers=target_config["num_hidden_layers"])
    torch.manual_seed(4)
    return write_drafter(DFlashModules(spec(config, (1,)), layer_config(spec(config, (1,)))), folder, config)


@pytest.fixture(scope="module")
def drafters(tiny_pair, tmp_path_factory) -> dict[str, Path]:
    """Beside a link to the tiny target: a DFlash drafter made for it, an EAGLE-3 head made for it,
    a drafter made for a model twice as wide, and a plain folder; and the fitting drafter's config
    alone (a hub drafter before its weights)."""
    from tests.eagle3_training import random_head, write_head

    root = tmp_path_factory.mktemp("beside")
    (root / "target").symlink_to(tiny_pair["target"], target_is_directory=True)
    config = _config(tiny_pair["target"])
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    fits = _drafter(config, root / "tiny-dflash", hidden)
    wide = _drafter(config, root / "wide-dflash", hidden * 2)
    eagle3 = write_head(random_head(3, hidden, vocab, (0, 1, 2)), root / "tiny-eagle3", layers=(0, 1, 2))
    (root / "notes").mkdir()
    (root / "notes" / "config.json").write_text("{}")
    config_only = tmp_path_factory.mktemp("config-only") / "tiny-dflash"
    config_only.mkdir()
    (config_only / "config.json").write_text((fits / "config.json").read_text())
    return {"target": root / "target", "fits": fits, "wide": wide, "eagle3": eagle3, "config_only": config_only}


# The catalog

def test_the_catalog_lists_qwen3_8b_with_its_dflash_drafter():
    from app.models.catalog import CATALOG_KINDS, _draft, catalog_head, load_catalog

    assert DraftKind.DFLASH in CATALOG_KINDS
    pair = {p.id: p for p in load_catalog("torch")}["qwen3-8b-dflash-torch"]
    assert pair.specs == (QWEN, DraftChoice.dflash(DRAFTER_ID)) and pair.draft_kind is DraftKind.DFLASH
    assert not pair.target.gated and pair.target.size_gb == 16.4 and pair.draft.size_gb == 2.1
    assert pair.size_gb == pytest.approx(18.5)
    assert "estimated from the parameter count" in pair.note and "exact total from the hub" in pair.note
    assert "block of 16" in pair.note and "embedding and head" in pair.note
    assert catalog_head(QWEN, DraftKind.DFLASH).repo == DRAFTER_ID
    assert catalog_head("meta-llama/Llama-3.1-8B-Instruct", DraftKind.DFLASH) is None
    assert catalog_head(QWEN, DraftKind.EAGLE3) is None  # each kind its own
    assert _draft({"id": "x", "draft": {"kind": "dflash", "repo": "a/b", "size_gb": 1}})[1] is DraftKind.DFLASH
    about = json.loads((Path(__file__).parents[1] / "resources" / "catalog.json").read_text())["about"]
    assert 'kind "dflash"' in about


# Sources: what the Draft slot fetches, and what the runner then loads

def test_a_hub_drafter_is_fetched_like_a_model_then_drafts_as_a_dflash_drafter(drafters):
    from app.models.sources import classify, draft_source

    named = classify(f"dflash:{HUB_DRAFTER}", "draft")
    assert named.kind == "hub" and named.ref.repo_id == HUB_DRAFTER  # fetched, not a keyword passed through
    fetched = str(drafters["fits"])  # where the download went
    expected = (DraftChoice.dflash(fetched), DraftChoice.dflash(HUB_DRAFTER))  # loads the folder, remembers the id
    assert named.as_draft(fetched) == expected
    assert draft_source(DraftChoice.dflash(HUB_DRAFTER)).as_draft(fetched) == expected  # the catalog's, a recent's
    assert classify(HUB_DRAFTER, "draft").as_draft(fetched) == expected  # a plain link: the folder says what it is
    local = str(drafters["fits"])
    assert classify(local, "draft").as_draft() == (DraftChoice.dflash(local),) * 2
    assert draft_source(DraftChoice.dflash(local)).as_draft() == (DraftChoice.dflash(local),) * 2


def test_a_drafter_is_checked_against_the_target_on_its_config_before_its_weights(drafters):
    from app.models.dflash_head import read_dflash
    from app.models.precheck import PairPart, local_part, precheck_pair

    target = local_part(drafters["target"])
    assert precheck_pair(target, local_part(drafters["fits"]), "torch") == ""  # no tokenizer asked of a drafter
    # as the download has it: the config here, the weights' size from the hub's list
    assert precheck_pair(target, PairPart(drafters["config_only"], 300_000), "torch") == ""
    with pytest.raises(ModelFileError, match="drafts for a model 128 wide"):
        precheck_pair(target, local_part(drafters["wide"]), "torch")
    config = _config(drafters["target"])
    assert read_dflash(drafters["config_only"], config, weights=False).block_size == 4
    with pytest.raises(ModelFileError, match="model.safetensors is missing"):  # the weights, once they should be here
        read_dflash(drafters["config_only"], config)


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


def test_a_hub_drafter_downloads_then_the_runner_loads_it_from_the_hub_cache(qtbot, drafters, hub_cache):
    from app.runner import Runner
    from tests.fake_hub import FakeHub

    with FakeHub() as server:
        server.add_folder(HUB_DRAFTER, drafters["fits"])
        pairing = _pairing(drafters["target"], server.endpoint)
        with qtbot.waitSignal(pairing.request_pair, timeout=30_000) as asked:
            pairing.choose_draft(DraftChoice.dflash(HUB_DRAFTER))
    request = asked.args[0]
    folder = Path(request.draft.source)
    assert request.draft.kind is DraftKind.DFLASH and hub_cache in folder.parents  # the snapshot, to load
    assert request.named()[1] == DraftChoice.dflash(HUB_DRAFTER)  # remembered by the id
    assert any(path.endswith("model.safetensors") for method, path, _ in server.requests if method == "GET")
    # the runner, told the id (the command line, a recent pair), finds the download in the cache
    loaded = Runner().load(drafters["target"], "torch", DraftChoice.dflash(HUB_DRAFTER), progress=lambda m: None)
    assert loaded.draft == DraftChoice.dflash(str(folder)) and loaded.draft_words()[0] == "DFlash drafter"
    assert loaded.draft_bytes > 0


def test_a_hub_drafter_for_another_model_is_refused_before_its_weights_come(qtbot, drafters, hub_cache):
    from tests.fake_hub import FakeHub

    with FakeHub() as server:
        server.add_folder("tandem-tests/wide-drafter", drafters["wide"])
        pairing = _pairing(drafters["target"], server.endpoint)
        with qtbot.waitSignal(pairing.error, timeout=30_000) as said:
            pairing.choose_draft(DraftChoice.dflash("tandem-tests/wide-drafter"))
    assert "drafts for a model 128 wide" in said.args[0]
    assert not [path for method, path, _ in server.requests if method == "GET" and path.endswith(".safetensors")]


def test_the_runner_says_a_hub_drafter_is_not_downloaded_before_loading_anything(tiny_pair, hub_cache):
    from app.runner import Runner

    said, runner = [], Runner()
    with pytest.raises(ModelFileError, match=f"DFlash drafter {HUB_DRAFTER} is not downloaded yet.*Draft slot"):
        runner.load(tiny_pair["target"], "torch", DraftChoice.dflash(HUB_DRAFTER), progress=said.append)
    assert runner.target is None and not any(line.startswith("Loading") for line in said)


def test_a_new_target_does_not_keep_a_drafter_made_for_the_old_one(qapp, drafters, tiny_pair):
    from ui.worker import PairRequest

    pairing = _pairing(drafters["target"])
    pairing.current = PairRequest(str(drafters["target"]), DraftChoice.dflash(str(drafters["fits"])), "torch")
    asked = []
    pairing.request_pair.connect(asked.append)
    pairing.choose("target", str(tiny_pair["near"]))
    assert [(r.target, r.draft) for r in asked] == [(str(tiny_pair["near"]), AUTO_DRAFT)]


# The Draft slot's menu

def test_the_drafters_beside_a_target_are_those_that_fit_it_of_either_kind(drafters):
    from app.models.head_sources import heads_beside

    # not the wide one, not the plain folder; both kinds, by folder name
    assert heads_beside(drafters["target"]) == [DraftChoice.dflash(str(drafters["fits"])),
                                                DraftChoice.eagle3(str(drafters["eagle3"]))]
    assert heads_beside(drafters["fits"]) == []  # a drafter beside a drafter: no target config to fit


def _entries(menu) -> dict:
    return {action.text(): action for action in menu.actions() if action.text().startswith("DFlash drafter")}


def test_the_draft_menu_offers_a_drafter_beside_the_target_and_checks_it_in_use(qapp, drafters, tmp_path):
    from PySide6.QtWidgets import QWidget

    from ui.pairing.slot_menu import build_slot_menu

    parent = QWidget()
    pairing = _pairing(drafters["target"])
    menu = build_slot_menu("draft", pairing, parent)
    entries = _entries(menu)
    assert list(entries) == ["DFlash drafter: tiny-dflash (beside the model)"]
    assert "EAGLE-3 head: tiny-eagle3 (beside the model)" in [a.text() for a in menu.actions()]  # beside it
    offered = entries["DFlash drafter: tiny-dflash (beside the model)"]
    assert offered.isCheckable() and not offered.isChecked()
    assert "block" in offered.toolTip() and str(drafters["fits"]) in offered.toolTip()
    asked = []
    pairing.request_pair.connect(asked.append)
    offered.trigger()
    assert [r.draft for r in asked] == [DraftChoice.dflash(str(drafters["fits"]))]
    pairing.loaded.draft = DraftChoice.dflash(str(drafters["fits"]))  # as Runner.load names it
    menu = build_slot_menu("draft", pairing, parent)
    assert _entries(menu)["DFlash drafter: tiny-dflash (beside the model)"].isChecked()
    others = [a for a in menu.actions() if a.text().startswith(("Prompt lookup", "EAGLE-3 head"))]
    assert len(others) == 2 and not any(a.isChecked() for a in others)
    assert not _entries(build_slot_menu("target", pairing, parent))  # a drafter is never a target
    _screenshot(menu, tmp_path / "dflash-beside.png")


def test_the_draft_menu_offers_the_catalogs_drafter_for_its_target_and_fetches_it(qtbot, drafters, hub_cache,
                                                                                   tmp_path):
    from PySide6.QtWidgets import QWidget

    from tests.fake_hub import FakeHub
    from ui.pairing.slot_menu import build_slot_menu
    from ui.worker import PairRequest

    parent = QWidget()
    pairing = _pairing(drafters["fits"])  # nothing beside it: only the catalog's drafter is offered
    pairing.current = PairRequest(str(drafters["fits"]), PROMPT_LOOKUP, "torch", target_name=QWEN)
    entries = _entries(build_slot_menu("draft", pairing, parent))
    assert list(entries) == [f"DFlash drafter: {DRAFTER_ID} (2.1 GB download)"]
    assert "fetched from the Hugging Face hub" in entries[f"DFlash drafter: {DRAFTER_ID} (2.1 GB download)"].toolTip()
    _screenshot(build_slot_menu("draft", pairing, parent), tmp_path / "dflash-catalog.png")
    pairing.loaded.folder = drafters["target"]  # the drafter stands in for z-lab's: it fits the tiny target
    with FakeHub() as server:
        server.add_folder(DRAFTER_ID, drafters["fits"])
        pairing.endpoint = server.endpoint
        with qtbot.waitSignal(pairing.request_pair, timeout=30_000) as asked:
            entries[f"DFlash drafter: {DRAFTER_ID} (2.1 GB download)"].trigger()
    assert asked.args[0].named()[1] == DraftChoice.dflash(DRAFTER_ID)
    pairing.current = asked.args[0]
    pairing.loaded.draft = asked.args[0].draft
    pairing.loaded.folder = drafters["fits"]
    menu = build_slot_menu("draft", pairing, parent)
    entries = _entries(menu)
    assert list(entries) == [f"DFlash drafter: {DRAFTER_ID} (downloaded)"]
    assert entries[f"DFlash drafter: {DRAFTER_ID} (downloaded)"].isChecked()
    _screenshot(menu, tmp_path / "dflash-catalog-in-use.png")


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


def test_auto_drafts_with_a_drafter_measured_faster_than_prompt_lookup_beyond_both_ranges(drafters, tmp_path):
    from app.models.pair_memory import PairMemory, measured_head

    target, drafter = str(drafters["target"]), DraftChoice.dflash(str(drafters["fits"]))
    memory = PairMemory(tmp_path / "pairs.json")
    assert measured_head("torch", target, memory) is None  # nothing measured
    memory.set_trial("torch", target, AUTO_DRAFT, _trial(1.3, 1.2, 1.4))  # "auto" while it meant prompt lookup
    memory.set_trial("torch", target, drafter, _trial(1.5, 1.35, 1.6))  # the ranges overlap: no claim
    assert measured_head("torch", target, memory) is None
    memory.set_trial("torch", target, drafter, _trial(2.4, 2.2, 2.6))
    assert measured_head("torch", target, memory) == drafter
    assert measured_head("mlx", target, memory) is None  # measured on the other backend only
    # an EAGLE-3 head that also clears: the faster of the two
    head = DraftChoice.eagle3(str(drafters["eagle3"]))
    memory.set_trial("torch", target, head, _trial(1.9, 1.7, 2.0))
    assert measured_head("torch", target, memory) == drafter
    memory.set_trial("torch", target, head, _trial(2.8, 2.7, 2.9))
    assert measured_head("torch", target, memory) == head
    memory.set_trial("torch", target, PROMPT_LOOKUP, _trial(3.0, 2.95, 3.1))  # lookup's own trial rules
    assert measured_head("torch", target, memory) is None


def test_auto_finds_a_hub_targets_trials_by_its_id_and_skips_a_drafter_no_longer_here(drafters, tmp_path,
                                                                                      hub_cache):
    from app.models.pair_memory import PairMemory, measured_head

    snapshot = hub_cache / "models--Qwen--Qwen3-8B" / "snapshots" / "0123abcd"
    memory = PairMemory(tmp_path / "pairs.json")
    memory.set_trial("torch", QWEN, PROMPT_LOOKUP, _trial(1.1, 1.0, 1.2))
    memory.set_trial("torch", QWEN, DraftChoice.dflash(DRAFTER_ID), _trial(2.5, 2.2, 2.8))  # not downloaded
    assert measured_head("torch", str(snapshot), memory) is None
    memory.set_trial("torch", QWEN, DraftChoice.dflash(str(drafters["fits"])), _trial(2.0, 1.9, 2.1))
    assert measured_head("torch", str(snapshot), memory) == DraftChoice.dflash(str(drafters["fits"]))
    # a folder that is no longer a DFlash drafter (replaced by an EAGLE-3 head) is not offered as one
    memory.set_trial("torch", QWEN, DraftChoice.dflash(str(drafters["eagle3"])), _trial(2.6, 2.5, 2.7))
    assert measured_head("torch", str(snapshot), memory) == DraftChoice.dflash(str(drafters["fits"]))


def test_auto_loads_the_measured_drafter(drafters):
    from app.models.pair_memory import PairMemory
    from app.runner import Runner, auto_draft

    target, drafter = str(drafters["target"]), DraftChoice.dflash(str(drafters["fits"]))
    assert auto_draft(target, "torch") == PROMPT_LOOKUP  # unchanged until a trial says otherwise
    memory = PairMemory()  # the window's own file (a private one per test)
    memory.set_trial("torch", target, PROMPT_LOOKUP, _trial(1.2, 1.1, 1.3))
    memory.set_trial("torch", target, drafter, _trial(1.9, 1.7, 2.0))
    assert auto_draft(target, "torch") == drafter
    loaded = Runner().load(target, "torch", AUTO_DRAFT, progress=lambda m: None)
    assert loaded.draft == drafter


# models info, and the help

def test_models_info_describes_a_drafter(drafters, capsys):
    from app.cli import main

    assert main(["models", "info", str(drafters["fits"])]) == 0
    said = capsys.readouterr().out
    assert "tiny-dflash: DFlash block drafter, 1 qwen3 decoder layer 64 wide for a target of 2 layers" in said
    assert "drafts a block of 4 (up to 3 tokens a pass) from mask token 0" in said
    assert "reading the states entering the target's layers 1, with the target's embedding and head" in said
    assert f"--draft dflash:{drafters['fits']}" in said and "Unrecognized model" not in said


def test_the_help_says_a_drafter_is_named_by_its_folder_or_hub_id(monkeypatch, capsys):
    from app.cli import main as cli
    from app.draft_choice import ACCEPTED, DraftChoiceError
    from ui.main import main as window

    monkeypatch.setenv("COLUMNS", "2000")  # argparse wraps at the terminal's width: one line per option
    for run, argv in ((cli, ["generate", "--help"]), (cli, ["bench", "--help"]), (cli, ["serve", "--help"]),
                      (window, ["--help"])):
        with pytest.raises(SystemExit):
            run(argv)
        said = capsys.readouterr().out
        assert '"eagle3:<folder or hub id>"' in said and '"dflash:<folder or hub id>"' in said, argv
    assert '"dflash:<folder or hub id>"' in ACCEPTED
    with pytest.raises(DraftChoiceError, match="DFlash drafter published for the model, or its Hugging Face id"):
        DraftChoice.parse("dflash:")
