"""Property tests: the on-device verification math of each backend against a numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from app.engine.backends import torch_backend as tb


def reference_greedy(logits: np.ndarray, drafts: np.ndarray) -> tuple[int, int]:
    n = 0
    while n < len(drafts) and int(np.argmax(logits[n])) == int(drafts[n]):
        n += 1
    return n, int(np.argmax(logits[n]))


def reference_rejection(q, p, drafts, r) -> tuple[int, np.ndarray]:
    k = len(drafts)
    for i in range(k):
        x = drafts[i]
        if not r[i] < min(1.0, q[i, x] / p[i, x]):
            res = np.maximum(q[i] - p[i], 0.0)
            return i, res / res.sum() if res.sum() > 0 else q[i]
    return k, q[k]


@st.composite
def greedy_case(draw):
    k = draw(st.integers(1, 6))
    vocab = draw(st.integers(2, 12))
    # distinct values per row, so argmax has one answer
    logits = np.stack([draw(st.permutations(range(vocab))) for _ in range(k + 1)]).astype(np.float32)
    match = draw(st.lists(st.booleans(), min_size=k, max_size=k))
    drafts = np.array([int(np.argmax(logits[i])) if match[i] else draw(st.integers(0, vocab - 1))
                       for i in range(k)])
    return logits, drafts


@st.composite
def rejection_case(draw):
    k = draw(st.integers(1, 5))
    vocab = draw(st.integers(2, 8))
    probs = st.floats(0.0, 1.0, allow_nan=False, width=32)
    q = draw(arrays(np.float64, (k + 1, vocab), elements=probs)) + 1e-3
    p = draw(arrays(np.float64, (k, vocab), elements=probs)) + 1e-3
    if draw(st.booleans()):
        p = q[:k].copy()  # the self-draft case: nothing is ever rejected
    q, p = q / q.sum(1, keepdims=True), p / p.sum(1, keepdims=True)
    drafts = np.array([draw(st.integers(0, vocab - 1)) for _ in range(k)])
    below_one = st.floats(0.0, 0.5, width=32) | st.floats(0.5, 0.9990000128746033, width=32)
    r = draw(arrays(np.float64, (k,), elements=below_one))
    return q.astype(np.float32), p.astype(np.float32), drafts, r.astype(np.float32)


@settings(max_examples=200, deadline=None)
@given(greedy_case())
def test_torch_greedy_matches_reference(case):
    logits, drafts = case
    n, token, q = tb.greedy_verdict(torch.from_numpy(logits), torch.from_numpy(drafts))
    assert (int(n), int(token)) == reference_greedy(logits, drafts)
    soft = np.exp(logits[:-1] - logits[:-1].max(1, keepdims=True))
    soft /= soft.sum(1, keepdims=True)
    np.testing.assert_allclose(q.numpy(), soft[np.arange(len(drafts)), drafts], rtol=1e-5)


@settings(max_examples=200, deadline=None)
@given(rejection_case())
def test_torch_rejection_matches_reference(case):
    q, p, drafts, r = case
    n, row, _ = tb.rejection_verdict(torch.from_numpy(q), torch.from_numpy(p),
                                     torch.from_numpy(drafts), torch.from_numpy(r))
    want_n, want_row = reference_rejection(q, p, drafts, r)  # float32, as on the device
    assert int(n) == want_n
    np.testing.assert_allclose(row.numpy(), want_row, atol=1e-5)


mx = pytest.importorskip("mlx.core")
from app.engine.backends import mlx_backend as mb  # noqa: E402


@settings(max_examples=100, deadline=None)
@given(greedy_case())
def test_mlx_greedy_matches_reference(case):
    logits, drafts = case
    n, token, _ = mb.greedy_verdict(mx.array(logits), mx.array(drafts.astype(np.int32)))
    assert (int(n.item()), int(token.item())) == reference_greedy(logits, drafts)


@settings(max_examples=100, deadline=None)
@given(rejection_case())
def test_mlx_rejection_matches_reference(case):
    q, p, drafts, r = case
    n, row, _ = mb.rejection_verdict(mx.array(q), mx.array(p), mx.array(drafts.astype(np.int32)),
                                     mx.array(r))
    want_n, want_row = reference_rejection(q, p, drafts, r)  # float32, as on the device
    assert int(n.item()) == want_n
    np.testing.assert_allclose(np.array(row), want_row, atol=1e-5)
