"""What the side panel shows and the history keeps of one answer: its rounds as token chips,
and the figures derived from them. Qt-free: the worker builds it from the engine's `Round`
events, the panel draws it, the history stores it as JSON, and exports write it out.

A chip is one token of a round: a draft the target accepted, a draft it rejected, or the token
the target wrote itself (the correction after a rejection, or the bonus after a full accept;
in plain rounds, every token).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from app.chat.baseline import Baseline, Speedup
from app.engine.events import Round

ACCEPTED, REJECTED, TARGET = "accepted", "rejected", "target"
# 2: the baseline's samples (version 1 stored one number, baseline_s_per_token); 3: each round
# says whether it was thinking (a reasoning model's block before the answer); 4: a round that
# verified a tree of drafts keeps its branches
TRACE_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)


@dataclass(frozen=True)
class Chip:
    token: int
    text: str
    kind: str  # ACCEPTED, REJECTED or TARGET
    p: float | None = None  # the draft's probability of the token (drafted tokens only)
    q: float | None = None  # the target's probability of the drafted token


@dataclass(frozen=True)
class RoundTrace:
    index: int
    k: int
    source: str  # which drafter: "model", "lookup", "mtp", "assistant"; "" (plain)
    chips: tuple[Chip, ...]
    text: str  # the answer text this round completed
    own_chars: int  # how many trailing characters of `text` the target's own token wrote
    at: float  # seconds from the first token to the end of this round (wall clock)
    draft_s: float = 0.0
    verify_s: float = 0.0
    # a reasoning model's round inside its thinking block: `text` then holds only what of the
    # round was answer (the thinking is shown apart, folded)
    thinking: bool = False
    # a round that verified a tree of drafts (app/engine/tree.py): the text of each branch, root to
    # leaf, the drafter's first guess first; the chips show the path the target took
    branches: tuple[str, ...] = ()

    def count(self, kind: str) -> int:
        return sum(chip.kind == kind for chip in self.chips)

    @property
    def drafted(self) -> int:
        return self.count(ACCEPTED) + self.count(REJECTED)

    @property
    def tokens(self) -> int:
        """Tokens this round committed to the answer."""
        return self.count(ACCEPTED) + self.count(TARGET)

    def spans(self) -> list[tuple[int, str]]:
        """(characters, origin) of this round's text: drafted text first, the target's own last."""
        if not self.chips or not self.drafted:
            return [(len(self.text), TARGET)] if self.text else []
        own = min(self.own_chars, len(self.text))
        return [(n, kind) for n, kind in ((len(self.text) - own, ACCEPTED), (own, TARGET)) if n]


def trace_round(event: Round, token_text: Callable[[int], str], at: float) -> RoundTrace:
    """Chips of one engine round. `event.emitted` is what the answer kept and `event.drafted` the
    drafts up to the answer's end: a stop token, and any draft after the end, is in neither and
    is not shown, so the panel's counts equal the engine's."""
    n = event.accepted
    chips = [Chip(t, token_text(t), ACCEPTED, _at(event.draft_p, i), _at(event.target_q, i))
             for i, t in enumerate(event.drafted[:n])]
    chips += [Chip(t, token_text(t), REJECTED, _at(event.draft_p, i), _at(event.target_q, i))
              for i, t in enumerate(event.drafted[n:], start=n)]
    own = event.emitted[n:] if event.drafted else event.emitted
    chips += [Chip(t, token_text(t), TARGET) for t in own]
    own_text = "".join(token_text(t) for t in own) if event.drafted else ""
    own_chars = len(own_text) if own_text and event.text.endswith(own_text) else 0
    return RoundTrace(event.index, event.k, event.source, tuple(chips), event.text, own_chars, at,
                      event.draft_s, event.verify_s, branches=_branches(event.tree, token_text))


def _branches(tree, token_text: Callable[[int], str]) -> tuple[str, ...]:
    """The text of each root-to-leaf path of a verified tree, in the trie's order; () for a chain."""
    if tree is None:
        return ()
    parents = set(tree.parents)
    leaves = [i for i in range(len(tree)) if i not in parents]
    return tuple("".join(token_text(tree.tokens[node]) for node in tree.path(leaf)) for leaf in leaves)


def _at(values: tuple[float, ...], i: int) -> float | None:
    return values[i] if i < len(values) else None


