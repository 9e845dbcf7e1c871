"""What a dropped or typed text means, the catalog, and what is remembered about pairs."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from app.draft_choice import AUTO_DRAFT, DraftChoice, DraftKind
from app.models.catalog import DEMO_PAIR, load_catalog
from app.models.errors import ModelFileError
from app.models.pair_memory import MAX_RECENT, PairMemory, TrialResult, read_trial
from app.models.sources import classify, drag_verdict


def test_local_folders_files_and_keywords(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert classify(str(folder)).kind == "folder"
    assert classify(f"file://{folder}").value == str(folder)
    assert classify(str(folder / "config.json")).value == str(folder)  # a file of a model folder
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    assert classify(str(gguf)).kind == "gguf"
    assert classify("Prompt lookup", "draft").value == "ngram"
    assert classify("none", "draft").value == "none"
    assert classify("Self:INT4", "draft").keyword == DraftChoice.self_draft("int4")
    assert classify("demo").kind == "demo"


def test_hub_references():
    source = classify("https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct/tree/main")
    assert (source.kind, source.value) == ("hub", "Qwen/Qwen2.5-0.5B-Instruct")
    assert classify("HuggingFaceTB/SmolLM2-135M-Instruct").ref.repo_id == "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.mark.parametrize("text, phrase", [
    ("", "Nothing to load"),
    ("/no/such/place", "no such file"),
    ("ngram", "drop it on the Draft slot"),  # a keyword is not a target
    ("just some words", "neither a file on this computer nor a Hugging Face model"),
])
def test_what_cannot_be_a_model_says_why(text, phrase):
    with pytest.raises(ModelFileError, match=phrase):
        classify(text, "target")


@pytest.mark.parametrize("text, phrase", [
    ("self:int3", "'int3' is not a precision a self-draft loads at"),
    ("self:", "no precision named"),
    ("model", "loads nothing"),  # a chat's setting, not a draft to load
])
def test_a_draft_keyword_that_names_nothing_to_load_says_why(text, phrase):
    with pytest.raises(ModelFileError, match=phrase):
        classify(text, "draft")


def test_pickled_and_stray_files_are_refused(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ModelFileError, match="arbitrary code"):
        classify(str(tmp_path / "pytorch_model.bin"))
    with pytest.raises(ModelFileError, match="not a model"):
        classify(str(tmp_path / "notes.txt"))


def test_drag_verdict_is_empty_only_for_what_looks_usable(tmp_path):
    assert drag_verdict(str(tmp_path), "target") == "no config.json: not a model folder"
    (tmp_path / "config.json").write_text("{}")
    assert drag_verdict(str(tmp_path), "target") == ""
    assert drag_verdict("Qwen/Qwen2.5-0.5B-Instruct", "draft") == ""


def test_catalog_pairs_per_backend_demo_first():
    for backend in ("mlx", "torch"):
        pairs = load_catalog(backend)
        assert pairs[0] is DEMO_PAIR and pairs[0].specs == ("demo", AUTO_DRAFT)
        # PyTorch's float32 reference pair, one click from the fast default (MLX's demo is float32)
        reference = [p for p in pairs if p.id == "demo-float32"]
        int4 = DraftChoice.self_draft("int4")
        assert [p.specs for p in reference] == ([("demo:float32", int4)] if backend == "torch" else [])
        downloads = [p for p in pairs if not p.id.startswith("demo")]
        assert len(downloads) >= 3 and all(p.backend == backend for p in pairs[1:])
        for pair in downloads:
            if pair.draft is None:  # the target's own MTP layer: nothing more to fetch
                assert pair.specs[1].kind is DraftKind.MTP
                continue
            assert pair.target.size_gb > pair.draft.size_gb > 0  # the draft is the small one
            assert "/" in pair.target.repo and "/" in pair.draft.repo
    titles = " ".join(p.title for p in load_catalog("mlx"))
    for family in ("Qwen2.5 7B", "Qwen2.5 32B", "Llama 3.1 8B", "SmolLM2 1.7B"):
        assert family in titles


def test_recent_pairs_newest_first_without_duplicates(tmp_path):
    memory = PairMemory(tmp_path / "pairs.json")
    for i in range(MAX_RECENT + 2):
        memory.add_recent("torch", f"t{i}", DraftChoice.model("d"), f"pair {i}")
    memory.add_recent("torch", "t5", DraftChoice.model("d"), "pair 5 again")
    again = PairMemory(tmp_path / "pairs.json")  # read back from disk
    recent = again.recent("torch")
    assert len(recent) == MAX_RECENT and recent[0]["title"] == "pair 5 again"
    assert [r["target"] for r in recent].count("t5") == 1
    assert again.recent("mlx") == []


def test_trial_results_are_kept_per_pair_and_a_damaged_file_is_set_aside(tmp_path):
    path = tmp_path / "pairs.json"
    memory = PairMemory(path)
    result = TrialResult(acceptance=0.71, speedup=2.14, tokens_per_pass=3.2, tokens=120, measured_at=1.0)
    memory.set_trial("torch", "a", DraftChoice.model("b"), result)
    assert PairMemory(path).trial("torch", "a", DraftChoice.model("b")) == result
    assert PairMemory(path).trial("torch", "a", DraftChoice.model("c")) is None
    assert result.summary() == "accepts 71%, about 2.1x faster here"  # remembered before trials had a range
    assert "slower" in TrialResult(0.1, 0.8, 1.1, 10, 1.0).summary()
    ranged = TrialResult(0.71, 2.14, 3.2, 120, 1.0, low=2.05, high=2.2)
    memory.set_trial("torch", "a", DraftChoice.model("r"), ranged)
    assert PairMemory(path).trial("torch", "a", DraftChoice.model("r")) == ranged
    assert ranged.summary() == "accepts 71%, 2.1x faster here (2.05-2.20x)"
    # a claim only where the whole range makes it
    assert TrialResult(0.3, 1.08, 1.4, 80, 1.0, low=0.98, high=1.15).summary() == (
        "accepts 30%, about as fast as the target alone here (0.98-1.15x)")
    assert "slower" in TrialResult(0.1, 0.8, 1.1, 10, 1.0, low=0.75, high=0.9).summary()
    # the side panel's rule: a range that clears 1 makes the claim; a lone figure needs a margin
    assert "slower" in TrialResult(0.1, 0.9, 1.1, 10, 1.0, low=0.85, high=0.97).summary()
    assert "1.0x faster here" in TrialResult(0.5, 1.04, 1.5, 80, 1.0, low=1.01, high=1.08).summary()
    assert "slower" not in TrialResult(0.1, 0.97, 1.1, 10, 1.0).summary()
    assert "faster" not in TrialResult(0.1, 1.03, 1.1, 10, 1.0).summary()
    # an alignment's trials are read as carefully: a damaged one is none, not a crash in the card
    memory.set_alignment("torch", "a", DraftChoice.model("r"), DraftChoice.model("b"), result, ranged, (0.1, 0.5))
    data = json.loads(path.read_text())
    entry = next(iter(data["alignments"].values()))
    entry["after"]["low"], entry["before"]["high"] = "x", 3.0  # not a number; half a range
    path.write_text(json.dumps(data))
    found = PairMemory(path).alignment("torch", "a")
    assert found is not None and found["before"] is None and found["after"] is None
    assert read_trial({**asdict(ranged), "low": 2.3}) is None  # upside down
    assert read_trial({**asdict(ranged), "extra": 1}) is None and read_trial(asdict(ranged)) == ranged
    path.write_text("{not json")
    fresh = PairMemory(path)
    assert fresh.recent() == [] and list(tmp_path.glob("pairs.damaged-*"))
    fresh.add_recent("torch", "x", DraftChoice.model("y"), "x + y")
    assert json.loads(path.read_text())["recent"][0]["target"] == "x"
