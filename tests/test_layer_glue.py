"""The lean step's glue (app/engine/backends/layer_glue_torch.py): the fused functions (what
torch.compile fuses on CUDA) compute what the eager ops compute, function by function and over
whole passes and answers, for float32 and bfloat16 models and Qwen3's per-head norms."""

from __future__ import annotations

import pytest
import torch

from app.engine.backends import layer_glue_torch as glue_module
from app.engine.backends.layer_glue_torch import EagerGlue, FusedGlue, why_not_fused
from app.engine.backends.lean_step_torch import LeanStep
from tests.test_lean_step import SHAPE, _family


@pytest.fixture
def uncompiled(monkeypatch):
    """FusedGlue with its functions run as written, not compiled: the arithmetic the compiled
    kernels implement, on the CPU in seconds (the compiled ones are checked on a GPU)."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)


def _norm_module(width: int, dtype: torch.dtype):
    norm = torch.nn.Module()
    norm.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(width).to(dtype), requires_grad=False)
    norm.variance_epsilon = 1e-6
    return norm


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@torch.inference_mode()
def test_fused_functions_compute_the_eager_glue(dtype, uncompiled):
    torch.manual_seed(0)
    heads, kv_heads, hd, n = 4, 2, 16, 5
    eager, fused = EagerGlue(heads, kv_heads, hd, dtype), FusedGlue(heads, kv_heads, hd, dtype)
    exact = dict(atol=0, rtol=0) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
    norm = _norm_module(64, dtype)
    x, y = torch.randn(n, 64).to(dtype), torch.randn(n, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(fused.norm(x, norm, torch.bfloat16), eager.norm(x, norm, torch.bfloat16),
                               **(exact if dtype != torch.float32 else dict(atol=1e-2, rtol=1e-2)))
    got_x, got_h = fused.add_norm(x.clone(), y, norm, dtype)
    want_x, want_h = eager.add_norm(x.clone(), y, norm, dtype)
    assert got_x.dtype == want_x.dtype == dtype  # a bfloat16 product into a float32 stream stays float32
    torch.testing.assert_close(got_x, want_x, atol=0, rtol=0)
    torch.testing.assert_close(got_h, want_h, atol=1e-5 if dtype == torch.float32 else 1e-2, rtol=1e-2)

    positions = torch.tensor([7, 8, 9, 10, 11])
    angles = positions[:, None].float() * torch.linspace(0.01, 1.0, hd // 2)[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1).to(dtype), torch.cat([angles.sin()] * 2, -1).to(dtype)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * hd).to(dtype)
    for q_norm, k_norm in ((None, None), (_norm_module(hd, dtype), _norm_module(hd, dtype))):
        q_want, (k_want, v_want) = eager.split_rope(qkv, eager.rope_inputs(cos, sin), q_norm, k_norm)
        q_got, kv_got = fused.split_rope(qkv, fused.rope_inputs(cos, sin), q_norm, k_norm)
        assert q_got.shape == (heads, n, hd) and kv_got.shape == (2, kv_heads, n, hd)
        close = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=1e-2)
        torch.testing.assert_close(q_got, q_want, **close)
        torch.testing.assert_close(kv_got[0], k_want, **close)
        torch.testing.assert_close(kv_got[1], v_want, atol=0, rtol=0)  # values are only split
    gate_up = torch.randn(n, 96, dtype=torch.bfloat16)
    torch.testing.assert_close(fused.gated(gate_up, torch.nn.SiLU(), torch.bfloat16),
                               eager.gated(gate_up, torch.nn.SiLU(), torch.bfloat16), atol=1e-2, rtol=1e-2)
    scores = torch.randn(2, n, 20).to(dtype)
    torch.testing.assert_close(fused.softmax(scores, dtype), eager.softmax(scores, dtype), atol=0, rtol=0)


@torch.inference_mode()
def test_both_glues_write_the_cache_where_the_pass_says():
    """A pass's keys and values land at its positions (a graph's positions tensor, or start..)."""
    store = torch.zeros(2, 2, 16, 4)
    k, v = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    for writer, kv in ((EagerGlue.write, (k, v)), (FusedGlue.write, torch.stack((k, v)))):
        for positions, start in ((torch.tensor([5, 6, 7]), 0), (None, 5)):
            store.zero_()
            writer(store, kv, start, positions)
            assert torch.equal(store[0, :, 5:8], k) and torch.equal(store[1, :, 5:8], v)
            assert store[:, :, :5].abs().sum() == 0 and store[:, :, 8:].abs().sum() == 0


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
@torch.inference_mode()
def test_fused_glue_passes_give_the_eager_passes_logits(kind, uncompiled):
    """Whole passes (prefill, a step, a verify pass) with the fused glue's arithmetic: the eager
    glue's logits, and the same greedy answer over 24 tokens."""
    model = _family(kind)
    ids = torch.randint(3, SHAPE["vocab_size"], (1, 36))
    lean_eager, lean_fused = LeanStep(model), LeanStep(model, fused=True)
    assert lean_fused.glue.fused and not lean_eager.glue.fused
    caches = lean_eager.new_cache(), lean_fused.new_cache()
    for part, keep in ((ids[:, :30], 30), (ids[:, 30:31], 1), (ids[:, 31:36], 5)):
        (want, want_hidden), (got, got_hidden) = (lean.forward(part, kv, keep, hidden=True)
                                                  for lean, kv in zip((lean_eager, lean_fused), caches, strict=True))
        for kv in caches:
            kv.appended(part.shape[1])
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got_hidden, want_hidden, atol=1e-4, rtol=1e-4)
    answers = []
    for lean in (lean_eager, lean_fused):
        kv, tokens = lean.new_cache(), []
        logits, _ = lean.forward(ids[:, :8], kv, 1)
        kv.appended(8)
        for _ in range(24):
            tokens.append(int(logits[-1].argmax()))
            logits, _ = lean.forward(torch.tensor([[tokens[-1]]]), kv, 1)
            kv.appended(1)
        answers.append(tokens)
    assert answers[0] == answers[1]


