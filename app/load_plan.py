"""What a load will do, decided before any weights load (issue 45: shape the load like the decode).

`plan_load` reads each file's facts once (the target's folder, config, weights and tokenizer; the
draft's, whatever its kind) into one `LoadPlan`: where each part comes from, how it will load and
what memory each needs. Every refusal that the files alone justify is made here, so nothing the
user has loaded is replaced by a pair that cannot load. `Runner.load` then checks the plan's
memory and loads by it (app/runner.py). Qt-free, and free of model code: nothing here imports
torch or mlx beyond what the checks themselves need.
"""

from __future__ import annotations

import sys

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app.draft_choice import PROMPT_LOOKUP, DraftChoice, DraftKind
from app.engine.backends import default_backend
from app.models.aligned_head import draft_vocab, head_bytes, head_weights, is_aligned_head, subset_bytes
from app.models.architecture import check_architecture
from app.models.draft_heads import assistant_estimate, has_mtp, is_assistant_folder, no_mtp_reason
from app.models.errors import ModelFileError
from app.models.folder import check_model_folder
from app.models.head_sources import HEADS, find_head, head_kind
from app.models.integrity import check_weights
from app.models.memory import MemoryEstimate, estimate, head_kv_per_token, kv_dtype_bytes
from app.models.mtp_weights import find_mtp, mtp_bytes
from app.models.pairing import check_tokenizers
from app.models.resolve import display_name, resolve_model


@dataclass(frozen=True)
class DraftPlan:
    """The draft as it will load: `choice` as resolved ("auto" decided, a head dropped as a draft
    model named as the head it is), and the one source its kind reads."""

    choice: DraftChoice
    folder: Path | None = None  # a draft model's folder, or a self-draft's (the target's own)
    precision: str | None = None  # a self-draft's
    tokenizer: Any = None  # a draft model's, already checked against the target's
    head_folder: Path | None = None  # an aligned draft head
    published: Any = None  # an EAGLE-3 head's or DFlash drafter's files, read and checked against the target
    assistant_folder: Path | None = None  # a Gemma 4 assistant
    weights: int = 0  # bytes reported for a drafter that is not a model of its own (an assistant's)


@dataclass(frozen=True)
class LoadPlan:
    folder: Path  # the target's, resolved (a .gguf's import, a hub cache, the demo)
    backend: str
    precision: str
    device: str  # where the target will run ("cpu", "cuda", "gpu" for MLX)
    config: dict
    file_bytes: int
    tokenizer: Any  # app.models.transformers_tokenizer.ChatTokenizer
    draft: DraftPlan
    models: tuple[MemoryEstimate, ...]  # the target's first, then the draft's where it holds memory
    auto: bool  # the draft was "auto": a built-in layer that cannot draft falls back to prompt lookup


def device_for(backend: str) -> str:
    if backend == "mlx":
        return "gpu"
    from app.models.memory_torch import torch_device

    return torch_device()


def published_kind(draft: DraftChoice) -> DraftKind | None:
    """The kind of published drafter `draft` loads: its own kind, or, for a draft model whose
    folder holds one, the kind its config says; None for any other draft."""
    if draft.kind in HEADS:
        return draft.kind
    return head_kind(draft.source) if draft.kind is DraftKind.MODEL else None


def auto_draft(spec: str | Path, backend: str | None = None, precision: str = "auto") -> DraftChoice:
    """What "auto" pairs a target with: the draft an alignment made for it (where it measured
    faster); the demo's measured best draft (app/models/demo.py); an EAGLE-3 head or DFlash
    drafter the pair trials measured faster than prompt lookup (app/models/pair_memory.measured_head);
    a checkpoint's own MTP layer where it ships one; for other targets prompt lookup, which costs no
    memory and which adaptive k turns off where it does not pay."""
    from app.models.demo import DEMO_SPECS, demo_draft
    from app.models.pair_memory import PairMemory, aligned_draft, measured_head

    backend = backend or default_backend()
    aligned = aligned_draft(backend, str(spec))  # `tandem-cli align` / Align draft paired it, measured faster
    if aligned is not None:
        return aligned
    if str(spec) in DEMO_SPECS:
        return demo_draft(str(spec), backend or default_backend(), precision, memory=PairMemory())
    if (head := measured_head(backend, str(spec))) is not None:
        return head
    return DraftChoice(DraftKind.MTP) if has_mtp(spec) else PROMPT_LOOKUP


def check_files(folder: Path, backend: str) -> tuple[dict, int]:
    """The folder's config and weight bytes, after checking the files are whole and the
    backend runs the architecture: each failure is a ModelFileError in plain words."""
    config = check_model_folder(folder)
    file_bytes = check_weights(folder)
    check_architecture(config, backend, display_name(folder))
    return config, file_bytes


