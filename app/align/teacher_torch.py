"""The target as teacher: its weights in float32 on PyTorch, its answers to the alignment prompts,
and its final-norm hidden state at every position of them.

The hidden states are all the data alignment keeps: the target's distribution at a position is
its head applied to that state, so one tensor per position gives both what a draft head should
predict (the next state, EAGLE's regression target) and the teacher's distribution (the KL
target), with no logits stored.

A GGUF opened at its own precisions is dequantized for this (its 4-bit blocks in float32: the
same weights, and PyTorch's int4 kernel is slow at the widths of batched generation); what the
result buys is measured against the target as it runs.

The teacher computes on a CUDA GPU where there is one (`resolve_device`): the job is the same,
its answers come tens of times faster. What it keeps (the sequences, their states) stays in RAM
either way; training moves one batch at a time to the device.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from app.align.cancel import never, stop_if_cancelled
from app.models.errors import ModelFileError
from app.models.names import display_name


TOP = 32  # the teacher's most likely tokens kept per position: the candidates of the distillation softmax


@dataclass
class Sequence:
    ids: torch.Tensor  # (L,) the prompt (chat template applied) and the target's answer
    hidden: torch.Tensor  # (L - 1, D) bfloat16: the target's final-norm output at positions 0..L-2
    answer_start: int  # the index of the answer's first token
    top: torch.Tensor | None = None  # (L - 1, TOP) int32: the target's most likely next tokens there
    prompt: int = -1  # the index of its prompt in the list collect() was given


def resolve_device(spec: str = "auto") -> torch.device:
    """Where alignment computes: "auto" is the CUDA GPU where PyTorch has one, else the CPU; a GPU
    asked for where there is none is refused with the reason, before anything loads."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if spec not in ("cpu", "cuda"):
        raise ModelFileError(f"--device {spec}: alignment computes on \"auto\", \"cpu\" or \"cuda\".")
    if spec.startswith("cuda") and not torch.cuda.is_available():
        raise ModelFileError(f"--device {spec}: this PyTorch build sees no CUDA GPU "
                             f"(torch {torch.__version__}). Use --device cpu, or install a CUDA build of PyTorch.")
    return torch.device(spec)


