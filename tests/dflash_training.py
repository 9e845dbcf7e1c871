"""A tiny Llama target and a DFlash block drafter trained together (a plain PyTorch loop,
autograd) on sequences that repeat three random tokens (a b c a b c ...): given the target's
states of two of its inner layers at every position before the anchor and the anchor token, the
drafter denoises the BLOCK_SIZE - 1 mask tokens after it into the next tokens, which only those
states carry (the anchor alone says nothing about the two tokens before it). Written in z-lab's
published layout (config.json with dflash_config, model.safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from app.engine.backends.dflash_torch import DFlashModules, layer_config
from app.models.dflash_head import DFlashHead
from tests.factories import tiny_llama
from tests.mtp_training import VOCAB, periodic

THEIR_LAYERS = (0, 2)  # z-lab's count: the outputs of layers 0 and 2 of the target's 4
OUR_LAYERS = tuple(i + 1 for i in THEIR_LAYERS)
HIDDEN = 32
BLOCK_SIZE = 4
MASK = 0  # an embedding row no text uses


def draft_config(hidden: int = HIDDEN, vocab: int = VOCAB, layers=THEIR_LAYERS, target_layers: int = 4,
                 draft_layers: int = 1) -> dict:
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
            "intermediate_size": 2 * hidden, "num_hidden_layers": draft_layers, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": hidden // 4, "rms_norm_eps": 1e-6, "vocab_size": vocab,
            "max_position_embeddings": 256, "rope_theta": 10000.0, "block_size": BLOCK_SIZE,
            "num_target_layers": target_layers,
            "dflash_config": {"mask_token_id": MASK, "target_layer_ids": list(layers)}}


def spec(config: dict | None = None, layers=OUR_LAYERS) -> DFlashHead:
    config = config or draft_config()
    return DFlashHead(Path("."), config, config["block_size"], MASK, tuple(layers))


def block_pass(drafter: DFlashModules, model, states: torch.Tensor, x: torch.Tensor, anchor: int) -> torch.Tensor:
    """The drafter's outputs for the block after position `anchor` of each row of x, reading the
    fused states of every position before it."""
    ids = torch.full((x.shape[0], BLOCK_SIZE), MASK)
    ids[:, 0] = x[:, anchor]
    positions = torch.arange(anchor + BLOCK_SIZE).view(1, -1)
    return drafter(drafter.context(states[:, :anchor]), model.model.embed_tokens(ids), positions, None)


def states_of(model, x: torch.Tensor, layers=OUR_LAYERS) -> torch.Tensor:
    hidden = model.model(input_ids=x, output_hidden_states=True).hidden_states
    return torch.cat([hidden[i] for i in layers], -1)


def train(seed: int = 0, steps: int = 300, batch: int = 16, length: int = 16):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # thousands of tiny ops: OpenMP's threads only spin against each other
    try:
        return _train(seed, steps, batch, length)
    finally:
        torch.set_num_threads(threads)


def _train(seed: int, steps: int, batch: int, length: int):
    torch.manual_seed(seed)
    model = tiny_llama(seed, vocab=VOCAB, hidden=HIDDEN, layers=4, heads=4, kv_heads=2, context=256)
    with torch.no_grad():  # tiny_llama's weights are scaled up for clear greedy choices: back to the init's
        for p in model.parameters():
            if p.dim() == 2:
                p.div_(4.0)
    model.train()
    drafter = DFlashModules(spec(), layer_config(spec())).train()
    optimizer = torch.optim.AdamW([*model.parameters(), *drafter.parameters()], lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    cross_entropy = torch.nn.functional.cross_entropy
    losses = (0.0, 0.0)
    for _ in range(steps):
        x = periodic(generator, batch, length)
        out = model.model(input_ids=x, output_hidden_states=True)
        next_loss = cross_entropy(model.lm_head(out.last_hidden_state[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        anchor = int(torch.randint(3, length - BLOCK_SIZE + 1, (1,), generator=generator))
        states = torch.cat([out.hidden_states[i] for i in OUR_LAYERS], -1)
        y = block_pass(drafter, model, states, x, anchor)
        logits = model.lm_head(y[:, 1:])
        block_loss = cross_entropy(logits.flatten(0, 1), x[:, anchor + 1 : anchor + BLOCK_SIZE].flatten())
        optimizer.zero_grad()
        (next_loss + block_loss).backward()
        optimizer.step()
        losses = (next_loss.item(), block_loss.item())
    return model.eval(), drafter.eval(), losses


def write_drafter(drafter: DFlashModules, folder: Path, config: dict | None = None, drop: str = "") -> Path:
    """The drafter's folder as z-lab publishes one."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: value.detach().contiguous() for name, value in drafter.state_dict().items()
               if not name.startswith("rotary_emb.") and name != drop}
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config or draft_config()))
    return folder