def gguf_loaded_bytes(folder: Path, backend: str, precision: str, progress=None, device: str = "cpu") -> int | None:
    """The weights' size as loaded when PyTorch reads them from a GGUF at its own precisions (the
    memory check must count that, not float32); None otherwise. On the CPU the size depends on
    whether Tandem's CPU kernel runs here, so the first GGUF of a process prepares the kernel here,
    and says so through `progress`; a GPU's load does not need it."""
    from app.models.gguf_import import gguf_source, inspect_gguf, is_gguf_folder

    if backend != "torch" or not (precision == "gguf" or is_gguf_folder(folder)):
        return None
    from app.models import int4_cpu_torch
    from app.models.gguf_torch import loaded_bytes

    if progress is not None and device == "cpu" and not int4_cpu_torch.decided():
        progress("Preparing the CPU kernel for GGUF weights (compiled on the first load, then cached)")

    info = inspect_gguf(gguf_source(folder))
    return loaded_bytes(info.elements or {}, info.embedding, info.head, info.head_rows, device=device)


def plan_load(spec: str | Path, backend: str | None = None, draft: DraftChoice | None = None,
              precision: str = "auto", context: int | None = None, progress=print) -> LoadPlan:
    """The plan for loading `spec` at `precision` with `draft`: every file read and checked once,
    every refusal the files justify made, nothing loaded. `context` caps what the memory check
    plans for (None: the model's own)."""
    draft = draft if draft is not None else DraftChoice(DraftKind.NONE)
    if context is not None and context < 2:
        raise ValueError(f"A context of {context} tokens cannot hold a message and an answer; ask for more.")
    backend = backend or default_backend()
    if precision == "gguf" and backend != "torch":  # before anything loads
        raise ValueError("precision gguf (a GGUF file's own 4-bit layers) runs on PyTorch only; on MLX "
                         "choose int4 (MLX's own 4-bit) or float32.")
    if not isinstance(draft, DraftChoice):  # the clients parse text at their edges
        raise TypeError(f"draft must be a DraftChoice (app/draft_choice.py), not {type(draft).__name__}")
    if draft.kind is DraftKind.PAIR:
        raise ValueError(f"“{draft}” is a request's choice among the loaded pair's drafters, not a draft to load.")
    auto = draft.kind is DraftKind.AUTO
    if auto:
        draft = auto_draft(spec, backend, precision)
    folder = resolve_model(spec, backend, progress, precision)
    if auto and draft == PROMPT_LOOKUP and has_mtp(folder):  # a hub id: its own MTP layer shows once fetched
        draft = DraftChoice(DraftKind.MTP)
    config, file_bytes = check_files(folder, backend)
    from app.models.transformers_tokenizer import ChatTokenizer  # transformers: seconds to import, so only here

    progress(f"Reading the tokenizer of {display_name(folder)} ...")  # seconds: the first also imports transformers
    tokenizer = ChatTokenizer(folder)
    if backend == "torch" and "torch" not in sys.modules:
        progress("Starting PyTorch ...")  # its first import: a second or two, said, not a silent tokenizer step
    device = device_for(backend)
    own_gguf = gguf_loaded_bytes(folder, backend, precision, progress, device)  # None: not a GGUF at its own precisions
    target = estimate("target", config, file_bytes, backend, device, precision, own_gguf)
    if draft.kind is DraftKind.SELF and draft.precision == precision:
        # a copy of the target at the target's own precision is the target: nothing to gain
        progress(f"The draft would be the target itself ({precision}): drafting with prompt lookup instead.")
        draft = PROMPT_LOOKUP
    elif draft.kind is DraftKind.SELF and own_gguf is not None:
        # PyTorch reads a GGUF at its own 4-bit precisions: the folder holds no float weights to
        # copy at another precision, and a 4-bit copy would be the target itself (it failed as
        # the draft loaded, after the target had: "no int4 weights to load")
        progress(f"{display_name(folder)} runs at its GGUF file's own 4-bit precisions, so a copy of it at "
                 f"{draft.precision} is no smaller draft: drafting with prompt lookup instead.")
        draft = PROMPT_LOOKUP
    planned, needs = _plan_draft(draft, folder, config, file_bytes, target, backend, device, precision,
                                 tokenizer, progress)
    models = (target, needs) if needs is not None else (target,)
    if context is not None:  # the memory check plans for the context asked for
        models = tuple(replace(m, context=min(m.context, context)) for m in models)
    return LoadPlan(folder, backend, precision, device, config, file_bytes, tokenizer, planned, models, auto)


