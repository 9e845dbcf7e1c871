"""What drafts for the target: one typed value, parsed once at the edges (the CLI's --draft, the
settings, pairs.json, a slot's keyword) and passed as it is everywhere inside.

Its text form is what files and the command line hold, the same words earlier versions wrote
("none", "ngram", "self:int4", "auto", a model's path or hub id; a request's "pair" and
"model"), so files stay readable both ways. Qt-, mlx- and torch-free, and below app/models/: it
imports only the leaf app/models/names.py, so every module there may import it.

A new way of drafting is one DraftKind member, its text (a word in WORDS; or, when it carries a
folder or a precision, its field in ARGUMENTS and a prefix in PREFIXES, as "self:int4" does),
its words in LABELS (or in `words` when they depend on its argument), and the drafter class the
runner builds for it (Runner.load).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum

from app.models.names import model_label, precision_words


class DraftKind(Enum):
    NONE = "none"  # the target decodes alone
    LOOKUP = "lookup"  # prompt lookup: n-grams copied from the chat, no model
    MODEL = "model"  # a draft model (folder, .gguf or hub id), prompt lookup beside it
    SELF = "self"  # the target's own weights at a lower precision, prompt lookup beside it
    AUTO = "auto"  # decided when the pair loads (app/runner.auto_draft)
    MTP = "mtp"  # the target checkpoint's own multi-token-prediction layer (app/engine/mtp.py)
    ASSISTANT = "assistant"  # a Gemma 4 assistant folder that drafts from the target's state
    HEAD = "head"  # a draft head aligned to the target by `tandem-cli align` (app/align/), from its folder
    EAGLE3 = "eagle3"  # a published EAGLE-3 head for the target (app/models/eagle3_head.py), from its folder
    DFLASH = "dflash"  # a published DFlash block drafter for the target (app/models/dflash_head.py), from its folder
    PAIR = "pair"  # a request's: whatever the loaded pair drafts with


# The precisions a self-draft can load at (the backends' own, less "auto": that is the target)
SELF_PRECISIONS = ("float32", "bfloat16", "float16", "int4", "int4-bf16-head", "int4-head", "gguf")

# Kinds without an argument: the one word each is written as
WORDS = {DraftKind.NONE: "none", DraftKind.LOOKUP: "ngram", DraftKind.AUTO: "auto", DraftKind.PAIR: "pair",
         DraftKind.MTP: "mtp"}
# Kinds with one: the field that holds it (a "source": folder, .gguf or hub id; a "precision")
ARGUMENTS = {DraftKind.MODEL: "source", DraftKind.SELF: "precision", DraftKind.ASSISTANT: "source",
             DraftKind.HEAD: "source", DraftKind.EAGLE3: "source", DraftKind.DFLASH: "source"}
# and the prefix written before it ("self:int4"); a draft model is written as its source alone
PREFIXES = {DraftKind.SELF: "self:", DraftKind.ASSISTANT: "assistant:", DraftKind.HEAD: "head:",
            DraftKind.EAGLE3: "eagle3:", DraftKind.DFLASH: "dflash:"}
# what the folder after a prefix is, for a choice that names none
FOLDER_WORDS = {DraftKind.ASSISTANT: "the folder of a Gemma 4 assistant (published beside its Gemma 4 model)",
                DraftKind.HEAD: "the folder `tandem-cli align` wrote",
                DraftKind.EAGLE3: "the folder of an EAGLE-3 head published for the model, or its Hugging Face id",
                DraftKind.DFLASH: "the folder of a DFlash drafter published for the model, or its Hugging Face id"}
MODEL_ONLY_WORD = "model"  # a request's: the pair's draft model without prompt lookup beside it
# Other spellings read (the Draft slot's keywords, older files); never written
ALIASES = {"lookup": DraftKind.LOOKUP, "prompt lookup": DraftKind.LOOKUP, "n-gram": DraftKind.LOOKUP,
           "built-in mtp": DraftKind.MTP, "mtp head": DraftKind.MTP}

LABELS = {  # (name, detail) in the UI's words, for kinds whose words do not depend on an argument
    DraftKind.NONE: ("none", "the target decodes alone"),
    DraftKind.LOOKUP: ("prompt lookup", "copies from the chat, no model"),
    DraftKind.AUTO: ("chosen for the model", "the demo's fastest measured here (prompt lookup on PyTorch, its own "
                     "4-bit copy on MLX), prompt lookup for other models"),
    DraftKind.PAIR: ("the pair's draft", "what the loaded pair drafts with"),
    DraftKind.MTP: ("built-in MTP head", "the model's own multi-token-prediction layer, reading its hidden states"),
}

ACCEPTED = ('a draft model\'s folder, .gguf file or Hugging Face id, "self:<precision>" (one of '
            f'{", ".join(SELF_PRECISIONS)}), "mtp" (the model\'s own MTP layer), "assistant:<folder>" (a Gemma 4 '
            'assistant), "head:<folder>" (a draft head `tandem-cli align` trained), "eagle3:<folder or hub id>" (an '
            'EAGLE-3 head), "dflash:<folder or hub id>" (a DFlash block drafter), "ngram" (prompt lookup), "none" or '
            '"auto"')


class DraftChoiceError(ValueError):
    """Text that names no way of drafting; the message says what was wrong and what is accepted."""


@dataclass(frozen=True)
class DraftChoice:
    kind: DraftKind
    source: str = ""  # MODEL: the folder, .gguf file or hub id, as named
    precision: str = ""  # SELF: one of SELF_PRECISIONS
    # A draft model loads with prompt lookup beside it (a lookup hit costs no forward pass); only
    # a request leaves it out ("model": PAIR without lookup, the pair's draft model alone).
    lookup: bool = True

    def __post_init__(self):
        if not isinstance(self.kind, DraftKind):
            raise DraftChoiceError(f"not a kind of draft: {self.kind!r}")
        if self.kind is DraftKind.SELF and self.precision not in SELF_PRECISIONS:
            wrong = (f"{self.precision!r} is not a precision a self-draft loads at" if self.precision
                     else "no precision named")
            raise DraftChoiceError(f"self:{self.precision}: {wrong}; write self:<precision> with one of "
                                   f"{', '.join(SELF_PRECISIONS)} (e.g. self:int4)")
        for field in ("source", "precision"):
            wanted = ARGUMENTS.get(self.kind) == field
            if bool(getattr(self, field)) != wanted:
                raise DraftChoiceError(f"a draft of kind {self.kind.value} {'needs' if wanted else 'has no'} {field}")
        if not self.lookup and self.kind is not DraftKind.PAIR:
            raise DraftChoiceError("only a request leaves prompt lookup out (\"model\": the pair's draft model alone)")

    @classmethod
    def model(cls, source: str) -> DraftChoice:
        return cls(DraftKind.MODEL, source=str(source))

    @classmethod
    def assistant(cls, source: str) -> DraftChoice:
        return cls(DraftKind.ASSISTANT, source=str(source))

    @classmethod
    def head(cls, source: str) -> DraftChoice:
        return cls(DraftKind.HEAD, source=str(source))

    @classmethod
    def eagle3(cls, source: str) -> DraftChoice:
        return cls(DraftKind.EAGLE3, source=str(source))

    @classmethod
    def dflash(cls, source: str) -> DraftChoice:
        return cls(DraftKind.DFLASH, source=str(source))

    @classmethod
    def self_draft(cls, precision: str) -> DraftChoice:
        return cls(DraftKind.SELF, precision=precision)

    @classmethod
    def keyword(cls, text: str) -> DraftChoice | None:
        """The way of drafting `text` names when it is a keyword rather than a model ("ngram",
        "Prompt lookup", "self:int4", "auto"; any case), else None."""
        word = text.strip().lower()
        if word == MODEL_ONLY_WORD:
            return PAIR_MODEL_ONLY
        kind = ALIASES.get(word) or next((k for k, w in WORDS.items() if w == word), None)
        if kind is not None:
            return cls(kind)
        for kind, prefix in PREFIXES.items():
            if word.startswith(prefix):
                argument = text.strip()[len(prefix):].strip()  # a folder keeps its case; precisions are lowercase
                field = ARGUMENTS[kind]
                if field == "source" and not argument:  # else "a draft of kind head needs source"
                    raise DraftChoiceError(f"“{prefix}” names no folder: write {prefix}<folder>, where <folder> "
                                           f"is {FOLDER_WORDS[kind]}")
                return cls(kind, **{field: argument.lower() if field == "precision" else argument})
        return None

    @classmethod
    def parse(cls, text: str) -> DraftChoice:
        """Any spelling this or an earlier version wrote or took: a keyword (see `keyword`), else
        a draft model's path or hub id. DraftChoiceError for text that names nothing."""
        if isinstance(text, os.PathLike):
            text = os.fspath(text)
        if not isinstance(text, str):
            raise DraftChoiceError(f"a draft is named by text, not by {type(text).__name__}: give {ACCEPTED}")
        stripped = text.strip()
        if not stripped:
            raise DraftChoiceError(f"no draft named (the text is empty): give {ACCEPTED}")
        if "\0" in stripped:  # no file name holds one
            raise DraftChoiceError(f"{stripped[:40]!r} holds a NUL character, so it names no draft: give {ACCEPTED}")
        return cls.keyword(stripped) or cls.model(stripped)

    @classmethod
    def parse_loadable(cls, text: str) -> DraftChoice:
        """As parse, for a draft to load (--draft, a recent pair): a request's "pair" and "model"
        choose among a loaded pair's drafters and load nothing."""
        choice = cls.parse(text)
        if choice.kind is DraftKind.PAIR:
            raise DraftChoiceError(f"“{str(text).strip()}” chooses among a loaded pair's drafters (a chat's "
                                   f"setting) and loads nothing: give {ACCEPTED}")
        return choice

    def __str__(self) -> str:
        """The text form parse reads back (the words earlier versions wrote)."""
        if self.kind in ARGUMENTS:
            return PREFIXES.get(self.kind, "") + getattr(self, ARGUMENTS[self.kind])
        return WORDS[self.kind] if self.lookup else MODEL_ONLY_WORD

    @property
    def label(self) -> str:
        """Its short name in the UI: "prompt lookup", "the same model in 4-bit", a model's name."""
        return self.words()[0]

    @property
    def detail(self) -> str:
        """A line more: "copies from the chat, no model", "draft model"."""
        return self.words()[1]

    def words(self, dtype: str = "") -> tuple[str, str]:
        """(label, detail); `dtype` is a loaded self-draft's own ("int4 (g32, float32 head)")."""
        if self.kind is DraftKind.MODEL:
            return model_label(self.source), "draft model"
        if self.kind is DraftKind.ASSISTANT:
            return model_label(self.source), "Gemma 4 assistant, reading the target's state"
        if self.kind is DraftKind.HEAD:
            return "aligned draft head", "a head trained on the target's own answers, reading its hidden states"
        if self.kind is DraftKind.EAGLE3:
            return "EAGLE-3 head", "a published draft head reading three of the target's layers"
        if self.kind is DraftKind.DFLASH:
            return "DFlash drafter", "a published block drafter: one pass drafts a whole block"
        if self.kind is DraftKind.SELF:
            precision = dtype or self.precision
            return f"the same model in {precision_words(precision)}", f"the target's own weights at {precision}"
        if self.kind is DraftKind.PAIR and not self.lookup:
            return "the pair's draft model alone", "what the loaded pair drafts with, without prompt lookup"
        return LABELS[self.kind]


NO_DRAFT = DraftChoice(DraftKind.NONE)
PROMPT_LOOKUP = DraftChoice(DraftKind.LOOKUP)
AUTO_DRAFT = DraftChoice(DraftKind.AUTO)
PAIR_DRAFT = DraftChoice(DraftKind.PAIR)  # a request's default
PAIR_MODEL_ONLY = DraftChoice(DraftKind.PAIR, lookup=False)
# What a request (a chat's settings) may choose among: the loaded pair decides the rest
REQUEST_CHOICES = (PAIR_DRAFT, PAIR_MODEL_ONLY, PROMPT_LOOKUP, NO_DRAFT)
