"""The speedup compares like with like (issue 46): an answer is measured only against timings of
the target alone at its own sampling settings and in its context region, and where there are none
it has no speedup and says why; one timing gives no verdict; the draft-k card and the exports show
no k for a pass that drafted nothing."""

from __future__ import annotations

import csv
import io

import pytest

pytest.importorskip("pytestqt")

from app.chat.baseline import GREEDY, Baseline, Timings, comparable, conditions_of  # noqa: E402
from app.chat.trace import ACCEPTED, TARGET, Chip, RoundTrace, TurnTrace  # noqa: E402
from app.engine.sampling import SamplingParams  # noqa: E402

CHAT = conditions_of(SamplingParams(temperature=0.7, top_p=0.95, top_k=40))


def test_settings_that_cost_differently_are_timed_apart():
    assert conditions_of(SamplingParams()) == GREEDY == conditions_of(SamplingParams(temperature=0.0, top_k=40))
    assert CHAT == "temperature 0.7, top-p 0.95, top-k 40"
    assert conditions_of(SamplingParams(temperature=0.7, top_p=1.0, top_k=0)) == "temperature 0.7"


def test_an_answer_takes_the_timings_at_its_settings_and_in_its_context_region():
    timings = (Timings().add(GREEDY, 0.010, 30, 32)  # at load, greedy
               .add(CHAT, 0.013, 30, 32)  # at load, the chat's settings
               .add(CHAT, 0.014, 400, 32)  # after an answer
               .add(CHAT, 0.030, 4000, 32))  # after a long chat
    greedy = timings.for_answer(GREEDY, 60)
    assert greedy.samples == (0.010,) and greedy.conditions == GREEDY
    short = timings.for_answer(CHAT, 200)
    assert short.samples == (0.013, 0.014) and short.conditions == CHAT and short.contexts == (30, 400)
    assert timings.for_answer(CHAT, 3000).samples == (0.030,)  # a long chat: the long timing only
    assert timings.for_answer(GREEDY, 3000) is None  # greedy was timed at 30 tokens only
    assert "was timed at temperature 0 at 30 tokens of context" in timings.missing(GREEDY, 3000)
    assert "has not been timed at temperature 1.2 yet" in timings.missing("temperature 1.2", 30)
    assert comparable(0, 250) and comparable(1000, 2000) and not comparable(100, 2000)


def test_a_baseline_keeps_its_settings_and_contexts_and_old_ones_read_as_greedy():
    baseline = Timings().add(CHAT, 0.013, 30, 32).add(CHAT, 0.014, 400, 32).for_answer(CHAT, 200)
    assert Baseline.from_dict(baseline.to_dict()) == baseline
    assert "at temperature 0.7, top-p 0.95, top-k 40" in baseline.describe()
    assert "30-400 tokens of context" in baseline.describe()
    old = Baseline.from_dict({"samples": [0.1, 0.2], "context": 50, "tokens": 32})
    assert old.conditions == GREEDY and old.contexts == ()
    for bad in ({"samples": [0.1], "conditions": 5}, {"samples": [0.1, 0.2], "contexts": [1]},
                {"samples": [0.1], "contexts": ["x"]}):
        assert Baseline.from_dict(bad) is None  # a damaged row: no baseline, not a traceback


def _trace(rounds, baseline=None, unmeasured=""):
    prefill = RoundTrace(0, 0, "", (Chip(5, "Hi", TARGET),), "Hi", 2, at=0.0)
    return TurnTrace([prefill, *rounds], baseline, unmeasured)


def test_a_pass_that_drafted_nothing_shows_and_exports_no_k():
    drafting = RoundTrace(1, 4, "lookup", (*[Chip(1, "a", ACCEPTED)] * 4, Chip(3, "t", TARGET)), "", 0, at=0.1)
    # the controller chose k = 4, but lookup found no match: a plain pass
    empty = RoundTrace(2, 4, "", (Chip(3, "t", TARGET),), "", 0, at=0.2)
    assert _trace([drafting]).figures().k == 4
    trace = _trace([drafting, empty])
    assert trace.figures().k == 0  # the card shows "–"
    rows = list(csv.DictReader(io.StringIO(trace.to_csv())))
    assert {row["k"] for row in rows if row["round"] == "2"} == {""}
    assert {row["k"] for row in rows if row["round"] == "1"} == {"4"}


def test_the_panel_says_why_an_answer_has_no_speedup_and_gives_one_timing_no_verdict(qtbot):
    from ui.panel.draft_panel import DraftPanel

    panel = DraftPanel()
    qtbot.addWidget(panel)
    timings = Timings().add(GREEDY, 0.010, 30, 32)
    panel.set_baseline(timings)
    drafting = RoundTrace(1, 4, "lookup", (*[Chip(1, "a", ACCEPTED)] * 4, Chip(3, "t", TARGET)), "", 0, at=0.1)
    why = timings.missing(CHAT, 40)
    panel.show_trace(_trace([drafting], None, why))
    tile = panel.tiles["speedup"]
    assert tile.value.text() == "–" and tile.caption.text() == "speedup"
    assert panel.baseline_label.text() == f"No speedup for this answer: {why}."
    # stored and read back, it still says why
    panel.show_trace(TurnTrace.from_dict(_trace([drafting], None, why).to_dict()))
    assert why in panel.baseline_label.text()
    panel.show_trace(_trace([drafting], timings.for_answer(GREEDY, 40)))
    assert tile.value.text() == "0.50×" and tile.caption.text() == "speedup"  # one timing: no verdict
    assert tile.detail.text() == "1 timing: no range yet"