def _plan_draft(draft: DraftChoice, folder: Path, config: dict, file_bytes: int, target: MemoryEstimate,
                backend: str, device: str, precision: str, tokenizer,
                progress) -> tuple[DraftPlan, MemoryEstimate | None]:
    """The draft's plan and the memory it needs (None: prompt lookup or none, which hold none)."""
    kv_bytes = kv_dtype_bytes(target, config)
    if draft.kind is DraftKind.SELF:  # same weights, same tokenizer: nothing to check
        return (DraftPlan(draft, folder=folder, precision=draft.precision or None),
                estimate("draft", config, file_bytes, backend, device, draft.precision or None))
    if draft.kind is DraftKind.HEAD or (draft.kind is DraftKind.MODEL and is_aligned_head(draft.source)):
        head_folder = Path(draft.source).expanduser()
        # a head dropped as a draft model drafts as one; its fit is checked before any weights load
        head_weights(head_folder, config)
        text = config.get("text_config") or config
        vocab = draft_vocab(head_folder, int(text.get("vocab_size", 2 ** 31)))
        return (DraftPlan(DraftChoice.head(str(head_folder)), head_folder=head_folder),
                MemoryEstimate("draft", head_bytes(head_folder) * 2 + subset_bytes(vocab, text),
                               head_kv_per_token(config, 1, kv_bytes), target.context))
    if (kind := published_kind(draft)) is not None:
        # an EAGLE-3 head or a DFlash drafter, named so or dropped as a draft model: it drafts as
        # one; read and checked against the target once, here, before any weights load
        published_folder = find_head(draft.source, kind)  # a folder, or a hub id downloaded
        published = HEADS[kind].read(published_folder, config)
        layers = published.layer_config if kind is DraftKind.EAGLE3 else published.config
        # what its config builds, not only what its file holds: a config may ask for far more
        return (DraftPlan(DraftChoice(kind, source=str(published_folder)), published=published),
                MemoryEstimate("draft", published.memory_bytes,
                               head_kv_per_token(layers, published.layer_count, kv_bytes), target.context))
    if draft.kind in (DraftKind.MODEL, DraftKind.ASSISTANT):
        draft_folder = resolve_model(draft.source, backend, progress)
        if is_assistant_folder(draft_folder):  # a Gemma 4 assistant dropped as the draft: it drafts as one
            needs = assistant_estimate(draft_folder, config, backend, device, precision)
            return (DraftPlan(DraftChoice.assistant(str(draft_folder)), assistant_folder=draft_folder,
                              weights=needs.weights), needs)
        if draft.kind is DraftKind.ASSISTANT:
            raise ModelFileError(f"{display_name(draft_folder)} is not a Gemma 4 assistant (its config's "
                                 "model_type is not gemma4_assistant): choose it as a draft model instead.")
        from app.models.transformers_tokenizer import ChatTokenizer

        draft_config, draft_bytes = check_files(draft_folder, backend)
        draft_tokenizer = ChatTokenizer(draft_folder)
        check_tokenizers(tokenizer, draft_tokenizer)  # before any weights load
        return (DraftPlan(draft, folder=draft_folder, tokenizer=draft_tokenizer),
                estimate("draft", draft_config, draft_bytes, backend, device,
                         loaded_bytes=gguf_loaded_bytes(draft_folder, backend, "auto", device=device)))
    if draft.kind is DraftKind.MTP:
        mtp = find_mtp(folder)  # before any weights load: a checkpoint without one is refused now
        if mtp is None:
            raise ModelFileError(no_mtp_reason(folder))
        return (DraftPlan(draft), MemoryEstimate("draft", mtp_bytes(mtp), head_kv_per_token(config, 1, kv_bytes),
                                                 target.context))
    return DraftPlan(draft), None  # prompt lookup, or none


def memory_lines(plan: LoadPlan, free: tuple[int, str]) -> list[str]:
    """What `models info` says of a plan: how the pair would load, the memory the load's own check
    plans for it (the same figures: app/models/memory.check_fits), and whether `free` holds it."""
    from app.models.memory import PLANNED_CONTEXT, NotEnoughMemory, check_fits, size_text

    planned = min(PLANNED_CONTEXT, max(m.context for m in plan.models))
    parts = " and ".join(f"the {m.name} {size_text(m.total(planned))} (weights {size_text(m.weights)} + KV cache "
                         f"{size_text(m.kv_per_token * min(planned, m.context))})" for m in plan.models)
    label, _ = plan.draft.choice.words()
    runs = f"{'MLX' if plan.backend == 'mlx' else 'PyTorch'} on {plan.device}"
    lines = [f"A load here ({runs}, draft: {label}) plans {parts} at {planned:,} tokens of context."]
    free_bytes, where = free
    try:
        warning = check_fits(list(plan.models), free_bytes, where)
    except NotEnoughMemory as exc:
        lines.append(str(exc))
    else:
        lines.append(warning or f"That fits: {size_text(free_bytes)} of {where} is free.")
    return lines
