"""Issue 48's first measurement (app/bench/tree_ranks.py): lookup's candidates as a trie ranked
by recency, the target's token's rank among its siblings at each depth, and the passes an answer
takes with a chain or a tree, on sequences whose answers are known by construction."""

from __future__ import annotations

from app.bench.tree_ranks import accepted, count_passes, lookup_matches, lookup_ranks, rank_table, tree_nodes

# context "9 5 1 2 3 | 9 5 1 7 8 | 9 5": the tail "9 5" occurred twice; the latest occurrence
# continues "1 7 8", the older one "1 2 3"
CONTEXT = [9, 5, 1, 2, 3, 9, 5, 1, 7, 8, 9, 5]


def test_the_trie_ranks_the_latest_occurrence_first_and_follows_the_targets_path():
    assert lookup_matches(CONTEXT, len(CONTEXT)) == [7, 2]  # after each "9 5", the latest first
    # the target writes "1 2 3": depth 0 both matches agree (rank 0), depth 1 the older one (rank 1)
    tokens = CONTEXT + [1, 2, 3]
    assert lookup_ranks(tokens, len(CONTEXT), depth=3) == [0, 1, 0]
    # the target writes "1 7 8": the chain's own path, rank 0 all the way
    assert lookup_ranks(CONTEXT + [1, 7, 8], len(CONTEXT), depth=3) == [0, 0, 0]
    # a token no match continues with ends the walk
    assert lookup_ranks(CONTEXT + [1, 4, 8], len(CONTEXT), depth=3) == [0]
    assert lookup_ranks([1, 2, 3], 3, depth=2) == []  # no earlier occurrence: no candidates


def test_a_tree_accepts_where_the_target_took_the_second_choice_and_a_chain_stops():
    ranks = [0, 1, 0]
    assert accepted(ranks, (1, 1, 1)) == 1  # the chain: rejected at depth 1
    assert accepted(ranks, (1, 2, 1)) == 3  # a tree two wide at depth 1
    assert accepted(ranks, (2, 1)) == 1 and accepted([], (3, 3)) == 0


def test_passes_fall_with_a_tree_where_the_answer_follows_an_older_copy():
    tokens = CONTEXT + [1, 2, 3, 4]  # the answer: "5" (from the prefill), then "1 2 3 4"
    prompt = len(CONTEXT) - 1
    chain, tree = count_passes(tokens, prompt, (1, 1, 1, 1)), count_passes(tokens, prompt, (1, 2, 1, 1))
    # the chain: "1" accepted, "2" its own; then "3" accepted, "4" its own. The tree: "1 2 3", then "4".
    assert (chain.passes, chain.accepted, chain.accepted_by_depth) == (2, 2, [2, 0, 0, 0])
    assert (tree.passes, tree.accepted, tree.accepted_by_depth) == (1, 3, [1, 1, 1, 0])
    # the tree's one pass verified the trie within its widths: 1, then 7 and 2, then 8 and 3, then 9 and 9
    assert tree.widths == [1 + tree_nodes(tokens, 12, (1, 2, 1, 1))] == [1 + 7]
    assert chain.widths[0] == 1 + 4  # "1 7 8 9": the latest copy, k=4
    table = rank_table(tokens, prompt, depth=2, ranks_shown=2)
    assert table[1][1] == 1 and table[0][0] >= 2  # the one rank-1 hit, at depth 1
    assert table[1][-1] == 1  # and one miss no sibling held: "4" after "1 2 3", where "9" came before


def test_a_draft_models_ranks_and_a_top_k_tree_over_them():
    import numpy as np

    from app.bench.tree_ranks import by_confidence, model_ranks, ranked_passes

    tokens = [0, 1, 2, 3, 4]
    logits = np.full((5, 6), -5.0)
    logits[0, 1] = 5.0  # predicts 1: right, sure
    logits[1, [3, 2]] = [4.0, 3.0]  # predicts 3 first, 2 second: the target wrote 2 (rank 1)
    logits[2, 3] = 1.0  # right, unsure-ish
    logits[3, [5, 0, 4]] = [3.0, 2.0, 1.0]  # the target's 4 is third (rank 2)
    ranks, top1 = model_ranks(logits, 1, tokens)
    assert ranks == [0, 1, 0, 2] and top1[0] > 0.99 > top1[1]
    chain, tree = ranked_passes(ranks, (1, 1, 1)), ranked_passes(ranks, (2, 1, 1))
    # after the prefill's "1": the chain rejects at once twice; the tree takes "2 3", then "4" is its own
    assert (chain.passes, chain.accepted) == (2, 1) and (tree.passes, tree.accepted) == (1, 2)
    assert tree.widths == [1 + 2 + 2 + 2] and chain.widths[0] == 1 + 3
    bands = by_confidence(ranks, top1, edges=(0.9,))
    assert [b[1] for b in bands] == [2, 2] and bands[0][3] == 1.0  # both unsure misses were rank 1-2
