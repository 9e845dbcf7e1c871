"""Pairing a target with a draft through the runner: tokenizer checks, padded vocabularies,
non-trimmable caches, and the adaptive controller's choices."""

from __future__ import annotations

import json
import shutil

import pytest

from app.draft_choice import NO_DRAFT, PROMPT_LOOKUP, DraftChoice
from app.engine.adaptive import DraftLengthController
from app.engine.events import Finished, Notice, Round
from app.models.pairing import PairingError
from app.runner import ChatRequest, Runner
from tests.factories import tiny_llama

ASK = ChatRequest(({"role": "user", "content": "hi there"},), max_tokens=30)


def _tokens(events):
    return [t for e in events if isinstance(e, Round) for t in e.emitted]


def _padded_copy(tiny_pair, tmp_path, rows=1088):
    """The target's tokenizer with an embedding matrix padded to more rows (like Qwen's)."""
    folder = tmp_path / "padded"
    model = tiny_llama(seed=1, vocab=rows)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_pair["target"] / name, folder / name)
    return folder


def test_padded_embeddings_pair_and_stay_exact(tiny_pair, tmp_path):
    padded = _padded_copy(tiny_pair, tmp_path)
    runner = Runner()
    runner.load(tiny_pair["target"], "torch", draft=DraftChoice.model(padded), progress=lambda m: None)
    assert runner.target.vocab_size == 1024 and runner.drafter.backend.vocab_size == 1088
    assert runner.target.vocab_limit == runner.drafter.backend.vocab_limit == 1024
    spec = list(runner.chat(ASK))
    plain = list(runner.chat(ChatRequest(ASK.messages, max_tokens=30, drafter=NO_DRAFT)))
    assert _tokens(spec) == _tokens(plain)
    assert max(_tokens(spec)) < 1024


def test_different_tokenizers_are_refused_before_loading(tiny_pair, demo, tmp_path):
    # the demo's full 49152-token tokenizer beside the tiny model's 1024-token slice, and
    # weights whose shapes fit neither config: the tokenizer check must come before any load
    odd = tmp_path / "odd"
    shutil.copytree(demo["hf"], odd, ignore=shutil.ignore_patterns("*.safetensors"))
    shutil.copy(tiny_pair["target"] / "model.safetensors", odd / "model.safetensors")
    runner = Runner()
    with pytest.raises(PairingError) as err:
        runner.load(tiny_pair["target"], "torch", draft=DraftChoice.model(odd), progress=lambda m: None)
    message = str(err.value)
    assert "cannot be paired" in message and "1,024" in message and "49,152" in message
    assert runner.target is None  # nothing was replaced


def test_prompt_lookup_and_plain_through_the_runner(tiny_pair):
    runner = Runner()
    loaded = runner.load(tiny_pair["target"], "torch", draft=PROMPT_LOOKUP, progress=lambda m: None)
    assert loaded.draft == PROMPT_LOOKUP
    spec = list(runner.chat(ASK))
    plain = list(runner.chat(ChatRequest(ASK.messages, max_tokens=30, drafter=NO_DRAFT)))
    assert _tokens(spec) == _tokens(plain)
    assert isinstance(spec[-1], Finished)


def test_untrimmable_target_decodes_plainly_and_says_why(tiny_pair, monkeypatch):
    runner = Runner()
    runner.load(tiny_pair["target"], "torch", draft=DraftChoice.model(tiny_pair["near"]), progress=lambda m: None)
    plain = _tokens(runner.chat(ChatRequest(ASK.messages, max_tokens=30, drafter=NO_DRAFT)))
    monkeypatch.setattr(runner.target, "can_trim", lambda: False)
    events = list(runner.chat(ASK))
    notices = [e for e in events if isinstance(e, Notice)]
    assert notices and "cannot be rolled back" in notices[0].message
    assert all(not e.drafted for e in events if isinstance(e, Round))
    assert _tokens(events) == plain


def test_controller_falls_back_to_plain_when_drafts_do_not_pay():
    c = DraftLengthController()
    c.record_plain(0.050)
    for _ in range(30):  # a bad draft: nothing accepted, and drafting costs a third of a pass
        c.record_round(4, 0, draft_s=4 * 0.017, verify_s=0.060)
    choices = []
    for _ in range(400):
        k = choices.append(c.choose()) or choices[-1]
        if k:
            c.record_round(k, 0, draft_s=k * 0.017, verify_s=0.060)
        else:
            c.record_plain(0.050)
    probes = [i for i, k in enumerate(choices) if k]
    assert 2 <= len(probes) <= 5  # plain, with an occasional probe ...
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert gaps == sorted(gaps) and gaps[-1] > 2 * gaps[0]  # ... ever rarer while they find nothing
    assert {choices[i] for i in probes} == {4}  # at the cheapest verify width measured (5)


def test_controller_drafts_long_when_everything_is_accepted():
    c = DraftLengthController()
    choices = []
    for _ in range(60):  # a cheap draft that is always right
        k = choices.append(c.choose()) or choices[-1]
        if k:
            c.record_round(k, k, draft_s=k * 0.005, verify_s=0.050 + 0.004 * k)
        else:
            c.record_plain(0.050)
    assert min(choices[-20:]) >= 6
    assert c.costs.bound(8) > 3.0  # 9 tokens for 0.04 + 0.082 s vs 0.05 s per token


