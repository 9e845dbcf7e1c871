"""Training batches from the teacher's sequences, and the distillation loss both trainers share."""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from app.align.teacher import Sequence


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


def distill_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float, candidates: int) -> torch.Tensor:
    """KL(teacher || student) over each row's distribution (rows of logits (N, V)), at `temperature`.

    The softmax runs over the batch's candidate tokens only, the union of each row's teacher top
    `candidates` (a sampled softmax: on a 49k vocabulary the full one is most of the training
    cost, and outside the teacher's top few dozen tokens its probabilities are negligible).
    0 candidates: the whole vocabulary."""
    if candidates:
        keep = torch.topk(teacher, min(candidates, teacher.shape[-1]), dim=-1).indices.unique()
        student, teacher = student[:, keep], teacher[:, keep]
    t = max(temperature, 1e-3)
    return F.kl_div(F.log_softmax(student / t, -1), F.log_softmax(teacher / t, -1), log_target=True,
                    reduction="batchmean") * t * t