def device_name(device: torch.device) -> str:
    """"CPU", or the GPU's name (the manifest and the progress line say where the job ran)."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"


class Teacher:
    """The target's model (float32, frozen), its text model and its head matrix (V, D), on `device`."""

    def __init__(self, folder: Path, device: torch.device | str = "cpu"):
        from app.models.gguf_import import gguf_source, is_gguf_folder

        self.folder = folder
        self.device = torch.device(device)
        if is_gguf_folder(folder):
            from app.models.gguf_torch import load_gguf_model

            self.model, _ = load_gguf_model(folder, gguf_source(folder), dtype=torch.float32, int4=False)
        else:
            from transformers import AutoModelForCausalLM

            config = _config(folder)
            if config.get("quantization") or config.get("quantization_config"):
                kind = "MLX" if config.get("quantization") else "pre-quantized"
                raise ModelFileError(f"{display_name(folder)} holds quantized weights ({kind}), which PyTorch "
                                     "cannot train against. Align against the original checkpoint (or its .gguf).")
            self.model = AutoModelForCausalLM.from_pretrained(
                str(folder), dtype=torch.float32, trust_remote_code=False, use_safetensors=True)
        self.model.to(self.device).eval().requires_grad_(False)
        self.text_model = getattr(self.model, "model", None)
        if self.text_model is None or not hasattr(self.text_model, "norm") or not hasattr(self.text_model, "layers"):
            raise ModelFileError(f"{display_name(folder)}: Tandem cannot read this model's hidden states to align a "
                                 "draft to.")
        head = self.model.get_output_embeddings()
        weight = getattr(head, "weight", None)
        if weight is None:
            raise ModelFileError(f"{display_name(folder)}: its output head has no weight matrix to distil from.")
        self.head_weight = weight.detach().float()  # (V, D)
        self.config = self.model.config
        self.hidden_size = int(self.head_weight.shape[1])

    def tokenizer(self):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(self.folder))

    def logits(self, hidden: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
        """The target's logits from its final-norm output: over the whole vocabulary, or over
        `rows` (token ids) only."""
        weight = self.head_weight if rows is None else self.head_weight[rows.to(self.device)]
        return hidden.to(self.device, torch.float32) @ weight.T

    @torch.no_grad()
    def rank(self, sequences: list[Sequence], chunk: int = 512, cancelled: Callable[[], bool] = never) -> None:
        """Each position's TOP most likely next tokens, once, so that training never needs the
        whole vocabulary's logits (on the demo that pass alone cost more than the rest of a step).
        AlignCancelled between chunks once `cancelled()`: the whole pass is minutes in a long job."""
        for s in sequences:
            if s.top is None:
                parts = []
                for i in range(0, len(s.hidden), chunk):
                    stop_if_cancelled(cancelled)
                    parts.append(torch.topk(self.logits(s.hidden[i:i + chunk]), TOP, dim=-1).indices.int().cpu())
                s.top = torch.cat(parts)  # (L - 1, TOP)


@contextmanager
def threads(count: int | None):
    """PyTorch's threads at `count` (None: as they are) for the block, then as they were."""
    before = torch.get_num_threads()
    if count:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _config(folder: Path) -> dict:
    import json

    return json.loads((folder / "config.json").read_text())


def collect(teacher: Teacher, tokenizer, prompts: list[str], max_tokens: int, batch: int,
            temperature: float, progress: Callable[[int, int], None] = lambda done, total: None,
            cancelled: Callable[[], bool] = lambda: False, enough: Callable[[], bool] = lambda: False,
            context: int = 1024) -> list[Sequence]:
    """The target's answers to `prompts` (greedy at temperature 0, else sampled at it), `batch` at a
    time with transformers' generate, with the hidden state of every position. Stops between
    batches once `enough()` (a time budget), and within one when `cancelled()`, returning the
    whole answers it has; `progress(prompts done, total)` after each batch."""
    out: list[Sequence] = []
    captured: list[torch.Tensor] = []
    hook = teacher.text_model.norm.register_forward_hook(lambda module, inputs, output: captured.append(output))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stops = set(stop_ids(tokenizer))
    try:
        for start in range(0, len(prompts), batch):
            if cancelled() or enough():
                break
            rows = [_prompt_ids(tokenizer, text)[-(context - max_tokens):] for text in prompts[start:start + batch]]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, r in enumerate(rows):  # left padding: every answer starts at the same column
                ids[i, width - len(r):] = torch.tensor(r)
                mask[i, width - len(r):] = 1
            captured.clear()
            sample = temperature > 0
            with torch.inference_mode():
                generated = teacher.model.generate(
                    input_ids=ids.to(teacher.device), attention_mask=mask.to(teacher.device),
                    max_new_tokens=max_tokens, do_sample=sample,
                    temperature=temperature if sample else None, top_p=None, top_k=None,
                    pad_token_id=pad, eos_token_id=sorted(stops) or None,
                    stopping_criteria=StoppingCriteriaList([_Cancelled(cancelled)]))
            if cancelled():  # a batch cut short: its answers are not the target's whole answers
                break
            hidden = torch.cat(captured, dim=1).to(torch.bfloat16).cpu()  # (B, width + new - 1, D): every position read
            generated = generated.cpu()
            for i, r in enumerate(rows):
                left = width - len(r)
                answer = generated[i, width:].tolist()
                end = next((j + 1 for j, t in enumerate(answer) if t in stops), len(answer))
                tokens = generated[i, left:width + end]
                if len(tokens) - len(r) < 2:
                    continue
                out.append(Sequence(tokens.clone(), hidden[i, left:left + len(tokens) - 1].clone(),
                                    len(r), prompt=start + i))
            progress(min(start + batch, len(prompts)), len(prompts))
    finally:
        hook.remove()
    return out


class _Cancelled(StoppingCriteria):
    """Ends generate at the next step once the job is cancelled (a batch takes minutes on a CPU)."""

    def __init__(self, cancelled: Callable[[], bool]):
        self.cancelled = cancelled

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.cancelled(), dtype=torch.bool, device=input_ids.device)


def _prompt_ids(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def stop_ids(tokenizer) -> list[int]:
    ids = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
    for name in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|endoftext|>"):
        token = tokenizer.convert_tokens_to_ids(name)
        if isinstance(token, int) and token != tokenizer.unk_token_id and token >= 0:
            ids.append(token)
    return ids
