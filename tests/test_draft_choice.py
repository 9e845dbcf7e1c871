"""The draft choice is one typed value (app/draft_choice.py): every spelling earlier versions
wrote or took parses into it, its text form reads back the same, and text that names no draft
is refused with words that say what was wrong and what is accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.chat.settings import ChatSettings
from app.draft_choice import (ARGUMENTS, AUTO_DRAFT, NO_DRAFT, PAIR_DRAFT, PAIR_MODEL_ONLY, PREFIXES, PROMPT_LOOKUP,
                              REQUEST_CHOICES, SELF_PRECISIONS, WORDS, DraftChoice, DraftChoiceError, DraftKind)
from app.models.pair_memory import PairMemory, TrialResult

# Every spelling of a draft an earlier version wrote to a file, took on the command line, or
# took on the Draft slot, and what it means
OLD_SPELLINGS = {
    "none": NO_DRAFT,
    "ngram": PROMPT_LOOKUP,
    "lookup": PROMPT_LOOKUP,
    "prompt lookup": PROMPT_LOOKUP,
    "Prompt lookup": PROMPT_LOOKUP,
    "auto": AUTO_DRAFT,
    "self:int4": DraftChoice(DraftKind.SELF, precision="int4"),
    "self:bfloat16": DraftChoice(DraftKind.SELF, precision="bfloat16"),
    "self:int4-head": DraftChoice(DraftKind.SELF, precision="int4-head"),
    "pair": PAIR_DRAFT,  # a chat's settings: the loaded pair's draft
    "model": PAIR_MODEL_ONLY,  # a chat's settings: the pair's draft model without prompt lookup
    "/models/Qwen2.5-0.5B-Instruct": DraftChoice(DraftKind.MODEL, source="/models/Qwen2.5-0.5B-Instruct"),
    "C:\\models\\tiny.gguf": DraftChoice(DraftKind.MODEL, source="C:\\models\\tiny.gguf"),
    "Qwen/Qwen2.5-0.5B-Instruct": DraftChoice(DraftKind.MODEL, source="Qwen/Qwen2.5-0.5B-Instruct"),
}


@pytest.mark.parametrize("text", OLD_SPELLINGS)
def test_every_old_spelling_parses(text):
    assert DraftChoice.parse(text) == OLD_SPELLINGS[text]
    assert DraftChoice.parse(f"  {text} ") == OLD_SPELLINGS[text]  # as typed or pasted


@pytest.mark.parametrize("choice", sorted(set(OLD_SPELLINGS.values()), key=str))
def test_text_form_round_trips(choice):
    assert DraftChoice.parse(str(choice)) == choice


def test_the_text_form_is_the_words_earlier_versions_wrote():
    """Old versions read new files: the canonical spellings are written unchanged."""
    for text in ("none", "ngram", "auto", "self:int4", "pair", "model", "/m/draft", "Qwen/Qwen2.5-0.5B"):
        assert str(DraftChoice.parse(text)) == text
    assert str(DraftChoice.parse("Prompt lookup")) == "ngram"  # an alias is written as the runner's word


def test_every_kind_is_written_read_and_named():
    """A kind added without its text or its words fails here, not in a user's pairs.json."""
    samples = {"source": "/models/x", "precision": "int4"}
    for kind in DraftKind:
        assert (kind in WORDS) != (kind in ARGUMENTS), kind
        assert kind in PREFIXES or kind not in ARGUMENTS or kind is DraftKind.MODEL, kind  # one bare kind only
        choice = DraftChoice(kind, **({ARGUMENTS[kind]: samples[ARGUMENTS[kind]]} if kind in ARGUMENTS else {}))
        assert DraftChoice.parse(str(choice)) == choice
        assert all(choice.words()), kind
    assert len(set(WORDS.values()) | set(PREFIXES.values())) == len(WORDS) + len(PREFIXES)


def test_paths_parse_as_models():
    assert DraftChoice.parse(Path("/m/draft")) == DraftChoice.model("/m/draft")


