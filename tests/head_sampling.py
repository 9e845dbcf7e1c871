"""The temperature-1 check every drafter that reads the target's state shares (MTP layers, EAGLE-3
heads, DFlash drafters): short answers drafted two tokens a round, each seeded differently, whose
tokens 2 and 3 must keep the target's own marginals (chi-square against transformers' exact
distribution), with both verdicts common so that the rejection path is exercised too."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from app.engine.events import Round
from app.engine.sampling import SamplingParams
from app.engine.speculative import generate


def check_sampling_keeps_the_target(folder, target, drafter, prompt, vocab: int, answers: int, seed: int = 11,
                                    trees: str = "auto") -> int:
    """-> the rounds that verified a tree (`trees="on"`: the drafter's trees, each verified by the
    target's own draws along it, tree_torch.verify_tree)."""
    import torch
    from transformers import AutoModelForCausalLM

    from tests.test_engine_sampling import ALPHA, _p_value, exact_marginals

    params = SamplingParams(temperature=1.0, seed=seed)
    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    exact = exact_marginals(model, prompt, params, depth=3, vocab=vocab)
    counts, drafted, accepted, tree_rounds = np.zeros((3, vocab)), 0, 0, 0
    for i in range(answers):
        seeded = replace(params, seed=params.seed * 100_003 + i)
        events = list(generate(target, lambda ids: "", prompt, drafter=drafter, max_tokens=3, draft_tokens=2,
                               params=seeded, trees=trees))
        tree_rounds += sum(1 for e in events if isinstance(e, Round) and e.tree is not None)
        stats = events[-1].stats
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
        for position, t in enumerate(t for e in events if isinstance(e, Round) for t in e.emitted):
            counts[position, t] += 1
    # both verdicts common: at least 2% rejected (20 of 1,000 drafts) runs the rejection path many
    # times; the tiny heads trained here accept 95-96% with the packages of 2026-11-28 (95% was the
    # bound before, and they crossed it without any change of Tandem's)
    assert 0.2 < accepted / drafted < 0.98, (accepted, drafted)
    for position in (1, 2):
        assert _p_value(counts[position], exact[position]) > ALPHA / 2, position
    return tree_rounds
