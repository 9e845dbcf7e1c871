"""The lean step (app/engine/backends/lean_step_torch.py) and its static-shape path for CUDA graphs
(cuda_graphs_torch.py with graphs off): the same logits as transformers' forward, and the same
answers, token for token, through the engine with every drafter, rollbacks, kept caches and Stop."""

from __future__ import annotations

import pytest
import torch
from transformers import (DynamicCache, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

from app.engine.backends import load_backend
from app.engine.backends.cuda_graphs_torch import (WIDTHS, GraphedStep, HostIds, length_bucket,
                                                   width_bucket)
from app.engine.backends.lean_step_torch import LeanStep, why_not_lean
from app.engine.drafters import LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter
from app.engine.events import Round
from app.engine.kept_caches import KeptCaches
from app.engine.sampling import SamplingParams
from app.engine.speculative import generate

SHAPE = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)


def _family(kind: str):
    torch.manual_seed(3)
    if kind == "llama":
        model = LlamaForCausalLM(LlamaConfig(**SHAPE, rope_parameters={"rope_type": "llama3", "rope_theta": 5e5,
                                 "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 64}))
    elif kind == "qwen2":  # biases on q/k/v
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
    elif kind == "qwen3":  # per-head q/k norms, an explicit head_dim
        model = Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=32))
    else:
        model = MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=None))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)  # norms and biases away from their init too
    return model.eval()



@torch.inference_mode()
def test_dense_projections_become_one_stacked_weight_held_once():
    """q/k/v and gate/up of a dense model become one matmul each: the modules' weights (and q/k/v
    biases) turn into views of one stacked tensor, so the model's bytes do not grow, and a second
    lean step over the same model (the step switched back and forth) stacks nothing again."""
    model = _family("qwen2")
    before = {name: p.clone() for name, p in model.named_parameters()}
    LeanStep(model)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    storage = attn.q_proj.weight.untyped_storage().data_ptr()
    assert attn.k_proj.weight.untyped_storage().data_ptr() == storage == attn.v_proj.weight.untyped_storage().data_ptr()
    assert attn.k_proj.bias.untyped_storage().data_ptr() == attn.q_proj.bias.untyped_storage().data_ptr()
    assert mlp.up_proj.weight.untyped_storage().data_ptr() == mlp.gate_proj.weight.untyped_storage().data_ptr()
    assert attn.o_proj.weight.untyped_storage().data_ptr() != storage  # a lone projection is left alone
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), name  # the same numbers under the same names
    LeanStep(model)
    assert attn.q_proj.weight.untyped_storage().data_ptr() == storage  # no second stack

@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "mistral"])
@torch.inference_mode()
def test_lean_logits_equal_transformers(kind):
    model = _family(kind)
    assert why_not_lean(model) == ""
    ids = torch.randint(3, 300, (1, 40))
    cache = DynamicCache(config=model.config)
    lean = LeanStep(model)
    kv = lean.new_cache()
    for part, keep in ((ids[:, :30], 30), (ids[:, 30:31], 1), (ids[:, 31:36], 5)):  # prefill, step, verify
        want = model(input_ids=part, cache=cache, use_cache=True).logits[0, -keep:]
        got, hidden = lean.forward(part, kv, keep, hidden=True)
        kv.appended(part.shape[1])
        assert hidden.shape == (part.shape[1], SHAPE["hidden_size"])
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert kv.length == 36


@torch.inference_mode()
def test_static_shapes_equal_exact_shapes():
    """Padded widths and bucketed lengths (the graphs' shapes) give the exact passes' logits, and
    padding never becomes part of the cache."""
    model = _family("llama")
    lean = LeanStep(model)
    exact, fixed = lean.new_cache(), lean.new_cache(fixed=True)
    fixed.reserve(1, planned=600)
    graphs = GraphedStep(lean, fixed, capture=False)
    ids = torch.randint(3, 300, (1, 300))
    lean.forward(ids[:, :250], exact, 1)
    lean.forward(ids[:, :250], fixed, 1)
    exact.appended(250)
    fixed.appended(250)
    at = 250
    for n in (1, 5, 7, 1, 13, 17, 2):  # widths 5, 7, 13 pad to 6, 8, 17; 260+ crosses into the 512 bucket
        part = ids[:, at:at + n]
        want, _ = lean.forward(part, exact, n)
        got, hidden = graphs.forward(part, n)
        exact.appended(n)
        fixed.appended(n)
        assert got.shape == (n, SHAPE["vocab_size"]) and hidden.shape == (n, SHAPE["hidden_size"])
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
        exact.trim(at + n - 1)  # a rejected last draft
        fixed.trim(at + n - 1)
        at += n - 1
    assert {key[1] for key in graphs.graphs} == {256, 512}
    assert graphs.replays == 7