def test_labels_in_the_words_of_the_window():
    assert PROMPT_LOOKUP.label == "prompt lookup" and PROMPT_LOOKUP.detail == "copies from the chat, no model"
    assert NO_DRAFT.label == "none"
    assert DraftChoice.self_draft("int4").label == "the same model in 4-bit"
    assert DraftChoice.self_draft("bfloat16").label == "the same model in bfloat16"
    # a loaded self-draft says the precision it loaded at
    assert DraftChoice.self_draft("int4").words("int4 (g32, float32 head)") == (
        "the same model in 4-bit", "the target's own weights at int4 (g32, float32 head)")
    assert DraftChoice.model("/models/Qwen2.5-0.5B-Instruct").words() == ("Qwen2.5-0.5B-Instruct", "draft model")
    assert DraftChoice.model("Qwen/Qwen2.5-0.5B-Instruct").label == "Qwen/Qwen2.5-0.5B-Instruct"
    assert AUTO_DRAFT.label == "chosen for the model"
    assert PAIR_DRAFT.label != PAIR_MODEL_ONLY.label


@pytest.mark.parametrize("text, wrong", [
    ("", "no draft named"),
    ("   ", "no draft named"),
    ("self:", "no precision named"),
    ("self:int8", "'int8' is not a precision"),
    ("self:auto", "'auto' is not a precision"),  # that would be the target itself
    ("a\0b", "NUL"),
])
def test_invalid_text_says_what_was_wrong_and_what_is_accepted(text, wrong):
    with pytest.raises(DraftChoiceError) as refused:
        DraftChoice.parse(text)
    message = str(refused.value)
    assert wrong in message
    if text.startswith("self:"):
        assert all(precision in message for precision in SELF_PRECISIONS)
    else:
        assert '"ngram" (prompt lookup)' in message and "self:<precision>" in message


def test_not_text_is_refused():
    with pytest.raises(DraftChoiceError, match="named by text, not by int"):
        DraftChoice.parse(3)


def test_a_request_choice_loads_nothing():
    for text in ("pair", "model"):
        assert DraftChoice.parse(text).kind is DraftKind.PAIR
        with pytest.raises(DraftChoiceError, match="loads nothing"):
            DraftChoice.parse_loadable(text)
    assert DraftChoice.parse_loadable("ngram") == PROMPT_LOOKUP


def test_the_value_holds_only_what_its_kind_has():
    with pytest.raises(DraftChoiceError):
        DraftChoice(DraftKind.MODEL)  # a model needs a source
    with pytest.raises(DraftChoiceError):
        DraftChoice(DraftKind.LOOKUP, source="/m")
    with pytest.raises(DraftChoiceError):
        DraftChoice(DraftKind.LOOKUP, precision="int4")
    with pytest.raises(DraftChoiceError):
        DraftChoice(DraftKind.MODEL, source="/m", lookup=False)  # only a request leaves lookup out
    with pytest.raises(DraftChoiceError):
        DraftChoice("ngram")


def test_keywords_are_told_from_models():
    assert DraftChoice.keyword("NGRAM") == PROMPT_LOOKUP
    assert DraftChoice.keyword("/models/ngram") is None
    assert DraftChoice.keyword("Qwen/Qwen2.5-0.5B") is None


