"""Where prompt lookup finds its continuation in the committed sequence (prompt + answer so far).

The rule of prompt lookup decoding (Saxena 2023): the latest earlier occurrence of the last n
tokens, n from `max_ngram` down to `min_ngram`, and what followed it there.

Copying with edits. An answer that writes its context out again with corrections (a spelling
fixed, a word changed) leaves the copy at each edit: the corrected token is not in the source, so
no n-gram of `min_ngram` tokens matches again until that many tokens past the edit, each decoded
plainly (on the demo's copy-email prompt 8 of 24 passes were such steps). A shorter match is
mostly chance in free text, but not where the copy resumes: here a tail of 1-2 tokens counts when
the `max_ngram` tokens that ended at most `EDIT` tokens before it also occur in the source, at
most `EDIT` tokens before the tail's occurrence there (an edit that replaced up to EDIT tokens of
the source by up to EDIT others). With that, the copy resumes one token after the edit. The
anchor is the longest gram, not the shortest: with 3 tokens a code answer's repeated phrases
resumed "copies" that were not there (on a pair-trial prompt 15 more drafts, 2 of them accepted),
with 4 it drafted what the plain rule drafts there, and the suite's prompts gained the same.

What it proposes is a function of the committed sequence alone (the index only makes it quick):
a seeded answer that repeats drafts the same.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

EDIT = 4  # the most tokens an edit may replace in the source, or write in their place
LATEST = 8  # an anchor's latest occurrences looked at (repetitive text has hundreds)


class LookupIndex:
    """The rule above, answered from an index of the sequence's n-grams kept between rounds: each
    round adds what was committed since the last, so a lookup costs 20-30 us at 4,000 tokens (the
    scan it replaces read the whole sequence every round: 1.2 ms there). What still grows with
    the length is the check below (0.25 ms at 32,000 tokens) and the index's memory, about 0.5 kB
    a token until the answer ends (`clear`).

    The prefix it covers is compared with the committed sequence on every call (one list
    comparison in C), and a sequence that does not extend it (a new chat, an edited turn) is
    indexed afresh: what it proposes never depends on what it saw before."""

    def __init__(self, max_ngram: int, min_ngram: int):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"prompt lookup matches n-grams of 1 <= min_ngram <= max_ngram tokens, "
                             f"not {min_ngram}..{max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.sizes = range(min_ngram, max_ngram + 1)
        self.clear()

    def clear(self) -> None:
        """Forget the sequence (the next call indexes its own from the start)."""
        self.tokens: list[int] = []
        self.starts: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in self.sizes}

    def _extend(self, committed: Sequence[int]) -> None:
        covered = len(self.tokens)
        prefix = committed[:covered]
        if len(prefix) < covered or (prefix if isinstance(prefix, list) else list(prefix)) != self.tokens:
            self.clear()
            covered = 0
        tokens = self.tokens
        try:
            tokens.extend(int(t) for t in committed[covered:])
            for n, starts in self.starts.items():
                for start in range(max(covered - n + 1, 0), len(tokens) - n + 1):
                    starts.setdefault(tuple(tokens[start : start + n]), []).append(start)
        except BaseException:  # interrupted halfway: an index that matches its tokens, or none
            self.clear()
            raise

    def matches(self, committed: Sequence[int]) -> Iterator[int]:
        """Where the rule's match continues, latest first: the position just after each earlier
        occurrence of the tail's longest n-gram (n from `max_ngram` down to `min_ngram`) that
        occurred at all. The drafter copies from the first; a tree of drafts
        (`continuations`) from several."""
        self._extend(committed)
        tokens, length = self.tokens, len(self.tokens)
        if length < 2:
            return
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            last_start = length - 1 - n  # the tail itself is no earlier occurrence
            found = (start + n for start in reversed(self.starts[n].get(tuple(tokens[length - n :]), ()))
                     if start <= last_start)
            first = next(found, None)
            if first is not None:
                yield first
                yield from found
                return

    def continuation(self, committed: Sequence[int], k: int, resync: bool = True) -> tuple[int, ...]:
        """Up to k tokens that followed the latest earlier match of the sequence's tail (or, with
        `resync`, where a copy resumed after an edit); () if none."""
        if k <= 0:
            return ()
        after = next(self.matches(committed), None)
        if after is not None:
            return tuple(self.tokens[after : after + k])
        if resync and self.min_ngram > 1 and len(self.tokens) >= 2:
            return self._after_edit(k)
        return ()

    def continuations(self, committed: Sequence[int], k: int, width: int) -> list[tuple[int, ...]]:
        """Up to `width` different continuations of up to k tokens, from the tail's matches latest
        first (the first is `continuation`'s): the branches of a tree of drafts (app/engine/tree.py).
        A tail with no match gives the resync's one continuation, or none."""
        if k <= 0 or width <= 0:
            return []
        found: list[tuple[int, ...]] = []
        for looked, after in enumerate(self.matches(committed)):
            follow = tuple(self.tokens[after:after + k])
            if follow and follow not in found:
                found.append(follow)
            if len(found) == width or looked + 1 == LATEST * width:
                break
        if found:
            return found
        one = self.continuation(committed, k)
        return [one] if one else []

    def _after_edit(self, k: int) -> tuple[int, ...]:
        """The copy resumed after an edit: the tail (1 or 2 tokens, too short to count alone) occurs
        in the source within EDIT tokens after an occurrence of an anchor (`max_ngram` tokens) that
        the answer wrote within EDIT tokens before the tail; anchors nearest the tail first."""
        tokens, length, anchor = self.tokens, len(self.tokens), self.max_ngram
        for n in range(min(self.min_ngram - 1, 2), 0, -1):
            tail = tokens[length - n :]
            for written in range(EDIT + 1):  # tokens the answer wrote between anchor and tail
                end = length - n - written
                if end - anchor < 1:
                    break
                found = self.starts[anchor].get(tuple(tokens[end - anchor : end]), ())
                looked = 0
                for q in reversed(found):
                    if q > end - 1 - anchor:
                        continue  # the anchor itself, or an occurrence too late to leave room
                    after = q + anchor
                    stop = min(after + EDIT + n, length - 1)
                    for at in range(after, stop - n + 1):
                        if tokens[at : at + n] == tail:
                            return tuple(tokens[at + n : at + n + k])
                    looked += 1
                    if looked == LATEST:
                        break
        return ()
