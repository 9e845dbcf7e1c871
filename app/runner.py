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
from app.engine.backends import load_backend
from app.engine.backends.base import ModelBackend
from app.engine.kept_caches import KeptCaches, default_budget
from app.engine.dflash import load_dflash_drafter
from app.engine.mtp import load_eagle3_drafter, load_head_drafter, load_mtp_drafter
from app.engine.drafters import (Drafter, LookupThenModelDrafter, ModelDrafter, PromptLookupDrafter, chat_lookup,
                                 head_passes)
from app.engine.events import Finished, Notice, Round
from app.engine.sampling import SamplingParams
from app.engine.speculative import generate
from app.models.errors import ModelFileError
from app.remote.endpoint import RemoteSpec, is_remote
from app.models.memory import (MemoryEstimate, NotEnoughMemory, check_fits, estimate, free_memory, longest_chat)
from app.models.head_sources import HEADS
from app.models.resolve import display_name
from app.load_plan import LoadPlan, auto_draft, device_for, plan_load  # noqa: F401 - auto_draft: the clients' name for it

BASELINE_TOKENS = 32  # about 2 s on the demo: long enough that one noisy moment does not set it


# The engine's loader of each kind of published drafter (app/models/head_sources.HEADS reads them)
PUBLISHED_LOADERS = {DraftKind.EAGLE3: load_eagle3_drafter, DraftKind.DFLASH: load_dflash_drafter}


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
    # trees of drafts (docs/trees.md): "auto" the branches that pay, "on" every alternative, "off" chains
    trees: str = "auto"
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
    # a remote target (app/remote/): the server's origin ("https://gpu-box:8000") and the model's id
    # there; `folder` is then that id, not a place on this machine, and backend is "remote"
    remote: str = ""
    remote_model: str = ""
    remote_switch: bool = False  # a request may turn the server's speculation off (another Tandem)
    remote_shows: str = ""  # what the panel shows of the server's speculation
    # why this target verifies chains of drafts only (its backend's tree_note), "" where it takes trees
    trees_note: str = ""

    @property
    def name(self) -> str:
        """The target's name for the window, the API and the history (llama-server names a model
        by its file's path: its file name is shown)."""
        if self.remote_model:
            return Path(self.remote_model).name if self.remote_model.endswith(".gguf") else self.remote_model
        return display_name(self.folder)

    def draft_words(self) -> tuple[str, str]:
        """The draft's (label, detail) for the window: a self-draft at the precision it loaded at; a
        remote target's speculation is its server's (app/remote/target.py says what each shows)."""
        if self.remote:
            return "the server's own", f"{self.dtype} speculates as it was started; {self.remote_shows}"
        label, detail = self.draft.words(self.draft_dtype if self.draft.kind is DraftKind.SELF else "")
        return label, f"{detail}; {self.draft_passes}" if self.draft_passes else detail

    def describe(self) -> str:
        pair = f" + {self.draft_words()[0]}" if self.draft != NO_DRAFT else ""
        if self.remote:
            return f"{self.remote_model} on {self.dtype} at {self.remote}"
        return f"{display_name(self.folder)}{pair} ({self.model_type}, {self.dtype}) on {self.backend}/{self.device}"


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
        self.remote = None  # a target served elsewhere (app/remote/target.RemoteTarget), else None
        self.free_memory = free_memory  # (backend, device) -> (bytes, name); tests may simulate less
        import psutil

        # other conversations' caches, set aside within a budget (the one answered last stays in the models)
        self.kept = KeptCaches(default_budget(psutil.virtual_memory().total))

    def _device(self, backend: str) -> str:
        return device_for(backend)

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
             context: int | None = None, graphs: str = "auto", glue: str = "auto",
             model_code: str = "auto") -> LoadedModel:
        """Load a target (folder, .gguf, or "demo") at `precision` and its draft (none, prompt
        lookup, a self-draft: a copy of the target's weights, a draft model, or auto). Everything is
        read and checked first, into one plan (app/load_plan.py), before anything replaces the
        current pair; then the pair loads by that plan. `compile` ("auto", "on", "off") is how the
        PyTorch target decodes (app/engine/backends/compile_torch.py). `context`: the most tokens
        a chat may hold (None: the model's own), never more than the model's or than memory holds.
        `model_code`: "transformers" loads transformers' model classes even where Tandem's own would
        do (a GGUF on the lean step, app/models/gguf_llama_torch.py), for what runs transformers'
        forward on the loaded model (the bench's anchors)."""
        start = time.perf_counter()
        if isinstance(spec, RemoteSpec) or is_remote(spec):
            return self._load_remote(spec if isinstance(spec, RemoteSpec) else RemoteSpec(spec), context, progress,
                                     start)
        plan = plan_load(spec, backend, draft, precision, context, progress)
        try:
            notice, memory_cap = self._check_memory(list(plan.models), plan.backend, progress)
        except NotEnoughMemory as exc:
            raise self._smaller_offer(exc, list(plan.models), plan.config, plan.file_bytes, plan.backend,
                                      plan.device, plan.precision, plan.folder, plan.draft.precision) from exc
        self.kept.forget()  # the old pair's set-aside caches: their memory is the new pair's now
        self._drop_remote()
        target, own = self._load_target(plan, memory_cap, context, progress, compile=compile, graphs=graphs,
                                         glue=glue, model_code=model_code)
        drafter, choice, draft_bytes, draft_dtype, fallback = self._load_drafter(
            plan, target, progress, graphs=graphs, glue=glue, model_code=model_code)
        notice = " ".join(filter(None, (notice, fallback)))
        self.target, self.drafter, self.tokenizer = target, drafter, plan.tokenizer
        self._controllers.clear()
        tokenizer = plan.tokenizer
        self.loaded = LoadedModel(plan.folder, plan.backend, target.device, target.dtype, target.model_type,
                                  target.context_length, target.weights_bytes,
                                  time.perf_counter() - start, choice, notice, draft_bytes,
                                  target.device_note,
                                  "switch" if tokenizer.thinking_switch else "always" if tokenizer.thinks else "",
                                  own, draft_dtype, head_passes(drafter, target.device),
                                  trees_note=target.tree_note())
        return self.loaded

    def _load_remote(self, spec: RemoteSpec, context: int | None, progress, start: float) -> LoadedModel:
        """A server's model as the target (app/remote/target.py). The server is asked first; only
        when it answers does the pair in use go (its memory is free for other work then)."""
        from app.remote.target import RemoteTarget  # httpx: only where a server is used

        remote = RemoteTarget(spec, progress)
        self._drop_remote()
        self.kept.forget()
        self.target = self.drafter = self.tokenizer = None
        self._controllers.clear()
        gc.collect()
        self.remote = remote
        own = remote.context_length
        asked = min(own, context) if own and context else (context or own)
        self.loaded = LoadedModel(Path(remote.model.id), "remote", remote.endpoint.origin, remote.engine, "remote",
                                  asked, 0, time.perf_counter() - start, NO_DRAFT, own_context=own,
                                  remote=remote.endpoint.origin, remote_model=remote.model.id,
                                  remote_switch=remote.can_choose_draft(), remote_shows=remote.shows(),
                                  # another Tandem takes the chat's choice (its own target may verify chains)
                                  trees_note="" if remote.can_choose_draft() else
                                  f"{remote.engine} speculates as it was started")
        progress(f"Connected: {remote.describe()}.")
        return self.loaded

    def _drop_remote(self) -> None:
        if self.remote is not None:
            self.remote.close()
            self.remote = None

    def _load_target(self, plan: LoadPlan, memory_cap: int | None, context: int | None, progress,
                     **options) -> tuple[ModelBackend, int]:
        """The target's backend, its context fitted (the model's own, or less where asked or where
        memory holds less), and the model's own context."""
        progress(f"Loading {display_name(plan.folder)} with {'MLX' if plan.backend == 'mlx' else 'PyTorch'} ...")
        options = {**options, "progress": progress} if plan.backend == "torch" else {}
        target = load_backend(plan.folder, plan.backend, precision=plan.precision, **options)
        # Fitting then leaves out old turns before the KV cache can outgrow memory.
        own = target.context_length
        asked = min(own, context or own)
        target.context_length = min(asked, memory_cap or asked)
        if memory_cap is not None and memory_cap <= asked and memory_cap < own:  # memory, not the ask, binds
            progress(f"Chats are kept within {memory_cap:,} tokens, what memory holds (the model reads {own:,}).")
        # Padded embeddings (e.g. 151936 rows for 151665 tokens): every drafter, and the target
        # alone, sample and compare over the tokenizer's real vocabulary only.
        target.vocab_limit = min(len(plan.tokenizer), target.vocab_size or len(plan.tokenizer))
        return target, own

    def _load_drafter(self, plan: LoadPlan, target: ModelBackend, progress, **options
                      ) -> tuple[Drafter | None, DraftChoice, int, str, str]:
        """(the drafter, the draft as loaded, its weights' bytes, a draft model's dtype, what the
        user should know where "auto" fell back to prompt lookup)."""
        draft, plan_draft = plan.draft.choice, plan.draft
        if plan_draft.folder is not None:
            which = (f"the same model in {plan_draft.precision}" if plan_draft.precision
                     else display_name(plan_draft.folder))
            progress(f"Loading draft {which} ...")
            options = options if plan.backend == "torch" else {}
            draft_backend = load_backend(plan_draft.folder, plan.backend, precision=plan_draft.precision or "auto",
                                         **options)
            limit = min(target.vocab_limit, draft_backend.vocab_size)
            target.vocab_limit = draft_backend.vocab_limit = limit
            if draft.kind is DraftKind.MODEL:  # named by the folder loaded (a .gguf's import, a hub cache)
                draft = DraftChoice.model(str(plan_draft.folder))
            return (LookupThenModelDrafter(ModelDrafter(draft_backend)), draft, draft_backend.weights_bytes,
                    draft_backend.dtype, "")
        if draft.kind is DraftKind.MTP:
            progress("Loading the model's built-in MTP layer ...")
            try:
                mtp_drafter = load_mtp_drafter(target)
            except ModelFileError as exc:
                if not plan.auto:
                    raise
                # "auto" asked for the best draft that works, not for this layer: a broken one costs
                # its speed-up, not the model
                fallback = f"The model's built-in MTP layer cannot draft, so prompt lookup drafts instead. {exc}"
                progress(fallback)
                return chat_lookup(), PROMPT_LOOKUP, 0, "", fallback
            return LookupThenModelDrafter(mtp_drafter), draft, mtp_drafter.head.weights_bytes, "", ""
        if plan_draft.head_folder is not None:
            progress(f"Loading the aligned draft head {plan_draft.head_folder.name} ...")
            head_drafter = load_head_drafter(target, plan_draft.head_folder)
            return LookupThenModelDrafter(head_drafter), draft, head_drafter.head.weights_bytes, "", ""
        if plan_draft.published is not None:
            published = plan_draft.published
            progress(f"Loading the {HEADS[draft.kind].words} {published.folder.name} ...")
            published_drafter = PUBLISHED_LOADERS[draft.kind](target, published)
            return LookupThenModelDrafter(published_drafter), draft, published_drafter.weights_bytes, "", ""
        if plan_draft.assistant_folder is not None:
            progress(f"Loading assistant {display_name(plan_draft.assistant_folder)} ...")
            return load_assistant_drafter(plan_draft.assistant_folder, target), draft, plan_draft.weights, "", ""
        if draft.kind is DraftKind.LOOKUP:  # asked for, or what "auto" decided
            return chat_lookup(), draft, 0, "", ""
        return None, draft, 0, "", ""

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
        if self.remote is not None:
            return self._time_remote_alone(messages, tokens, cancelled, params)
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

    def _time_remote_alone(self, messages, tokens, cancelled, params) -> tuple[float, int] | None:
        """A remote Tandem's target alone, timed from here (network included, as its answers are).
        Other engines fix their speculation at start: there is no target alone to time, and
        RemoteError says so."""
        from app.remote.client import RemoteError

        if not self.remote.can_choose_draft():
            raise RemoteError(f"{self.remote.engine} sets its speculation when it starts, so its target alone "
                              "cannot be timed from here: the speedup is not measured.")
        request = ChatRequest(tuple(messages) or ({"role": "user", "content": "Hello!"},), max_tokens=tokens,
                              params=params, drafter=NO_DRAFT, cancel=CancelToken(also=cancelled))
        finished = None
        for event in self.remote.chat(request):
            if isinstance(event, Finished):
                finished = event
        stats = finished.stats
        if stats.finish_reason == "cancelled" or not stats.decode_tokens:
            return None
        return stats.decode_s / stats.decode_tokens, stats.prompt_tokens + stats.tokens

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        """The request's prompt as token ids: its chat through the template (with its tools), or
        its raw prompt."""
        if request.prompt is not None:
            return self.tokenizer.encode(request.prompt)
        return self.tokenizer.render_chat(list(request.messages), tools=list(request.tools) or None,
                                          thinking=request.thinking)

    def prompt_length(self, request: ChatRequest) -> int | None:
        """The request's prompt in tokens; None for a remote target (its server counts them)."""
        return None if self.remote is not None else len(self.prompt_ids(request))

    def starts_thinking(self, request: ChatRequest) -> bool | None:
        """None for a model that does not think; else whether its answer begins inside the
        thinking block (the prompt opened it) rather than with the answer or the opening tag."""
        from app.chat.thinking import starts_thinking

        if self.remote is not None or self.tokenizer is None or not self.tokenizer.thinks:
            return None  # a remote target's thinking comes apart from its answer (app/remote/target.py)
        if request.prompt is not None:
            return starts_thinking(request.prompt)
        return starts_thinking(self.tokenizer.render_text(list(request.messages), tools=list(request.tools) or None,
                                                          thinking=request.thinking))

    def fit(self, request: ChatRequest) -> tuple[ChatRequest, str]:
        """The request with its oldest turns left out where the chat outgrows the context (never
        the system prompt or the last message; app/chat/context.py), and the notice that says so
        ("" when nothing was). A ContextOverflowError when even those do not fit."""
        if self.remote is not None:  # a server counts its own tokens (and refuses what is too long)
            return request, ""
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
        if self.remote is not None:
            self._running = request.cancel
            try:
                yield from self.remote.chat(request)
            finally:
                self._running = None
            return
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
                draft_tokens=request.draft_tokens, trees=request.trees, should_stop=lambda: request.cancel.cancelled,
                controller=None if request.draft_tokens else self._controller(request.drafter),
                reuse_cache=True,  # a follow-up turn prefills only its new tokens
            )
        finally:
            self._running = None