def test_old_pairs_file_loads_typed_and_round_trips(tmp_path):
    """A pairs.json written by an earlier version: its drafts read back typed, a pair named again
    finds its trial, and what is written again holds the same words."""
    old = {"recent": [
        {"backend": "torch", "target": "demo", "draft": "auto", "title": "Demo"},
        {"backend": "torch", "target": "/m/a", "draft": "ngram", "title": "a + prompt lookup"},
        {"backend": "mlx", "target": "demo", "draft": "self:int4", "title": "Demo + 4-bit"},
        {"backend": "torch", "target": "/m/b", "draft": "/m/b-draft", "title": "b + b-draft"},
        {"backend": "torch", "target": "/m/c", "draft": "none", "title": "c alone"},
        {"backend": "torch", "target": "/m/d", "draft": "self:int9", "title": "no such precision"},
        {"backend": "torch", "target": "/m/e", "draft": "pair", "title": "a request's choice"},
    ], "trials": {"torch|/m/a|ngram": {"acceptance": 0.5, "speedup": 1.5, "tokens_per_pass": 2.0, "tokens": 96,
                                      "measured_at": 1.0}}}
    path = tmp_path / "pairs.json"
    path.write_text(json.dumps(old), encoding="utf-8")
    memory = PairMemory(path)
    drafts = [(r["target"], r["draft"]) for r in memory.recent()]
    assert drafts == [("demo", AUTO_DRAFT), ("/m/a", PROMPT_LOOKUP), ("demo", DraftChoice.self_draft("int4")),
                      ("/m/b", DraftChoice.model("/m/b-draft")), ("/m/c", NO_DRAFT)]  # the unreadable two skipped
    assert memory.trial("torch", "/m/a", PROMPT_LOOKUP).speedup == 1.5
    assert memory.add_recent("torch", "/m/f", DraftChoice.self_draft("bfloat16")) is None
    assert memory.set_trial("torch", "/m/f", DraftChoice.self_draft("bfloat16"),
                            TrialResult(0.9, 2.0, 3.0, 96, 2.0)) is None
    written = json.loads(path.read_text(encoding="utf-8"))
    assert [r["draft"] for r in written["recent"]] == ["self:bfloat16", "auto", "ngram", "self:int4", "/m/b-draft",
                                                        "none"]
    assert set(written["trials"]) == {"torch|/m/a|ngram", "torch|/m/f|self:bfloat16"}
    again = PairMemory(path)
    assert [r["draft"] for r in again.recent()][:2] == [DraftChoice.self_draft("bfloat16"), AUTO_DRAFT]
    assert again.trial("torch", "/m/f", DraftChoice.parse("self:bfloat16")).acceptance == 0.9


def test_old_chat_settings_load_typed_and_round_trip():
    """A chat's settings as earlier versions stored them (history, QSettings): each drafter word
    reads back typed and is written as the same word; an unknown one falls back to the default."""
    for word, choice in (("pair", PAIR_DRAFT), ("model", PAIR_MODEL_ONLY), ("ngram", PROMPT_LOOKUP),
                         ("none", NO_DRAFT)):
        settings = ChatSettings.from_dict({"temperature": 0.2, "drafter": word})
        assert settings.drafter == choice and settings.temperature == 0.2
        stored = settings.to_dict()
        assert stored["drafter"] == word and json.loads(json.dumps(stored)) == stored
        assert ChatSettings.from_dict(stored) == settings
    for bad in ("self:int4", "/m/draft", "", 7, None):  # not a request's choice: the default, not a crash
        assert ChatSettings.from_dict({"drafter": bad}).drafter == PAIR_DRAFT
    assert set(REQUEST_CHOICES) == {PAIR_DRAFT, PAIR_MODEL_ONLY, PROMPT_LOOKUP, NO_DRAFT}
    with pytest.raises(ValueError, match="drafter must be one of pair, model, ngram, none"):
        ChatSettings(drafter=DraftChoice.model("/m/draft"))


def test_the_command_line_takes_what_it_took(capsys):
    from app.cli import build_parser

    parser = build_parser()
    for text, choice in (("self:int4", DraftChoice.self_draft("int4")), ("ngram", PROMPT_LOOKUP),
                         ("none", NO_DRAFT), ("/m/draft", DraftChoice.model("/m/draft"))):
        assert parser.parse_args(["generate", "--prompt", "hi", "--draft", text]).draft == choice
    assert parser.parse_args(["generate", "--prompt", "hi"]).draft == AUTO_DRAFT
    assert parser.parse_args(["serve"]).draft == AUTO_DRAFT
    with pytest.raises(SystemExit):
        parser.parse_args(["bench", "--draft", "self:int3"])
    assert "'int3' is not a precision" in capsys.readouterr().err
