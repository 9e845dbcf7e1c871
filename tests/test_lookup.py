"""Prompt lookup's matching (app/engine/lookup.py): the rule, the edit rule, and the index that
answers both from what earlier rounds indexed."""

from __future__ import annotations

import random

import pytest

from app.engine.drafters import PromptLookupDrafter, chat_lookup
from app.engine.lookup import EDIT, LATEST, LookupIndex
from app.engine.sampling import SamplingParams


def reference(seq: list[int], k: int, max_ngram: int, min_ngram: int, resync: bool = True) -> tuple[int, ...]:
    """The module's rule written as plainly as possible: a scan of the whole sequence."""
    if k <= 0 or len(seq) < 2:
        return ()
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        tail = seq[-n:]
        for i in range(len(seq) - n - 1, -1, -1):
            if seq[i : i + n] == tail:
                return tuple(seq[i + n : i + n + k])
    if not resync or min_ngram < 2:
        return ()
    length, anchor = len(seq), max_ngram
    for n in range(min(min_ngram - 1, 2), 0, -1):
        tail = seq[-n:]
        for written in range(EDIT + 1):
            end = length - n - written
            if end - anchor < 1:
                break
            gram = seq[end - anchor : end]
            starts = [q for q in range(end - anchor) if seq[q : q + anchor] == gram]
            for q in starts[::-1][:LATEST]:
                after = q + anchor
                for at in range(after, min(after + EDIT + n, length - 1) - n + 1):
                    if seq[at : at + n] == tail:
                        return tuple(seq[at + n : at + n + k])
    return ()


def test_the_index_answers_what_a_scan_of_the_whole_sequence_answers():
    """Over growing sequences that are also cut back and edited (a new chat, an edited turn), the
    index proposes exactly what the rule gives for the sequence alone, whatever it indexed before."""
    rng = random.Random(7)
    checked = proposed = 0
    for _ in range(1500):
        vocab = rng.choice([2, 3, 5, 20])
        max_ngram = rng.randrange(1, 5)
        min_ngram = rng.randrange(1, max_ngram + 1)
        index, seq = LookupIndex(max_ngram, min_ngram), []
        for _ in range(rng.randrange(1, 12)):
            if rng.random() < 0.1:
                seq = seq[: rng.randrange(len(seq) + 1)]
            seq += [rng.randrange(vocab) for _ in range(rng.randrange(8))]
            if seq and rng.random() < 0.05:
                seq[rng.randrange(len(seq))] = rng.randrange(vocab)
            k = rng.randrange(8)
            for resync in (True, False):
                want = reference(seq, k, max_ngram, min_ngram, resync)
                assert index.continuation(seq, k, resync) == want, (seq, k, max_ngram, min_ngram, resync)
                checked += 1
                proposed += bool(want)
    assert proposed > checked // 4  # the comparison covered proposals, not only empty answers


SOURCE = list(range(100, 140))  # the text the answer copies, in the prompt


def _lookup(committed: list[int], k: int = 6) -> tuple[int, ...]:
    return chat_lookup().propose(committed, k, SamplingParams()).ids


def test_a_copy_resumes_one_token_after_a_substituted_token():
    # the answer wrote 104 as 999 (a corrected word), then the source's next token, 105
    committed = [*SOURCE, 1, 2, 100, 101, 102, 103, 999, 105]
    assert _lookup(committed) == (106, 107, 108, 109, 110, 111)
    # the plain rule alone (3-4 token matches) finds nothing here: 999 105 is not in the source
    assert LookupIndex(4, 3).continuation(committed, 6, resync=False) == ()


def test_a_copy_resumes_after_a_word_written_as_two_tokens_and_after_a_deletion():
    # 104 105 (one misspelt word in two tokens) became 777 888 889 in the answer
    assert _lookup([*SOURCE, 1, 100, 101, 102, 103, 777, 888, 889, 106]) == (107, 108, 109, 110, 111, 112)
    # the answer left out 104 105 106
    assert _lookup([*SOURCE, 1, 100, 101, 102, 103, 107], k=3) == (108, 109, 110)
    # a two-token tail resumes too: 999 then 105 106
    assert _lookup([*SOURCE, 1, 100, 101, 102, 103, 999, 105, 106], k=2) == (107, 108)


def test_an_edit_longer_than_the_rule_allows_is_not_bridged():
    wrote = [900 + i for i in range(EDIT + 1)]  # more new tokens than an edit may hold
    assert _lookup([*SOURCE, 1, 100, 101, 102, 103, *wrote, 105]) == ()
    skipped = 104 + EDIT + 1  # more source tokens left out than an edit may skip
    assert _lookup([*SOURCE, 1, 100, 101, 102, 103, skipped]) == ()


def test_a_chance_short_match_is_not_proposed():
    # 120 occurs in the source, but nothing the answer wrote before it was copied
    assert _lookup([*SOURCE, 1, 5, 7, 9, 11, 13, 120]) == ()
    # nor is a copy of only 3 tokens before the edit enough: chance repeats that short are common
    assert _lookup([*SOURCE, 1, 101, 102, 103, 999, 105]) == ()


def test_lengths_outside_one_to_max_are_refused_at_construction():
    for max_ngram, min_ngram in ((2, 3), (3, 0)):
        with pytest.raises(ValueError, match="min_ngram <= max_ngram"):
            PromptLookupDrafter(max_ngram=max_ngram, min_ngram=min_ngram)


def test_one_drafter_serves_unrelated_sequences_in_turn():
    """The runner keeps one lookup for every request: a sequence that does not extend the last
    one is indexed afresh, and proposes what a new drafter would."""
    drafter = chat_lookup()
    first = [*SOURCE, 1, 100, 101, 102]
    assert drafter.propose(first, 3, SamplingParams()).ids == (103, 104, 105)
    other = [7, 8, 9, 10, 11, 7, 8, 9]
    assert drafter.propose(other, 3, SamplingParams()).ids == (10, 11, 7)
    assert drafter.propose(first + [103], 2, SamplingParams()).ids == (104, 105)
    drafter.finish(first + [103])  # the answer ended: its index is let go
    assert drafter.index.tokens == [] and not any(drafter.index.starts.values())
    assert drafter.propose(other, 3, SamplingParams()).ids == (10, 11, 7)
