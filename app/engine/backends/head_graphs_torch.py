"""A drafter head's passes (an EAGLE-3 head, an MTP layer, a DFlash drafter) over fixed buffers,
replayed as CUDA graphs.

A head is one or two decoder layers and a projection: its weights read in a fraction of a
millisecond on a GPU, but transformers' modules run eagerly launch 50-100 kernels a step from
Python, so an eager head costs what its launches cost, k times a round. The target's passes
already replay as graphs (cuda_graphs_torch.py); this does the same for the heads:

- `HeadKV` is the head's KV cache in one fixed buffer, (layers, 2, kv_heads, capacity, head_dim),
  behind the two calls transformers' attention modules make of a cache (`update` and
  `get_seq_length`) and the `crop` the head's rounds make. A pass writes its positions in place
  (`index_copy_` at a positions tensor) and attends over the first `attended` positions, a length
  bucket as the target's graphs use, never the whole planned context;
- `GraphedHead` runs a head's pass at the target's width buckets (1 for each chained step, up to
  17 for the catch-up pass that reads the tokens the target committed), padded, under a mask built
  from the positions inside the pass; the head's output at the last real token and, where the
  head's draft vocabulary is fixed, its logits (`tail`) come out of the same replay;
- `GraphedBlock` does the same for a DFlash drafter's block: its new context padded to a width
  bucket, the padding hidden by a mask built inside the pass;
- one graph per (width, length), captured lazily into one pool; a pass wider than the widest
  bucket runs eagerly through the same code at its own shape.

`capture=False` runs the same static-shape code eagerly (what the CPU tests check against the
heads' DynamicCache path). The Gemma 4 assistant reads the target's DynamicCache (its target has
sliding-window layers, which run transformers' forward eagerly): it stays eager.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from app.engine.backends.cuda_graphs_torch import WIDTHS, CaptureError, capture, length_bucket, width_bucket

# run(ids (1, w), hidden (1, w, H_in), positions (1, w), mask (1, 1, w, L) bool or None) -> (1, w, H)
HeadPass = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]


def head_graph_mode(target) -> str:
    """How a head drafting for `target` runs its passes: "capture" (CUDA graphs: on a GPU, with the
    target's graphs mode "auto", also where the target's own passes cannot be captured, as a hybrid
    target's MTP layer's), "static" (the graphs' static shapes eagerly: the target's graphs mode
    "static", what the CPU tests run) or "" (transformers' DynamicCache, eagerly: graphs off)."""
    mode = getattr(target, "graphs", "off")
    device = getattr(target, "_device", torch.device("cpu"))
    if mode == "static":
        return "static"
    return "capture" if mode == "auto" and device.type == "cuda" else ""


def _captured_or_why(run, pool, what: str):
    """capture(run, pool), or a CaptureError that says what failed and why (the head then runs
    eagerly at the same shapes)."""
    try:
        return capture(run, pool)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else "no message"
        raise CaptureError(f"capturing {what} failed ({type(exc).__name__}: {first})") from exc


class HeadKV:
    """A head's KV cache in one fixed buffer (module docstring). `positions` and `attended` are set
    by the pass that runs (GraphedHead); `length` counts the positions committed to it."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device):
        self.shape = (layers, 2, kv_heads, head_dim)
        self.dtype, self.device = dtype, device
        self.store: torch.Tensor | None = None
        self.length = 0
        self.positions: torch.Tensor | None = None
        self.attended = 0

    @property
    def capacity(self) -> int:
        return 0 if self.store is None else self.store.shape[3]

    def reserve(self, end: int) -> bool:
        """Room for positions up to `end`; True where the buffer moved (graphs on the old one are stale)."""
        if end <= self.capacity:
            return False
        layers, two, kv_heads, head_dim = self.shape
        # zeros: a bucketed pass attends past the filled part under a mask, and a masked NaN from
        # uninitialised memory would still poison the softmax
        store = torch.zeros(layers, two, kv_heads, end, head_dim, dtype=self.dtype, device=self.device)
        if self.store is not None and self.length:
            store[:, :, :, :self.length] = self.store[:, :, :, :self.length]
        self.store = store
        return True

    # transformers' cache calls (its attention modules, DynamicCache's crop semantics)
    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        if max_length < 0:  # transformers 5: a negative count removes that many
            max_length = self.length + max_length
        self.length = max(0, min(self.length, max_length))

    def update(self, keys: torch.Tensor, values: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Keys and values (1, kv_heads, w, head_dim) written at `positions`; the first `attended`
        positions of the layer's buffer back, (1, kv_heads, attended, head_dim) each."""
        held_keys, held_values = self.store[layer_idx, 0], self.store[layer_idx, 1]
        held_keys.index_copy_(1, self.positions, keys[0].to(self.dtype))
        held_values.index_copy_(1, self.positions, values[0].to(self.dtype))
        return held_keys[None, :, :self.attended], held_values[None, :, :self.attended]


class _Graphs:
    """Passes by key, each captured once as a CUDA graph and replayed after (`capture`), or run
    eagerly at the same static shapes. `graphs[key]` is (graph or None, the outputs the replays
    refill); outputs are the caller's to copy before the next pass."""

    def __init__(self, capture: bool):
        self.capture = capture
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.replays = 0  # passes that ran as a graph (or its static-shape stand-in)
        self.captures = 0  # graphs captured, or tried: one-time work a round's timing must not price

    def drop(self) -> None:
        """Forget the graphs (what they compute changed): each is captured again when next needed."""
        self.graphs.clear()

    def _outputs(self, key: tuple[int, int], run: Callable, what: str):
        """What `run()` returns: a replay of its graph, its capture the first time, or a run."""
        held = self.graphs.get(key)
        if held is not None and held[0] is not None:
            held[0].replay()
            return held[1]
        if held is None and self.capture:
            self.captures += 1
            self.graphs[key] = _captured_or_why(run, self.pool, what)
            return self.graphs[key][1]
        self.graphs[key] = (None, None)  # (which shapes ran, for the tests)
        return run()


class GraphedHead(_Graphs):
    """A head's pass at bucketed static shapes over a HeadKV: captured as CUDA graphs (`capture`) or
    run eagerly at those shapes. `tail(row (1, H)) -> logits (V,)` runs inside the pass where given
    (a head whose logits depend on nothing but its output); `planned()` is the positions the buffer
    is allocated for (the target's planned context and a padded pass's room)."""

    def __init__(self, run: HeadPass, kv: HeadKV, in_width: int, in_dtype: torch.dtype,
                 planned: Callable[[], int], capture: bool, tail: Callable[[torch.Tensor], torch.Tensor] | None = None):
        super().__init__(capture)
        self.run, self.kv, self.planned, self.tail = run, kv, planned, tail
        device = kv.device
        widest = WIDTHS[-1]
        self.ids = torch.zeros(1, widest, dtype=torch.long, device=device)
        self.hidden = torch.zeros(1, widest, in_width, dtype=in_dtype, device=device)
        self.positions = {w: torch.zeros(1, w, dtype=torch.long, device=device) for w in WIDTHS}
        self._count = {w: torch.arange(w, device=device).view(1, w) for w in WIDTHS}
        self.last = torch.zeros(1, dtype=torch.long, device=device)  # the last real token's row
        self._chain_in: tuple | None = None  # greedy_chain's inputs: logits, last output, start

    def forward(self, ids: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens (1, n) beside states (1, n, H_in) appended at kv.length -> the output at the last
        token (1, 1, H) and, with a tail, its logits (V,): copies no later pass overwrites."""
        n, start, kv = ids.shape[1], self.kv.length, self.kv
        width = width_bucket(n)
        if kv.reserve(max(start + (width or n), self.planned())):
            self.graphs.clear()  # the buffer moved (a first pass, or a context past the planned one)
        if width is None:  # wider than any bucket (a long first catch-up): its own shape, eagerly
            kv.positions = torch.arange(start, start + n, device=kv.device)
            kv.attended = start + n
            mask = (torch.arange(start + n, device=kv.device)[None, :] <= kv.positions[:, None])[None, None]
            out = self.run(ids, hidden, kv.positions.view(1, n), mask)[:, -1:]
            kv.length += n
            return out, (self.tail(out[0]) if self.tail is not None else None)
        length = length_bucket(start + width, kv.capacity)
        self._load_inputs(ids, hidden)
        torch.add(self._count[width], start, out=self.positions[width])
        self.last.fill_(n - 1)
        last, logits = self._outputs((width, length), lambda: self._pass(width, length),
                                     f"a head's pass of width {width}")
        self.replays += 1
        kv.length += n
        return last.clone(), (logits.clone() if logits is not None else None)

    def _load_inputs(self, ids: torch.Tensor, hidden: torch.Tensor) -> None:
        """A pass's tokens (1, n) and states (1, n, H_in) into the buffers the graphs read
        (device-side copies; inside a chain's graph, recorded with it)."""
        n = ids.shape[1]
        self.ids[:, :n].copy_(ids)
        self.hidden[:, :n].copy_(hidden)

    def _pass(self, width: int, length: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        kv = self.kv
        positions = self.positions[width]
        kv.positions, kv.attended = positions[0], length
        mask = (torch.arange(length, device=kv.device)[None, :] <= positions[0][:, None])[None, None]
        out = self.run(self.ids[:, :width], self.hidden[:, :width], positions, mask)
        last = out[0].index_select(0, self.last)  # (1, H): no read of n back to the host
        return last[None], (self.tail(last) if self.tail is not None else None)

    def greedy_chain(self, last: torch.Tensor, logits: torch.Tensor, k: int,
                     state: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A whole greedy draft of k tokens in one replay, after a pass gave (last, logits): the first
        pick from `logits`, each next from a chained step reading the last pick beside state(the
        step's own output). (tokens (k,), their softmax probabilities (k,)) as DraftSteps picks them
        at temperature 0; None where it cannot run (logits outside the pass, no room)."""
        kv = self.kv
        start = kv.length
        if self.tail is None or start + k > kv.capacity:
            return None
        if self._chain_in is None or self._chain_in[0].shape != logits.shape:
            self._chain_in = (torch.empty_like(logits), torch.empty_like(last),
                              torch.zeros(1, dtype=torch.long, device=kv.device))
        chain_logits, chain_last, chain_start = self._chain_in
        chain_logits.copy_(logits)
        chain_last.copy_(last)
        chain_start.fill_(start)
        length = length_bucket(start + k, kv.capacity)
        # key (-k, length): a chain of k, beside the passes' (width, length)
        tokens, probs = self._outputs((-k, length), lambda: self._chain(k, length, state), f"a draft of {k}")
        self.replays += k - 1
        kv.length += k - 1
        return tokens.clone(), probs.clone()

    def _chain(self, k: int, length: int, state) -> tuple[torch.Tensor, torch.Tensor]:
        logits, last = self._chain_in[0], self._chain_in[1]
        tokens, probs = [], []
        for i in range(k):
            token = torch.argmax(logits)  # DraftSteps.pick's greedy rule, op for op
            tokens.append(token)
            probs.append(torch.softmax(logits, -1).gather(0, token.view(1))[0])
            if i == k - 1:
                break
            self._load_inputs(token.view(1, 1), state(last).view(1, 1, -1))
            torch.add(self._chain_in[2], i, out=self.positions[1][0])
            self.last.zero_()
            last, logits = self._pass(1, length)
        return torch.stack(tokens), torch.stack(probs)


class GraphedBlock(_Graphs):
    """A DFlash drafter's block pass at bucketed static shapes over a HeadKV, captured as CUDA graphs
    (`capture`) or run eagerly at those shapes. A pass reads c new context rows (c padded to a width
    bucket cw) and drafts a block of b positions after them: the context's keys and values are written
    after what the buffer holds (at kv.length .. + cw - 1), the block's after them, and each block
    query attends to the real context and the block, nothing between (DFlash's rule: no causal
    mask). RoPE reads the true positions: the context's from start, the block's from start + c.
    After the pass the cache keeps the real context; what lies past it is overwritten later.

    `run(ids (1, b), rows (1, cw, H_in), rope positions (1, cw + b), mask (1, 1, b, L)) -> logits`
    computes the block's logits (the same for every pass: the target's head on the drafted rows)."""

    def __init__(self, run: Callable, kv: HeadKV, ids: list[int], in_width: int, in_dtype: torch.dtype,
                 planned: Callable[[], int], capture: bool):
        super().__init__(capture)
        self.run, self.kv, self.planned = run, kv, planned
        device, self.b = kv.device, len(ids)
        self.ids = torch.tensor([ids], dtype=torch.long, device=device)  # the anchor goes first, per pass
        self.rows = torch.zeros(1, WIDTHS[-1], in_width, dtype=in_dtype, device=device)
        self.rope = {w: torch.zeros(1, w + self.b, dtype=torch.long, device=device) for w in WIDTHS}
        self.writes = {w: torch.zeros(w + self.b, dtype=torch.long, device=device) for w in WIDTHS}
        self._count = {w: torch.arange(w + self.b, device=device) for w in WIDTHS}
        self.real = torch.zeros(1, dtype=torch.long, device=device)  # the real context's end in the buffer

    def forward(self, anchor: int, rows: torch.Tensor | None, start: int) -> torch.Tensor:
        """Context rows (c, H_in) of positions start .. start + c - 1 (None: none new) read into
        the cache after what it holds, then the block after anchor: its logits, a copy. The
        cache's entries count from where the drafter started reading (DFlashDrafter's base, not
        always position 0): RoPE takes the true positions, the buffer its own."""
        kv, b = self.kv, self.b
        at = kv.length  # where the new context goes in the buffer
        c = 0 if rows is None else rows.shape[-2]
        width = width_bucket(max(c, 1))
        if kv.reserve(max(at + (width or c) + b, self.planned() + b)):
            self.graphs.clear()
        self.ids[0, 0].fill_(anchor)
        if width is None:  # more new context than any bucket (the first block of a chat): its own shape
            kv.positions = torch.arange(at, at + c + b, device=kv.device)
            kv.attended = at + c + b
            rope = torch.arange(start, start + c + b, device=kv.device).view(1, -1)
            logits = self.run(self.ids, rows.view(1, c, -1), rope, None)
            kv.length = at + c
            return logits
        length = length_bucket(at + width + b, kv.capacity)
        if c:
            self.rows[:, :c].copy_(rows.view(1, c, -1))
        # rope: the context from start (padding continuing), the block from start + c
        torch.add(self._count[width], start, out=self.rope[width][0])
        self.rope[width][0, width:].sub_(width - c)
        torch.add(self._count[width], at, out=self.writes[width])  # written side by side
        self.real.fill_(at + c)
        logits = self._outputs((width, length), lambda: self._pass(width, length), f"a block pass of width {width}")
        self.replays += 1
        kv.length = at + c
        return logits.clone()

    def _pass(self, width: int, length: int) -> torch.Tensor:
        kv, b = self.kv, self.b
        kv.positions, kv.attended = self.writes[width], length
        keys = torch.arange(length, device=kv.device)
        first = self.writes[width][width:width + 1]  # where the block's keys are written
        mask = (keys < self.real) | ((keys >= first) & (keys < first + b))
        return self.run(self.ids, self.rows[:, :width], self.rope[width], mask.view(1, 1, 1, length))
