"""An output head that reads a quarter of float32's bytes and still picks float32's argmax.

The demo's tied head is 49,152 x 576 float32 weights: 113 MB read per decoded token, 10 ms of a
26 ms forward on this CPU, more than all 210 int4 linear layers together. Reading it in 8 bits
would make it 5.5x cheaper, but its logits would come back in bfloat16 (PyTorch's int8 CPU kernel
has no float32 output at speed), where near-ties between the top tokens become exact ties or
swap, and a greedy answer would no longer be what the float32 head decides.

So the head screens, then rescores (the rule of a bounded screen, as in top-k retrieval with a
quantized index): an int8 pass gives every logit with a known error bound, and only the rows
whose logit could still be the largest are recomputed from the float32 weights. For row v at
activations h, with the screen's weights w' and activations h' (h in bfloat16),

    h.w - h'.w' = h.(w - w') + (h - h').w'
    |h.w - screen_v| <= |h| |w_v - w'_v| + |h - h'| |w'_v| + the kernel's rounding  (Cauchy-Schwarz)

Let j maximise screen - bound. Every row whose screen + bound falls below screen_j - bound_j
has a float32 logit below row j's, so it cannot be the argmax; the rest (1-26 rows per position
on the demo, measured) get their float32 logits. The argmax of what the head returns is therefore
the float32 head's argmax: the same token, batched or step by step, as long as the hidden state
is the same. Logits outside the rescored rows keep the screen's value (used by sampling, where
the target is this head: plain and speculative decoding share it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

# the int8 kernel accumulates in float32 and rounds its output to bfloat16: half a unit in the last
# place is 2**-8 of the value; 2**-7 leaves room for the accumulation's own rounding
OUTPUT_ROUNDING = 2.0 ** -7
SCREEN_BYTES = 1  # per weight: its int8 code
SCREEN_ROW_BYTES = 2 + 4 + 4  # per row: its bfloat16 scale and two float32 norms
SLACK = 1e-3  # an absolute floor under the bound (float32 arithmetic in the bound itself)


class ScreenedHead(torch.nn.Module):
    """logits = head(hidden): (..., D) float -> (..., V) float32, argmax exact to float32.

    `exact_rows(index)` returns the float32 weights of the given rows, (n, D): the tied embedding
    already in memory, or rows decoded from the model file on demand."""

    def __init__(self, weights: torch.Tensor | None, exact_rows: Callable[[torch.Tensor], torch.Tensor],
                 shape: tuple[int, int] | None = None, chunk_bytes: int = 4 << 20):
        super().__init__()
        vocab, dim = weights.shape if weights is not None else shape
        self.out_features, self.in_features = vocab, dim
        self.exact_rows = exact_rows
        self.limit = vocab  # rows at or past it (a padded vocabulary) can never be chosen
        self.register_buffer("codes", torch.empty(vocab, dim, dtype=torch.int8))
        self.register_buffer("scales", torch.empty(vocab, dtype=torch.bfloat16))
        self.register_buffer("error_norm", torch.empty(vocab))  # |w_v - w'_v|
        self.register_buffer("screen_norm", torch.empty(vocab))  # |w'_v|
        self._compiled = None  # Tandem's CPU kernel (kernels_numba.screen) where it runs, at the first pass
        if weights is not None:
            step = max(1, chunk_bytes // (dim * 4))  # a chunk's float32 temporaries at a time
            for start in range(0, vocab, step):
                self.fill(start, weights[start:start + step].float())

    @classmethod
    def empty(cls, vocab: int, dim: int, exact_rows: Callable[[torch.Tensor], torch.Tensor]) -> ScreenedHead:
        """A head to `fill` block by block (from a file: its float32 weights never exist whole)."""
        return cls(None, exact_rows, shape=(vocab, dim))

    @torch.no_grad()
    def fill(self, start: int, rows: torch.Tensor) -> None:
        """Rows start.. of the screen, from their float32 weights: one compiled pass a row where
        Tandem's CPU kernel runs (repack_numba.screen_rows: the same codes and scales; docs/gguf.md
        has its timings), else PyTorch's ops."""
        end = start + rows.shape[0]
        self._compiled = None  # its scales are read again at the next pass
        if self._fill_compiled(start, end, rows):
            return
        scale = (rows.abs().amax(dim=1).clamp(min=1e-30) / 127.0).to(torch.bfloat16)
        codes = torch.round(rows / scale.float()[:, None]).clamp(-127, 127)
        screen = codes * scale.float()[:, None]
        self.codes[start:end] = codes.to(torch.int8)
        self.scales[start:end] = scale
        self.error_norm[start:end] = (rows - screen).norm(dim=1)
        self.screen_norm[start:end] = screen.norm(dim=1)

    def _fill_compiled(self, start: int, end: int, rows: torch.Tensor) -> bool:
        if rows.device.type != "cpu" or rows.dtype != torch.float32 or self.codes.device.type != "cpu":
            return False
        from app.models.int4_cpu_torch import compiled, screen_rows

        if compiled() is None:
            return False
        errors, norms = self.error_norm[start:end].numpy(), self.screen_norm[start:end].numpy()
        screen_rows(rows.detach().contiguous().numpy(), self.codes[start:end].numpy(),
                    self.scales[start:end].view(torch.int16).numpy().view(np.uint16), errors, norms)
        # a NaN or an infinity in a row makes its norms NaN: such rows as PyTorch's ops carry them
        # (the compiled max skips a NaN where torch.amax keeps it)
        return bool(np.isfinite(errors).all() and np.isfinite(norms).all())

    @property
    def weight(self) -> torch.Tensor:
        """The head's shape for callers that read `get_output_embeddings().weight.shape`."""
        return self.codes

    def candidates(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(screen logits (n, V) float32, mask (n, V) of the rows that could be each argmax)."""
        screen, pos, rows = self._candidate_pairs(hidden)
        mask = torch.zeros(screen.shape, dtype=torch.bool)
        mask[pos, rows] = True
        return screen, mask

    def _candidate_pairs(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(screen logits (n, V) float32, and the (token, row) pairs that could be each argmax)."""
        compiled = self._kernel() if hidden.device.type == "cpu" else None
        if compiled is not None:
            return self._compiled_candidates(compiled, hidden)
        low = hidden.to(torch.bfloat16)
        screen = torch.ops.aten._weight_int8pack_mm(low, self.codes, self.scales).float()
        if self.limit < self.out_features:
            screen[:, self.limit:] = float("-inf")
        h_norm = hidden.norm(dim=1, keepdim=True)
        rounding = (hidden - low.float()).norm(dim=1, keepdim=True)
        bound = screen.abs().mul_(OUTPUT_ROUNDING).add_(SLACK)
        bound.addcmul_(h_norm, self.error_norm).addcmul_(rounding, self.screen_norm)
        floor = (screen - bound).amax(dim=1, keepdim=True)
        return screen, *((screen + bound) >= floor).nonzero(as_tuple=True)

    def _kernel(self):
        """The compiled module (int4_cpu_torch.compiled()) with the float32 scales it reads, or None."""
        if self._compiled is None:
            from app.models.int4_cpu_torch import compiled

            module = compiled() if self.in_features % 8 == 0 else None  # its rows: whole vectors of 8
            # a float32 sum of n products errs by at most n * 2**-24 of the sum of their sizes,
            # which Cauchy-Schwarz bounds by |h| |w'_v| (Higham's gamma_n; n + 2 for the scale's
            # product): per row, |h| times this
            rounding = (self.in_features + 2) * 2.0 ** -24
            row_bound = np.ascontiguousarray((self.error_norm + rounding * self.screen_norm).numpy(), np.float32)
            self._compiled = (False,) if module is None else (module, self.scales.float().numpy(), row_bound)
        return self._compiled[0] or None

    def _compiled_candidates(self, compiled, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The same screen and bound on Tandem's CPU kernel: float32 activations and sums, so the
        bound has no activation rounding and no bfloat16 output rounding, only the sum's."""
        from app.models.int4_cpu_torch import threads

        flat = np.ascontiguousarray(hidden.float().numpy())
        screen = np.empty((flat.shape[0], self.out_features), np.float32)
        compiled.screen(self.codes.numpy(), self._compiled[1], flat, screen, threads())
        if self.limit < self.out_features:
            screen[:, self.limit:] = float("-inf")
        h_norm = np.linalg.norm(flat.astype(np.float64), axis=1).astype(np.float32)
        pos, rows = compiled.screen_candidates(screen, self._compiled[2], h_norm, np.float32(SLACK), self.limit)
        return torch.from_numpy(screen), torch.from_numpy(pos), torch.from_numpy(rows)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, self.in_features).float()
        logits, pos, rows = self._candidate_pairs(flat)
        dots = getattr(self.exact_rows, "dots", None)  # the rows' own kernel, where they have one
        if dots is not None:
            logits[pos, rows] = dots(flat, pos, rows)
        else:
            logits[pos, rows] = (flat[pos] * self.exact_rows(rows)).sum(dim=1)
        return logits.reshape(*hidden.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 screen, float32 argmax"
