"""Decode and verify passes replayed as captured CUDA graphs (`torch.cuda.CUDAGraph`).

A small pass on a GPU is launch-bound: an 8B-shape bf16 pass of transformers' eager forward cost
20-24 ms on an H100 whatever its width, where its weights need 4.9 ms and the same forward replayed
as one graph 9.0 ms (the CUDA issue's figures). So every pass the lean step (lean_step_torch.py)
runs at a width the engine uses is captured once and replayed:

- one graph per (width bucket, length bucket). Widths: WIDTHS, the decode step and the verify
  passes of every draft length adaptive k may choose (up to MAX_DRAFT + 1), padded up to the next
  bucket; padding positions continue the count past the real tokens, so the causal mask hides them
  from every real query and what they write past the cache's length is overwritten later.
- attention reads only the first L positions of the KV buffer, L the smallest power of two from
  MIN_LENGTH that holds the pass (the planned context, 32,768 positions on an 8B model, would add
  ~4 GB of reads to every token);
- inputs reach the graph through fixed buffers: token ids copied device to device (a draft step's
  token never leaves the GPU) or from pinned host memory without a synchronisation
  (`HostIds`), positions written by one kernel from the cache length;
- prefill, and any pass wider than the widest bucket, runs eagerly through the same code.

Graphs are captured lazily, the first time a (width, length) is needed, into one memory pool;
their outputs are copied out before the next replay reuses it. The KV buffer is fixed at the
planned context (static_kv_torch.py), so its address never changes under the graphs.

Measured on an H100 (docs/performance.md): an 8B-shape bf16 pass replays in 7.3 ms against 22 ms
eagerly through transformers (0.64 of its bandwidth bound), widths 2-16 within 1.10x of width 1.
The CPU tests run the same static-shape code eagerly (`StaticShape` with graphs off), and
tests/test_cuda_graphs.py holds the CUDA-marked tests (run with benchmarks/gpu_call.sh).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from app.engine.adaptive import MAX_DRAFT
from app.engine.backends.lean_step_torch import LeanStep, StaticShape
from app.engine.backends.static_kv_torch import StaticKV

WIDTHS = tuple(w for w in (1, 2, 3, 4, 5, 6, 8, 12, 17) if w <= MAX_DRAFT + 1)
MIN_LENGTH = 256


def width_bucket(n: int) -> int | None:
    return next((w for w in WIDTHS if w >= n), None)


def length_bucket(end: int, capacity: int) -> int:
    """The attended length for a pass that ends at `end`: a power of two from MIN_LENGTH, at most
    the buffer's capacity."""
    length = MIN_LENGTH
    while length < end:
        length *= 2
    return min(length, capacity)


class HostIds:
    """Token ids from Python to the device without a synchronisation: written into a pinned host
    buffer, then copied asynchronously. A ring of slots, so a copy still in flight is never
    overwritten (each round synchronises once, on its verdict, long before a slot comes round)."""

    SLOTS = 8

    def __init__(self, device: torch.device, width: int = 64):
        self.device = device
        pinned = device.type == "cuda"
        self._host = torch.empty(self.SLOTS, width, dtype=torch.long, pin_memory=pinned)
        self._slot = 0

    def __call__(self, ids: Sequence[int]) -> torch.Tensor:
        """(1, n) on the device."""
        n = len(ids)
        if self.device.type != "cuda" or n > self._host.shape[1]:
            return torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        row = self._host[self._slot]
        self._slot = (self._slot + 1) % self.SLOTS
        row[:n] = torch.as_tensor(list(ids), dtype=torch.long)
        return row[:n].to(self.device, non_blocking=True).view(1, n)


class CaptureError(RuntimeError):
    """A pass could not be captured (the backend then runs eagerly and says why)."""


def capture(run, pool):
    """(the graph, what `run()` returned inside it): warmed up on a side stream first (PyTorch's
    rule for capture: lazy initialisation and the allocator's first blocks happen outside the
    graph; what the warm-up writes is the same pass), captured into `pool`, then replayed once,
    since the capture itself ran nothing and the caller asked for this pass."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = run()
    graph.replay()
    return graph, outputs


class _Captured:
    def __init__(self, graph, logits: torch.Tensor, hidden: torch.Tensor):
        self.graph, self.logits, self.hidden = graph, logits, hidden


class GraphedStep:
    """The lean step's passes at the bucketed shapes, captured (`capture=True`, CUDA) or run
    eagerly at the same static shapes (`capture=False`: what the CPU tests check)."""

    def __init__(self, lean: LeanStep, kv: StaticKV, capture: bool = True):
        if not kv.fixed:
            raise ValueError("graphs need a KV buffer fixed at the planned context")
        self.lean, self.kv, self.capture = lean, kv, capture
        device = lean.device
        widest = WIDTHS[-1]
        self.ids = torch.zeros(1, widest, dtype=torch.long, device=device)
        self.positions = {w: torch.zeros(w, dtype=torch.long, device=device) for w in WIDTHS}
        self._count = {w: torch.arange(w, device=device) for w in WIDTHS}
        self.graphs: dict[tuple[int, int], _Captured] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.replays = 0  # passes that ran as a graph (or its static-shape stand-in)

    def fits(self, n: int, start: int) -> bool:
        width = width_bucket(n)
        return width is not None and self.kv.store is not None and start + width <= self.kv.capacity

    def forward(self, ids: torch.Tensor, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Like LeanStep.forward (ids (1, n) on the device at kv.length): (keep, V) logits and the
        (n, D) final-norm output, both copies the next replay cannot overwrite."""
        n, start = ids.shape[1], self.kv.length
        width = width_bucket(n)
        length = length_bucket(start + width, self.kv.capacity)
        self._load_inputs(ids, start, width)
        key = (width, length)
        captured = self.graphs.get(key)
        if captured is None:
            try:
                captured = self.graphs[key] = self._build(width, length)
            except Exception as exc:
                raise CaptureError(f"capturing a pass of width {width} failed ({type(exc).__name__}: "
                                   f"{str(exc).strip().splitlines()[0][:160] if str(exc).strip() else 'no message'})"
                                   ) from exc
        elif captured.graph is not None:
            captured.graph.replay()
        self.replays += 1
        if captured.graph is None:  # the static shapes, eagerly (graphs off)
            logits, hidden = self._pass(width, length)
            return logits[n - keep:n].clone(), hidden[:n].clone()
        return captured.logits[n - keep:n].clone(), captured.hidden[:n].clone()

    def _load_inputs(self, ids: torch.Tensor, start: int, width: int) -> None:
        """The pass's tokens and positions into the buffers the graphs read (device-side copies)."""
        self.ids[:, :ids.shape[1]].copy_(ids)
        torch.add(self._count[width], start, out=self.positions[width])

    def _pass(self, width: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        static = StaticShape(self.positions[width], length)
        return self.lean.forward(self.ids[:, :width], self.kv, width, hidden=True, static=static)

    def _build(self, width: int, length: int) -> _Captured:
        self.lean.rope_tables(self.kv.capacity)  # the tables the graph indexes, allocated outside it
        if not self.capture:
            return _Captured(None, None, None)
        graph, (logits, hidden) = capture(lambda: self._pass(width, length), self.pool)
        return _Captured(graph, logits, hidden)
