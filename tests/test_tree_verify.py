"""A token tree verified in one pass (app/engine/tree.py, app/engine/backends/tree_torch.py):
each node's logits are a one-token step's along its path, the cache keeps exactly the accepted
path, and the verdict is the target's own: its greedy tokens at temperature 0, its distribution
over two-token continuations above 0 (chi-square)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.engine.sampling import SamplingParams
from app.engine.tree import ROOT, TokenTree, walk

GREEDY = SamplingParams(temperature=0.0)
PROMPT = [5, 17, 300, 42, 7, 9, 101, 3]


def test_a_trie_merges_shared_prefixes_and_keeps_parents_first():
    tree = TokenTree.from_paths([[1, 2, 3], [1, 4], [5], [1, 2, 6]])
    assert tree.tokens == (1, 2, 3, 4, 5, 6)
    assert tree.parents == (ROOT, 0, 1, 0, ROOT, 1)
    assert tree.depths == (0, 1, 2, 1, 0, 2)
    assert tree.path(5) == (0, 1, 5) and tree.visible[3] == frozenset({0, 3})
    assert tree.children(ROOT) == {1: 0, 5: 4} and not tree.is_chain
    assert TokenTree.from_paths([[7, 8, 9]]).is_chain
    with pytest.raises(ValueError, match="not an earlier node"):
        TokenTree((1, 2), (1, ROOT))
    with pytest.raises(ValueError, match="merge them"):
        TokenTree((1, 1), (ROOT, ROOT))


def test_the_walk_descends_while_a_child_carries_the_chosen_token():
    tree = TokenTree.from_paths([[1, 2, 3], [1, 4], [5]])
    choices = {ROOT: 1, 0: 4, 3: 8}  # root -> 1 (node 0) -> 4 (node 3) -> 8: no such child
    verdict = walk(tree, lambda node: choices[node])
    assert verdict.path == (0, 3) and verdict.token == 8 and verdict.emitted(tree) == [1, 4, 8]
    assert walk(tree, lambda node: 9).path == ()  # nothing accepted: the target's own token alone


@pytest.fixture
def target(tiny_pair):
    from app.engine.backends.torch_backend import TorchBackend

    backend = TorchBackend(tiny_pair["target"], device="cpu", precision="float32")
    assert backend.step == "lean"
    return backend


@pytest.fixture
def transformers_target(tiny_pair):
    """The same tiny Llama through transformers' own forward and cache (a 4-D mask, position ids)."""
    from app.engine.backends.torch_backend import TorchBackend

    backend = TorchBackend(tiny_pair["target"], device="cpu", precision="float32", step="transformers")
    assert backend.step == "transformers" and backend.tree_note() == ""
    return backend


@pytest.fixture(scope="module")
def families(tmp_path_factory) -> dict:
    """Folders of tiny Gemma, Phi-3 and Gemma 2 models (transformers' forward runs them)."""
    from tests.factories import tiny_family

    root = tmp_path_factory.mktemp("families")
    for kind in ("gemma", "phi3", "gemma2"):
        tiny_family(kind, seed=5).save_pretrained(root / kind)
    return {kind: root / kind for kind in ("gemma", "phi3", "gemma2")}


def _family(families, kind):
    from app.engine.backends.torch_backend import TorchBackend

    backend = TorchBackend(families[kind], device="cpu", precision="float32")
    assert backend.step == "transformers" and backend.tree_note() == ""
    return backend


@pytest.fixture
def gemma(families):
    return _family(families, "gemma")


@pytest.fixture
def phi3(families):
    return _family(families, "phi3")


def test_sliding_window_and_recurrent_targets_say_why_they_verify_chains(families, tmp_path):
    """Through transformers' forward: a sliding window's layer keeps its last positions only, and a
    recurrent layer reads a pass in order (siblings would corrupt each other's state)."""
    from app.engine.backends.torch_backend import TorchBackend
    from tests.factories import save_qwen35, tiny_qwen35

    sliding = TorchBackend(families["gemma2"], device="cpu", precision="float32")
    assert "sliding window" in sliding.tree_note()
    hybrid = TorchBackend(save_qwen35(tiny_qwen35(3), tmp_path / "hybrid"), device="cpu", precision="float32")
    assert "recurrent layers read a pass in order" in hybrid.tree_note()


