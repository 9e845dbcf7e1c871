"""Gemma 4 "assistant" drafters: a small model that reads the target instead of the text.

Google ships each Gemma 4 model with an assistant (transformers' `Gemma4AssistantForCausalLM`,
model_type "gemma4_assistant") that has no KV cache and no embedding of its own to speak of: it
drafts from the target's state. transformers' `SinglePositionMultiTokenCandidateGenerator` is the
rule followed here, step by step:

- its input is cat(target embedding of the last committed token, the target's last hidden state
  of the position before it), (1, 1, 2 * backbone_hidden_size); the hidden state is the final
  norm's output (transformers' `hidden_states[-1]`), which is what `TargetState.hidden` holds;
- every layer attends to the target's own keys and values: those of the last layer of each kind
  (full, sliding) that computes them (`kv_sharing_modes` "store"), over the committed positions;
- the query sits at one constant position, that of the last committed token, for all k steps;
  each step feeds the token it drafted and the assistant's own projected hidden state back in.

So the drafter keeps only the target's hidden state of the position before the pending token;
the keys and values are read from the target's cache when it proposes, when that cache holds
exactly the committed positions but the pending one (the engine's invariant between rounds).
The arrays live in backend modules (app/engine/backends/assistant_*.py); this one decides when,
and app/engine/assistant_kv.py holds which keys and values they read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from app.engine.backends.base import ModelBackend
from app.engine.drafters import Drafter, Proposal, TargetState, draft_seed
from app.engine.sampling import SamplingParams
from app.models.draft_heads import ASSISTANT_TYPES
from app.models.errors import ModelFileError
from app.models.folder import check_model_folder
from app.models.names import display_name

TARGET_TYPES = ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text")


class Gemma4AssistantDrafter(Drafter):
    """Proposes by chaining a Gemma 4 assistant from the target's last hidden state and cache.

    `runner` (app/engine/backends/assistant_torch.py or assistant_mlx.py) owns the model and
    does one draft: runner.draft(token, hidden_row, position, k, params, should_stop) returns
    what ModelBackend.draft returns; runner.seed(seed) starts its own random stream."""

    wants_target_state = True

    def __init__(self, runner: Any, target: ModelBackend, folder: Path):
        self.runner, self.target = runner, target
        self.name = f"Gemma 4 assistant {display_name(folder)}"
        self._hidden = None  # (1, backbone) on the device: the target's state at _hidden_at
        self._hidden_at = -1

    def start(self, prompt_ids: Sequence[int], seed: int | None = None, reuse: bool = False,
              should_stop: Callable[[], bool] | None = None) -> None:
        self._hidden, self._hidden_at = None, -1
        self.runner.seed(draft_seed(seed))

    def accepted(self, committed, proposal, n_accepted, state: TargetState | None = None) -> None:
        if state is None or state.hidden is None or len(state.hidden) == 0:
            return
        # The last committed position's row is the one whose logits chose the pending token.
        self._hidden = state.hidden[-1:]
        self._hidden_at = state.start + len(state.hidden) - 1

    def propose(self, committed: Sequence[int], k: int, params: SamplingParams,
                should_stop: Callable[[], bool] | None = None) -> Proposal:
        start = time.perf_counter()
        position = len(committed) - 1  # the pending token's: the query position of every step
        if self._hidden is None or self._hidden_at != position - 1 or self.target.cache_len != position:
            # Not the state this position needs (none handed over yet): a plain step hands it over.
            return Proposal((), (), seconds=time.perf_counter() - start)
        ids, p, probs, ids_array = self.runner.draft(committed[-1], self._hidden, position, k, params,
                                                     should_stop)
        return Proposal(ids, p, probs, ids_array, time.perf_counter() - start, "assistant")


def _text_config(config: dict) -> dict:
    return config.get("text_config") or config


def load_assistant_drafter(folder: str | Path, target_backend: ModelBackend) -> Drafter:
    """A drafter from the Gemma 4 assistant in `folder` for `target_backend` (a loaded Gemma 4
    target, PyTorch or MLX). Raises ModelFileError saying what does not fit and what to do."""
    folder = Path(folder)
    config = check_model_folder(folder)
    kind = config.get("model_type")
    if kind not in ASSISTANT_TYPES:
        raise ModelFileError(
            f"{display_name(folder)} is not a Gemma 4 assistant (its config.json says model_type {kind!r}, not "
            f"{' or '.join(map(repr, ASSISTANT_TYPES))}). Choose the assistant folder published next to "
            "the Gemma 4 model (e.g. google/gemma-4-e2b-it-assistant), or use it as an ordinary draft model.")
    target_kind = target_backend.model_type
    if target_kind not in TARGET_TYPES:
        raise ModelFileError(
            f"A Gemma 4 assistant drafts only for a Gemma 4 model: it reads the target's hidden states and "
            f"KV cache, and the loaded target is a {target_kind!r} model. Load the Gemma 4 model it was "
            f"published with, or choose another kind of draft for {display_name(target_backend.folder)}.")
    target_text = _text_config(check_model_folder(target_backend.folder, weights=False))
    want = {"hidden size": (config.get("backbone_hidden_size"), target_text.get("hidden_size")),
            "vocabulary": (_text_config(config).get("vocab_size"), target_text.get("vocab_size"))}
    for key in ("head_dim", "global_head_dim", "num_key_value_heads"):  # the shapes of the keys it reads
        if key in _text_config(config) and key in target_text:
            want[key.replace("_", " ")] = (_text_config(config)[key], target_text[key])
    for what, (theirs, ours) in want.items():
        if theirs != ours:
            raise ModelFileError(
                f"{display_name(folder)} was trained for a Gemma 4 model with a {what} of {theirs}, but "
                f"{display_name(target_backend.folder)} has {ours}: it is the assistant of another Gemma 4 size. "
                "Choose the assistant published with this model (same size, e.g. e2b with e2b).")
    if target_backend.name == "torch":
        from app.engine.backends.assistant_torch import TorchAssistant

        runner = TorchAssistant(folder, config, target_backend)
    elif target_backend.name == "mlx":
        if kind != "gemma4_assistant":
            raise ModelFileError(f"{display_name(folder)} ({kind}) runs only on PyTorch for now; Tandem's MLX port "
                                 "covers gemma4_assistant. Load the target with the PyTorch backend.")
        from app.engine.backends.assistant_mlx import MLXAssistant

        runner = MLXAssistant(folder, config, target_backend)
    else:
        raise ModelFileError(f"no Gemma 4 assistant runs on the {target_backend.name} backend")
    return Gemma4AssistantDrafter(runner, target_backend, folder)