def test_buckets():
    assert [width_bucket(n) for n in (1, 2, 5, 7, 9, 17)] == [1, 2, 5, 8, 12, 17]
    assert width_bucket(WIDTHS[-1] + 1) is None
    assert length_bucket(1, 10_000) == 256 and length_bucket(257, 10_000) == 512
    assert length_bucket(5000, 6000) == 6000  # never past the buffer


def test_host_ids_on_the_cpu():
    assert HostIds(torch.device("cpu"))([4, 5, 6]).tolist() == [[4, 5, 6]]


def test_families_it_does_not_cover_keep_transformers():
    config = MistralConfig(**SHAPE, sliding_window=16)
    assert "sliding" in why_not_lean(MistralForCausalLM(config))
    config = LlamaConfig(**SHAPE, rope_parameters={"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0})
    assert "dynamic rope" in why_not_lean(LlamaForCausalLM(config))


# --- through the engine: static shapes (graphs off) against transformers' forward ---------------

PROMPTS = [
    [1, 969, 198, 20, 300, 301, 2, 198, 1, 520, 198],
    [1, 520, 198, 40, 41, 42, 40, 41, 42, 40, 41],  # repetitive: prompt lookup finds matches
]
N = 40


def _tokens(target, prompt, drafter=None, **options):
    return [t for e in generate(target, lambda ids: "", prompt, drafter=drafter, max_tokens=N, **options)
            if isinstance(e, Round) for t in e.emitted]


@pytest.fixture(scope="module")
def pairs(tiny_pair):
    def load(role, step, graphs):
        return load_backend(tiny_pair["target" if role == "self" else role], "torch", step=step, graphs=graphs)
    static = {role: load(role, "lean", "static") for role in ("target", "draft", "near", "self")}
    return {"transformers": {"target": load("target", "transformers", "off")}, "static": static,
            "lean": {"target": load("target", "lean", "off")}}


def test_static_shapes_give_transformers_tokens_with_every_drafter(pairs):
    reference, static = pairs["transformers"]["target"], pairs["static"]
    assert static["target"].step == "lean" and "lean step" in static["target"].precision
    assert pairs["transformers"]["target"].step == "transformers"
    for prompt in PROMPTS:
        plain = _tokens(reference, prompt)
        assert _tokens(static["target"], prompt) == plain
        assert _tokens(pairs["lean"]["target"], prompt) == plain
        for role in ("self", "near", "draft"):
            for k in (None, 3):
                assert _tokens(static["target"], prompt, ModelDrafter(static[role]), draft_tokens=k) == plain, role
        assert _tokens(static["target"], prompt, PromptLookupDrafter()) == plain
        both = LookupThenModelDrafter(ModelDrafter(static["near"]), min_tokens=1)
        assert _tokens(static["target"], prompt, both, draft_tokens=4) == plain
    assert static["target"]._graphs.replays > 0  # the static shapes really ran


def test_static_shapes_sample_as_the_target_does(pairs):
    """A seeded answer at temperature 1 is the same sample on both paths (same logits, same stream)."""
    params = SamplingParams(temperature=1.0, seed=11)
    reference = _tokens(pairs["transformers"]["target"], PROMPTS[0], params=params)
    assert _tokens(pairs["static"]["target"], PROMPTS[0], params=params) == reference
    drafted = ModelDrafter(pairs["static"]["near"])
    again = _tokens(pairs["static"]["target"], PROMPTS[0], drafted, params=params, draft_tokens=3)
    assert len(again) == N


def test_static_shapes_keep_caches_across_chats(pairs):
    """A chat set aside and taken up again continues from its own cache (copied out of and back into
    the fixed buffer the graphs read), while another chat used the buffer in between."""
    target = pairs["static"]["target"]
    reference = pairs["transformers"]["target"]
    first, second = PROMPTS
    kept = KeptCaches(budget_bytes=1 << 30)
    kept.switch("a", [target])
    answer = _tokens(target, first, reuse_cache=True)
    assert not kept.switch("b", [target])
    _tokens(target, second, reuse_cache=True)
    assert kept.switch("a", [target])
    assert target.cache_len == len(first) + N - 1 and target.cache.store is target._graphs.kv.store
    follow = [*first, *answer, 198, 1, 520, 198]
    assert _tokens(target, follow, reuse_cache=True) == _tokens(reference, follow)


def test_stop_mid_round_leaves_the_static_cache_whole(pairs):
    target, draft = pairs["static"]["target"], pairs["static"]["near"]
    calls = {"n": 0}

    def stop_after_a_few():
        calls["n"] += 1
        return calls["n"] > 9

    events = list(generate(target, lambda ids: "", PROMPTS[0], drafter=ModelDrafter(draft), max_tokens=N,
                           draft_tokens=4, should_stop=stop_after_a_few, reuse_cache=True))
    done = events[-1]
    assert done.stats.finish_reason == "cancelled"
    emitted = [t for e in events if isinstance(e, Round) for t in e.emitted]
    assert target.cache_len == len(PROMPTS[0]) + len(emitted) - 1  # no rejected or unverified drafts held
    follow = [*PROMPTS[0], *emitted]
    reference = pairs["transformers"]["target"]
    assert _tokens(target, follow, reuse_cache=True) == _tokens(reference, follow)


def test_a_pass_that_cannot_be_captured_runs_eagerly_and_says_why(tiny_pair, monkeypatch):
    from app.engine.backends import cuda_graphs_torch

    def broken(self, width, length):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(cuda_graphs_torch.GraphedStep, "_build", broken)
    target = load_backend(tiny_pair["target"], "torch", graphs="static")
    reference = load_backend(tiny_pair["target"], "torch", step="transformers")
    assert _tokens(target, PROMPTS[0]) == _tokens(reference, PROMPTS[0])
    assert "no CUDA graphs: capturing a pass of width 12 failed (RuntimeError: operation not permitted" \
        in target.precision


def test_models_info_says_how_passes_run(tiny_pair, capsys):
    from app.cli import main

    assert main(["models", "info", str(tiny_pair["target"])]) == 0
    out = capsys.readouterr().out
    assert "passes on PyTorch: the lean step" in out and "trees of drafts verified on the CPU" in out
    from types import SimpleNamespace

    from app.engine.backends.lean_step_torch import passes_words

    # a hybrid (Qwen3.5: Gated DeltaNet in three layers of four) verifies chains, and says why
    hybrid = SimpleNamespace(model_type="qwen3_5", text_config=SimpleNamespace(
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"]))
    words = passes_words(hybrid)
    assert words.startswith("passes on PyTorch: transformers' forward (") and "not qwen3_5" in words
    assert "chains, not trees: its recurrent layers read a pass in order" in words
    assert "trees of drafts verified through transformers' forward" in passes_words(SimpleNamespace(model_type="phi3"))
    gemma3 = SimpleNamespace(model_type="gemma3", layer_types=["sliding_attention"] * 5 + ["full_attention"])
    assert "chains, not trees: its sliding-window (or chunked) layers" in passes_words(gemma3)


def test_graphs_off_reaches_the_target_and_its_draft(tiny_pair):
    from app.cli import build_parser
    from app.draft_choice import DraftChoice
    from app.runner import Runner

    assert build_parser().parse_args(["bench", "--graphs", "off"]).graphs == "off"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "--graphs", "sometimes"])
    runner = Runner()
    runner.load(str(tiny_pair["target"]), "torch", draft=DraftChoice.parse_loadable(str(tiny_pair["near"])),
                progress=lambda message: None, graphs="off")
    assert runner.target.graphs == "off" and runner.drafter.backend.graphs == "off"


def test_a_capture_never_prices_a_draft_length(pairs, monkeypatch):
    """A CUDA graph's capture costs 100 times a pass (measured on an H100: a planted 1B draft
    accepted in full, and adaptive k still chose plain decoding after its first rounds had captured
    graphs). Here each capture of the static path costs 10 s on the clock the engine reads: the
    rounds that captured keep their acceptance, but no draft or verify cost includes one, and the
    pair still drafts."""
    import time

    from app.engine.adaptive import DraftLengthController
    from app.engine.backends import cuda_graphs_torch

    offset = {"s": 0.0}
    real_clock, real_build = time.perf_counter, cuda_graphs_torch.GraphedStep._build

    def slow_build(self, width, length):
        offset["s"] += 10.0
        return real_build(self, width, length)

    monkeypatch.setattr(time, "perf_counter", lambda: real_clock() + offset["s"])
    monkeypatch.setattr(cuda_graphs_torch.GraphedStep, "_build", slow_build)
    target = load_backend(pairs["static"]["target"].folder, "torch", graphs="static")  # nothing captured yet
    draft = load_backend(pairs["static"]["self"].folder, "torch", graphs="static")
    real_forward = draft._forward

    def free_forward(ids, keep):  # the draft is the target itself: its passes cost nothing on the
        began = real_clock()      # engine's clock, so that drafting pays whatever this machine's
        try:                      # timings, as long as the captures (10 s each) are not priced in
            return real_forward(ids, keep)
        finally:
            offset["s"] -= real_clock() - began

    draft._forward = free_forward
    controller = DraftLengthController()
    events = list(generate(target, lambda ids: "", PROMPTS[0], drafter=ModelDrafter(draft), max_tokens=N,
                           controller=controller))
    assert offset["s"] >= 40 and target.one_time_work > 0 and draft.one_time_work > 0  # captures happened
    costs = controller.for_source(None).costs
    assert costs.t_verify and max(costs.t_verify.values()) < 5
    assert costs.t_draft is not None and costs.t_draft < 5
    rounds = [e for e in events if isinstance(e, Round)]
    assert sum(len(r.drafted) for r in rounds[-5:]) > 0  # the draft (the target itself) still drafts
