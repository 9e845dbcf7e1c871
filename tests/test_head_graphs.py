"""Draft heads' passes over fixed buffers (app/engine/backends/head_graphs_torch.py): an EAGLE-3 head,
an MTP layer and a DFlash drafter, run at the CUDA graphs' bucketed static shapes (graphs mode "static", on the CPU),
draft round for round what their DynamicCache passes draft: at temperature 0 and 1, for every k,
across conversations, a follow-up turn that keeps the caches, a first catch-up wider than any
bucket and an answer crossing a length bucket. Marked `cuda` (run on a lent GPU): the captured
passes draft what the eager ones do, and a replay reading a stale input fails that comparison."""

from __future__ import annotations

import pytest
import torch

from app.engine.backends import cuda_graphs_torch, head_graphs_torch, load_backend
from app.engine.backends.head_graphs_torch import GraphedHead, HeadKV
from app.engine.drafters import LookupThenModelDrafter
from app.engine.events import Notice, Round
from app.engine.dflash import load_dflash_drafter
from app.engine.mtp import MTPDrafter, load_eagle3_drafter, load_mtp_drafter
from app.engine.sampling import SamplingParams
from app.engine.speculative import generate

PERIODIC = [1, 5, 9, 17, 5, 9, 17, 5]
OTHER = [1, 4, 8, 15, 22, 3, 7]
LONG = [1] + [5, 9, 17, 20] * 6  # 25 tokens: the first catch-up is wider than the widest bucket (17)
on_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.fixture(scope="module")
def heads(tmp_path_factory):
    """{kind: (target folder, drafter loader)}: a tiny Llama with a trained EAGLE-3 head, another with
    a trained DFlash drafter, a tiny Qwen3.5 with its trained MTP layer (tests/*_training.py)."""
    from tests import dflash_training
    from tests.eagle3_training import train, write_head
    from tests.mtp_training import save_trained

    root = tmp_path_factory.mktemp("head-graphs")
    model, head, _ = train(steps=300)
    model.save_pretrained(root / "llama")
    eagle = write_head(head, root / "eagle3")
    mtp, _ = save_trained(root / "qwen35-mtp")
    model, drafter, _ = dflash_training.train()
    model.save_pretrained(root / "llama-dflash")
    dflash = dflash_training.write_drafter(drafter, root / "dflash")

    def mtp_subset(target):  # an aligned head's way: a draft vocabulary growing with the conversation
        from app.engine.backends.mtp_torch import TorchMTPHead
        from app.models.mtp_weights import find_mtp

        drafter = MTPDrafter(TorchMTPHead(target, find_mtp(mtp), vocab=list(range(3, 12))), "aligned draft head")
        assert drafter.head.subset is not None
        return drafter

    return {"eagle3": (root / "llama", lambda target: load_eagle3_drafter(target, eagle)),
            "mtp": (mtp, load_mtp_drafter), "mtp-subset": (mtp, mtp_subset),
            "dflash": (root / "llama-dflash", lambda target: load_dflash_drafter(target, dflash))}


def _rounds(target, drafter, prompt, trees="off", **options) -> list[tuple]:
    """Chains unless `trees` says otherwise ("auto" would choose by the clock, and runs must repeat)."""
    events = generate(target, lambda ids: "", prompt, drafter=drafter, trees=trees, **options)
    return [(e.drafted, e.accepted, e.emitted) for e in events if isinstance(e, Round)]