def test_positions_never_drafted_borrow_the_pooled_acceptance():
    """A pair accepting 98% at k = 4 must try longer drafts: positions 5.. were never drafted,
    and a fixed pessimistic prior there kept k at 4 for good (the demo pair did exactly that)."""
    c = DraftLengthController(fixed_k=4)
    for i in range(40):
        c.record_round(4, 3 if i % 12 == 0 else 4, draft_s=4 * 0.028, verify_s=0.080)
    c.costs.record_verify(1, 0.060)
    assert c.costs.acceptance(10) > 0.9
    adaptive = DraftLengthController()
    adaptive.costs = c.costs
    adaptive._warmup = []
    assert adaptive.choose() > 4
    # and a pair that rejects most drafts is not talked into long ones
    bad = DraftLengthController(fixed_k=4)
    for _ in range(40):
        bad.record_round(4, 0, draft_s=4 * 0.028, verify_s=0.080)
    assert bad.costs.acceptance(10) < 0.15


def test_all_rates_at_once_are_the_formula_for_each_k():
    """choose() prices every k in one pass (CostModel.rates): E[tokens | k] accumulated across k
    equals bound.expected_tokens for each k on its own, before anything is measured, with only
    plain decoding measured, after mixed rounds and for a block drafter."""
    import random

    from app.engine.bound import expected_tokens

    def one_by_one(costs):
        acceptance = [costs.acceptance(i) for i in range(costs.max_k)]
        return {k: expected_tokens(acceptance[:k], k) / (costs.draft_cost(k) + costs.verify_cost(k + 1))
                for k in range(costs.max_k + 1)
                if costs.verify_cost(k + 1) is not None and (not k or costs.t_draft is not None)}

    c = DraftLengthController()
    rng = random.Random(3)
    states = []
    for step in range(60):
        states.append(c.costs.rates())
        assert states[-1] == one_by_one(c.costs)
        if step == 0:
            c.record_plain(0.02)
        else:
            drafted = rng.randrange(1, 12)
            c.record_round(drafted, rng.randrange(drafted + 1), 0.001 * drafted, 0.02 + 0.003 * drafted)
    assert states[0] == {} and set(states[1]) == {0} and len(states[-1]) == c.costs.max_k + 1
    c.costs.per_pass = True  # a block drafter's: one pass drafts every token
    assert c.costs.rates() == one_by_one(c.costs) != states[-1]


def test_fixed_k_is_respected():
    c = DraftLengthController(fixed_k=3)
    c.record_round(3, 0, 0.1, 0.1)
    assert {c.choose() for _ in range(10)} == {3}


def test_cli_generate_with_a_self_draft(tiny_pair, capsys):
    from app.cli import main

    args = ["generate", "--target", str(tiny_pair["target"]), "--backend", "torch",
            "--prompt", "hello", "--max-tokens", "20"]
    assert main(args + ["--draft", "none"]) == 0
    plain = capsys.readouterr()
    assert main(args + ["--draft", str(tiny_pair["target"]), "--draft-tokens", "4",
                        "--show-rounds"]) == 0
    spec = capsys.readouterr()
    assert spec.out == plain.out
    assert "acceptance 100%" in spec.err and "[round 1 k=4] +" in spec.err


def test_cli_reports_bad_input_clearly(tmp_path, capsys):
    from app.cli import main

    (tmp_path / "weights.bin").write_bytes(b"\x80\x02pickle")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    assert main(["generate", "--target", str(tmp_path), "--backend", "torch", "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "pickled" in err and "safetensors" in err


def test_auto_draft_is_the_demo_default_or_prompt_lookup(tmp_path):
    from app.models.demo import DEMO_DRAFT, DEMO_REFERENCE
    from app.runner import auto_draft

    # the demo's measured best: on PyTorch its GGUF at its own precisions with prompt lookup (no
    # draft model agrees with it more cheaply than itself); its 4-bit copy for the float32 models
    assert auto_draft("demo", "torch") == PROMPT_LOOKUP
    assert auto_draft("demo", "torch", "gguf") == PROMPT_LOOKUP
    assert auto_draft("demo", "torch", "float32") == DEMO_DRAFT == DraftChoice.self_draft("int4")
    assert auto_draft(DEMO_REFERENCE, "torch") == DEMO_DRAFT
    assert auto_draft("demo", "mlx") == DEMO_DRAFT
    assert auto_draft(tmp_path, "torch") == auto_draft(tmp_path, "mlx") == PROMPT_LOOKUP


def test_one_slow_pass_does_not_rule_a_draft_length_out():
    c = DraftLengthController()
    for _ in range(5):
        c.record_round(4, 4, 0.04, 0.10)
    c.record_round(4, 4, 0.04, 5.0)  # a hiccup fifty times the usual cost
    assert c.costs.t_verify[5] < 0.12
