"""A draft head's output over its draft vocabulary on PyTorch (FR-Spec, Zhao et al. 2025;
app/align/draft_vocab.py): the target's output head over some of its rows.

The logits are the head's at the subset's ids and -inf elsewhere, a vector over the whole
vocabulary, so the draft's distribution is still one over every token (zero outside the subset)
and verification stays exact. A draft's logits need not be the target's to the last bit, so a
screened head's int8 rows serve as they are.

The subset is the vocabulary's fixed part plus the tokens of the conversation so far (`add`):
answers repeat their prompt's words and their own. On the demo's held-out answers the 8,192
tokens of a fixed subset covered 90.6% of the target's tokens, 95.2% with the conversation's
tokens added (benchmarks/add_draft_vocab.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from app.models.aligned_head import DRAFT_VOCAB_EXTRA as EXTRA


class SubsetHead:
    def __init__(self, head: torch.nn.Module, ids: Sequence[int], limit: int):
        from app.models.screened_head_torch import ScreenedHead

        self.head, self.limit = head, limit
        self.device = head.weight.device
        self.int8 = isinstance(head, ScreenedHead) and self.device.type == "cpu"  # PyTorch's int8 kernel is the CPU's
        self.fixed = sorted({int(i) for i in ids if 0 <= int(i) < limit})
        self.ids, self.rows = self._part(self.fixed)
        self.clear()

    @classmethod
    def fits(cls, head: torch.nn.Module) -> bool:
        """Whether its rows can be taken: a screened head, or a linear head whose weight is a plain
        floating-point (V, D) matrix. Not a quantized head (torchao's int4 head keeps packed codes
        under `weight`, whose rows are not the vocabulary's): it drafts over the whole vocabulary."""
        from app.models.screened_head_torch import ScreenedHead

        if isinstance(head, ScreenedHead):
            return True
        weight = getattr(head, "weight", None)
        return (isinstance(head, torch.nn.Linear) and type(weight) in (torch.Tensor, torch.nn.Parameter)
                and weight.dim() == 2 and weight.is_floating_point()
                and tuple(weight.shape) == (head.out_features, head.in_features))

    def _part(self, ids: list[int]) -> tuple[torch.Tensor, tuple]:
        """(ids, what a matmul over their rows needs): int8 codes and scales, or weight (and bias)."""
        index = torch.tensor(ids, dtype=torch.long, device=self.device)
        head = self.head
        if self.int8:
            return index, (head.codes[index].contiguous(), head.scales[index].contiguous())
        if hasattr(head, "codes"):  # a screened head off the CPU: its rows, decoded
            return index, (head.codes[index].float() * head.scales[index].float()[:, None], None)
        bias = getattr(head, "bias", None)
        return index, (head.weight.detach()[index].contiguous(), None if bias is None else bias.detach()[index])

    def _logits(self, hidden: torch.Tensor, rows: tuple) -> torch.Tensor:
        if self.int8:
            return torch.ops.aten._weight_int8pack_mm(hidden.view(1, -1).to(torch.bfloat16), *rows)[0].float()
        weight, bias = rows
        return torch.nn.functional.linear(hidden.to(weight.dtype), weight, bias).float()

    def clear(self) -> None:
        """Back to the fixed part (a new conversation)."""
        self.known = set(self.fixed)
        self.extra = 0  # conversation tokens held, in the first rows of the buffers below
        self.extra_ids, self.extra_rows = None, None

    def add(self, tokens: Iterable[int]) -> None:
        """Take on the conversation's tokens (up to EXTRA beyond the fixed part)."""
        # in the order they came (where the cap binds, the first ones stay)
        new = [t for t in dict.fromkeys(int(t) for t in tokens) if 0 <= t < self.limit and t not in self.known]
        new = new[: EXTRA - self.extra]
        if not new:
            return
        self.known.update(new)
        ids, rows = self._part(new)
        start, end = self.extra, self.extra + len(new)
        if self.extra_ids is None or end > len(self.extra_ids):
            # buffers that double (a round's new tokens are written in place, not the rows held
            # copied again: 33 MB a round for 4,096 rows of a 4,096-wide bfloat16 head)
            size = min(EXTRA, max(2 * end, GROWTH_FLOOR))
            before = self.extra_rows or (None,) * len(rows)
            self.extra_ids = _grown(self.extra_ids, ids, start, size)
            self.extra_rows = tuple(None if r is None else _grown(held, r, start, size)
                                    for held, r in zip(before, rows, strict=True))
        self.extra_ids[start:end] = ids
        for held, r in zip(self.extra_rows, rows, strict=True):
            if r is not None:
                held[start:end] = r
        self.extra = end

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (D,) -> logits (limit,) float32."""
        out = torch.full((self.limit,), float("-inf"), device=self.device)
        out.index_copy_(0, self.ids, self._logits(hidden, self.rows))
        if self.extra:
            held = tuple(None if r is None else r[: self.extra] for r in self.extra_rows)
            out.index_copy_(0, self.extra_ids[: self.extra], self._logits(hidden, held))
        return out


GROWTH_FLOOR = 256  # rows the conversation's buffers start at


def _grown(held: torch.Tensor | None, like: torch.Tensor, count: int, size: int) -> torch.Tensor:
    """A buffer of `size` rows shaped and typed as `like`'s, holding the first `count` rows of `held`."""
    out = torch.empty((size, *like.shape[1:]), dtype=like.dtype, device=like.device)
    if held is not None and count:
        out[:count] = held[:count]
    return out
