"""One progress line for a load, with its steps (issue 46: a Q8_0 GGUF took four minutes on a busy
machine, and the window showed three loading messages in a row, none saying how far it was).

The runner reports each step as a sentence (app/runner.py, the GGUF reader's layers, the kernels'
preparation). Here they become one line that keeps its place: which model, which step of the
load it is on, the step's own count where it has one ("layer 12 of 30"), and, once a load takes
a while, how long it has taken. The slot being changed (the target's, or the draft's when only
the draft changes) shows the same step in a few words; the other slot keeps what it shows."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass

SHOW_ELAPSED_S = 5.0  # a load shorter than this needs no clock

# (pattern over the runner's sentence, the step in a user's words, whose step it is); the first match
# wins; {0}.. are the pattern's groups, {target}/{draft} the names the user knows
STEPS = (
    (r"^Checking ", "checking its files and the memory it needs", "target"),
    (r"^Reading the tokenizer", "reading its tokenizer", "target"),
    (r"^Starting PyTorch", "starting PyTorch", "target"),
    (r"^Unloading the current pair", "making room: unloading the current pair", "target"),
    (r"^Reading the model description and vocabulary", "reading its description and vocabulary", "target"),
    (r"^Reading the weights of .*: layer (\d+) of (\d+)", "reading the weights, layer {0} of {1}", "target"),
    (r"^Loading draft |^Loading the model's built-in MTP|^Loading the aligned draft head|^Loading the |"
     r"^Loading assistant ", "loading the draft, {draft}", "draft"),
    (r"^Loading .* with (MLX|PyTorch)", "building it with {0}", "target"),
    (r"^Preparing the decoder layers' compiled call", "preparing the compiled decoder", "target"),
    (r"^Preparing the CPU kernel", "preparing the CPU kernel (compiled once, then cached)", "target"),
    (r"^Compiling the glue", "compiling the glue between kernels (once, then cached)", "target"),
    (r"^Compiling the decoder layers", "compiling the decoder layers (about a minute)", "target"),
)


@dataclass(frozen=True)
class Shown:
    line: str  # the status bar's one line
    slot: str  # "target" or "draft": the slot that shows the step
    words: str  # the step in a few words, for that slot


class LoadSteps:
    """The steps of one load, numbered as they come (a step's repeats, such as the next layer,
    update it in place)."""

    def __init__(self, target: str, draft: str, draft_only: bool = False,
                 clock: Callable[[], float] = time.monotonic):
        self.target, self.draft, self.draft_only = target, draft, draft_only
        self._clock = clock
        self.started = clock()
        self.kinds: list[str] = []  # the steps seen, in order

    def step(self, message: str) -> Shown:
        kind, words, whose = _classify(message, self.target, self.draft)
        if not self.kinds or self.kinds[-1] != kind:
            self.kinds.append(kind)
        slot = "draft" if self.draft_only or whose == "draft" else "target"
        name = self.draft if slot == "draft" else self.target
        line = f"Loading {name}: step {len(self.kinds)}, {words}"
        elapsed = self._clock() - self.started
        if elapsed >= SHOW_ELAPSED_S:
            line += f" · {int(elapsed) // 60}:{int(elapsed) % 60:02d}"
        return Shown(line, slot, words)


def _classify(message: str, target: str, draft: str) -> tuple[str, str, str]:
    """(kind, words, whose) of a runner's sentence; one not listed is shown as it is."""
    for pattern, words, whose in STEPS:
        found = re.match(pattern, message)
        if found:
            return pattern, words.format(*found.groups(), target=target, draft=draft), whose
    text = message.strip().removesuffix("...").strip()
    return text, text[:1].lower() + text[1:], "target"
