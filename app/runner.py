"""The one owner of a loaded model pair. Qt-free: the window's worker, the CLI and (later) the
local server are its clients.

A runner is used from one thread for its whole life (MLX streams belong to one thread). Each
request carries its own `CancelToken`, made by the client when it asks (so a Stop pressed the
instant after Send still reaches that request) and never cleared; the generator checks it
between rounds and between draft steps. `cancel()` cancels the request running now.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from app.chat.context import fit_messages
from app.draft_choice import NO_DRAFT, PAIR_DRAFT, PROMPT_LOOKUP, DraftChoice, DraftKind
from app.engine.adaptive import DraftLengthController
from app.engine.assistant import load_assistant_drafter
from app.engine.backends import default_backend, load_backend
from app.engine.backends.base import ModelBackend
from app.engine.kept_caches import KeptCaches, default_budget
from app.engine.dflash import load_dflash_drafter
from app.engine.mtp import load_eagle3_drafter, load_head_drafter, load_mtp_drafter
from app.engine.drafters import (Drafter, LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter, chat_lookup,
                                 head_passes)
from app.engine.events import Finished, Notice, Round
from app.engine.sampling import SamplingParams
from app.engine.speculative import generate
from app.models.architecture import check_architecture
from app.models.draft_heads import assistant_estimate, has_mtp, is_assistant_folder, no_mtp_reason
from app.models.errors import ModelFileError
from app.models.folder import check_model_folder
from app.models.integrity import check_weights
from app.models.memory import (MemoryEstimate, NotEnoughMemory, check_fits, estimate, free_memory, head_kv_per_token,
                               kv_dtype_bytes, longest_chat)
from app.models.aligned_head import draft_vocab, head_bytes, head_weights, is_aligned_head, subset_bytes
from app.models.head_sources import HEADS, find_head, head_kind
from app.models.mtp_weights import find_mtp, mtp_bytes
from app.models.pairing import check_tokenizers
from app.models.resolve import display_name, resolve_model

BASELINE_TOKENS = 32  # about 2 s on the demo: long enough that one noisy moment does not set it


# The engine's loader of each kind of published drafter (app/models/head_sources.HEADS reads them)
PUBLISHED_LOADERS = {DraftKind.EAGLE3: load_eagle3_drafter, DraftKind.DFLASH: load_dflash_drafter}


def _published_kind(draft: DraftChoice) -> DraftKind | None:
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


class CancelToken:
    """One request's Stop: set from any thread, never cleared (a new request gets a new token)."""

    def __init__(self, also: Callable[[], bool] | None = None):
        self._event = threading.Event()
        self._also = also  # another reason to stop (a background job gives way to a real request)

    def cancel(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set() or (self._also is not None and self._also())


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[dict, ...]  # ({"role": "system"|"user"|"assistant", "content": str}, ...)
    max_tokens: int = 512
    params: SamplingParams = SamplingParams()
    stop_strings: tuple[str, ...] = ()
    draft_tokens: int | None = None  # None: adaptive
    # one of REQUEST_CHOICES (app/draft_choice.py): the pair's draft as loaded (a draft model
    # works with prompt lookup), its draft model alone, prompt lookup alone, the target alone
    drafter: DraftChoice = PAIR_DRAFT
    # whose caches to answer from (app/engine/kept_caches.py): a chat's id; "" for a one-off
    conversation: str = ""
    tools: tuple[dict, ...] = ()  # function tools, rendered by the chat template in its own format
    prompt: str | None = None  # a raw prompt (a completion, no chat template): `messages` unused
    # fit a chat that outgrows the context by leaving out old turns (the window); False: refuse
    # it (an API client is told, as OpenAI's API does, and shortens it itself)
    fit: bool = True
    thinking: bool | None = None  # a reasoning template's switch (None: the template's default)
    cancel: CancelToken = field(default_factory=CancelToken, compare=False, repr=False)

    @property
    def use_draft(self) -> bool:
        return self.drafter.kind is not DraftKind.NONE


@dataclass(frozen=True)
class LoadedModel:
    folder: Path
    backend: str
    device: str
    dtype: str
    model_type: str
    context_length: int
    weights_bytes: int
    load_s: float
    draft: DraftChoice = NO_DRAFT  # what drafts for it ("auto" decided; a draft model by its folder)
    notice: str = ""  # what the user should know about this pair (it fits memory only tightly)
    draft_bytes: int = 0  # the draft model's weights (0 for prompt lookup and none)
    device_note: str = ""  # e.g. "no NVIDIA GPU or driver found" when a CUDA build runs on the CPU
    reasoning: str = ""  # the model thinks before answering: "switch" (its template turns it off), "always", ""
    own_context: int = 0  # what the model itself reads (context_length is what chats are kept within)
    draft_dtype: str = ""  # a draft model's as loaded ("int4 (g32, float32 head)"), "" for none and lookup
    draft_passes: str = ""  # how a draft head's passes run on PyTorch ("passes: CUDA graphs"), "" elsewhere

    def draft_words(self) -> tuple[str, str]:
        """The draft's (label, detail) for the window: a self-draft at the precision it loaded at."""
        label, detail = self.draft.words(self.draft_dtype if self.draft.kind is DraftKind.SELF else "")
        return label, f"{detail}; {self.draft_passes}" if self.draft_passes else detail

    def describe(self) -> str:
        pair = f" + {self.draft_words()[0]}" if self.draft != NO_DRAFT else ""
        return f"{display_name(self.folder)}{pair} ({self.model_type}, {self.dtype}) on {self.backend}/{self.device}"


def _gguf_loaded_bytes(folder: Path, backend: str, precision: str) -> int | None:
    """The weights' size as loaded when PyTorch reads them from a GGUF at its own precisions (the
    memory check must count that, not float32); None otherwise."""
    from app.models.gguf_import import gguf_source, inspect_gguf, is_gguf_folder

    if backend != "torch" or not (precision == "gguf" or is_gguf_folder(folder)):
        return None
    from app.models.gguf_torch import loaded_bytes

    info = inspect_gguf(gguf_source(folder))
    return loaded_bytes(info.elements or {}, info.embedding, info.head, info.head_rows)


class Runner:
    def __init__(self):
        self.target: ModelBackend | None = None
        self.drafter: Drafter | None = None
        self.tokenizer = None
        self.loaded: LoadedModel | None = None
        self._lookup = chat_lookup()
        # Adaptive k per drafter, kept across turns: what it measured (the cost of each verify
        # width, the acceptance) belongs to the pair and this machine, not to one answer.
        self._controllers: dict[str, DraftLengthController] = {}
        self._running: CancelToken | None = None  # the token of the request being answered
        self.free_memory = free_memory  # (backend, device) -> (bytes, name); tests may simulate less
        import psutil

        # other conversations' caches, set aside within a budget (the one answered last stays in the models)
        self.kept = KeptCaches(default_budget(psutil.virtual_memory().total))

    def _device(self, backend: str) -> str:
        if backend == "mlx":
            return "gpu"
        from app.models.memory_torch import torch_device

        return torch_device()

    def _check_memory(self, models: list[MemoryEstimate], backend: str, progress) -> tuple[str, int | None]:
        """(a warning or "", the longest chat memory holds where that is less than planned) when
        the pair fits; NotEnoughMemory when it cannot. When it fits only without the pair in use,
        that pair is unloaded first: every other check has passed."""
        device = self._device(backend)
        free, where = self.free_memory(backend, device)
        try:
            return check_fits(models, free, where) or "", longest_chat(models, free)
        except NotEnoughMemory:
            held = self._held_bytes()
            if not held:
                raise
            warning = check_fits(models, free + held, where) or ""  # raises when even that is too little
            progress("Unloading the current pair to make room ...")
            self.target = self.drafter = self.tokenizer = self.loaded = None
            self._controllers.clear()
            gc.collect()
            return warning, longest_chat(models, free + held)

    def settle(self) -> None:
        """Finish the device work queued on this (the engine's) thread: an MLX stream still
        evaluating when the interpreter tears down could abort the process at exit ("terminate
        called without an active exception"). The pair stays loaded: a runner outlives a service
        that closes (the tests share one)."""
        mlx_core = sys.modules.get("mlx.core")
        if mlx_core is not None:
            mlx_core.synchronize()

    def _held_bytes(self) -> int:
        """The weights of the pair in use, which a new pair replaces (and may unload to make room)."""
        held = self.target.weights_bytes if self.target is not None else 0
        draft = self._draft_backend()
        return held + (draft.weights_bytes if draft is not None and draft is not self.target else 0)

    def _smaller_offer(self, refused: NotEnoughMemory, models: list[MemoryEstimate], config: dict, file_bytes: int,
                       backend: str, device: str, precision: str, folder: Path,
                       draft_precision: str | None) -> NotEnoughMemory:
        """A 16- or 32-bit target that does not fit: the same refusal, plus the figures at int4
        (weight-only, group 32: torchao on PyTorch, MLX's own 4-bit) when the pair fits at that,
        with `fits_at` set so a window can offer it as one click. An int4 self-draft of an int4
        target would be the target itself: the offer drafts with prompt lookup instead. Other
        refusals stay as they are."""
        from app.models.gguf_import import is_gguf_folder
        from app.models.memory import DTYPE_BYTES, TOO_LARGE_ADVICE, loaded_dtype, size_text

        stored = loaded_dtype(config, backend, device, precision)
        if precision != "auto" or stored not in DTYPE_BYTES or (backend == "torch" and is_gguf_folder(folder)):
            return refused
        same_draft = draft_precision == "int4"
        smaller = [estimate("target", config, file_bytes, backend, device, "int4"), *models[1:]]
        if same_draft:
            smaller = smaller[:1]
        free, where = self.free_memory(backend, device)
        try:
            check_fits(smaller, free + self._held_bytes(), where)
        except NotEnoughMemory:
            return refused
        fits = ("it fits with prompt lookup as the draft (its 4-bit copy would be the target itself)" if same_draft
                else "the pair fits")
        flags = "--precision int4 --draft ngram" if same_draft else "--precision int4"
        offer = (f"In 4-bit (int4 weight-only, groups of 32) the target's weights take {size_text(smaller[0].weights)} "
                 f"instead of {size_text(models[0].weights)}, and {fits}: load it in 4-bit (tandem-cli: {flags}). "
                 "Answers then come from the 4-bit model.")
        return NotEnoughMemory(str(refused).replace(TOO_LARGE_ADVICE, offer), fits_at="int4",
                               fits_with_draft=PROMPT_LOOKUP if same_draft else None)

    def load(self, spec: str | Path, backend: str | None = None, draft: DraftChoice = NO_DRAFT,
             precision: str = "auto", progress=print, compile: str = "auto",
             context: int | None = None, graphs: str = "auto", glue: str = "auto") -> LoadedModel:
        """Load a target (folder, .gguf, or "demo") at `precision` and its draft (none, prompt
        lookup, a self-draft: a copy of the target's weights, a draft model, or auto). Everything is checked
        before anything replaces the current pair. `compile` ("auto", "on", "off") is how the
        PyTorch target decodes (app/engine/backends/compile_torch.py). `context`: the most tokens
        a chat may hold (None: the model's own), never more than the model's or than memory holds."""
        if context is not None and context < 2:
            raise ValueError(f"A context of {context} tokens cannot hold a message and an answer; ask for more.")
        from app.models.transformers_tokenizer import ChatTokenizer

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
        start = time.perf_counter()
        folder = resolve_model(spec, backend, progress, precision)
        if auto and draft == PROMPT_LOOKUP and has_mtp(folder):  # a hub id: its own MTP layer shows once fetched
            draft = DraftChoice(DraftKind.MTP)
        config, file_bytes = self._check_files(folder, backend)
        tokenizer = ChatTokenizer(folder)
        device = self._device(backend)
        models = [estimate("target", config, file_bytes, backend, device, precision,
                           _gguf_loaded_bytes(folder, backend, precision))]
        draft_folder = draft_tokenizer = assistant_folder = head_folder = published = None
        draft_weights = 0  # what the LoadedModel reports for a drafter that is not a model of its own
        if draft.kind is DraftKind.SELF and draft.precision == precision:
            # a copy of the target at the target's own precision is the target: nothing to gain
            progress(f"The draft would be the target itself ({precision}): drafting with prompt lookup instead.")
            draft = PROMPT_LOOKUP
        draft_precision = draft.precision or None  # a self-draft's
        if draft.kind is DraftKind.SELF:
            draft_folder = folder  # same weights, same tokenizer: nothing to check
            models.append(estimate("draft", config, file_bytes, backend, device, draft_precision))
        elif draft.kind is DraftKind.HEAD or (draft.kind is DraftKind.MODEL and is_aligned_head(draft.source)):
            head_folder = Path(draft.source).expanduser()
            # a head dropped as a draft model drafts as one; its fit is checked before any weights load
            draft = DraftChoice.head(str(head_folder))
            head_weights(head_folder, config)
            text = config.get("text_config") or config
            vocab = draft_vocab(head_folder, int(text.get("vocab_size", 2 ** 31)))
            models.append(MemoryEstimate("draft", head_bytes(head_folder) * 2 + subset_bytes(vocab, text),
                                         head_kv_per_token(config, 1, kv_dtype_bytes(models[0], config)),
                                         models[0].context))
        elif (published_kind := _published_kind(draft)) is not None:
            # an EAGLE-3 head or a DFlash drafter, named so or dropped as a draft model: it drafts as
            # one; read and checked against the target once, here, before any weights load
            published_folder = find_head(draft.source, published_kind)  # a folder, or a hub id downloaded
            draft = DraftChoice(published_kind, source=str(published_folder))
            published = HEADS[published_kind].read(published_folder, config)
            layers = published.layer_config if published_kind is DraftKind.EAGLE3 else published.config
            # what its config builds, not only what its file holds: a config may ask for far more
            models.append(MemoryEstimate("draft", published.memory_bytes,
                                         head_kv_per_token(layers, published.layer_count,
                                                           kv_dtype_bytes(models[0], config)),
                                         models[0].context))
        elif draft.kind in (DraftKind.MODEL, DraftKind.ASSISTANT):
            draft_folder = resolve_model(draft.source, backend, progress)
            if is_assistant_folder(draft_folder):  # a Gemma 4 assistant dropped as the draft: it drafts as one
                draft, assistant_folder, draft_folder = DraftChoice.assistant(str(draft_folder)), draft_folder, None
                models.append(assistant_estimate(assistant_folder, config, backend, device, precision))
                draft_weights = models[-1].weights
            elif draft.kind is DraftKind.ASSISTANT:
                raise ModelFileError(f"{display_name(draft_folder)} is not a Gemma 4 assistant (its config's "
                                     "model_type is not gemma4_assistant): choose it as a draft model instead.")
            else:
                draft_config, draft_bytes = self._check_files(draft_folder, backend)
                draft_tokenizer = ChatTokenizer(draft_folder)
                check_tokenizers(tokenizer, draft_tokenizer)  # before any weights load
                models.append(estimate("draft", draft_config, draft_bytes, backend, device,
                                       loaded_bytes=_gguf_loaded_bytes(draft_folder, backend, "auto")))
        elif draft.kind is DraftKind.MTP:
            mtp = find_mtp(folder)  # before any weights load: a checkpoint without one is refused now
            if mtp is None:
                raise ModelFileError(no_mtp_reason(folder))
            models.append(MemoryEstimate("draft", mtp_bytes(mtp),
                                         head_kv_per_token(config, 1, kv_dtype_bytes(models[0], config)),
                                         models[0].context))
        if context is not None:  # the memory check plans for the context asked for
            models = [replace(m, context=min(m.context, context)) for m in models]
        try:
            notice, memory_cap = self._check_memory(models, backend, progress)
        except NotEnoughMemory as exc:
            raise self._smaller_offer(exc, models, config, file_bytes, backend, device, precision, folder,
                                      draft_precision) from exc
        self.kept.forget()  # the old pair's set-aside caches: their memory is the new pair's now
        progress(f"Loading {display_name(folder)} with {'MLX' if backend == 'mlx' else 'PyTorch'} ...")
        options = ({"compile": compile, "progress": progress, "graphs": graphs, "glue": glue}
                   if backend == "torch" else {})
        target = load_backend(folder, backend, precision=precision, **options)
        # The context chats are fitted to: the model's own, or less where asked or where memory
        # holds less (fitting then leaves out old turns before the KV cache can outgrow memory).
        own = target.context_length
        asked = min(own, context or own)
        target.context_length = min(asked, memory_cap or asked)
        if memory_cap is not None and memory_cap <= asked and memory_cap < own:  # memory, not the ask, binds
            progress(f"Chats are kept within {memory_cap:,} tokens, what memory holds (the model reads {own:,}).")
        # Padded embeddings (e.g. 151936 rows for 151665 tokens): every drafter, and the target
        # alone, sample and compare over the tokenizer's real vocabulary only.
        target.vocab_limit = min(len(tokenizer), target.vocab_size or len(tokenizer))
        drafter: Drafter | None = None
        draft_dtype = ""
        if draft_folder is not None:
            which = f"the same model in {draft_precision}" if draft_precision else display_name(draft_folder)
            progress(f"Loading draft {which} ...")
            draft_options = {"graphs": graphs, "glue": glue} if backend == "torch" else {}
            draft_backend = load_backend(draft_folder, backend, precision=draft_precision or "auto", **draft_options)
            limit = min(target.vocab_limit, draft_backend.vocab_size)
            target.vocab_limit = draft_backend.vocab_limit = limit
            drafter = LookupThenModelDrafter(ModelDrafter(draft_backend))
            draft_dtype = draft_backend.dtype
            if draft.kind is DraftKind.MODEL:  # named by the folder loaded (a .gguf's import, a hub cache)
                draft = DraftChoice.model(str(draft_folder))
        elif draft.kind is DraftKind.MTP:
            progress("Loading the model's built-in MTP layer ...")
            try:
                mtp_drafter = load_mtp_drafter(target)
            except ModelFileError as exc:
                if not auto:
                    raise
                # "auto" asked for the best draft that works, not for this layer: a broken one costs
                # its speed-up, not the model
                fallback = f"The model's built-in MTP layer cannot draft, so prompt lookup drafts instead. {exc}"
                progress(fallback)
                draft, notice = PROMPT_LOOKUP, " ".join(filter(None, (notice, fallback)))
            else:
                drafter, draft_weights = LookupThenModelDrafter(mtp_drafter), mtp_drafter.head.weights_bytes
        elif head_folder is not None:
            progress(f"Loading the aligned draft head {head_folder.name} ...")
            head_drafter = load_head_drafter(target, head_folder)
            drafter, draft_weights = LookupThenModelDrafter(head_drafter), head_drafter.head.weights_bytes
        elif published is not None:
            progress(f"Loading the {HEADS[published_kind].words} {published.folder.name} ...")
            published_drafter = PUBLISHED_LOADERS[published_kind](target, published)
            drafter, draft_weights = LookupThenModelDrafter(published_drafter), published_drafter.weights_bytes
        elif assistant_folder is not None:
            progress(f"Loading assistant {display_name(assistant_folder)} ...")
            assistant = load_assistant_drafter(assistant_folder, target)
            drafter = assistant
        if draft.kind is DraftKind.LOOKUP:  # asked for, or what "auto" fell back to above
            drafter = chat_lookup()
        self.target, self.drafter, self.tokenizer = target, drafter, tokenizer
        self._controllers.clear()
        self.loaded = LoadedModel(folder, backend, target.device, target.dtype, target.model_type,
                                  target.context_length, target.weights_bytes,
                                  time.perf_counter() - start, draft, notice,
                                  draft_backend.weights_bytes if draft_folder is not None else draft_weights,
                                  target.device_note,
                                  "switch" if tokenizer.thinking_switch else "always" if tokenizer.thinks else "",
                                  own, draft_dtype, head_passes(drafter, target.device))
        return self.loaded

    @staticmethod
    def _check_files(folder: Path, backend: str) -> tuple[dict, int]:
        """The folder's config and weight bytes, after checking the files are whole and the
        backend runs the architecture: each failure is a ModelFileError in plain words."""
        config = check_model_folder(folder)
        file_bytes = check_weights(folder)
        check_architecture(config, backend, display_name(folder))
        return config, file_bytes

    def cancel(self) -> None:
        """Stop the request being answered now, between rounds or draft steps (any thread)."""
        running = self._running
        if running is not None:
            running.cancel()

    def _draft_backend(self) -> ModelBackend | None:
        """The draft model's backend (ModelDrafter, and LookupThenModelDrafter through its model),
        or None for prompt lookup and no draft."""
        return getattr(self.drafter, "backend", None)

    def _backends(self) -> list[ModelBackend]:
        """The models whose caches a conversation keeps: the target, and the draft model if any."""
        draft = self._draft_backend()
        return [self.target] if draft is None else [self.target, draft]

    def _controller(self, choice: DraftChoice) -> DraftLengthController:
        return self._controllers.setdefault(choice, DraftLengthController())

    def _drafter_for(self, choice: DraftChoice) -> Drafter | None:
        """The drafter a request's choice (one of REQUEST_CHOICES) takes from the loaded pair."""
        if choice.kind is DraftKind.NONE:
            return None
        if choice.kind is DraftKind.LOOKUP:
            # what it proposes depends on the sequence alone (its index is checked each call): one
            # instance serves every request
            return self.drafter if isinstance(self.drafter, PromptLookupDrafter) else self._lookup
        if choice.kind is not DraftKind.PAIR:
            raise ValueError(f"A request drafts with the loaded pair, prompt lookup or none, not “{choice}”: load "
                             "that draft first.")
        if not choice.lookup and isinstance(self.drafter, LookupThenModelDrafter):
            return self.drafter.model
        return self.drafter

    def time_target_alone(self, messages: tuple[dict, ...] = (), tokens: int = BASELINE_TOKENS,
                          cancelled: Callable[[], bool] = lambda: False,
                          params: SamplingParams = SamplingParams()) -> tuple[float, int] | None:
        """Seconds per token of the target decoding alone after `messages` (or a short greeting),
        sampling with `params` as the answers it is compared with do, and the context length it was
        measured at: the side panel's speedup is measured against this, never assumed. Stop tokens
        are ignored so every timing covers `tokens` tokens. None when `cancelled()` turned true (a
        real request wants the engine): no half timing."""
        if self.target is None:
            raise RuntimeError("No model is loaded.")
        prompt = self.tokenizer.render_chat(list(messages) or [{"role": "user", "content": "Hello!"}])
        prompt = prompt[-(self.target.context_length - tokens - 1):]
        finished = None
        # with the conversation's cache: only what the last answer did not leave there is prefilled
        for event in generate(self.target, self.tokenizer.decode, prompt, drafter=None, max_tokens=tokens,
                              params=params, should_stop=cancelled, reuse_cache=True):
            if isinstance(event, Finished):
                finished = event
        stats = finished.stats
        if stats.finish_reason == "cancelled" or not stats.decode_tokens:
            return None
        return stats.decode_s / stats.decode_tokens, len(prompt) + tokens

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        """The request's prompt as token ids: its chat through the template (with its tools), or
        its raw prompt."""
        if request.prompt is not None:
            return self.tokenizer.encode(request.prompt)
        return self.tokenizer.render_chat(list(request.messages), tools=list(request.tools) or None,
                                          thinking=request.thinking)

    def starts_thinking(self, request: ChatRequest) -> bool | None:
        """None for a model that does not think; else whether its answer begins inside the
        thinking block (the prompt opened it) rather than with the answer or the opening tag."""
        from app.chat.thinking import starts_thinking

        if self.tokenizer is None or not self.tokenizer.thinks:
            return None
        if request.prompt is not None:
            return starts_thinking(request.prompt)
        return starts_thinking(self.tokenizer.render_text(list(request.messages), tools=list(request.tools) or None,
                                                          thinking=request.thinking))

    def fit(self, request: ChatRequest) -> tuple[ChatRequest, str]:
        """The request with its oldest turns left out where the chat outgrows the context (never
        the system prompt or the last message; app/chat/context.py), and the notice that says so
        ("" when nothing was). A ContextOverflowError when even those do not fit."""
        if self.loaded is None or self.tokenizer is None:
            raise RuntimeError("No model is loaded.")
        # Room kept for the answer: what was asked for, but never more than half the context, so
        # a large "max new tokens" does not refuse every message; the answer then ends at the
        # context's end instead.
        if request.prompt is not None or not request.fit:
            return request, ""  # the engine refuses a prompt that leaves no room to answer
        context = self.loaded.context_length
        room = min(request.max_tokens, context // 2)
        tools = list(request.tools) or None
        messages, dropped = fit_messages(
            list(request.messages),
            lambda chunk: len(self.tokenizer.render_chat(chunk, tools=tools, thinking=request.thinking)),
            context - room)
        if not dropped:
            return request, ""
        noun = "message was" if dropped == 1 else "messages were"
        notice = f"{dropped} earlier {noun} left out to fit the model's context."
        return replace(request, messages=tuple(messages)), notice

    def chat(self, request: ChatRequest) -> Iterator[Round | Notice | Finished]:
        """Answer `request`: fitted to the context (a Notice says what was left out), from the
        caches its conversation left (app/engine/reuse.py, kept_caches.py)."""
        if self.target is None:
            raise RuntimeError("No model is loaded.")
        request, left_out = self.fit(request)
        if left_out:
            yield Notice(left_out)
        prompt_ids = self.prompt_ids(request)
        self.kept.switch(request.conversation, self._backends())
        self._running = request.cancel
        try:
            yield from generate(
                self.target, self.tokenizer.decode, prompt_ids,
                drafter=self._drafter_for(request.drafter),
                stop_ids=self.tokenizer.stop_ids, max_tokens=request.max_tokens,
                params=request.params, stop_strings=request.stop_strings,
                draft_tokens=request.draft_tokens, should_stop=lambda: request.cancel.cancelled,
                controller=None if request.draft_tokens else self._controller(request.drafter),
                reuse_cache=True,  # a follow-up turn prefills only its new tokens
            )
        finally:
            self._running = None
