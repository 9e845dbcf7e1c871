"""Compiled decoding on PyTorch: each decoder layer through torch.compile, the KV cache outside.

Regional compilation (PyTorch's recipe for models that repeat one block): every decoder layer
runs the same code, so one compiled graph, with dynamic shapes, serves all of them and every
width the engine asks for (the decode step, the verify pass's few widths, a prefill), instead of
one graph per width and cache length as a whole-model compile with a static cache needs. The
cache update stays eager (`StepCache.update` is excluded from the graph): it writes in place into
the block-grown buffers (kv_cache_torch.py) and decides growth from Python lengths, which a graph
would otherwise re-specialise on at every step. Compiling fuses what sits between the matmuls
(norms, rotary embedding, activations, residual adds) into a few kernels per layer.

Whether it pays is measured, not assumed (docs/compiled-decoding.md): on this project's 2-core
CPU the compiled demo step was slower than eager, and no GPU has measured it yet, so "auto" runs
eagerly everywhere for now and "on" compiles where asked (on CUDA the same fusion removes kernel
launches, which is where it is expected to pay). A compile that fails or disagrees with eager at load falls back
to eager, and the reason is logged and shown.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable

import torch

from app.engine.backends.base import COMPILE_CHOICES, check_choice

log = logging.getLogger(__name__)

# Compiled and eager logits at load may differ by fused rounding (measured on the demo's GGUF
# target: 0.29 at one token, 0.41 at four, for logits spanning about 40); a miscompiled graph is
# off by the logits' own size. The screen: the largest difference within this share of the eager
# logits' span. (It also bounds which choices may differ: flipping an argmax whose top two are g
# apart moves some logit by at least g / 2.) Exactness itself is the engine's tests' business.
LOAD_TOLERANCE = 0.05


def decide(mode: str, device: torch.device) -> tuple[bool, str]:
    """(compile?, why not) for `mode` ("auto", "on", "off") on `device`."""
    check_choice("compile mode", mode, COMPILE_CHOICES)
    if mode == "off":
        return False, "compiling is off"
    if device.type == "cuda" and importlib.util.find_spec("triton") is None:
        # PyTorch's Windows wheels ship no Triton, which compiled CUDA kernels need
        return False, "this PyTorch has no Triton, which compiling for CUDA needs"
    if mode == "on":
        return True, ""
    if device.type == "cpu":
        return False, "compiling measured slower on the CPU"  # docs/compiled-decoding.md
    # "auto" compiles only where it measured faster; no GPU has measured it yet
    return False, f"compiling not yet measured faster on {device.type}; --compile on tries it"


def decoder_layers(model: torch.nn.Module):
    """The model's repeated decoder blocks (transformers' `model.layers`), or None."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) and len(layers) else None


def use_cache_dir() -> None:
    """Inductor keeps compiled kernels on disk; keep them in Tandem's cache, where a later load
    finds them, rather than a temporary folder. (Inductor writes its default into the environment
    when first asked, so the default is replaced and a folder the user chose is kept.)"""
    from torch._inductor.runtime.runtime_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        from app.paths import cache_dir

        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "torch-compile")


def compile_layers(model: torch.nn.Module) -> None:
    from app.models.gguf_layers_torch import step_around_compile

    layers = decoder_layers(model)
    use_cache_dir()
    step_around_compile()
    import torch._dynamo.config as dynamo_config

    # each layer's index is an int attribute read by the (eager) cache update: unspecialised, it
    # does not make one graph per layer
    dynamo_config.allow_unspec_int_on_nn_module = True
    dynamo_config.cache_size_limit = max(dynamo_config.cache_size_limit, 16)
    for layer in layers:
        layer.compile(dynamic=True)


def uncompile_layers(model: torch.nn.Module) -> None:
    for layer in decoder_layers(model) or ():
        layer._compiled_call_impl = None  # what nn.Module.compile() set: back to the eager forward


def agree(compiled: torch.Tensor, eager: torch.Tensor) -> str:
    """"" where compiled logits pass the load screen against eager ones (n, V), else why not."""
    diff = float((compiled - eager).abs().max())
    span = float(eager.max() - eager.min())
    if not diff <= LOAD_TOLERANCE * span:  # also catches NaN
        return f"compiled logits differ from eager by {diff:.3g} (logits span {span:.3g})"
    return ""


def warm_up(forward: Callable[[list[int], int], torch.Tensor], reset: Callable[[], None],
            ids: list[int]) -> list[torch.Tensor]:
    """Logits of the three kinds of pass decoding makes, so that a compiled model builds its
    graphs here, at load, and not in the first answer: a prefill into an empty cache (causal, no
    mask), a one-token step, and a verify pass of several tokens after the cache (a mask). Their
    lengths differ from each other, so no graph is specialised on two sizes being equal."""
    reset()
    out = [forward(ids[:5], 5), forward(ids[5:6], 1), forward(ids[6:10], 4)]
    reset()
    return out