def test_alibi_models_verify_chains(tmp_path):
    """Bloom biases attention by where a key sits in the pass and reads the mask as (batch, length):
    positions by depth cannot reach it, so it verifies chains."""
    from transformers import BloomConfig, BloomForCausalLM

    from app.engine.backends.torch_backend import TorchBackend

    torch.manual_seed(0)
    BloomForCausalLM(BloomConfig(vocab_size=1024, hidden_size=64, n_layer=2, n_head=4)).save_pretrained(tmp_path / "b")
    bloom = TorchBackend(tmp_path / "b", device="cpu", precision="float32")
    assert bloom.step == "transformers" and "rotary positions taken from position ids" in bloom.tree_note()


@pytest.fixture(scope="module")
def compiled_target(tmp_path_factory, tiny_fields):
    """A tiny Llama GGUF whose decoder layers run as one compiled call on Tandem's CPU kernel."""
    import gguf

    from app.engine.backends.torch_backend import TorchBackend
    from app.models.gguf_import import import_gguf
    from tests.factories import tiny_llama, write_gguf

    q = gguf.GGMLQuantizationType
    root = tmp_path_factory.mktemp("tree_q4")
    write_gguf(tiny_llama(seed=23, hidden=128, heads=4, kv_heads=2), root / "m.gguf", tiny_fields, q.Q4_1,
               embedding_qtype=q.Q8_0)
    backend = TorchBackend(import_gguf(root / "m.gguf", root / "import", mlx_variants=())["hf"], precision="gguf")
    assert backend._lean.native is not None
    return backend


# A branch revisited after shallower tokens took its ancestors' rows: 18 sits under 11 -> 12 -> 13,
# and comes after 14 and 15, which took the rows of 12 and 11 while 13's stayed in place
BRANCHY = [[11, 12, 13], [11, 14], [15], [11, 12, 13, 18], [15, 16], [11, 12, 17], [11, 12, 19, 20]]


def test_on_the_compiled_layers_each_node_is_bit_for_bit_a_one_token_step(compiled_target):
    """The compiled call gathers each node's path where a one-token step along it would have it
    (kernels_numba._attend_tree): the same bits, not only close."""
    from app.engine.backends.tree_torch import tree_logits

    target = compiled_target
    tree = TokenTree.from_paths(BRANCHY)
    target.reset()
    target.prefill(PROMPT[:-2])
    logits = tree_logits(target, PROMPT[-2:], tree)
    assert torch.equal(logits[1], _step_logits(target, [PROMPT[-1]]))
    for node in range(len(tree)):
        path = [PROMPT[-1], *(tree.tokens[i] for i in tree.path(node))]
        assert torch.equal(logits[2 + node], _step_logits(target, path)), node


def test_on_the_compiled_layers_the_kept_path_continues_bit_for_bit(compiled_target):
    from app.engine.backends.tree_torch import keep_path, tree_logits

    target = compiled_target
    tree = TokenTree.from_paths(BRANCHY)
    target.reset()
    target.prefill(PROMPT[:-1])
    tree_logits(target, [PROMPT[-1]], tree)
    node = tree.children(tree.children(tree.children(tree.children(ROOT)[11])[12])[19])[20]
    keep_path(target, 1, tree.path(node), len(PROMPT) - 1)
    after = target.forward_last([21])
    assert torch.equal(after, _step_logits(target, [PROMPT[-1], 11, 12, 19, 20, 21]))


def _step_logits(backend, tokens):
    """The logits after reading `tokens` one at a time from an empty cache (after the prompt)."""
    backend.reset()
    backend.prefill(PROMPT[:-1])
    for token in tokens[:-1]:
        backend.forward_last([token])
    return backend.forward_last([tokens[-1]])


