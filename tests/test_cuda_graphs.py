"""Captured CUDA graphs (app/engine/backends/cuda_graphs_torch.py) against the same passes run
eagerly: marked `cuda`, skipped where no NVIDIA GPU is present (CI), run on a lent GPU machine
with `python -m pytest -m cuda tests/test_cuda_graphs.py`."""

from __future__ import annotations

import pytest
import torch

from app.engine.backends import load_backend
from app.engine.backends.cuda_graphs_torch import GraphedStep
from app.engine.drafters import ModelDrafter, PromptLookupDrafter
from app.engine.events import Round
from app.engine.speculative import generate

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

PROMPT = [1, 969, 198, 20, 300, 301, 2, 198, 1, 520, 198, 40, 41, 42, 40, 41]
LONG = 500  # crosses the 256 and 512 length buckets


def _tokens(target, drafter=None, n=LONG, **options):
    return [t for e in generate(target, lambda ids: "", PROMPT, drafter=drafter, max_tokens=n, **options)
            if isinstance(e, Round) for t in e.emitted]


def tiny_folders(root) -> dict[str, object]:
    """A tiny random Llama target and a noisy copy of it (accepts often, not always), written as
    model folders; built here because a GPU machine has no demo model to take a tokenizer from
    (the engine runs on token ids)."""
    from tests.factories import near_copy, tiny_llama

    target, near = tiny_llama(1, context=1024), near_copy(tiny_llama(1, context=1024))
    folders = {}
    for role, model in (("target", target), ("near", near)):
        model.save_pretrained(root / role, safe_serialization=True)
        folders[role] = root / role
    return folders


@pytest.fixture(scope="module")
def on_gpu(tmp_path_factory):
    folders = tiny_folders(tmp_path_factory.mktemp("cuda"))

    def load(role, graphs, glue="auto"):
        return load_backend(folders[role], "torch", device="cuda", graphs=graphs, glue=glue)
    return {"eager": load("target", "off", "off"), "graphs": load("target", "auto"),
            "graphs, eager glue": load("target", "auto", "off"),
            "near": load("near", "auto"), "self": load("target", "auto")}


@pytest.mark.parametrize("which", ["graphs", "graphs, eager glue"])
def test_captured_passes_give_the_eager_tokens_over_500(on_gpu, which):
    """Captured with the glue as the eager passes run it, and fused by torch.compile (float32: the
    fused rounding is far below this model's gaps between its top two logits)."""
    eager = _tokens(on_gpu["eager"])
    assert len(eager) == LONG
    graphs = on_gpu[which]
    assert _tokens(graphs) == eager
    assert "CUDA graphs" in graphs.precision and graphs._graphs.graphs  # really captured
    assert all(c.graph is not None for c in graphs._graphs.graphs.values())
    assert graphs._lean.glue.fused == (which == "graphs"), graphs.precision


def test_captured_speculation_gives_the_eager_tokens(on_gpu):
    eager = _tokens(on_gpu["eager"], n=200)
    for drafter in (ModelDrafter(on_gpu["near"]), ModelDrafter(on_gpu["self"]), PromptLookupDrafter()):
        assert _tokens(on_gpu["graphs"], drafter, n=200) == eager
    assert _tokens(on_gpu["graphs"], ModelDrafter(on_gpu["near"]), n=200, draft_tokens=7) == eager


def test_a_stale_graph_input_is_caught(on_gpu, monkeypatch):
    """The comparison above must fail when a replay reads a stale input: here the token ids are no
    longer copied into the graph's buffer, so every replay decodes the previous pass's tokens."""
    eager = _tokens(on_gpu["eager"], n=64)

    def positions_only(self, ids, start, width):  # the ids buffer keeps the previous pass's tokens
        torch.add(self._count[width], start, out=self.positions[width])

    monkeypatch.setattr(GraphedStep, "_load_inputs", positions_only)
    on_gpu["graphs"].reset()
    assert _tokens(on_gpu["graphs"], n=64) != eager


def test_captured_passes_hand_over_the_inner_layer_states_eager_passes_do(on_gpu):
    """EAGLE-3's and DFlash's inner-layer states are an output of the captured pass, not a hook
    (which a replay would skip): a drafter reading layers 0, 1 and 2 gets the eager rows, by
    position, from plain steps and verify passes of every width."""
    from tests.scripted import ScriptedDrafter

    class Recorder(ScriptedDrafter):
        wants_target_state = True
        target_layers = (0, 1, 2)

        def accepted(self, committed, proposal, n_accepted, state=None):
            super().accepted(committed, proposal, n_accepted, state)
            for i, row in enumerate(state.hidden.float().cpu()):
                self.rows[state.start + i] = row

    plain = _tokens(on_gpu["eager"], n=60)
    rows = {}
    for which in ("eager", "graphs"):
        recorder = Recorder(PROMPT, plain, on_gpu[which].vocab_limit)
        recorder.rows = {}
        assert _tokens(on_gpu[which], recorder, n=60, draft_tokens=4) == plain
        rows[which] = recorder.rows
    assert sorted(rows["graphs"]) == sorted(rows["eager"]) and len(rows["eager"]) > 60
    for position, row in rows["eager"].items():
        torch.testing.assert_close(rows["graphs"][position], row, atol=1e-4, rtol=1e-4)