def test_the_glue_is_fused_only_where_it_can_be(monkeypatch):
    from types import SimpleNamespace

    silu = SimpleNamespace(hidden_act="silu")
    assert "unless asked" in why_not_fused(silu, torch.device("cpu"))
    assert why_not_fused(silu, torch.device("cpu"), asked=True) == ""
    monkeypatch.setattr(glue_module.importlib.util, "find_spec", lambda name: None)
    assert "no Triton" in why_not_fused(silu, torch.device("cuda"))
    monkeypatch.setattr(glue_module.importlib.util, "find_spec", lambda name: object())
    assert why_not_fused(silu, torch.device("cuda")) == ""
    assert "not gelu" in why_not_fused(SimpleNamespace(hidden_act="gelu"), torch.device("cuda"))


def test_an_answer_with_the_fused_glue_is_the_target_alone(tiny_pair, uncompiled):
    """`--glue on` through the engine (the fused arithmetic, uncompiled): the target's own tokens
    with a draft model and with prompt lookup, at the graphs' static shapes and at exact ones, and
    the load line says what runs."""
    from app.engine.backends import load_backend
    from app.engine.drafters import ModelDrafter, PromptLookupDrafter
    from tests.test_lean_step import PROMPTS, _tokens

    plain = load_backend(tiny_pair["target"], "torch", graphs="off", glue="off")
    assert "glue" not in plain.precision
    for graphs in ("static", "off"):
        target = load_backend(tiny_pair["target"], "torch", graphs=graphs, glue="on")
        draft = load_backend(tiny_pair["near"], "torch", graphs=graphs, glue="on")
        assert target._lean.glue.fused and "glue fused by torch.compile" in target.precision
        for prompt in PROMPTS:
            want = _tokens(plain, prompt)
            assert _tokens(target, prompt) == want
            assert _tokens(target, prompt, ModelDrafter(draft), draft_tokens=3) == want
            assert _tokens(target, prompt, PromptLookupDrafter()) == want


def test_a_glue_that_fails_to_fuse_runs_eagerly_and_says_why(tiny_pair, monkeypatch):
    """At load (no C++ compiler, an op Inductor cannot take) or at any later pass: the eager glue
    takes over, the answer is the same, and the precision words give the reason."""
    from app.engine.backends import load_backend
    from app.engine.drafters import ModelDrafter
    from tests.test_lean_step import PROMPTS, _tokens

    calls = {"n": 0, "fail_from": 0}

    def flaky_compile(fn, **kwargs):
        def run(*args, **kw):
            calls["n"] += 1
            if calls["n"] > calls["fail_from"]:
                raise RuntimeError("Inductor: no working C++ compiler found")
            return fn(*args, **kw)
        return run

    monkeypatch.setattr(torch, "compile", flaky_compile)
    plain = load_backend(tiny_pair["target"], "torch", graphs="static", glue="off")
    want = _tokens(plain, PROMPTS[0])
    at_load = load_backend(tiny_pair["target"], "torch", graphs="static", glue="on")
    assert not at_load._lean.glue.fused
    assert "glue eager: fusing it failed (RuntimeError: Inductor: no working C++ compiler found)" in at_load.precision
    assert _tokens(at_load, PROMPTS[0]) == want
    calls["n"], calls["fail_from"] = 0, 10 ** 9
    later = load_backend(tiny_pair["target"], "torch", graphs="static", glue="on")
    draft = load_backend(tiny_pair["near"], "torch", graphs="static", glue="off")
    assert later._lean.glue.fused
    calls["fail_from"] = calls["n"] + 40  # fails in the middle of the answer, inside a pass
    assert _tokens(later, PROMPTS[0], ModelDrafter(draft), draft_tokens=3) == want
    assert not later._lean.glue.fused and "glue eager: fusing it failed" in later.precision
    assert later._graphs is not None and later._graphs.replays > 0  # the static shapes go on, eager glue


@torch.inference_mode()
def test_grouped_attention_gives_the_logits_of_sdpa_with_grouped_heads():
    """CUDA's masked attention (each KV head's queries together, an additive mask, baddbmm,
    softmax and bmm) run here on the CPU: the logits of the CPU's path."""
    model = _family("llama")
    ids = torch.randint(3, SHAPE["vocab_size"], (1, 36))
    plain, grouped = LeanStep(model), LeanStep(model)
    grouped.grouped = True
    caches = plain.new_cache(), grouped.new_cache()
    for part, keep in ((ids[:, :30], 30), (ids[:, 30:31], 1), (ids[:, 31:36], 5)):
        want, got = (lean.forward(part, kv, keep)[0] for lean, kv in zip((plain, grouped), caches, strict=True))
        for kv in caches:
            kv.appended(part.shape[1])
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