def _probability(value) -> float | None:
    """A chip's p or q as stored: none, or a number the panel's tooltip can print (a stored
    string there once reached its format and raised)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"not a probability: {value!r}")
    return float(value)


def round_row(r: RoundTrace) -> list:
    """A round as one JSON row: how the history stores it and a remote Tandem streams it
    (app/server/openai_api.py, app/remote/target.py)."""
    row = [r.index, r.k, r.source, r.text, r.own_chars, round(r.at, 6), round(r.draft_s, 6), round(r.verify_s, 6),
           [[c.token, c.text, c.kind, c.p, c.q] for c in r.chips], r.thinking]
    return [*row, list(r.branches)] if r.branches else row


def round_from_row(row) -> RoundTrace:
    """`round_row`'s row read back; TypeError or ValueError (OverflowError) for a damaged one."""
    i, k, src, text, own, at, ds, vs, chips, *rest = row
    branches = rest[1] if len(rest) > 1 else []
    if not isinstance(branches, list) or not all(isinstance(b, str) for b in branches):
        raise ValueError(f"a round's branches are not texts: {branches!r}"[:200])
    return RoundTrace(int(i), int(k), str(src),
                      tuple(Chip(int(t), str(s), str(kind), _probability(p), _probability(q))
                            for t, s, kind, p, q in chips),
                      str(text), int(own), float(at), float(ds), float(vs), bool(rest and rest[0]), tuple(branches))


@dataclass(frozen=True)
class Figures:
    tokens: int  # committed answer tokens
    drafted: int
    accepted: int
    rejected: int
    target_tokens: int  # tokens the target wrote itself
    rounds: int  # target passes after the prefill
    seconds: float  # wall clock from the first token to the last
    tokens_per_s: float
    acceptance: float
    tokens_per_pass: float
    k: int  # the latest pass's draft length (0: it drafted nothing)
    speedup: Speedup | None  # the baseline's seconds per token over ours, median and range (None: none measured)


@dataclass(frozen=True)
class Reported:
    """A remote engine's own count of one answer's speculation, where it sends no rounds (vLLM's
    /metrics, llama-server's timings: app/remote/engines.py): totals, and acceptance by position
    where the engine gives it, over `proposals` drafts."""

    tokens: int  # the answer's, from the server's usage
    drafted: int = 0
    accepted: int = 0
    accepted_by_position: tuple[int, ...] = ()
    proposals: int = 0

    def words(self) -> str:
        if not self.drafted:
            return f"As the server counted them: {self.tokens} tokens; it reported no drafts."
        rate = f" ({self.accepted / self.drafted:.0%})"
        text = f"As the server counted them: {self.accepted} of {self.drafted} drafted tokens accepted{rate}"
        if self.proposals and self.accepted_by_position:
            shown = ", ".join(f"{n / self.proposals:.0%}" for n in self.accepted_by_position)
            text += f"; by position {shown} of {self.proposals} drafts"
        return text + "."

    def to_list(self) -> list:
        return [self.tokens, self.drafted, self.accepted, list(self.accepted_by_position), self.proposals]

    @classmethod
    def from_list(cls, value) -> Reported | None:
        """None for anything but what to_list wrote (a damaged row loses this part only)."""
        try:
            tokens, drafted, accepted, by_position, proposals = value
            counts = [tokens, drafted, accepted, *by_position, proposals]
        except (TypeError, ValueError):
            return None
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts) or accepted > drafted:
            return None
        return cls(tokens, drafted, accepted, tuple(by_position), proposals)


@dataclass(frozen=True)
class WhoseAnswer:
    """Whose answer a trace is, for its exports: the question it answers and the pair that wrote
    it, in the header's words. Not stored with the trace: the history keeps the question, and the
    pair in the answer's settings (ui/chat/controller.py fills this in from them)."""

    question: str = ""
    target: str = ""
    draft: str = ""


