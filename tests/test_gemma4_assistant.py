"""Gemma 4 assistant drafters (app/engine/assistant.py) on tiny random Gemma 4 models built from
transformers' own classes: the MLX port computes transformers' logits; speculation with the
assistant is exact at temperature 0 on both backends and in distribution above it; each proposal is
what transformers' own candidate generator proposes from the same target state; a folder that
does not fit is refused with a message that says why."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers import Gemma4ForCausalLM, GenerationConfig
from transformers.generation.candidate_generator import SinglePositionMultiTokenCandidateGenerator

from app.engine.assistant import load_assistant_drafter
from app.engine.backends import load_backend
from app.engine.drafters import Drafter
from app.engine.events import Round
from app.engine.sampling import SamplingParams
from app.engine.speculative import generate
from app.models.errors import ModelFileError
from tests.factories_gemma4 import WINDOW, save_assistant, save_gemma4, tiny_assistant, tiny_gemma4

PROMPT = [2, 5, 9, 100, 33, 7, 250, 11, 48, 301, 77]
MAX_TOKENS = 24  # prompt + answer + drafts stay inside the sliding window (MLX's ring buffer)
assert len(PROMPT) + MAX_TOKENS + 8 < WINDOW


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("gemma4")
    return {"target": save_gemma4(tiny_gemma4(1), root / "target"),
            "assistant": save_assistant(tiny_assistant(2, ordered=True), root / "assistant"),
            "plain_head": save_assistant(tiny_assistant(3), root / "plain-head")}


class Recorded(Drafter):
    """The assistant drafter, recording each proposal with the sequence it followed."""

    wants_target_state = True

    def __init__(self, inner: Drafter):
        self.inner, self.proposals = inner, []

    def start(self, prompt_ids, seed=None, reuse=False, should_stop=None):
        self.inner.start(prompt_ids, seed, reuse, should_stop)

    def propose(self, committed, k, params, should_stop=None):
        proposal = self.inner.propose(committed, k, params, should_stop)
        self.proposals.append((tuple(committed), proposal.ids))
        return proposal

    def accepted(self, committed, proposal, n_accepted, state=None):
        self.inner.accepted(committed, proposal, n_accepted, state)


def _answer(target, drafter=None, k=None, params=SamplingParams(), max_tokens=MAX_TOKENS, prompt=PROMPT):
    events = list(generate(target, lambda ids: "", prompt, drafter=drafter, draft_tokens=k,
                           max_tokens=max_tokens, params=params))
    return [t for e in events if isinstance(e, Round) for t in e.emitted], events[-1].stats


# --- the MLX port ---------------------------------------------------------------------------------

@pytest.mark.parametrize("head", ["assistant", "plain_head"], ids=["ordered-embeddings", "tied-head"])
def test_the_mlx_port_gives_transformers_logits(folders, head):
    """Same weights, same inputs_embeds and shared keys and values, float32: the same logits and
    projected hidden state. The sliding keys outnumber the window, so its mask counts too."""
    mx = pytest.importorskip("mlx.core")
    from transformers import Gemma4AssistantForCausalLM

    from app.engine.backends.assistant_mlx import load_assistant
    from app.models.folder import check_model_folder

    ours = load_assistant(folders[head], check_model_folder(folders[head]))
    theirs = Gemma4AssistantForCausalLM.from_pretrained(str(folders[head]), dtype=torch.float32).eval()
    rng = np.random.default_rng(0)
    embeds = rng.standard_normal((1, 1, 128)).astype(np.float32)
    kv = {"full_attention": [rng.standard_normal((1, 2, 30, 32)).astype(np.float32) for _ in range(2)],
          "sliding_attention": [rng.standard_normal((1, 2, WINDOW + 9, 16)).astype(np.float32) for _ in range(2)]}
    for position in (29, 80):
        with torch.no_grad():
            out = theirs(inputs_embeds=torch.from_numpy(embeds), position_ids=torch.tensor([[position]]),
                         shared_kv_states={k: tuple(map(torch.from_numpy, v)) for k, v in kv.items()})
        logits, hidden = ours(mx.array(embeds), {k: tuple(map(mx.array, v)) for k, v in kv.items()}, position)
        for got, want in ((logits, out.logits), (hidden, out.last_hidden_state)):
            want = want.numpy()
            assert np.abs(np.array(got) - want).max() / max(1.0, np.abs(want).max()) < 1e-4


# --- temperature 0 --------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_speculation_with_the_assistant_is_the_target_token_for_token(folders, backend):
    """k = 1 .. 8 on a target with sliding windows, KV-shared layers and per-layer embeddings."""
    if backend == "mlx":
        pytest.importorskip("mlx_lm")
    target = load_backend(folders["target"], backend)
    plain, _ = _answer(target)
    drafter = load_assistant_drafter(folders["assistant"], target)
    drafted = 0
    for k in range(1, 9):
        tokens, stats = _answer(target, drafter, k)
        assert tokens == plain, k
        drafted += stats.drafted
    assert drafted > 80  # the assistant proposed in (almost) every round


def _transformers_candidates(model: Gemma4ForCausalLM, assistant, committed: tuple[int, ...], k: int) -> tuple:
    """What transformers' own candidate generator (SinglePositionMultiTokenCandidateGenerator, its
    `generate(assistant_model=...)` path for Gemma 4) proposes after `committed`, from the target's
    outputs over every committed token but the last: its last hidden state and shared keys and values."""
    with torch.no_grad():
        out = model(torch.tensor([committed[:-1]]), output_hidden_states=True, return_shared_kv_states=True)
    assistant.generation_config.num_assistant_tokens = k
    generator = SinglePositionMultiTokenCandidateGenerator(assistant, model.get_input_embeddings(),
                                                           GenerationConfig(max_length=4096))
    ids, _ = generator.get_candidates(torch.tensor([committed]), {}, out, is_first_iteration=False,
                                      n_last_matches=0)
    return tuple(ids[0, len(committed):].tolist())


def test_each_proposal_is_what_transformers_candidate_generator_proposes(folders):
    """Every round's proposal, after full acceptances and after rejections alike, equals
    transformers' own candidate step fed from scratch: a drafter fed the wrong hidden state,
    position or keys (or a prefill state put at the wrong positions) fails here."""
    from transformers import Gemma4AssistantForCausalLM

    target = load_backend(folders["target"], "torch")
    drafter = Recorded(load_assistant_drafter(folders["assistant"], target))
    _answer(target, drafter, k=5, max_tokens=24)
    model = Gemma4ForCausalLM.from_pretrained(str(folders["target"]), dtype=torch.float32).eval()
    assistant = Gemma4AssistantForCausalLM.from_pretrained(str(folders["assistant"]), dtype=torch.float32).eval()
    assert len(drafter.proposals) > 5 and drafter.proposals[0][0] == (*PROMPT, drafter.proposals[0][0][-1])
    for committed, ids in drafter.proposals:
        assert ids and ids == _transformers_candidates(model, assistant, committed, len(ids)), len(committed)


def test_the_mlx_drafter_proposes_what_the_torch_drafter_does(folders):
    pytest.importorskip("mlx_lm")
    proposals = {}
    for backend in ("torch", "mlx"):
        target = load_backend(folders["target"], backend)
        drafter = Recorded(load_assistant_drafter(folders["assistant"], target))
        _answer(target, drafter, k=4, max_tokens=24)
        proposals[backend] = [(c, ids) for c, ids in drafter.proposals if ids]
    assert len(proposals["torch"]) > 5 and proposals["mlx"] == proposals["torch"]


# --- temperature above 0 --------------------------------------------------------------------------

SMALL_VOCAB = 16
SMALL_PROMPT = [3, 7, 1, 12]


def test_sampling_with_the_assistant_matches_the_target(tmp_path):
    """Leviathan/Chen with the assistant's own distributions (its centroid-masked head included):
    tokens 2 and 3 of many seeded answers against the target's exact marginals. On MLX, where these
    tiny models decode about ten times faster than through transformers' Gemma 4 classes."""
    pytest.importorskip("mlx_lm")
    from tests.test_engine_sampling import ALPHA, _p_value, exact_marginals

    target_folder = save_gemma4(tiny_gemma4(21, hidden=32, vocab=SMALL_VOCAB, scale=2.0), tmp_path / "target")
    assistant_folder = save_assistant(tiny_assistant(22, backbone=32, vocab=SMALL_VOCAB, ordered=True, centroids=4,
                                                     scale=2.0), tmp_path / "assistant")
    params = SamplingParams(temperature=1.0, seed=11)
    model = Gemma4ForCausalLM.from_pretrained(str(target_folder), dtype=torch.float32).eval()
    exact = exact_marginals(model, SMALL_PROMPT, params, depth=3, vocab=SMALL_VOCAB)
    target = load_backend(target_folder, "mlx")
    drafter = load_assistant_drafter(assistant_folder, target)
    counts, drafted, accepted = np.zeros((3, SMALL_VOCAB)), 0, 0
    for i in range(1500):
        seeded = replace(params, seed=params.seed * 100_003 + i)
        tokens, stats = _answer(target, drafter, k=2, params=seeded, max_tokens=3, prompt=SMALL_PROMPT)
        drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
        for position, t in enumerate(tokens):
            counts[position, t] += 1
    assert 0.1 * drafted < accepted < 0.9 * drafted  # both acceptances and rejections were tested
    for position in (1, 2):
        assert _p_value(counts[position], exact[position]) > ALPHA / 2, position


