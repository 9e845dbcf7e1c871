"""Layer replay on PyTorch: a rollback's recurrent state rebuilt by the recurrent layers alone.

After a rejected draft the recurrent layers (Gated DeltaNet, Mamba) go back to the checkpoint
and must advance over the kept positions again. Passing the kept tokens through the whole model
(the engine's replay) recomputes every layer; but the model is causal, so the input each
recurrent mixer received at a kept position in the verify pass does not depend on the rejected
positions after it. Recorded during the pass (a forward pre-hook on each mixer, installed only
between a checkpoint and its rewind), those inputs are all a mixer needs: called alone on rows
[0:n] with the cache, it advances its conv and recurrent states over exactly the n kept positions
(issue 18). Attention layers need nothing: the pass wrote their keys and values, and the rewind
trims them. The states equal the whole-model replay's up to float rounding (the inputs come from
a pass of k + 1 positions instead of n).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, LinearAttentionCacheLayerMixin


def recurrent_mixers(model: torch.nn.Module, store: DynamicCache) -> dict[int, torch.nn.Module] | None:
    """The module that reads and writes each recurrent cache layer, by layer index: the innermost
    module whose `layer_idx` is that layer's (transformers' mixers carry it; a decoder block that
    also carries it holds the mixer). None when some recurrent layer has no such module or more
    than one (a layer that is both attention and recurrent): then only the whole model can replay."""
    wanted = {i for i, layer in enumerate(store.layers) if isinstance(layer, LinearAttentionCacheLayerMixin)}
    found: dict[int, list[torch.nn.Module]] = {i: [] for i in wanted}
    for module in model.modules():
        index = getattr(module, "layer_idx", None)
        if index in wanted and not any(getattr(child, "layer_idx", None) == index
                                       for child in module.modules() if child is not module):
            found[index].append(module)
    if not wanted or any(len(modules) != 1 for modules in found.values()):
        return None
    return {i: modules[0] for i, modules in sorted(found.items())}


class MixerInputs:
    """Each recurrent mixer's inputs over the passes between a checkpoint and its rewind."""

    def __init__(self, mixers: dict[int, torch.nn.Module]):
        self.mixers = mixers
        self._hooks: list = []
        # per layer, per pass: (hidden_states (1, t, hidden), passed by position?, other arguments)
        self._calls: dict[int, list[tuple[torch.Tensor, bool, dict]]] = {}

    def start(self) -> None:
        self.stop()
        self._calls = {i: [] for i in self.mixers}
        for index, mixer in self.mixers.items():
            self._hooks.append(mixer.register_forward_pre_hook(self._recorder(self._calls[index]),
                                                               with_kwargs=True))

    def stop(self) -> None:
        """Remove the hooks (plain passes run without them) and let the recorded inputs go."""
        self._unhook()
        self._calls = {}

    def _unhook(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    @staticmethod
    def _recorder(calls: list):
        def record(module, args, kwargs):
            # the block's normed input, a fresh tensor each pass: kept as is, no copy
            if args:
                calls.append((args[0], True, {**kwargs, "_more_positional": args[1:]}))
            else:
                rest = dict(kwargs)
                calls.append((rest.pop("hidden_states", None), False, rest))

        return record

    def _replayable(self, n: int) -> bool:
        """Whether every mixer saw at least n positions, through calls it can repeat: the cache
        and flags as arguments, and no other tensor (a padding mask would have to be cut too)."""
        for calls in self._calls.values():
            for hidden, _, rest in calls:
                if not isinstance(hidden, torch.Tensor) or rest.get("_more_positional"):
                    return False
                if any(isinstance(value, torch.Tensor) for value in rest.values()):
                    return False
            if sum(hidden.shape[1] for hidden, _, _ in calls) < n:
                return False
        return True

    @torch.inference_mode()  # the cache's states are inference tensors
    def replay(self, n: int) -> bool:
        """Run each mixer alone on its first n recorded positions, with the arguments of its last
        recorded call: the same cache, so it writes its states into the layer a whole-model pass
        writes. False (nothing run) when the calls cannot be repeated: the caller then replays
        the whole model."""
        if n == 0:
            return True
        if not self._hooks or not self._replayable(n):
            return False
        self._unhook()  # the mixers' calls here are not inputs to record
        for index, mixer in self.mixers.items():
            calls = self._calls[index]
            rows = torch.cat([hidden for hidden, _, _ in calls], dim=1)[:, :n]  # (1, n, hidden)
            _, positional, rest = calls[-1]
            rest = {name: value for name, value in rest.items() if name != "_more_positional"}
            if positional:
                mixer(rows, **rest)
            else:
                mixer(hidden_states=rows, **rest)
        return True
