"""The pair checks that can run before a hub model's weights are fetched: with its config and
tokenizer files (kilobytes) and the hub's listed weight sizes, Tandem can say whether the pair
works together and fits in memory before downloading gigabytes. Runner.load checks everything
again on the finished files; this only moves the answer earlier."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.models.architecture import check_architecture
from app.models.draft_heads import is_assistant_folder
from app.models.folder import check_model_folder
from app.models.head_sources import HEADS, head_kind
from app.models.integrity import check_weights
from app.models.memory import MemoryEstimate, check_fits, estimate, free_memory
from app.models.pairing import check_tokenizers
from app.models.resolve import display_name


@dataclass(frozen=True)
class PairPart:
    folder: Path  # config.json and tokenizer files (the weights may not be there yet)
    weight_bytes: int  # from the hub's file list, or the files on disk
    precision: str = "auto"


def precheck_pair(target: PairPart, draft: PairPart | None, backend: str, held_bytes: int = 0) -> str:
    """Raise (ModelFileError, PairingError, NotEnoughMemory) when the pair cannot work; else a
    memory warning or "". `held_bytes`: the pair in use, which loading a new one replaces."""
    from app.models.transformers_tokenizer import ChatTokenizer

    if backend == "mlx":
        device = "gpu"
    else:
        from app.models.memory_torch import torch_device

        device = torch_device()
    # A Gemma 4 assistant is no model of its own: it may ship no tokenizer, and its loader checks
    # the target's vocabulary and hidden size (app/engine/assistant.py); its weights are counted.
    # A published drafter neither (an EAGLE-3 head, a DFlash drafter): its config is checked
    # against the target's here (hidden size, vocabulary, the layers it reads), its tensors once
    # they are fetched (Runner.load).
    assistant = draft is not None and is_assistant_folder(draft.folder)
    kind = None if draft is None or assistant else head_kind(draft.folder)
    head = kind is not None
    parts = [("target", target)] + ([("draft", draft)] if draft is not None and not (assistant or head) else [])
    estimates = []
    for role, part in parts:
        config = check_model_folder(part.folder, weights=False)
        check_architecture(config, backend, display_name(part.folder))
        estimates.append(estimate(role, config, part.weight_bytes, backend, device, part.precision))
    if head:
        HEADS[kind].read(draft.folder, check_model_folder(target.folder, weights=False), weights=False)
    if assistant or head:
        estimates.append(MemoryEstimate("draft", draft.weight_bytes, 0, 1))
    if draft is not None and not (assistant or head) and draft.folder != target.folder:
        check_tokenizers(ChatTokenizer(target.folder), ChatTokenizer(draft.folder))
    free, where = free_memory(backend, device)
    return check_fits(estimates, free + held_bytes, where) or ""


def local_part(folder: str | Path, precision: str = "auto") -> PairPart:
    """A model already on disk: its weight bytes from the safetensors headers."""
    return PairPart(Path(folder), check_weights(folder), precision)
