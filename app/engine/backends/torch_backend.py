"""PyTorch backend: transformers' model classes and DynamicCache; CUDA, then MPS, then CPU."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

# transformers' modules (its model classes, DynamicCache and what reads it: compile_torch,
# kv_cache_torch, layer_replay_torch, torch_cache, attention_torch) are imported where they are
# used, not here: a GGUF whose passes are the lean step's never needs them, and importing them
# costs seconds (app/models/gguf_llama_torch.py)
from app.engine.backends.base import (STATE_REPLAYS, ModelBackend, Verdict, check_choice, check_layers,
                                      entropy_seed)
from app.engine.backends.compile_torch import agree, compile_layers, decide, decoder_layers, uncompile_layers, warm_up
from app.engine.backends.cuda_graphs_torch import CaptureError, GraphedStep, HostIds
from app.engine.backends.layer_glue_torch import why_not_fused
from app.engine.backends.lean_step_torch import LeanStep, why_not_lean
from app.engine.backends.verdict_torch import DraftSteps, greedy_verdict, probs_from_logits, rejection_verdict
from app.engine.backends.static_kv_torch import StaticKV
from app.engine.sampling import SamplingParams
from app.models.folder import check_model_folder, context_length_of
from app.models.torch_quantize import quiet_torchao_logs

quiet_torchao_logs()
log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# "auto": the weights' own; "gguf": an imported GGUF's own (4-bit tensors stay 4-bit)
PRECISIONS = ("auto", *_DTYPES, "int4", "int4-bf16-head", "int4-head", "gguf")
# How passes run (TorchBackend.step): the lean step where the model allows it, or transformers' forward
STEPS = ("auto", "lean", "transformers")
# How the lean step's decode and verify passes run: "auto", as captured CUDA graphs on a GPU (eager
# elsewhere); "off", eagerly at their exact shapes; "static", eagerly at the graphs' bucketed static
# shapes over a fixed KV buffer (the graphs' own code without capture: what the CPU tests run).
GRAPH_MODES = ("auto", "off", "static")
# The glue between the lean step's matmuls (layer_glue_torch.py): "auto" fuses it with torch.compile
# where the passes replay as CUDA graphs and Triton exists; "on" wherever the lean step runs (the
# CPU too, with a C++ compiler); "off" keeps PyTorch's eager ops.
GLUE_MODES = ("auto", "on", "off")
# Whose model classes hold a GGUF whose passes are the lean step's: "auto", Tandem's own where they
# cover the family (app/models/gguf_llama_torch.py); "transformers", transformers' always (for code
# that runs transformers' forward on the loaded model: the bench's anchors)
MODEL_CODES = ("auto", "transformers")
MAX_WIDTH = 32  # positions a fixed KV buffer keeps past the planned context for a pass's padding


def pick_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def cpu_fallback_reason() -> str:
    """Why a CUDA build of PyTorch runs on the CPU ("" where it does not: a CPU build, or a GPU in
    use). The Windows package bundles the CUDA build, which must still run on a PC without an
    NVIDIA GPU or driver, and say so."""
    if torch.version.cuda is None or torch.cuda.is_available():
        return ""
    return "no NVIDIA GPU or driver found"


def pick_dtype(stored: str | None, device: torch.device) -> torch.dtype:
    """Run at the weights' own precision where the device computes it well.

    float16 on the CPU is slow and inexact in PyTorch, so it runs as float32 there; float32 on a
    GPU stays float32 (the exact reference) unless the caller asks otherwise.
    """
    dtype = _DTYPES.get(stored or "float32", torch.float32)
    if device.type == "cpu" and dtype == torch.float16:
        return torch.float32
    if device.type == "mps" and dtype == torch.bfloat16 and not torch.backends.mps.is_macos_or_newer(14, 0):
        return torch.float16
    return dtype


def _with_detail(precision: str, words: str, short_words: str = "") -> str:
    """Precision words "short (detail)": `short_words` joined to the short part the status bar
    shows, `words` to the detail tooltips show."""
    short, _, detail = precision.partition(" (")
    detail = detail.removesuffix(")")
    short += short_words
    if words:
        detail = f"{detail}; {words}" if detail else words
    return f"{short} ({detail})" if detail else short


def _with_compile_state(precision: str, compiled: bool, eager_reason: str) -> str:
    """The precision words with how it decodes: ", compiled" in the short part the status bar
    shows; why it runs eagerly, where compiling was asked for, in the detail tooltips show."""
    if compiled:
        return _with_detail(precision, "", ", compiled")
    return _with_detail(precision, f"eager: {eager_reason}" if eager_reason else "")


class TorchBackend(ModelBackend):
    name = "torch"

    def __init__(self, folder: Path, device: str | None = None, precision: str = "auto",
                 compile: str = "off", progress: Callable[[str], None] | None = None,
                 state_replay: str = "layers", step: str = "auto", graphs: str = "auto", glue: str = "auto",
                 model_code: str = "auto"):
        config = check_model_folder(folder)
        self._progress = progress or (lambda message: None)
        self._state_replay = check_choice("state replay", state_replay, STATE_REPLAYS)
        check_choice("precision", precision, PRECISIONS)
        check_choice("model code", model_code, MODEL_CODES)
        self.folder = folder
        self._device = torch.device(device) if device else pick_device()
        stored = config.get("dtype") or config.get("torch_dtype")
        if precision in _DTYPES:
            self._dtype = _DTYPES[precision]
        else:  # int4 keeps the float layers (norms, embeddings, the head) at the weights' precision
            self._dtype = pick_dtype(stored, self._device)
        self.precision = str(self._dtype).removeprefix("torch.")
        from app.models.gguf_import import is_gguf_folder

        if is_gguf_folder(folder) and precision not in ("auto", "gguf"):
            from app.models.errors import ModelFileError

            raise ModelFileError(
                f"This model was opened at its GGUF file's own precisions, so it has no {precision} weights "
                f"to load. To run it at {precision}, open the .gguf file with that precision chosen "
                "(Tandem then imports a float32 copy).")
        want, self.compile_note = decide(compile, self._device)
        if precision == "gguf" or is_gguf_folder(folder):
            # passes by the lean step alone need none of transformers' model code (gguf_llama_torch.py)
            lean_only = model_code == "auto" and step != "transformers" and not want
            self.model, self.precision = self._load_gguf(folder, lean_only=lean_only)
        else:
            from transformers import AutoModelForCausalLM
            from transformers.utils import logging as transformers_logging

            transformers_logging.disable_progress_bar()  # the window and the CLI report loading themselves
            self.model = AutoModelForCausalLM.from_pretrained(
                str(folder),
                dtype=self._dtype,
                trust_remote_code=False,  # never run code shipped with a model
                use_safetensors=True,
            ).to(self._device)
        if precision.startswith("int4"):
            from app.models.torch_quantize import GROUP_SIZE, lower_head_precision, quantize_int4

            quantize_int4(self.model, include_head=precision == "int4-head")
            head = "int4 head" if precision == "int4-head" else f"{self.precision} head"
            if precision == "int4-bf16-head":
                lower_head_precision(self.model, torch.bfloat16)
                head = "bfloat16 head"
            self.precision = f"int4 (g{GROUP_SIZE}, {head})"
        self.model.eval()
        if not own_layers(self.model):  # (Tandem's own modules run no transformers forward to route)
            from app.models.attention_torch import use_on_cpu

            use_on_cpu(self.model, self._device)  # verify passes without copying the KV cache (attention_torch.py)
        self.device = str(self._device)
        self.device_note = cpu_fallback_reason() if self._device.type == "cpu" else ""
        self.threads = torch.get_num_threads()  # what a comparison run beside it should use
        self.dtype = self.precision
        self.model_type = config.get("model_type", "?")
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        head = self.model.get_output_embeddings().weight
        # what the logits are rounded to (a screened head's argmax and rescored rows are float32)
        self.logits_dtype = str(head.dtype).removeprefix("torch.") if head.is_floating_point() else "float32"
        self.vocab_limit = self.vocab_size
        self.context_length = context_length_of(config)
        self.weights_bytes = sum(t.numel() * t.element_size()
                                 for t in [*self.model.parameters(), *self.model.buffers()])
        self._generator = torch.Generator(device=self._device)
        self._generator.manual_seed(entropy_seed())  # never torch's fixed default seed
        self.compiled = False
        self._hidden_hooks, self._hidden, self._layer_rows, self._layers_asked = [], None, {}, ()
        self._want_hidden = False
        self._mixers: dict | None = None  # found at the first reset (layer_replay_torch.py)
        self._host_ids = HostIds(self._device)
        self._lean: LeanStep | None = None
        self._graphs: GraphedStep | None = None
        self._graph_mode = check_choice("graphs mode", graphs, GRAPH_MODES)
        self._glue_mode = check_choice("glue mode", glue, GLUE_MODES)
        self.glue_note = ""  # why the lean step's glue runs eagerly where passes are captured
        self.lean_note = why_not_lean(self.model)  # why transformers' own forward runs ("" where it does not)
        self.graph_note = ""  # why passes on CUDA run eagerly
        self.step = "transformers" if want else step  # compiling compiles transformers' forward
        if want:
            self.compile_note = self._compile(self._progress)
            if not self.compiled and step != "transformers":
                self.step = step  # compiling failed or disagreed: the lean step, eagerly
        self.dtype = self.precision = _with_compile_state(self.precision, self.compiled,
                                                          "" if compile == "off" else self.compile_note)
        self._base_precision = self.precision
        self.dtype = self.precision = self._with_step(self.precision)

    @property
    def step(self) -> str:
        """How passes run: "lean" (lean_step_torch.py, replayed as CUDA graphs on a GPU) or
        "transformers" (transformers' own forward); "auto" on setting picks lean where it can."""
        return "lean" if self._lean is not None else "transformers"

    @step.setter
    def step(self, step: str) -> None:
        check_choice("step", step, STEPS)
        if step == "lean" and self.lean_note:
            raise ValueError(f"the lean step cannot run this model: {self.lean_note}")
        if step == "lean" and self.compiled:
            raise ValueError("the lean step runs eagerly or as CUDA graphs, not with compiled layers")
        lean = step != "transformers" and not self.lean_note and not self.compiled
        if not lean and own_layers(self.model):
            raise ValueError("this GGUF was loaded without transformers' model code, for the lean step alone "
                             f"({self.lean_note or 'asked for transformers'}); load it with step \"transformers\" "
                             "to run transformers' forward")
        if lean and self._device.type == "cpu" and _on_codes(self.model):  # (compiled_layers_torch.py)
            self._progress("Preparing the decoder layers' compiled call ...")
        self._lean = LeanStep(self.model) if lean else None
        self._graphs, self.graph_note = None, ""
        if self._device.type == "cuda" and not lean:
            self.graph_note = f"no CUDA graphs: transformers' forward runs ({self.lean_note or 'asked'})"
        elif self._device.type == "cuda" and self._graph_mode == "off":
            self.graph_note = "no CUDA graphs: turned off"
        self._fuse_glue()
        self.cache = None  # a new kind of cache: never hand the old one to the other step
        self.reset()
        if hasattr(self, "_base_precision"):
            self.dtype = self.precision = self._with_step(self._base_precision)

    @property
    def graphs(self) -> str:
        """GRAPH_MODES: how the lean step's decode and verify passes run."""
        return self._graph_mode

    @graphs.setter
    def graphs(self, mode: str) -> None:
        self._graph_mode = check_choice("graphs mode", mode, GRAPH_MODES)
        self.step = self.step  # new caches and notes for the mode

    @property
    def glue(self) -> str:
        """GLUE_MODES: whether the glue between the lean step's matmuls is fused where it can be."""
        return self._glue_mode

    @glue.setter
    def glue(self, mode: str) -> None:
        self._glue_mode = check_choice("glue mode", mode, GLUE_MODES)
        self.step = self.step  # a new lean step, and new graphs, with that glue

    def _fuse_glue(self) -> None:
        """Fuse the lean step's glue (layer_glue_torch.py) where passes are captured and it can be,
        compiled here, at load, by a few passes into a scratch cache (widths 1 and several: the
        two shapes torch.compile specialises), not in the first answer. Inductor keeps the kernels
        on disk, so a later load takes seconds. A failure leaves the glue eager, saying why."""
        self.glue_note = ""
        if self._lean is None or (self._glue_mode == "auto" and not self._captures()):
            return
        if self._glue_mode == "off":
            self.glue_note = "glue eager: turned off"
            return
        reason = why_not_fused(self.model.config, self._device, asked=self._glue_mode == "on")
        if reason:
            self.glue_note = f"glue eager: {reason}"
            return
        self._progress("Compiling the glue between the kernels (once; kept on disk)")
        self._lean.glue = self._lean.new_glue(True)
        try:
            with torch.inference_mode():
                scratch = self._lean.new_cache()
                for ids in ([1, 2, 3, 4, 5], [6], [7, 8, 9, 10]):
                    self._lean.forward(torch.tensor([ids], device=self._device), scratch, 1)
                    scratch.appended(len(ids))
        except Exception as exc:  # no C++ compiler for Triton's launcher, an op Inductor cannot take
            self._unfuse(exc)

    def _unfuse(self, exc: BaseException) -> None:
        """The eager glue from here on, with the reason in the precision words; captured graphs
        are dropped (they ran the fused kernels), the KV buffer kept."""
        log.warning("the lean step's glue runs eagerly: %s: %s", type(exc).__name__, exc)
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else "no message"
        self.glue_note = f"glue eager: fusing it failed ({type(exc).__name__}: {first})"
        self._lean.glue = self._lean.new_glue(False)
        self._graphs = None
        if hasattr(self, "_base_precision"):
            self.dtype = self.precision = self._with_step(self._base_precision)

    def _with_step(self, precision: str) -> str:
        """The precision words with how passes run, in the detail tooltips and `models info` show."""
        if self._lean is not None:
            how = "CUDA graphs" if self._captures() else "lean step"
            if self._lean.native is not None:
                how += ", its decoder layers as one compiled call on Tandem's CPU kernel"
            elif self._lean.kernel_words:
                how += f", {self._lean.kernel_words}"
            if self._lean.glue.fused:
                how += ", glue fused by torch.compile"
            elif self.glue_note and (self._captures() or self._glue_mode == "on"):
                how += f" ({self.glue_note})"
        else:
            how = f"transformers' forward ({self.lean_note or 'asked'})" if not self.compiled else ""
        if self.graph_note and self._lean is not None:
            how += f"; {self.graph_note}"
        return _with_detail(precision, f"passes: {how}" if how else "")

    def _compile(self, progress: Callable[[str], None]) -> str:
        """Compile the decoder layers (compile_torch.py) and build their graphs now, checked
        against eager logits; "" when compiled, else why it runs eagerly (and it then does)."""
        if decoder_layers(self.model) is None:
            return f"{self.model_type} has no decoder layer list to compile"

        def forward(ids: list[int], keep: int) -> torch.Tensor:
            with torch.inference_mode():
                return self._forward(self._ids(ids), keep)

        ids = [(11 + 37 * i) % self.vocab_size for i in range(10)]
        eager = warm_up(forward, self.reset, ids)
        progress("Compiling the decoder layers (about a minute; longer the first time) ...")
        self.compiled = True  # reset() now makes the cache the compiled layers expect
        try:
            compile_layers(self.model)
            compiled = warm_up(forward, self.reset, ids)
            reason = next((why for c, e in zip(compiled, eager, strict=True) if (why := agree(c, e))), "")
        except Exception as exc:  # no C++ compiler, an unsupported op: eager still works
            first = (str(exc).strip() or "no message").splitlines()[0][:160]
            reason = f"compiling failed ({type(exc).__name__}: {first})"
        if reason:
            log.warning("decoding eagerly: %s", reason)
            uncompile_layers(self.model)
            self.compiled = False
            self.reset()
        return reason

    def _load_gguf(self, folder: Path, lean_only: bool):
        """The weights straight from the GGUF the folder was imported from, at its own precisions
        (app/models/gguf_torch.py): on the CPU its tensors run on Tandem's CPU kernel
        (int4_cpu_torch.py), or on PyTorch's int4 kernel where that cannot run; on CUDA the 4-bit
        ones on tinygemm's CUDA kernel and the rest in bfloat16 (docs/gguf.md)."""
        from app.models.errors import ModelFileError
        from app.models.gguf_import import gguf_source
        from app.models.gguf_torch import BATCHED_TIE_GAP, load_gguf_model

        if self._device.type not in ("cpu", "cuda"):
            raise ModelFileError(
                f"Loading a GGUF at its own precisions runs on the CPU or an NVIDIA GPU; on {self._device.type} "
                "choose float16 or bfloat16 instead.")
        gpu_layers = self._gguf_gpu_layers()
        if self._device.type == "cuda" and torch.cuda.get_device_capability(self._device) < (8, 0):
            # tinygemm's CUDA kernels are built for Ampere and later only (int4mm.cu: __CUDA_ARCH__ >= 800)
            raise ModelFileError(
                "Loading a GGUF at its own precisions on an NVIDIA GPU needs an Ampere card or later "
                "(RTX 30xx, A100 or newer); on this GPU choose float16 instead.")
        if not gpu_layers:
            from app.models import int4_cpu_torch

            if not int4_cpu_torch.decided():  # the first GGUF of this process: Numba builds or reads the kernel
                self._progress("Preparing the CPU kernel for GGUF weights (compiled on the first load, then cached)")
                int4_cpu_torch.why_not_available()
        else:
            self._dtype = torch.bfloat16  # tinygemm's activations; the dense tensors the same
        model, report = load_gguf_model(folder, gguf_source(folder), dtype=self._dtype, progress=self._progress,
                                        lean_only=lean_only, device=self._device, gpu_layers=gpu_layers)
        if not gpu_layers:  # on CUDA bfloat16's own near-tie rule applies (app/bench/exactness.py)
            self.near_tie_gap = BATCHED_TIE_GAP
        # the UI shows the words before " (", and the whole in tooltips and the load line
        return model, f"{report.short()} ({report.describe()})"

    def _gguf_gpu_layers(self) -> bool:
        """Whether a GGUF loads into the modules a GPU runs (tinygemm's int4 for the 4-bit types,
        bfloat16 for the rest): on CUDA. (Tests build them on the CPU too, whose tinygemm kernel
        computes the same numbers.)"""
        return self._device.type == "cuda"

    @property
    def vocab_limit(self) -> int:
        return self._vocab_limit

    @vocab_limit.setter
    def vocab_limit(self, limit: int) -> None:
        self._vocab_limit = limit
        head = self.model.get_output_embeddings()
        if hasattr(head, "limit"):  # a screened head must not pick a row past it (ScreenedHead)
            head.limit = limit

    def reset(self) -> None:
        if self._lean is not None:
            self._reset_lean()
            return
        from transformers.cache_utils import DynamicCache

        from app.engine.backends.kv_cache_torch import StepCache, block_grown_cache
        from app.engine.backends.layer_replay_torch import recurrent_mixers
        from app.engine.backends.torch_cache import TorchCache

        if isinstance(getattr(self, "cache", None), TorchCache):
            self.cache.drop_recording()
        store = block_grown_cache(self.model.config, StepCache if self.compiled else DynamicCache)
        if self._mixers is None:
            self._mixers = recurrent_mixers(self.model, store) or {}
        # compiled layers trace the mixers: a hook put on and taken off at every round would
        # recompile them, so compiled models replay the whole model
        self.cache = TorchCache(store, None if self.compiled else self._mixers, self._state_replay)
        self.held = ()

    def _reset_lean(self) -> None:
        """An empty KV buffer: grown as needed on the CPU; on CUDA fixed at the planned context
        (allocated at the first pass, once the runner has set the context) and kept across resets,
        since the captured graphs hold its address."""
        self.held = ()
        if self._graphs is not None:
            self._graphs.kv.trim(0)
            self.cache = self._graphs.kv
            return
        self.cache = self._lean.new_cache(fixed=self._captures() or self._graph_mode == "static")

    def _captures(self) -> bool:
        """Whether the lean step's passes replay as captured CUDA graphs."""
        return (self._lean is not None and self._device.type == "cuda" and self._graph_mode == "auto"
                and not self.graph_note)

    def _graphed(self, n: int) -> GraphedStep | None:
        """The graphs (or their static shapes) for a pass of n tokens at the cache's length, where
        one fits; None: the pass runs eagerly at its own shape."""
        if self.graph_note or not (self._captures() or self._graph_mode == "static"):
            return None
        if self._graphs is None:
            self.cache.reserve(1, planned=self._planned())
            try:
                self._graphs = GraphedStep(self._lean, self.cache, capture=self._captures())
            except Exception as exc:  # a CUDA build without graph support: eager, saying why
                self._without_graphs(f"no CUDA graphs ({type(exc).__name__}: {exc})")
                return None
        return self._graphs if self._graphs.kv is self.cache and self._graphs.fits(n, self.cache.length) else None

    def _planned(self) -> int:
        """Positions a fixed KV buffer is allocated for: the context, and room for a padded pass."""
        return self.context_length + MAX_WIDTH

    def _without_graphs(self, reason: str) -> None:
        """Passes run eagerly from here on; the precision words say why."""
        log.warning("decoding without CUDA graphs: %s", reason)
        self.graph_note, self._graphs = reason, None
        self.dtype = self.precision = self._with_step(self._base_precision)

    @torch.inference_mode()  # the buffers are inference tensors (allocated inside a pass)
    def park(self) -> object:
        if isinstance(self.cache, StaticKV) and self.cache.fixed:
            return self.cache.parked(), self.held  # the live buffer stays where the graphs read it
        return super().park()

    def cache_bytes(self) -> int:
        if isinstance(self.cache, StaticKV) and self.cache.fixed:  # what park() would hold
            return self.cache.nbytes() * self.cache.length // max(1, self.cache.capacity)
        return super().cache_bytes()

    @torch.inference_mode()
    def restore(self, state: object) -> None:
        cache, held = state
        if isinstance(cache, StaticKV) and isinstance(self.cache, StaticKV) and self.cache.fixed:
            self.cache.load(cache)
            self.held = held
            return
        super().restore(state)

    @property
    def state_replay(self) -> str:
        """How rewinds rebuild recurrent state (torch_cache.STATE_REPLAYS): "layers", the recurrent
        mixers alone on their recorded inputs, or "model", the kept tokens through the whole model."""
        return self._state_replay

    @state_replay.setter
    def state_replay(self, mode: str) -> None:
        self._state_replay = check_choice("state replay", mode, STATE_REPLAYS)
        if self.cache is not None and not isinstance(self.cache, StaticKV):  # (the lean step's holds no state)
            from app.engine.backends.torch_cache import TorchCache

            if isinstance(self.cache, TorchCache):
                self.cache.state_replay = mode

    def seed(self, seed: int | None) -> None:
        self._generator.manual_seed(entropy_seed() if seed is None else seed)

    def capture_hidden(self, on: bool, layers: tuple[int, ...] = ()) -> str:
        for hook in self._hidden_hooks:
            hook.remove()
        self._hidden_hooks, self._hidden, self._layer_rows = [], None, {}
        layers = self._layers_asked = tuple(layers) if on else ()
        if on and self._lean is not None and self._lean.aux != layers:
            why = check_layers(layers, len(self._lean.layers))
            if why:
                return why
            self._lean.aux = layers  # (kept when capture goes off: the next answer's graphs still fit)
            # captured passes hand over what they were captured with: capture again, over the same
            # KV buffer (self.cache is the graphs' fixed one)
            self._graphs = None
        self._want_hidden = on and self._lean is not None  # the lean pass hands them back itself
        if not on or self._want_hidden:
            return ""
        inner = getattr(self.model, "model", None)
        # a multimodal wrapper (Gemma 4's published checkpoints) keeps the text model in language_model
        inner = inner if getattr(inner, "norm", None) is not None else getattr(inner, "language_model", None)
        norm = getattr(inner, "norm", None)
        if not isinstance(norm, torch.nn.Module):
            return f"{self.model_type} has no final norm to read its hidden states from"
        if not layers:
            def keep(module, inputs, output):
                self._hidden = output

            self._hidden_hooks.append(norm.register_forward_hook(keep))
            return ""
        blocks = getattr(inner, "layers", None)
        if not isinstance(blocks, torch.nn.ModuleList):
            return f"{self.model_type} has no decoder layer list to read inner states from"
        why = check_layers(layers, len(blocks))
        if why:
            return why
        for index in layers:  # a pre-hook on the module the state enters (the final norm for the last)
            module = blocks[index] if index < len(blocks) else norm
            self._hidden_hooks.append(module.register_forward_pre_hook(self._keeper(index), with_kwargs=True))
        return ""

    def _keeper(self, index: int):
        def keep(module, args, kwargs):
            self._layer_rows[index] = args[0] if args else kwargs.get("hidden_states")
        return keep

    def last_hidden(self) -> torch.Tensor | None:
        if self._layer_rows:  # the asked layers' states side by side, in the order asked
            return torch.cat([self._layer_rows[i][0] for i in self._layers_asked], -1)
        return None if self._hidden is None else self._hidden[0]

    def join_hidden(self, parts: list) -> torch.Tensor:
        return torch.cat(parts)

    def _forward(self, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
        """Append input_ids (1, n) to the cache; logits of the last `keep` positions (keep, V')."""
        if self._lean is not None:
            try:
                return self._lean_forward(input_ids, keep)
            except Exception as exc:
                if not self._lean.glue.fused:
                    raise
                self._unfuse(exc)  # whatever failed in the fused glue, the eager glue runs the pass
                return self._lean_forward(input_ids, keep)
        out = self.model(input_ids=input_ids, cache=self.cache.store, use_cache=True,
                         logits_to_keep=keep)
        self.cache.appended(input_ids.shape[1])
        return out.logits[0, :, : self.vocab_limit].float()

    def _lean_forward(self, input_ids: torch.Tensor, keep: int) -> torch.Tensor:
        """The lean step's pass: replayed as a graph where one fits, else eagerly."""
        n = input_ids.shape[1]
        graphs = self._graphed(n)
        captured = len(graphs.graphs) if graphs is not None else 0
        try:
            logits, hidden = graphs.forward(input_ids, keep) if graphs is not None else (None, None)
        except CaptureError as exc:  # eager from here on, saying why (the KV buffer stays as it is)
            if self._lean.glue.fused:
                raise  # first the graphs again with the eager glue (_forward)
            self._without_graphs(f"no CUDA graphs: {exc}")
            graphs = None
        if graphs is None or len(graphs.graphs) != captured:
            self.one_time_work += graphs is not None or captured > 0  # a capture, or a failed one
        if graphs is None:
            if isinstance(self.cache, StaticKV) and self.cache.fixed:
                self.cache.reserve(self.cache.length + n, planned=self._planned())
            logits, hidden = self._lean.forward(input_ids, self.cache, keep, self._want_hidden)
        self.cache.appended(n)
        if self._want_hidden:
            self._hidden = hidden[None]
        return logits[:, : self.vocab_limit].float()

    def _ids(self, ids: Sequence[int]) -> torch.Tensor:
        return self._host_ids(ids)  # (1, n), without a synchronisation on CUDA

    @torch.inference_mode()
    def forward_last(self, ids: Sequence[int]) -> torch.Tensor:
        """Logits of the last position after appending `ids`. (V,) float32, on the device."""
        return self._forward(self._ids(ids), 1)[-1]

    @torch.inference_mode()
    def top2(self, ids: Sequence[int]) -> tuple[float, float]:
        self.reset()
        first, second = torch.topk(self.forward_last(ids), 2).values.tolist()
        self.reset()
        return first, second

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int]) -> None:
        if ids:
            self._forward(self._ids(ids), 1)

    @torch.inference_mode()
    def next_token(self, ids: Sequence[int], params: SamplingParams) -> int:
        logits = self.forward_last(ids)
        if params.greedy:
            return int(torch.argmax(logits))
        return int(torch.multinomial(probs_from_logits(logits, params), 1, generator=self._generator))

    def tree_note(self) -> str:
        from app.engine.backends.static_kv_torch import StaticKV

        if self._lean is None:
            from app.engine.backends.tree_torch import transformers_tree_note

            return transformers_tree_note(self)
        if self._device.type != "cpu":
            return "trees of drafts are verified on the CPU only so far (not in CUDA graphs)"
        if not isinstance(self.cache, StaticKV):
            return "trees of drafts are verified on the lean step's own KV cache, which this model does not use"
        if self._lean.glue.fused:
            return "trees of drafts are verified with the eager glue, not torch.compile's fused one"
        return ""

    def verify_tree(self, ids: Sequence[int], tree, params: SamplingParams):
        """The target's verdict on a token tree, its cache keeping `ids` and the accepted path
        (tree_torch.py)."""
        from app.engine.backends.tree_torch import verify_tree

        return verify_tree(self, ids, tree, params)

    @torch.inference_mode()
    def draft(self, ids: Sequence[int], k: int, params: SamplingParams,
              should_stop: Callable[[], bool] | None = None, runner_up: bool = False):
        """k drafts after `ids`: (ids, p, probs, ids on the device), and with `runner_up` each
        step's most likely other token too (a tree's alternatives)."""
        x = self._ids(ids)
        steps = DraftSteps(params, self._generator, runner_up)
        for i in range(k):
            if should_stop is not None and should_stop():  # Stop is honoured between draft steps
                break
            token = steps.pick(self._forward(x, 1)[-1])
            if i < k - 1:
                x = token.view(1, 1)  # stays on the device: no sync inside the loop
        return steps.drafted()

    @torch.inference_mode()
    def verify(self, ids: Sequence[int], proposal, params: SamplingParams) -> Verdict:
        k = len(proposal.ids)
        # (k+1, V): position i predicts draft i+1 (ids may start with tokens the cache lacked)
        logits = self._forward(self._ids(ids), k + 1)
        drafts = proposal.ids_array
        if drafts is None:
            drafts = self._ids(proposal.ids)
        drafts = drafts.view(k)
        if params.greedy:
            n, token, q = greedy_verdict(logits, drafts)
        else:
            q_all = probs_from_logits(logits, params)  # (k+1, V) target q
            p_all = proposal.probs  # (k, V) draft p, after the same transform
            if p_all is None:  # a deterministic drafter: p is one-hot at its token
                p_all = torch.zeros_like(q_all[:k]).scatter_(1, drafts.view(k, 1), 1.0)
            r = torch.rand(k, generator=self._generator, device=self._device)
            n, row, q = rejection_verdict(q_all, p_all, drafts, r)
            token = torch.multinomial(row, 1, generator=self._generator)[0]
        out = torch.cat([n.view(1).float(), token.view(1).float(), q.float()]).tolist()
        return Verdict(accepted=int(out[0]), token=int(out[1]), q=tuple(out[2:]))


def own_layers(model: torch.nn.Module) -> bool:
    """Whether `model` is built from Tandem's own Llama-family modules (no transformers forward)."""
    from app.models.gguf_llama_torch import CausalLM

    return isinstance(model, CausalLM)


def _on_codes(model: torch.nn.Module) -> bool:
    """Whether a model has GGUF weights on Tandem's CPU kernel (its layers may run as one call)."""
    from app.models.gguf_layers_torch import GGUFCodesLinear

    return any(isinstance(m, GGUFCodesLinear) for m in model.modules())
