"""What a drafter head on PyTorch keeps beside its layers (an MTP layer, an EAGLE-3 head, a DFlash
drafter): its own KV cache, transformers' DynamicCache over the head's config, cut back to a
length after each round, and its own random stream (the target's would be shared with it, and
rejection sampling needs the two independent).

Where the target's graphs are on, on a GPU (or run their static shapes, graphs mode "static"), a
head keeps its cache in a fixed buffer instead and runs its passes through `GraphedHead` (EAGLE-3,
MTP: `_graph_step`) or `GraphedBlock` (DFlash) (head_graphs_torch.py); `_static_passes` in its
__init__ sets that up."""

from __future__ import annotations

import logging

import torch
from transformers.cache_utils import DynamicCache

from app.engine.backends.base import entropy_seed
from app.engine.backends.cuda_graphs_torch import CaptureError
from app.engine.backends.head_graphs_torch import GraphedBlock, GraphedHead, HeadKV, head_graph_mode

log = logging.getLogger(__name__)


class CachedHead:
    """A mixin: the class sets `config` (its layers' transformers config) and calls
    `_own_stream(device)` in its __init__. A head with static passes defines `_run` (GraphedHead's
    pass), `_tail_rule()` and `_tail(row)` (its logits, or None where they cannot run in a graph)."""

    config = None
    cache: DynamicCache | HeadKV
    graph_mode = ""  # head_graph_mode: "capture", "static", or "" (DynamicCache, eagerly)
    graph_note = ""  # why the head's passes run eagerly where the target's are captured
    static_kv: HeadKV | None = None
    _graphed: GraphedHead | GraphedBlock | None = None
    _chains = True  # whole greedy drafts as one replay (False once capturing one failed)

    def _own_stream(self, device) -> None:
        self._generator = torch.Generator(device=device)
        self._generator.manual_seed(entropy_seed())

    def _static_passes(self, target, attention: torch.nn.Module, layers: int, dtype: torch.dtype, device) -> None:
        """Fixed-buffer passes where the target's mode asks for them (head_graph_mode): a HeadKV of
        `layers` layers shaped like `attention`'s keys and values, allocated at the first pass."""
        self.graph_mode = head_graph_mode(target)
        if not self.graph_mode:
            return
        self._planned = target._planned  # the target's planned context and a padded pass's room
        self._in_dtype = dtype
        self.static_kv = HeadKV(layers, attention.config.num_key_value_heads, attention.head_dim, dtype, device)

    def eager(self) -> None:
        """transformers' DynamicCache and eager passes from here on, whatever the target runs
        (a benchmark's baseline; `--graphs off` does this for a whole pair). Starts an empty cache."""
        self.graph_mode, self.static_kv, self._graphed = "", None, None
        self.reset()

    def reset(self) -> None:
        if self.static_kv is not None:
            self.static_kv.length = 0  # the buffer stays where the graphs read it
            self.cache = self.static_kv
            return
        self.cache = DynamicCache(config=self.config)

    def _graph_step(self, ids: torch.Tensor, hidden: torch.Tensor):
        """A pass over the fixed buffer: (the output at the last token (1, 1, H), its logits (V,) or None)."""
        if self._graphed is None:
            self._graphed = GraphedHead(self._run, self.static_kv, hidden.shape[-1], self._in_dtype, self._planned,
                                        capture=self.graph_mode == "capture")
            self._rule = None
        rule = self._tail_rule()
        if rule != self._rule:  # what the logits depend on changed (the target's vocab_limit)
            self._rule, self._graphed.tail = rule, (self._tail if rule is not None else None)
            self._graphed.drop()
        return self._without_graphs_if_need_be(lambda: self._graphed.forward(ids, hidden))

    def _without_graphs_if_need_be(self, run):
        """run() over the head's graphs; where a capture fails, the same pass at the same shapes,
        eagerly, from here on, saying why (graph_note: the answer's notice, the log)."""
        try:
            return run()
        except CaptureError as exc:
            log.warning("a draft head runs without CUDA graphs: %s", exc)
            self.graph_note = f"no CUDA graphs: {exc}"
            self.graph_mode, self._graphed.capture = "static", False
            self._graphed.drop()
            return run()

    def _greedy_chain(self, last: torch.Tensor, logits: torch.Tensor, k: int, params, state,
                      should_stop=None):
        """The whole greedy draft of k as one replay (GraphedHead.greedy_chain), as DraftSteps.result
        gives it; None where the draft goes step by step (sampling, eager passes, a draft of one,
        logits outside the pass). Stop is honoured before the chain, not inside it (one replay)."""
        graphed = self._graphed
        if not (params.greedy and k > 1 and self.graph_mode and graphed is not None and graphed.tail is not None
                and self._chains):
            return None
        if should_stop is not None and should_stop():
            return (), (), None, None
        try:
            chained = graphed.greedy_chain(last, logits, k, state)
        except CaptureError as exc:  # step by step from here on (each step still replays), saying why
            log.warning("a draft head drafts step by step: %s", exc)
            self.graph_note, self._chains = f"no whole-draft graphs: {exc}", False
            return None
        if chained is None:
            return None
        tokens, probs = chained
        both = torch.cat([tokens.float(), probs.float()]).tolist()  # one transfer, as DraftSteps.result
        return tuple(int(t) for t in both[:k]), tuple(both[k:]), None, tokens

    def _tail_rule(self):
        return None

    @property
    def one_time_work(self) -> int:
        """Graphs captured (or tried) so far: a round that captured is timed with that work in it
        (speculative.one_time_work leaves its timings out, as for the target's captures)."""
        return self._graphed.captures if self._graphed is not None else 0

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def trim(self, length: int) -> None:
        if self.length > length:
            self.cache.crop(length - self.length)  # transformers 5: a negative count removes that many

    def concat(self, rows, more):
        return torch.cat([rows, more])

    def seed(self, seed: int | None) -> None:
        self._generator.manual_seed(entropy_seed() if seed is None else seed)
