"""A tiny Qwen3.5 hybrid and its MTP layer, trained together (a plain PyTorch loop, autograd) on a
task where the token after next depends on more than the next token: each sequence repeats three
random tokens (a b c a b c ...). The target predicts t+1 = t-2; the MTP layer, given the token at
t+1 and the target's hidden state at t, predicts t+2 = t-1, which only that hidden state carries:
fed the state of another position, it guesses wrong. The DeepSeek-V3 recipe: both losses summed,
the MTP loss reaching the trunk too."""

from __future__ import annotations

from pathlib import Path

import torch

from app.engine.backends.mtp_torch import build_layer, mtp_config, run_layer, to_checkpoint_name
from tests.factories import save_qwen35, tiny_qwen35

VOCAB = 24
FIRST = 3  # tokens 0..2 are the specials (bos, eos, pad)
PERIOD = 3


def periodic(generator: torch.Generator, batch: int, length: int) -> torch.Tensor:
    """(batch, length) sequences, each repeating its own PERIOD random tokens from an offset."""
    seeds = torch.randint(FIRST, VOCAB, (batch, PERIOD), generator=generator)
    phase = torch.randint(0, PERIOD, (batch, 1), generator=generator)
    index = (torch.arange(length).view(1, -1) + phase) % PERIOD
    return seeds.gather(1, index)


def train(seed: int = 0, steps: int = 200, batch: int = 16, length: int = 16):
    """The trained target (transformers' Qwen3_5ForCausalLM) and its MTP layer (transformers'
    MtpLayer), with the final losses of each."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny ops: OpenMP's threads only spin against each other
    try:
        return _train(seed, steps, batch, length)
    finally:
        torch.set_num_threads(threads)


def _train(seed: int, steps: int, batch: int, length: int):
    torch.manual_seed(seed)
    model = tiny_qwen35(seed, vocab=VOCAB, hidden=32, layers=2, full_attention_interval=2, scale=1.0,
                        context=256).train()
    layer = build_layer(model.model, mtp_config(model.config)).train()
    optimizer = torch.optim.AdamW([*model.parameters(), *layer.parameters()], lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    cross_entropy = torch.nn.functional.cross_entropy
    losses = (0.0, 0.0)
    for _ in range(steps):
        x = periodic(generator, batch, length)
        hidden = model.model(input_ids=x).last_hidden_state  # the final norm's output, what the head reads
        next_loss = cross_entropy(model.lm_head(hidden[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        # pair i: the token at i + 1 beside the hidden state at i, predicting the token at i + 2
        out = run_layer(layer, model.model, x[:, 1:], hidden[:, :-1], torch.arange(length - 1), None)
        mtp_loss = cross_entropy(model.lm_head(out[:, :-1]).flatten(0, 1), x[:, 2:].flatten())
        optimizer.zero_grad()
        (next_loss + mtp_loss).backward()
        optimizer.step()
        losses = (next_loss.item(), mtp_loss.item())
    return model.eval(), layer.eval(), losses


def save_trained(folder: Path, tokenizer_from: Path | None = None, seed: int = 0, steps: int = 200):
    """Train, and write the pair as a Qwen3.5 checkpoint with its mtp.* weights. Returns the
    folder and the final (next-token, MTP) losses."""
    model, layer, losses = train(seed, steps)
    mtp = {"mtp." + to_checkpoint_name(name): value for name, value in layer.state_dict().items()}
    return save_qwen35(model, folder, tokenizer_from, extra=mtp), losses