def _session(target, drafter) -> list[list[tuple]]:
    """Conversations one after another (the head restarts on each), every k, a follow-up turn that
    keeps both caches, sampled answers, and one answer long enough to cross a length bucket."""
    seen = []
    for prompt in (PERIODIC, OTHER, LONG):
        for k in (1, 3, 8, 15):
            seen.append(_rounds(target, drafter, prompt, max_tokens=24, draft_tokens=k))
    first = _rounds(target, drafter, PERIODIC, max_tokens=12, draft_tokens=2, reuse_cache=True)
    follow = [*PERIODIC, *(t for r in first for t in r[2]), 3, 11, 6, 3, 11]
    seen += [first, _rounds(target, drafter, follow, max_tokens=12, draft_tokens=2, reuse_cache=True)]
    # a turn decoded without the drafter, then a follow-up with it: the drafter starts reading
    # mid-conversation (its cache's entry 0 is not position 0)
    plain = _rounds(target, None, OTHER, max_tokens=10, reuse_cache=True)
    later = [*OTHER, *(t for r in plain for t in r[2]), 5, 9, 17, 5, 9, 17]
    seen += [plain, _rounds(target, drafter, later, max_tokens=16, draft_tokens=3, reuse_cache=True)]
    for seed in range(4):
        seen.append(_rounds(target, drafter, OTHER, max_tokens=16, draft_tokens=3,
                            params=SamplingParams(temperature=1.0, seed=seed)))
    limit = target.vocab_limit  # fewer tokens allowed: the logits' rule changes, the graphs with it
    target.vocab_limit = limit - 3
    try:
        seen.append(_rounds(target, drafter, PERIODIC, max_tokens=16, draft_tokens=3))
    finally:
        target.vocab_limit = limit
    for prompt in (PERIODIC, OTHER):  # a head's trees: its runner-ups drafted with its passes too
        seen.append(_rounds(target, drafter, prompt, max_tokens=24, draft_tokens=4, trees="on"))
    seen.append(_rounds(target, drafter, LONG, max_tokens=120, draft_tokens=4))  # across length buckets (last)
    return seen


@pytest.mark.parametrize("kind", ["eagle3", "mtp", "mtp-subset", "dflash"])
def test_fixed_buffer_passes_draft_what_the_dynamic_cache_drafts(heads, kind, monkeypatch):
    # length buckets from 32 (not 256): the tiny models' 256-position context then crosses several
    monkeypatch.setattr(cuda_graphs_torch, "MIN_LENGTH", 32)
    folder, load = heads[kind]
    runs = {}
    for mode in ("off", "static"):
        target = load_backend(folder, "torch", graphs=mode)
        drafter = load(target)
        runs[mode] = _session(target, drafter)
        head = getattr(drafter, "head", None) or drafter.block  # MTPDrafter's head, DFlashDrafter's block
        assert head.graph_mode == ("static" if mode == "static" else "")
        assert isinstance(head.cache, HeadKV) == (mode == "static")
    assert runs["static"] == runs["off"]
    assert sum(r[1] for run in runs["off"] for r in run) > 50  # drafts were accepted: rollbacks kept entries
    if kind in ("eagle3", "mtp"):  # greedy drafts of k > 1 ran as one chain (keys (-k, length))
        assert any(width < 0 for width, _ in head._graphed.graphs)
    lengths = {length for _, length in head._graphed.graphs}  # (width, length) keys
    assert {32, 64, 128} <= lengths and head._graphed.replays > 150, (lengths, head._graphed.replays)
    plain = load_backend(folder, "torch")
    assert [t for r in runs["static"][-1] for t in r[2]] == [
        t for r in _rounds(plain, None, LONG, max_tokens=120) for t in r[2]]  # exact, as ever


def test_a_stale_head_input_changes_the_drafts(heads, monkeypatch):
    """The comparison above must fail when a pass reads a stale input: here the chained steps'
    states are no longer copied into the head's buffer, in a whole greedy draft's one replay
    (temperature 0) and step by step (temperature 1)."""
    folder, load = heads["eagle3"]
    target = load_backend(folder, "torch", graphs="static")
    sampled = SamplingParams(temperature=1.0, seed=3)
    right = [_rounds(target, load(target), PERIODIC, max_tokens=24, draft_tokens=4, params=params)
             for params in (SamplingParams(), sampled)]
    load_inputs = GraphedHead._load_inputs

    def stale(self, ids, hidden):
        if ids.shape[1] == 1:  # a chained step: its state stays the previous pass's
            hidden = self.hidden[:, :1].clone()
        return load_inputs(self, ids, hidden)

    monkeypatch.setattr(GraphedHead, "_load_inputs", stale)
    for params, good in zip((SamplingParams(), sampled), right, strict=True):
        wrong = _rounds(target, load(target), PERIODIC, max_tokens=24, draft_tokens=4, params=params)
        assert wrong and [r[:2] for r in wrong] != [r[:2] for r in good], params


