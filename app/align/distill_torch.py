"""Distilling the target into a draft model: the draft's whole weights fine-tuned on the target's
answers, with KL to the target's distribution at every position (sequence-level knowledge
distillation, Kim & Rush 2016, with the teacher's soft targets; DistillSpec, Zhou et al. 2024,
shows this is what raises speculative acceptance). A plain PyTorch training loop; the tokenizers
are checked to be the same before anything loads (app/align/job.py)."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import torch

from app.align.batches_torch import batches, candidates, distill_loss, optimizer_step
from app.align.cancel import never, stop_if_cancelled
from app.align.teacher_torch import Sequence, Teacher
from app.models.errors import ModelFileError
from app.models.names import display_name


def load_student(folder: Path) -> torch.nn.Module:
    from app.models.gguf_import import gguf_source, is_gguf_folder

    if is_gguf_folder(folder):
        from app.models.gguf_torch import load_gguf_model

        model, _ = load_gguf_model(folder, gguf_source(folder), dtype=torch.float32, int4=False)
        return model
    from transformers import AutoModelForCausalLM

    import json

    config = json.loads((folder / "config.json").read_text())
    if config.get("quantization") or config.get("quantization_config"):
        raise ModelFileError(f"{display_name(folder)} holds quantized weights, which cannot be fine-tuned here. "
                             "Align the original checkpoint of the draft (or its .gguf).")
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32, trust_remote_code=False,
                                                use_safetensors=True)


class DraftTrainer:
    kind = "model"

    def __init__(self, teacher: Teacher, draft_folder: Path, seed: int = 0, lr: float = 1e-4,
                 batch_tokens: int = 512, temperature: float = 1.0):
        torch.manual_seed(seed)
        self.teacher, self.device = teacher, teacher.device
        self.model = load_student(draft_folder).float().to(self.device).train()
        self.vocab = min(int(self.model.get_output_embeddings().weight.shape[0]), teacher.head_weight.shape[0])
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=0.0)
        self.batch_tokens, self.temperature = batch_tokens, temperature
        self.rng = random.Random(seed)
        self.steps = 0

    def train(self, sequences: list[Sequence], steps: int, should_stop=lambda: False,
              on_step=lambda step, loss: None) -> None:
        self.teacher.rank(sequences)
        head = self.model.get_output_embeddings()
        stream = batches(sequences, self.batch_tokens, self.rng)
        for _ in range(steps):
            if should_stop():
                return
            group = next(stream)
            width = max(len(s.ids) for s in group)
            ids = torch.zeros(len(group), width, dtype=torch.long)
            mask = torch.zeros(len(group), width, dtype=torch.long)
            states = torch.zeros(len(group), width - 1, group[0].hidden.shape[-1])
            valid = torch.zeros(len(group), width - 1, dtype=torch.bool)
            for b, s in enumerate(group):
                ids[b, :len(s.ids)] = s.ids
                mask[b, :len(s.ids)] = 1
                states[b, :len(s.ids) - 1] = s.hidden.float()
                valid[b, :len(s.ids) - 1] = True
            ids, mask, states, valid = (t.to(self.device) for t in (ids, mask, states, valid))
            rows = candidates([s.top for s in group]).to(self.device)
            rows = rows[rows < self.vocab]
            # the draft's own head over the candidate tokens only (its full head is most of a step's cost)
            hidden = self.model.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1][valid]
            logits = hidden @ head.weight[rows].T + (head.bias[rows] if head.bias is not None else 0)
            with torch.no_grad():
                teacher_logits = self.teacher.logits(states[valid], rows)
            loss = distill_loss(logits, teacher_logits, self.temperature)
            value = optimizer_step(self.optimizer, loss)
            self.steps += 1
            on_step(self.steps, value)

    @torch.no_grad()
    def agreement(self, sequences: list[Sequence], cancelled: Callable[[], bool] = never) -> tuple[int, int]:
        """(agreed, positions): the draft's argmax against the target's at every answer position,
        teacher-forced on the target's answers. AlignCancelled between sequences once `cancelled()`."""
        self.model.eval()
        agreed = total = 0
        try:
            for s in sequences:
                stop_if_cancelled(cancelled)  # each is a pass of the draft and the target's whole head
                logits = self.model(input_ids=s.ids[:-1].view(1, -1).to(self.device)).logits[0, :, : self.vocab]
                wanted = self.teacher.logits(s.hidden)[:, : self.vocab].argmax(-1)
                first = s.answer_start - 1
                agreed += int((logits[first:].argmax(-1) == wanted[first:]).sum())
                total += len(wanted) - first
        finally:  # a cancel leaves the model as training left it
            self.model.train()
        return agreed, total

    def round_to_saved(self) -> None:
        pass  # saved in float32: what is measured is what loads

    def save(self, folder: Path) -> None:
        self.model.eval().cpu()
        self.model.save_pretrained(str(folder), safe_serialization=True)