@dataclass
class TurnTrace:
    """Every round of one answer, and the target-alone baseline it is measured against (kept with
    the answer: a later timing must not change an old answer's speedup)."""

    rounds: list[RoundTrace] = field(default_factory=list)
    baseline: Baseline | None = None
    # why there is no baseline: no timing at the answer's settings or in its context region ("": none said)
    unmeasured: str = ""
    whose: WhoseAnswer = field(default_factory=WhoseAnswer)
    reported: Reported | None = None  # a remote engine's own count, where it sent no rounds

    @property
    def baseline_s_per_token(self) -> float | None:
        """The baseline's median (the figure the speedup's headline uses)."""
        return self.baseline.median if self.baseline else None

    def add(self, rounds: Iterable[RoundTrace]) -> None:
        self.rounds.extend(rounds)

    def figures(self) -> Figures:
        rounds = self.rounds
        drafted = sum(r.drafted for r in rounds)
        accepted = sum(r.count(ACCEPTED) for r in rounds)
        tokens = sum(r.tokens for r in rounds)
        # decode throughput as the engine reports it: tokens after the first (which the prefill
        # wrote) over the wall clock from the first token to the last
        decode = [r for r in rounds if r.index > 0]
        decode_tokens = sum(r.tokens for r in decode)
        seconds = rounds[-1].at if rounds else 0.0
        passes = len({r.index for r in decode})  # a text-only tail round repeats the last index
        reported = self.reported
        if reported is not None and not any(r.chips for r in rounds):
            # a server that sends text only: its own counts, once the answer is over (none per round)
            drafted, accepted, tokens, passes = reported.drafted, reported.accepted, reported.tokens, 0
            decode_tokens = max(tokens - 1, 0)
        tps = decode_tokens / seconds if seconds > 0 else 0.0
        speedup = self.baseline.speedup(tps) if self.baseline else None
        # the latest pass's draft length; none (0, shown "–") where that pass drafted nothing: lookup
        # found no match, or plain decoding was chosen (a text-only tail round, chipless, is no pass)
        last = next((r for r in reversed(rounds) if r.index > 0 and r.chips), None)
        last_k = last.k if last is not None and last.drafted else 0
        return Figures(tokens, drafted, accepted, drafted - accepted, sum(r.count(TARGET) for r in rounds),
                       passes, seconds, tps, accepted / drafted if drafted else 0.0,
                       decode_tokens / passes if passes else 0.0, last_k, speedup)

    def series(self) -> dict[str, list[float]]:
        """Per round, for the graphs: tokens so far, speedup so far (median, and the range over
        the baseline's timings), tokens/s so far, accepted count and acceptance of the round."""
        out: dict[str, list[float]] = {"tokens": [], "speedup": [], "speedup_low": [], "speedup_high": [],
                                       "tokens_per_s": [], "accepted": [], "acceptance": []}
        tokens = 0
        for r in self.rounds:
            if r.index == 0:
                continue
            tokens += r.tokens
            tps = tokens / r.at if r.at > 0 else 0.0
            out["tokens"].append(tokens)
            out["tokens_per_s"].append(tps)
            speedup = self.baseline.speedup(tps) if self.baseline else None
            out["speedup"].append(speedup.median if speedup else float("nan"))
            out["speedup_low"].append(speedup.low if speedup else float("nan"))
            out["speedup_high"].append(speedup.high if speedup else float("nan"))
            out["accepted"].append(r.count(ACCEPTED))
            out["acceptance"].append(r.count(ACCEPTED) / r.drafted if r.drafted else float("nan"))
        return out

    def spans(self) -> list[tuple[int, str]]:
        """(characters, origin) over the answer text, merged: the inline tint."""
        merged: list[tuple[int, str]] = []
        for r in self.rounds:
            for n, kind in r.spans():
                if merged and merged[-1][1] == kind:
                    merged[-1] = (merged[-1][0] + n, kind)
                else:
                    merged.append((n, kind))
        return merged

    # --- storage and export ----------------------------------------------------------------

    def to_dict(self) -> dict:
        data = {"version": TRACE_VERSION, "baseline": self.baseline.to_dict() if self.baseline else None,
                "unmeasured": self.unmeasured,
                "rounds": [round_row(r) for r in self.rounds]}
        if self.reported is not None:
            data["reported"] = self.reported.to_list()
        return data

    @classmethod
    def from_dict(cls, data: dict | None) -> TurnTrace | None:
        """None for anything that is not a trace this version can read (older answers have none)."""
        if not isinstance(data, dict) or data.get("version") not in READABLE_VERSIONS:
            return None
        try:
            rounds = [round_from_row(row) for row in data["rounds"]]
        except (KeyError, TypeError, ValueError, OverflowError):  # int(1e400) overflows: a damaged row
            return None
        stored = data.get("baseline") if data["version"] >= 2 else data.get("baseline_s_per_token")
        unmeasured = data.get("unmeasured")
        return cls(rounds, Baseline.from_dict(stored), unmeasured[:600] if isinstance(unmeasured, str) else "",
                   reported=Reported.from_list(data["reported"]) if "reported" in data else None)

    def to_json(self) -> str:
        figures = self.figures()
        return json.dumps({"figures": asdict(figures), "trace": self.to_dict()}, indent=1)

    def to_csv(self) -> str:
        """One row per chip, with its round's figures: spreadsheets read it as it is."""
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["round", "k", "source", "at_s", "draft_s", "verify_s", "position", "token", "text",
                         "kind", "draft_p", "target_q"])
        for r in self.rounds:
            for position, c in enumerate(r.chips):
                # k is what a drafting round drafted up to; a round that drafted nothing has none
                writer.writerow([r.index, r.k if r.drafted else "", r.source, f"{r.at:.6f}", f"{r.draft_s:.6f}",
                                 f"{r.verify_s:.6f}", position, c.token, c.text, c.kind,
                                 "" if c.p is None else f"{c.p:.6g}", "" if c.q is None else f"{c.q:.6g}"])
        return out.getvalue()


def figures_from_csv(text: str, baseline: Baseline | None = None) -> Figures:
    """The figures of a CSV export, read back (the export's own check)."""
    rounds: dict[int, dict] = {}
    for row in csv.DictReader(io.StringIO(text)):
        r = rounds.setdefault(int(row["round"]), {"k": int(row["k"] or 0), "source": row["source"],
                                                  "at": float(row["at_s"]), "chips": []})
        r["chips"].append(Chip(int(row["token"]), row["text"], row["kind"],
                               float(row["draft_p"]) if row["draft_p"] else None,
                               float(row["target_q"]) if row["target_q"] else None))
    trace = TurnTrace([RoundTrace(i, r["k"], r["source"], tuple(r["chips"]), "", 0, r["at"])
                       for i, r in sorted(rounds.items())], baseline)
    return trace.figures()
