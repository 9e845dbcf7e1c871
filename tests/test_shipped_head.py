"""The draft head aligned to the demo's GGUF that ships with Tandem (resources/aligned/, made by
benchmarks/make_aligned_demo.py): it loads beside the demo, drafts tokens the target takes, leaves
the answer the target's own, and is offered in the Draft slot where the demo is the target;
"auto" drafts with it only where this computer's pair trials measured it faster than lookup."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.draft_choice import AUTO_DRAFT, PROMPT_LOOKUP
from app.engine.events import Round
from app.engine.sampling import SamplingParams
from app.models.demo import demo_draft, demo_head, demo_head_agreement
from app.models.pair_memory import PairMemory, TrialResult
from app.runner import ChatRequest, Runner
from tests.test_gguf_own_precision import GGUF_TIE_GAP, SUITE, _disagreements


def test_the_shipped_head_drafts_tokens_the_demo_takes_and_the_answer_stays_the_targets(demo):
    head = demo_head()
    assert head is not None, "resources/aligned/ lost the demo's head"
    runner = Runner()
    loaded = runner.load("demo", "torch", draft=head, progress=lambda m: None)
    assert loaded.draft == head and loaded.dtype.startswith("4-bit GGUF")
    drafted = accepted = 0
    for prompt in SUITE[:3]:
        messages = ({"role": "user", "content": prompt},)
        # k fixed at 2: adaptive k may rightly stop drafting with a head that does not pay here; chains:
        # under "auto" the tree chooser follows the clock, so how many drafts a run shows would too
        request = ChatRequest(messages, max_tokens=48, params=SamplingParams(temperature=0.0), draft_tokens=2,
                              trees="off")
        rounds = [e for e in runner.chat(request) if isinstance(e, Round)]
        tokens = [t for r in rounds for t in r.emitted]
        for position, gap in _disagreements(runner.target, runner.tokenizer.render_chat(list(messages)),
                                            tokens):
            assert gap < GGUF_TIE_GAP, f"token {position} differs from the target alone (top-2 gap {gap:.3f})"
        by_head = [r for r in rounds if r.source == "head"]  # the head drafts through the MTP drafter, as "head"
        drafted += sum(len(r.drafted) for r in by_head)
        accepted += sum(r.accepted for r in by_head)
    # an unaligned head agrees 0.04% (its manifest); this one took 12% of its drafts on the suite
    assert drafted >= 40 and accepted / drafted > 0.04, (accepted, drafted)
    before, after = demo_head_agreement()
    assert before < 0.01 < 0.3 < after  # as measured when it was made, on held-out answers


def _trial(speedup: float, low: float | None = None, high: float | None = None) -> TrialResult:
    return TrialResult(acceptance=0.5, speedup=speedup, tokens_per_pass=1.5, tokens=100, measured_at=1.0,
                       low=low, high=high)


def test_auto_drafts_the_demo_with_the_head_only_where_its_trial_measured_faster(tmp_path):
    head = demo_head()
    memory = PairMemory(tmp_path / "pairs.json")
    assert demo_draft("demo", "torch", memory=memory) == PROMPT_LOOKUP  # nothing measured: the bench's pick
    memory.set_trial("torch", "demo", head, _trial(1.5))
    assert demo_draft("demo", "torch", memory=memory) == PROMPT_LOOKUP  # lookup unmeasured here
    memory.set_trial("torch", "demo", AUTO_DRAFT, _trial(1.6))  # "auto" measured while it meant lookup
    assert demo_draft("demo", "torch", memory=memory) == PROMPT_LOOKUP
    memory.set_trial("torch", "demo", PROMPT_LOOKUP, _trial(1.4))  # lookup's own trial counts first
    assert demo_draft("demo", "torch", memory=memory) == head
    memory.set_trial("torch", "demo", head, _trial(1.45))  # 3.5% faster: within a trial's noise
    assert demo_draft("demo", "torch", memory=memory) == PROMPT_LOOKUP
    memory.set_trial("torch", "demo", head, _trial(1.5))
    assert demo_draft("demo", "torch", "float32", memory=memory) != head  # the float32 reference keeps its int4 copy
    assert demo_draft("demo", "mlx", memory=memory) != head
    assert demo_draft("demo", "torch", memory=memory, measured=False) == PROMPT_LOOKUP


@pytest.mark.parametrize("head_range, lookup_range, picks_head", [
    ((1.45, 1.55), (1.30, 1.40), True),  # the head's whole range above lookup's
    ((1.38, 1.62), (1.30, 1.40), False),  # 7% ahead on the figures, but the ranges overlap
    ((1.60, 1.70), (1.30, 1.65), False),  # lookup's range reaches the head's
])
def test_with_ranged_trials_auto_takes_the_head_only_where_its_range_clears_lookups(
        tmp_path, head_range, lookup_range, picks_head):
    head = demo_head()
    memory = PairMemory(tmp_path / "pairs.json")
    memory.set_trial("torch", "demo", head, _trial(sum(head_range) / 2, *head_range))
    memory.set_trial("torch", "demo", PROMPT_LOOKUP, _trial(sum(lookup_range) / 2, *lookup_range))
    assert (demo_draft("demo", "torch", memory=memory) == head) == picks_head


@pytest.mark.parametrize("target, backend, offered", [("demo", "torch", True), ("demo", "mlx", False),
                                                      ("/models/other", "torch", False)])
def test_the_draft_slot_offers_the_head_only_with_the_demo_on_pytorch(target, backend, offered):
    pytest.importorskip("PySide6")
    from ui.pairing.slot_menu import shipped_head_entry

    pairing = SimpleNamespace(loaded=SimpleNamespace(backend=backend),
                              current=SimpleNamespace(named=lambda: (target, AUTO_DRAFT)))
    entry = shipped_head_entry(pairing)
    assert (entry is not None) == offered
    if offered:
        text, tip, choice = entry
        assert choice == demo_head() and "shipped" in text and f"{demo_head_agreement()[1]:.0%}" in tip
