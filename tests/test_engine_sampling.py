"""Distribution at temperature > 0: speculative sampling (Leviathan/Chen rejection sampling)
produces the target's own distribution. A chi-square goodness-of-fit test compares the tokens
produced by the first speculative round with their exact marginal under the target, computed by
enumerating a 16-token vocabulary."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import LlamaConfig, LlamaForCausalLM

from app.engine.backends import load_backend
from app.engine.backends import torch_backend as tb
from app.engine.drafters import LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter
from app.engine.events import Round
from app.engine.sampling import SamplingParams
from app.engine.speculative import generate

VOCAB = 16
PROMPT = [3, 7, 1, 12]
ALPHA = 1e-3  # significance: a correct sampler fails this test once in a thousand seeds
SAMPLES = 2500


def _small_model(seed: int, folder):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=64, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # sharper distributions than the init, so draft and target differ
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(6.0)
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def small_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    return _small_model(21, root / "target"), _small_model(22, root / "draft")


def exact_marginals(model, prompt: list[int], params: SamplingParams, depth: int = 3,
                    vocab: int = VOCAB) -> list[np.ndarray]:
    """P(t_i) for i = 1..depth under `model` (a transformers model, run on whole sequences, no
    cache) alone, by enumeration."""

    def next_probs(prefix):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + list(prefix)])).logits[0, -1]
        return tb.probs_from_logits(logits, params).double().numpy()

    marginals, frontier = [], {(): 1.0}
    for _ in range(depth):
        dist, nxt = np.zeros(vocab), {}
        for prefix, weight in frontier.items():
            probs = next_probs(prefix)
            dist += weight * probs
            for t in np.nonzero(probs > 1e-4)[0]:
                nxt[prefix + (int(t),)] = weight * probs[t]
        marginals.append(dist)
        frontier = nxt
    return marginals


def _exact_marginals(folder, params: SamplingParams, depth: int = 3) -> list[np.ndarray]:
    model = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return exact_marginals(model, PROMPT, params, depth)


def _speculative_samples(small_pair, params, n=SAMPLES, backend="torch", lookup=False, trees="auto", **options):
    target = load_backend(small_pair[0], backend, **options)
    drafter = ModelDrafter(load_backend(small_pair[1], backend, **options))
    if lookup:  # one-token matches: deterministic lookup drafts and model drafts both occur
        drafter = LookupThenModelDrafter(drafter, PromptLookupDrafter(max_ngram=2, min_ngram=1), min_tokens=1)
    counts = np.zeros((3, VOCAB))
    for i in range(n):
        # a seed repeats its answer, so each sample gets its own (from the case's, reproducibly)
        seeded = replace(params, seed=None if params.seed is None else params.seed * 100_003 + i)
        rounds = [e for e in generate(target, lambda ids: "", PROMPT, drafter=drafter,
                                      draft_tokens=2, max_tokens=3, params=seeded, trees=trees)
                  if isinstance(e, Round)]
        tokens = [t for e in rounds for t in e.emitted]
        TREE_ROUNDS[trees] = TREE_ROUNDS.get(trees, 0) + sum(e.tree is not None for e in rounds)
        for i, t in enumerate(tokens):
            counts[i, t] += 1
    return counts


TREE_ROUNDS: dict[str, int] = {}  # rounds that verified a tree, by the trees option


def _p_value(observed: np.ndarray, expected_p: np.ndarray) -> float:
    expected = expected_p / expected_p.sum() * observed.sum()
    big = expected >= 5  # pool sparse cells so the chi-square approximation holds
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp).pvalue)


CASES = [SamplingParams(temperature=1.0, seed=5),
         SamplingParams(temperature=0.7, top_p=0.9, seed=6)]


@pytest.mark.parametrize("params", CASES, ids=["T1", "T0.7-top_p0.9"])
def test_speculative_sampling_matches_the_target(small_pair, params):
    exact = _exact_marginals(small_pair[0], params)
    counts = _speculative_samples(small_pair, params)
    for position in (1, 2):  # tokens 2 and 3 come from the first speculative round
        assert _p_value(counts[position], exact[position]) > ALPHA / 2, position


def test_static_shape_passes_sample_as_the_target(small_pair):
    """The passes CUDA graphs replay (padded widths, bucketed lengths, a fixed KV buffer), run
    eagerly here: rejection sampling on them still gives the target's own distribution."""
    params = CASES[0]
    exact = _exact_marginals(small_pair[0], params)
    counts = _speculative_samples(small_pair, params, graphs="static")
    for position in (1, 2):
        assert _p_value(counts[position], exact[position]) > ALPHA / 2, position


def test_lookup_then_model_sampling_matches_the_target(small_pair):
    params = CASES[1]
    exact = _exact_marginals(small_pair[0], params)
    counts = _speculative_samples(small_pair, params, lookup=True)
    for position in (1, 2):
        assert _p_value(counts[position], exact[position]) > ALPHA / 2, position


def test_unseeded_sampling_as_the_window_asks_matches_the_target(small_pair):
    """No seed, as the window sends: each answer draws from the OS's entropy, the draft on a
    stream of its own (a shared stream made P(t2 = t1) 10.2% against an exact 2.67%)."""
    params = SamplingParams(temperature=1.0)
    exact = _exact_marginals(small_pair[0], params)
    counts = _speculative_samples(small_pair, params)
    for position in (1, 2):
        assert _p_value(counts[position], exact[position]) > ALPHA / 2, position


def test_trees_of_a_sampled_draft_sample_as_the_target(small_pair):
    """Every round a tree where the draft was unsure (its runner-up beside its sampled token):
    the walk takes the target's own draw at each node and descends where a child matches it,
    so the first three tokens' marginals are the target's (app/engine/tree.py)."""
    params = CASES[1]
    exact = _exact_marginals(small_pair[0], params)
    TREE_ROUNDS.clear()
    counts = _speculative_samples(small_pair, params, n=1500, trees="on")
    assert TREE_ROUNDS["on"] > 300  # (the draft was unsure often enough for trees to be tested)
    for position in range(3):
        assert _p_value(counts[position], exact[position]) > ALPHA / 2, position


def test_the_test_catches_a_wrong_residual(small_pair, monkeypatch):
    """With the residual taken as max(p - q, 0) the same test must fail."""
    params = CASES[0]
    exact = _exact_marginals(small_pair[0], params)
    from app.engine.backends import verdict_torch

    monkeypatch.setattr(verdict_torch, "residual", lambda q, p: (p - q).clamp(min=0.0))
    counts = _speculative_samples(small_pair, params)
    assert min(_p_value(counts[i], exact[i]) for i in (1, 2)) < ALPHA / 2


def test_mlx_speculative_sampling_matches_the_target(small_pair, tmp_path):
    pytest.importorskip("mlx_lm")
    params = CASES[0]
    exact = _exact_marginals(small_pair[0], params)
    counts = _speculative_samples(small_pair, params, n=1500, backend="mlx")
    for position in (1, 2):
        assert _p_value(counts[position], exact[position]) > ALPHA / 2, position