# --- what does not fit ----------------------------------------------------------------------------

def test_a_folder_that_is_not_an_assistant_is_refused(folders):
    target = load_backend(folders["target"], "torch")
    with pytest.raises(ModelFileError, match="is not a Gemma 4 assistant .*model_type 'gemma4_text'"):
        load_assistant_drafter(folders["target"], target)


def test_an_assistant_of_another_size_is_refused(folders, tmp_path):
    target = load_backend(folders["target"], "torch")
    other = save_assistant(tiny_assistant(4, backbone=48), tmp_path / "other-size")
    with pytest.raises(ModelFileError, match="hidden size of 48, but target has 64.*another Gemma 4 size"):
        load_assistant_drafter(other, target)


def test_a_target_that_is_not_gemma4_is_refused(folders, tmp_path):
    from tests.factories import save_qwen35, tiny_qwen35

    target = load_backend(save_qwen35(tiny_qwen35(5), tmp_path / "qwen"), "torch")
    with pytest.raises(ModelFileError, match="drafts only for a Gemma 4 model.*'qwen3_5'"):
        load_assistant_drafter(folders["assistant"], target)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_the_published_layout_speculates_too(tmp_path, backend):
    """Google publishes Gemma 4 as model_type "gemma4" with the text model inside a multimodal
    wrapper: the target still hands over its hidden states (its final norm is found there)."""
    if backend == "mlx":
        pytest.importorskip("mlx_lm")
    folder = save_gemma4(tiny_gemma4(1), tmp_path / "gemma4", multimodal=True)
    target = load_backend(folder, backend)
    assert target.model_type == "gemma4"
    plain, _ = _answer(target, max_tokens=20)
    drafter = load_assistant_drafter(save_assistant(tiny_assistant(2), tmp_path / "assistant"), target)
    tokens, stats = _answer(target, drafter, k=4, max_tokens=20)
    assert tokens == plain and stats.drafted > 40