@pytest.mark.parametrize("which", ["target", "transformers_target", "gemma", "phi3"])
def test_each_nodes_logits_are_a_one_token_steps_along_its_path(which, request):
    from app.engine.backends.tree_torch import tree_logits

    target = request.getfixturevalue(which)
    tree = TokenTree.from_paths([[11, 12, 13], [11, 14], [15, 16], [11, 12, 17]])
    target.reset()
    target.prefill(PROMPT[:-2])
    logits = tree_logits(target, PROMPT[-2:], tree)  # two pending tokens, then the tree
    assert logits.shape[0] == 2 + len(tree)
    torch.testing.assert_close(logits[1], _step_logits(target, [PROMPT[-1]]), atol=1e-4, rtol=1e-4)
    for node in range(len(tree)):
        path = [PROMPT[-1], *(tree.tokens[i] for i in tree.path(node))]
        torch.testing.assert_close(logits[2 + node], _step_logits(target, path), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("which", ["target", "transformers_target", "phi3"])
def test_the_cache_keeps_the_pending_tokens_and_the_accepted_path_only(which, request):
    from app.engine.backends.tree_torch import keep_path, tree_logits

    target = request.getfixturevalue(which)
    tree = TokenTree.from_paths([[11, 12, 13], [11, 14, 18], [15, 16]])
    target.reset()
    target.prefill(PROMPT[:-1])
    tree_logits(target, [PROMPT[-1]], tree)
    node = tree.children(tree.children(tree.children(ROOT)[11])[14])[18]
    path = tree.path(node)  # 11 -> 14 -> 18: nodes 0, 3, 4, moved behind the prompt
    assert path == (0, 3, 4)
    keep_path(target, 1, path, len(PROMPT) - 1)
    assert target.cache.length == len(PROMPT) + 3
    after = target.forward_last([21])
    assert target.cache.length == len(PROMPT) + 4
    target.reset()
    want = target.forward_last([*PROMPT, 11, 14, 18, 21])  # a fresh prefill of the prompt and the path
    torch.testing.assert_close(after, want, atol=1e-4, rtol=1e-4)


def _step_states(backend, tokens):
    """The inner states a one-token step hands over for each of `tokens`, read one at a time
    after the prompt (the cache is left as it was found: empty)."""
    backend.reset()
    backend.prefill(PROMPT[:-2])
    rows = []
    for token in tokens:
        backend.forward_last([token])
        rows.append(backend.last_hidden()[-1].clone())
    backend.reset()
    return torch.stack(rows)


@pytest.mark.parametrize("which,layers", [("target", ()), ("compiled_target", ()), ("compiled_target", (0, 2)),
                                          ("transformers_target", ()), ("transformers_target", (0, 2))])
def test_the_kept_paths_inner_states_are_handed_over_as_one_token_steps_give_them(which, layers, request):
    """A drafter that reads the target's states (an MTP layer, an aligned head; EAGLE-3's three
    layers) is handed, after a tree's verdict, the pending tokens' and the kept path's rows in the
    cache's order, whichever branch the walk took: on the compiled call the same bits as one-token
    steps along that path (the final norm's output); on the PyTorch body, and for inner layers,
    which run on it, the same within float32's rounding."""
    from app.engine.backends.tree_torch import keep_path, tree_logits

    backend = request.getfixturevalue(which)
    tree = TokenTree.from_paths(BRANCHY)
    node = tree.children(tree.children(tree.children(tree.children(ROOT)[11])[12])[19])[20]
    assert backend.capture_hidden(True, layers) == ""
    try:
        backend.reset()
        backend.prefill(PROMPT[:-2])
        tree_logits(backend, PROMPT[-2:], tree)
        keep_path(backend, 2, tree.path(node), len(PROMPT) - 2)
        kept = backend.last_hidden().clone()
        want = _step_states(backend, [*PROMPT[-2:], 11, 12, 19, 20])
    finally:
        backend.capture_hidden(False)
    width = backend.model.config.hidden_size * max(len(layers), 1)
    assert kept.shape == want.shape == (6, width)
    if which == "compiled_target" and not layers:
        assert torch.equal(kept, want)
    else:
        torch.testing.assert_close(kept, want, atol=1e-4, rtol=1e-4)


def _greedy(backend, n):
    backend.reset()
    out, ids = [], PROMPT
    for _ in range(n):
        token = backend.next_token(ids, GREEDY)
        out.append(token)
        ids = [token]
    backend.reset()
    return out


@pytest.mark.parametrize("which", ["target", "compiled_target", "transformers_target", "gemma"])
def test_at_temperature_0_the_verdict_is_the_longest_path_of_the_targets_own_tokens(which, request):
    check_greedy_verdict(request.getfixturevalue(which))


def check_greedy_verdict(target) -> None:
    """Decoys beside the target's greedy path: the verdict takes the path, and the next round goes
    on from it as the target alone would (tests/test_tree_mlx.py runs it on MLX)."""
    greedy = _greedy(target, 6)
    wrong = [(t + 1) % 1000 for t in greedy]
    # decoys beside the greedy path: a wrong first token, a right one then wrong, the right three
    tree = TokenTree.from_paths([[wrong[0], greedy[1]], greedy[:1] + wrong[1:3], greedy[:3], greedy[:2] + wrong[2:3]])
    target.reset()
    target.prefill(PROMPT[:-1])
    verdict = target.verify_tree([PROMPT[-1]], tree, GREEDY)
    assert verdict.emitted(tree) == greedy[:4]
    # the next round continues from the kept path as the target alone would
    assert target.next_token([verdict.token], GREEDY) == greedy[4]


def _two_token_law(backend, params):
    """The target's own probability of every first token and of the second given the first."""
    from app.engine.backends.verdict_torch import probs_from_logits

    backend.reset()
    first = probs_from_logits(backend.forward_last(PROMPT), params)
    seconds = {}
    for token in torch.nonzero(first > 1e-4).flatten().tolist():
        backend.reset()
        seconds[token] = probs_from_logits(backend.forward_last([*PROMPT, token]), params)
    backend.reset()
    return first, seconds


def test_above_temperature_0_two_token_continuations_follow_the_targets_law(target):
    """Chi-square over (first, second) token pairs from 1,500 rounds of a tree whose children are
    the target's likeliest tokens and some it never picks: deterministic children, the target's
    own draws (tree_torch.verify_tree)."""
    from scipy.stats import chisquare

    params = SamplingParams(temperature=0.7, top_k=6)
    first, seconds = _two_token_law(target, params)
    likely = torch.topk(first, 3).indices.tolist()
    paths = [[a, b] for a in likely for b in torch.topk(seconds[a], 2).indices.tolist()] + [[999, 998]]
    tree = TokenTree.from_paths(paths)
    target.seed(1234)
    counts: dict[tuple[int, int], int] = {}
    rounds = 1500
    for _ in range(rounds):
        target.reset()
        target.prefill(PROMPT[:-1])
        emitted = target.verify_tree([PROMPT[-1]], tree, params).emitted(tree)
        if len(emitted) < 2:  # nothing accepted: the second token is the next round's first
            emitted.append(target.next_token([emitted[0]], params))
        pair = (emitted[0], emitted[1])
        counts[pair] = counts.get(pair, 0) + 1
    law = {(a, b): float(first[a] * seconds[a][b]) for a in seconds for b in
           torch.nonzero(seconds[a] > 0).flatten().tolist()}
    assert set(counts) <= set(law)
    big = [pair for pair, p in law.items() if p * rounds >= 5]
    observed = [counts.get(pair, 0) for pair in big] + [rounds - sum(counts.get(pair, 0) for pair in big)]
    expected = [law[pair] * rounds for pair in big] + [rounds * (1 - sum(law[pair] for pair in big))]
    expected = np.array(expected) * (rounds / sum(expected))
    assert len(big) >= 6
    assert chisquare(observed, expected).pvalue > 1e-3, (observed, expected.round(1).tolist())


def test_lookups_tree_is_the_trie_of_every_match_latest_first():
    from app.bench.tree_ranks import lookup_tree

    tokens = [1, 2, 3, 9, 1, 5, 1, 2, 3, 7, 8, 4, 1, 2, 3]  # the tail 1 2 3 occurred twice before
    tree = lookup_tree(tokens, (2, 1), max_ngram=3, min_ngram=3)
    assert tree.children(ROOT) == {7: 0, 9: 1}  # the latest match's continuation first
    assert [tree.tokens[i] for i in tree.path(2)] == [7, 8] and [tree.tokens[i] for i in tree.path(3)] == [9, 1]
    assert len(lookup_tree(tokens, (1, 1), max_ngram=3, min_ngram=3)) == 2  # one child a node: the chain
    assert len(lookup_tree([4, 5, 6], (2, 2), max_ngram=3, min_ngram=1)) == 0  # no earlier occurrence


def test_a_tree_without_its_root_is_refused_and_the_cache_is_left_as_it_was(compiled_target):
    from app.engine.backends.tree_torch import tree_logits

    compiled_target.reset()
    compiled_target.prefill(PROMPT)
    with pytest.raises(ValueError, match="needs its root"):
        tree_logits(compiled_target, [], TokenTree.from_paths([[11, 12]]))
    assert compiled_target.cache.length == len(PROMPT)
