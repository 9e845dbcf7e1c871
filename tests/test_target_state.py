"""The target's state for drafters that condition on it (MTP heads, EAGLE, Gemma 4 assistants):
a drafter that asks (`wants_target_state`) gets the final hidden state of every committed
position exactly once, from the prefill, the verify passes (before any replay) and plain steps,
equal to what the target computes for those tokens from scratch; a drafter that does not ask
costs the target nothing (no capture is installed)."""

from __future__ import annotations

import numpy as np
import pytest

from app.engine.backends import load_backend
from app.engine.drafters import ModelDrafter
from app.engine.events import Round
from app.engine.speculative import generate
from tests.factories import save_qwen35, tiny_qwen35
from tests.scripted import ScriptedDrafter

PROMPT = [1, 969, 198, 20, 300, 301, 2, 198, 1, 520, 198]


def _numpy(array) -> np.ndarray:
    return array.float().numpy() if hasattr(array, "float") and hasattr(array, "numpy") else np.array(array)


class StateRecorder(ScriptedDrafter):
    """The target's own answer with a wrong token at a moving position (rejections of every
    length, and full acceptances), recording the hidden states it is handed, by position."""

    wants_target_state = True

    def __init__(self, plain, vocab, layers=()):
        super().__init__(PROMPT, plain, vocab)
        self.target_layers = layers
        self.rows: dict[int, np.ndarray] = {}
        self.twice: list[int] = []

    def accepted(self, committed, proposal, n_accepted, state=None):
        super().accepted(committed, proposal, n_accepted, state)
        if state is None:
            return
        assert state.start + len(state.hidden) <= len(committed) - 1  # committed positions only
        for i, row in enumerate(_numpy(state.hidden)):
            if state.start + i in self.rows:
                self.twice.append(state.start + i)
            self.rows[state.start + i] = row


def _check(target, fresh, draft_tokens, layers=()):
    plain = [t for e in generate(fresh, str, PROMPT, max_tokens=30) if isinstance(e, Round) for t in e.emitted]
    recorder = StateRecorder(plain, target.vocab_limit, layers)
    events = list(generate(target, str, PROMPT, drafter=recorder, draft_tokens=draft_tokens, max_tokens=30))
    rounds = [e for e in events if isinstance(e, Round)]
    assert any(e.drafted and e.accepted < len(e.drafted) for e in rounds)  # rejections happened
    assert any(e.drafted and e.accepted == len(e.drafted) for e in rounds)  # and full acceptances
    held = list(target.held)
    assert len(held) == target.cache_len > len(PROMPT)
    assert not recorder.twice and sorted(recorder.rows) == list(range(len(held)))
    assert target.last_hidden() is None  # capture is off again after the answer
    assert fresh.capture_hidden(True, layers) == ""
    fresh.reset()
    fresh.prefill(held)
    want = _numpy(fresh.last_hidden())
    fresh.capture_hidden(False)
    got = np.stack([recorder.rows[i] for i in range(len(held))])
    scale = max(1.0, float(np.abs(want).max()))
    assert np.abs(got - want).max() / scale < 1e-4


@pytest.mark.parametrize("backend", ["torch", "mlx"])
@pytest.mark.parametrize("layers", [(), (2, 0, 1)], ids=["final norm", "inner layers"])
def test_a_drafter_that_asks_gets_every_committed_positions_hidden_state(tiny_pair, backend, layers):
    if backend == "mlx":
        pytest.importorskip("mlx_lm")
    folder = tiny_pair["target"] if backend == "torch" else tiny_pair["target_mlx"]
    _check(load_backend(folder, backend), load_backend(folder, backend), draft_tokens=4, layers=layers)


@pytest.mark.parametrize("step", ["lean", "transformers"])
def test_inner_layer_states_are_the_states_entering_those_layers(tiny_pair, step):
    """EAGLE-3's convention (HF's hidden_states[i], vLLM's aux layers): layer i's state is what
    enters decoder layer i, 0 the embedding; the layer count names the last layer's output,
    which the final norm turns into the model's last hidden state."""
    import torch

    target = load_backend(tiny_pair["target"], "torch")
    target.step = step
    count = len(target.model.model.layers)
    want = target.model.model(input_ids=torch.tensor([PROMPT]), output_hidden_states=True)
    assert target.capture_hidden(True, (count, 1, 0)) == ""
    target.prefill(PROMPT)
    got = target.last_hidden().float()
    width = want.hidden_states[0].shape[-1]
    assert got.shape == (len(PROMPT), 3 * width)
    torch.testing.assert_close(got[:, width:2 * width], want.hidden_states[1][0].float(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[:, 2 * width:], want.hidden_states[0][0].float(), atol=1e-4, rtol=1e-4)
    normed = target.model.model.norm(got[:, :width].to(want.last_hidden_state.dtype))
    torch.testing.assert_close(normed.float(), want.last_hidden_state[0].float(), atol=1e-4, rtol=1e-4)
    assert f"this model has {count} decoder layers" in target.capture_hidden(True, (count + 1,))
    assert "twice" in target.capture_hidden(True, (1, 1))
    target.capture_hidden(False)


def test_a_hybrid_target_hands_the_verify_pass_state_not_the_replays(tiny_pair, tmp_path):
    """On a hybrid the rejected rounds replay the kept tokens: the state handed over is the
    verify pass's rows of the kept positions, the same as from scratch."""
    folder = save_qwen35(tiny_qwen35(3), tmp_path / "hybrid", tiny_pair["target"])
    target = load_backend(folder, "torch")
    _check(target, load_backend(folder, "torch"), draft_tokens=3)


def test_plain_pairs_pay_nothing_for_the_state_path(tiny_pair):
    """A draft model does not ask for the target's state: no capture is installed, nothing kept."""
    target = load_backend(tiny_pair["target"], "torch")
    norm = target.model.model.norm
    seen = []
    for event in generate(target, str, PROMPT, drafter=ModelDrafter(load_backend(tiny_pair["near"], "torch")),
                          draft_tokens=4, max_tokens=12):
        if isinstance(event, Round):
            seen.append((len(norm._forward_hooks), target.last_hidden()))
    assert seen and all(hooks == 0 and hidden is None for hooks, hidden in seen)


def test_the_static_shape_passes_hand_over_the_inner_states_of_exact_shapes(tiny_pair):
    """The passes CUDA graphs capture (static shapes, padded widths; here eagerly, graphs off)
    hand a drafter the inner-layer states the exact-shape lean pass does, by position."""
    rows = {}
    for graphs in ("off", "static"):
        target = load_backend(tiny_pair["target"], "torch", step="lean", graphs=graphs)
        fresh = load_backend(tiny_pair["target"], "torch", step="lean", graphs=graphs)
        plain = [t for e in generate(fresh, str, PROMPT, max_tokens=30) if isinstance(e, Round) for t in e.emitted]
        recorder = StateRecorder(plain, target.vocab_limit, (2, 0, 1))
        list(generate(target, str, PROMPT, drafter=recorder, draft_tokens=5, max_tokens=30))
        rows[graphs] = recorder.rows
        if graphs == "static":
            assert target._graphs is not None and target._graphs.replays > 0  # the static path ran
    assert sorted(rows["static"]) == sorted(rows["off"])
    for position, row in rows["off"].items():
        assert np.abs(rows["static"][position] - row).max() < 1e-4 * max(1.0, float(np.abs(row).max()))
