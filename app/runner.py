"""The one owner of a loaded model pair. Qt-free: the window's worker, the CLI and (later) the
local server are its clients.

A runner is used from one thread for its whole life (MLX streams belong to one thread); its
only cross-thread entry point is `cancel()`, a flag the generator checks between rounds.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app.engine.backends import default_backend, load_backend
from app.engine.backends.base import ModelBackend
from app.engine.events import Finished, Round
from app.engine.plain import generate_plain
from app.engine.sampling import SamplingParams
from app.models.resolve import resolve_model


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[dict, ...]  # ({"role": "system"|"user"|"assistant", "content": str}, ...)
    max_tokens: int = 512
    params: SamplingParams = SamplingParams()
    stop_strings: tuple[str, ...] = ()


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
    extra: dict = field(default_factory=dict)

    def describe(self) -> str:
        return f"{self.folder.name} ({self.model_type}, {self.dtype}) on {self.backend}/{self.device}"


class Runner:
    def __init__(self):
        self.target: ModelBackend | None = None
        self.tokenizer = None
        self.loaded: LoadedModel | None = None
        self._cancel = threading.Event()

    def load(self, spec: str | Path, backend: str | None = None, progress=print) -> LoadedModel:
        """Load a target (folder, .gguf, or "demo"). The current model stays until this succeeds."""
        backend = backend or default_backend()
        start = time.perf_counter()
        folder = resolve_model(spec, backend, progress)
        from app.models.transformers_tokenizer import ChatTokenizer

        progress(f"Loading {folder.name} on {backend} ...")
        tokenizer = ChatTokenizer(folder)
        target = load_backend(folder, backend)
        self.target, self.tokenizer = target, tokenizer
        self.loaded = LoadedModel(folder, backend, target.device, target.dtype, target.model_type,
                                  target.context_length, target.weights_bytes,
                                  time.perf_counter() - start)
        return self.loaded

    def cancel(self) -> None:
        """Ask the running generation to stop after its current round (any thread)."""
        self._cancel.set()

    def chat(self, request: ChatRequest) -> Iterator[Round | Finished]:
        if self.target is None:
            raise RuntimeError("No model is loaded.")
        self._cancel.clear()
        prompt_ids = self.tokenizer.render_chat(list(request.messages))
        yield from generate_plain(
            self.target, self.tokenizer.decode, prompt_ids,
            stop_ids=self.tokenizer.stop_ids, max_tokens=request.max_tokens,
            params=request.params, stop_strings=request.stop_strings,
            should_stop=self._cancel.is_set,
        )
