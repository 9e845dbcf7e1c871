"""Streaming detokenization and stop strings."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.engine.detokenize import REPLACEMENT, StreamingDetokenizer
from app.engine.stops import StopStrings
from app.models.transformers_tokenizer import ChatTokenizer

SAMPLES = [
    " leading space and  double spaces",
    "naïve café — 東京 🚀🎉 emoji split over byte tokens",
    "line one\n\n    indented code()\n\ttab",
    "ÀÉÎÕÜ ß ø 中文字符",
]


@pytest.fixture(scope="module")
def tokenizer(demo):
    return ChatTokenizer(demo["hf"])


@pytest.mark.parametrize("text", SAMPLES)
def test_deltas_join_to_the_text_and_never_split_a_character(tokenizer, text):
    ids = tokenizer.encode(text)
    detok = StreamingDetokenizer(tokenizer.decode, context=tokenizer.encode("Answer:"))
    deltas = [detok.add(t) for t in ids]
    deltas.append(detok.flush())
    assert "".join(deltas) == text
    assert all(REPLACEMENT not in d for d in deltas)
    if "🚀" in text:  # the emoji is several byte tokens: some add() calls must hold text back
        assert any(d == "" for d in deltas[:-1])


@settings(max_examples=60, deadline=None)
@given(st.text(min_size=1, max_size=40))
def test_any_text_streams_back_exactly(tokenizer, text):
    ids = tokenizer.encode(text)
    detok = StreamingDetokenizer(tokenizer.decode)
    streamed = "".join(detok.add(t) for t in ids) + detok.flush()
    assert streamed == tokenizer.decode(ids)


def test_stop_string_split_across_deltas_is_never_shown():
    stops = StopStrings(["</answer>"])
    shown = []
    for delta in ["The result", " is 4.</", "ans", "wer> trailing"]:
        text, hit = stops.feed(delta)
        shown.append(text)
        if hit:
            break
    assert "".join(shown) == "The result is 4."
    assert hit


def test_held_prefix_is_released_when_it_does_not_complete():
    stops = StopStrings(["STOP"])
    assert stops.feed("go ST") == ("go ", False)
    assert stops.feed("ART") == ("START", False)
    assert stops.flush() == ""