def test_a_failed_capture_leaves_the_head_on_the_same_shapes_eagerly(heads, monkeypatch):
    """On a GPU a pass that cannot be captured: the head drafts on at the same shapes, eagerly,
    says why, and counts the try as one-time work; the drafts stay the DynamicCache path's."""
    folder, load = heads["eagle3"]
    plain = load_backend(folder, "torch", graphs="off")
    right = _rounds(plain, load(plain), PERIODIC, max_tokens=24, draft_tokens=4)
    target = load_backend(folder, "torch", graphs="static")
    drafter = load(target)

    def broken(run, pool):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)  # (this machine has no CUDA)
    monkeypatch.setattr(head_graphs_torch, "capture", broken)
    drafter.head.graph_mode = "capture"  # what a GPU would run
    events = list(generate(target, lambda ids: "", PERIODIC, drafter=drafter, max_tokens=24, draft_tokens=4))
    notices = [e.message for e in events if isinstance(e, Notice)]
    assert len(notices) == 1 and notices[0].startswith("Draft head: no CUDA graphs: capturing a head's pass")
    assert notices[0].endswith("; it drafts on without them.")  # said once, where the window shows notices
    assert LookupThenModelDrafter(drafter).graph_note == drafter.head.graph_note  # (as the runner pairs it)
    target.reset()
    drafter = load(target)
    drafter.head.graph_mode = "capture"
    assert _rounds(target, drafter, PERIODIC, max_tokens=24, draft_tokens=4) == right
    head = drafter.head
    assert head.graph_mode == "static" and not head._graphed.capture
    assert head.graph_note.startswith("no CUDA graphs: capturing a head's pass of width 8 failed (RuntimeError: "
                                      "operation not permitted")  # (the first pass read the prompt's 8)
    assert drafter.one_time_work == 1


@pytest.mark.cuda
@on_gpu
@pytest.mark.parametrize("kind", ["eagle3", "mtp", "dflash"])
def test_captured_head_passes_draft_what_eager_ones_draft(heads, kind, monkeypatch):
    monkeypatch.setattr(cuda_graphs_torch, "MIN_LENGTH", 32)
    folder, load = heads[kind]
    runs, drafters = {}, {}
    for mode in ("off", "auto"):
        target = load_backend(folder, "torch", device="cuda", graphs=mode)
        drafters[mode] = load(target)
        runs[mode] = _session(target, drafters[mode])
    head = getattr(drafters["auto"], "head", None) or drafters["auto"].block
    # every capture is one-time work the engine leaves out of a round's timings
    assert head.one_time_work == len(head._graphed.graphs) == drafters["auto"].one_time_work
    assert head.graph_mode == "capture" and not head.graph_note, head.graph_note
    captured = head._graphed.graphs.values()  # (graph, outputs) each
    assert captured and all(graph is not None for graph, _ in captured)
    assert runs["auto"] == runs["off"]


@pytest.mark.parametrize("kind", ["mtp", "dflash"])
def test_the_memory_check_counts_a_heads_fixed_cache(kind, tiny_pair, tmp_path):
    """A head's own KV cache is held for the planned context from its first pass: the pair's
    memory check counts it, per position, as the fixed buffer holds it (layers, heads, dtype)."""
    import json

    from app.draft_choice import DraftChoice
    from app.runner import ChatRequest, Runner

    if kind == "mtp":
        from tests.test_mtp_drafter import _random_mtp_checkpoint

        target, named = _random_mtp_checkpoint(tmp_path / "qwen35-mtp", tiny_pair["target"]), "mtp"
    else:
        from app.engine.backends.dflash_torch import DFlashModules, layer_config
        from tests.dflash_training import draft_config, spec, write_drafter

        target = tiny_pair["target"]
        config = json.loads((target / "config.json").read_text())
        drafter = draft_config(hidden=config["hidden_size"], vocab=config["vocab_size"], layers=(0,),
                               target_layers=config["num_hidden_layers"], draft_layers=2)  # two layers' caches
        torch.manual_seed(4)
        shape = spec(drafter, (1,))
        named = f"dflash:{write_drafter(DFlashModules(shape, layer_config(shape)), tmp_path / 'd', drafter)}"
    runner, estimates = Runner(), []
    real_check = runner._check_memory
    runner._check_memory = lambda models, *rest: (estimates.extend(models), real_check(models, *rest))[1]
    runner.load(target, "torch", DraftChoice.parse(named), graphs="static", progress=lambda m: None)
    ask = ChatRequest(({"role": "user", "content": "Say 1, 2, 3, 1, 2, 3 again."},), max_tokens=12, draft_tokens=3)
    list(runner.chat(ask))
    inner = runner.drafter.model
    kv = (getattr(inner, "head", None) or inner.block).static_kv
    assert kv.store is not None  # it drafted, over the fixed buffer
    assert next(e for e in estimates if e.name == "draft").kv_per_token == kv.store.nbytes // kv.capacity > 0