def test_the_runner_pairs_a_dropped_assistant_folder_as_an_assistant_and_stays_exact(tiny_pair, tmp_path):
    """An assistant chosen as an ordinary draft model (dropped in the Draft slot) drafts as an
    assistant: no tokenizer of its own is needed, and the chat is the target's token for token."""
    import shutil

    from app.draft_choice import NO_DRAFT, DraftChoice, DraftKind
    from app.engine.assistant import Gemma4AssistantDrafter
    from app.engine.events import Finished
    from app.runner import ChatRequest, Runner

    target = save_gemma4(tiny_gemma4(31, vocab=1024), tmp_path / "gemma4")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_pair["target"] / name, target / name)
    assistant = save_assistant(tiny_assistant(32, vocab=1024), tmp_path / "gemma4-assistant")
    runner = Runner()
    loaded = runner.load(target, "torch", DraftChoice.model(str(assistant)), progress=lambda m: None)
    assert loaded.draft.kind is DraftKind.ASSISTANT and isinstance(runner.drafter, Gemma4AssistantDrafter)
    assert loaded.draft_bytes > 0
    ask = ChatRequest(({"role": "user", "content": "hi"},), max_tokens=20, draft_tokens=3)
    spec = list(runner.chat(ask))
    plain = list(runner.chat(ChatRequest(ask.messages, max_tokens=20, drafter=NO_DRAFT)))
    tokens = [[t for e in events if isinstance(e, Round) for t in e.emitted] for events in (spec, plain)]
    assert tokens[0] == tokens[1]
    assert next(e for e in spec if isinstance(e, Finished)).stats.drafted > 0
