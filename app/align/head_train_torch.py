"""Training a draft head for a target: one decoder layer of the target's own kind on the target's
final hidden states (EAGLE, Li et al. 2024: predict the next feature from the current one and the
next token's embedding, read through the target's frozen head).

The layer is the same block a checkpoint's built-in MTP layer is (transformers' `MtpLayer`:
norms, a projection of [embedding; hidden], a decoder layer, a norm), so the trained head drafts
through the MTP drafter on both backends (app/engine/mtp.py) and is saved under the MTP layer's
checkpoint names. Its inputs at position i are the token at i + 1 and the target's state at i;
it is trained to give the target's state at i + 1 (smooth L1, EAGLE's regression loss) and the
target's distribution there through the head (KL, the distillation loss). Chained drafting feeds
it its own output, as it does the built-in layer.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import torch
import torch.nn.functional as F

from app.align.batches_torch import batches, candidates, distill_loss, optimizer_step
from app.align.cancel import never, stop_if_cancelled
from app.align.teacher_torch import Sequence, Teacher
from app.engine.backends.mtp_torch import build_layer, mtp_config, to_checkpoint_name

REGRESSION_WEIGHT = 1.0  # EAGLE weighs the feature loss 1 and the token loss 0.1 on 7B models; here
# the KL to a soft teacher is the signal agreement rides on, the regression keeps the chain in range


class HeadTrainer:
    kind = "head"

    def __init__(self, teacher: Teacher, seed: int = 0, lr: float = 2e-3, batch_tokens: int = 512,
                 temperature: float = 1.0):
        torch.manual_seed(seed)
        self.teacher, self.device = teacher, teacher.device
        self.config = mtp_config(teacher.config)
        self.layer = build_layer(teacher.text_model, self.config).float().to(self.device).train()
        self.optimizer = torch.optim.AdamW(self.layer.parameters(), lr=lr, weight_decay=0.0)
        self.batch_tokens, self.temperature = batch_tokens, temperature
        self.rng = random.Random(seed)
        self.steps = 0

    def _run(self, ids: torch.Tensor, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        text = self.teacher.text_model
        embeds = text.embed_tokens(ids)
        positions = torch.arange(ids.shape[1], device=ids.device).view(1, -1).expand(ids.shape[0], -1)
        return self.layer(embeds, hidden, position_embeddings=text.rotary_emb(embeds, positions),
                          attention_mask=mask, position_ids=positions, cache=None)

    @staticmethod
    def _inputs(group: list[Sequence]):
        """Right-padded (tokens at i + 1, states at i, states at i + 1, valid) for a group, and
        the candidate tokens of its distillation softmax."""
        width = max(len(s.ids) for s in group) - 2
        size = group[0].hidden.shape[-1]
        ids = torch.zeros(len(group), width, dtype=torch.long)
        states = torch.zeros(len(group), width, size)
        targets = torch.zeros(len(group), width, size)
        valid = torch.zeros(len(group), width, dtype=torch.bool)
        for b, s in enumerate(group):
            n = len(s.ids) - 2
            ids[b, :n] = s.ids[1:n + 1]
            states[b, :n] = s.hidden[:n].float()
            targets[b, :n] = s.hidden[1:n + 1].float()
            valid[b, :n] = True
        return ids, states, targets, valid, candidates([s.top[1:] for s in group])

    def train(self, sequences: list[Sequence], steps: int, should_stop=lambda: False,
              on_step=lambda step, loss: None) -> None:
        self.teacher.rank(sequences)
        stream = batches(sequences, self.batch_tokens, self.rng)
        for _ in range(steps):
            if should_stop():
                return
            ids, states, targets, valid, rows = (t.to(self.device) for t in self._inputs(next(stream)))
            width = ids.shape[1]
            causal = torch.ones(width, width, dtype=torch.bool, device=self.device).tril().view(1, 1, width, width)
            out = self._run(ids, states, causal)[valid]
            wanted = targets[valid]
            with torch.no_grad():
                teacher_logits = self.teacher.logits(wanted, rows)
            loss = distill_loss(self.teacher.logits(out, rows), teacher_logits, self.temperature)
            loss = loss + REGRESSION_WEIGHT * F.smooth_l1_loss(out, wanted)
            value = optimizer_step(self.optimizer, loss)
            self.steps += 1
            on_step(self.steps, value)

    @torch.no_grad()
    def agreement(self, sequences: list[Sequence], vocab: list[int] | None = None,
                  cancelled: Callable[[], bool] = never) -> tuple[int, int]:
        """(agreed, positions): how often the head's first draft after each answer position is the
        target's own argmax, teacher-forced on the target's answers (the drafts a round's first
        position gets); with `vocab`, drafting from those tokens and the ones read so far (the prompt
        and the answer up to there), as the drafter does (app/engine/backends/subset_head_torch.py).
        AlignCancelled between sequences once `cancelled()`."""
        self.layer.eval()
        try:
            return self._agreement(sequences, vocab, cancelled)
        finally:  # a cancel leaves the layer as training left it
            self.layer.train()

    def _agreement(self, sequences: list[Sequence], vocab: list[int] | None,
                   cancelled: Callable[[], bool]) -> tuple[int, int]:
        ids = None if vocab is None else torch.tensor(vocab, dtype=torch.long, device=self.device)
        agreed = total = 0
        for s in sequences:
            stop_if_cancelled(cancelled)  # each is two passes through the target's whole head
            n = len(s.ids) - 2
            if n < 1:
                continue
            out = self._run(s.ids[1:n + 1].view(1, -1).to(self.device),
                            s.hidden[:n].to(self.device, torch.float32).view(1, n, -1), None)[0]
            logits = self.teacher.logits(out)
            if ids is not None:
                allowed = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
                allowed[:, ids] = True
                seen_at: dict[int, int] = {}
                for position, token in enumerate(s.ids[1: n + 1].tolist(), start=1):  # the drafter reads from 1
                    seen_at.setdefault(token, position)
                for token, position in seen_at.items():  # output j has read ids[1..j + 1]
                    allowed[position - 1:, token] = True
                logits = logits.masked_fill(~allowed, float("-inf"))
            drafted = logits.argmax(-1)
            wanted = self.teacher.logits(s.hidden[1:n + 1]).argmax(-1)
            first = max(0, s.answer_start - 2)  # outputs from here on predict answer tokens
            agreed += int((drafted[first:] == wanted[first:]).sum())
            total += n - first
        return agreed, total

    def round_to_saved(self) -> None:
        """Round the weights to what is saved (bfloat16), so what is measured after is what loads."""
        with torch.no_grad():
            for p in self.layer.parameters():
                p.copy_(p.to(torch.bfloat16).float())

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"mtp." + to_checkpoint_name(name): value.detach().to("cpu", torch.bfloat16).contiguous()
                for name, value in self.layer.state_dict().items()}
