"""Training batches from the teacher's sequences, and the distillation loss both trainers share."""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from app.align.teacher_torch import Sequence


def batches(sequences: list[Sequence], tokens: int, rng: random.Random) -> Iterator[list[Sequence]]:
    """The sequences in a shuffled order, grouped up to about `tokens` tokens a batch; endless
    (one epoch after another)."""
    while True:
        order = list(range(len(sequences)))
        rng.shuffle(order)
        group, count = [], 0
        for i in order:
            group.append(sequences[i])
            count += len(sequences[i].ids)
            if count >= tokens:
                yield group
                group, count = [], 0
        if group:
            yield group


def candidates(tops: list[torch.Tensor]) -> torch.Tensor:
    """The tokens the distillation softmax runs over for a batch: the union of every position's
    teacher top tokens (a sampled softmax; outside the teacher's top few dozen tokens its
    probabilities are negligible, and on a 49k vocabulary the full softmax was most of a step)."""
    return torch.cat([t.reshape(-1) for t in tops]).unique().long()


def optimizer_step(optimizer: torch.optim.Optimizer, loss: torch.Tensor) -> float:
    """One training step on `loss`; its value, for the progress line."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(teacher || student) between rows of logits over the same candidate tokens, at
    `temperature` (scaled by T^2, as Hinton et al. do, so the gradient's size does not depend on it)."""
    t = max(temperature, 1e-3)
    return F.kl_div(F.log_softmax(student / t, -1), F.log_softmax(teacher / t, -1), log_target=True,
                    reduction="batchmean") * t * t
