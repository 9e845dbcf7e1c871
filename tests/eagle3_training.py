"""A tiny Llama target and an EAGLE-3 head trained together (a plain PyTorch loop, autograd) on a
task where the token after next depends on more than the next token: each sequence repeats three
random tokens (a b c a b c ...). The target predicts t+1 = t-2; the head, given the token at t+1
and the fused states of three of the target's inner layers at t, predicts t+2 = t-1, which only
those states carry. The head drafts over a smaller vocabulary than the target's (the specials
left out), mapped back by d2t, so the map's offsets are exercised too. Written in the speculators
layout or in EAGLE's original one (midlayer.*)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from app.engine.backends.eagle3_torch import Eagle3Modules, layer_config
from app.models.eagle3_head import Eagle3Head
from tests.factories import tiny_llama
from tests.mtp_training import FIRST, VOCAB, periodic

LAYERS = (1, 2, 3)  # of the target's 4: the states entering layers 1, 2 and 3
HIDDEN = 32
DRAFT_VOCAB = VOCAB - FIRST  # draft id i is target id i + FIRST


def layer_dict(hidden: int = HIDDEN, vocab: int = VOCAB) -> dict:
    return {"model_type": "llama", "hidden_size": hidden, "intermediate_size": 2 * hidden, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": vocab,
            "max_position_embeddings": 256, "rope_theta": 10000.0, "hidden_act": "silu", "head_dim": hidden // 4}


def spec(flags: dict | None = None, layers=LAYERS, hidden: int = HIDDEN, vocab: int = VOCAB,
         draft_vocab: int = DRAFT_VOCAB) -> Eagle3Head:
    return Eagle3Head(Path("."), "speculators", layer_dict(hidden, vocab), hidden, hidden, draft_vocab, vocab,
                      tuple(layers),
                      {"norm_before_residual": False, "norm_before_fc": False, "fc_norm": False, "norm_output": False,
                       **(flags or {})})


def fused_states(model, x: torch.Tensor, layers=LAYERS) -> torch.Tensor:
    states = model.model(input_ids=x, output_hidden_states=True).hidden_states
    return torch.cat([states[i] for i in layers], -1)


def head_pass(head: Eagle3Modules, model, tokens: torch.Tensor, fused: torch.Tensor) -> torch.Tensor:
    positions = torch.arange(tokens.shape[1]).view(1, -1)
    return head(model.model.embed_tokens(tokens), fused, positions, None, None)


def train(seed: int = 0, steps: int = 200, batch: int = 16, length: int = 16):
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
    head = Eagle3Modules(spec(), layer_config(spec())).train()
    head.d2t.fill_(FIRST)
    optimizer = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=3e-3)
    generator = torch.Generator().manual_seed(seed)
    cross_entropy = torch.nn.functional.cross_entropy
    losses = (0.0, 0.0)
    for _ in range(steps):
        x = periodic(generator, batch, length)
        out = model.model(input_ids=x, output_hidden_states=True)
        next_loss = cross_entropy(model.lm_head(out.last_hidden_state[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        fused = head.fuse(torch.cat([out.hidden_states[i] for i in LAYERS], -1))
        # pair i: the token at i + 1 beside the fused state at i, predicting the token at i + 2
        y = head_pass(head, model, x[:, 1:], fused[:, :-1])
        head_loss = cross_entropy(head.lm_head(head.norm(y[:, :-1])).flatten(0, 1), (x[:, 2:] - FIRST).flatten())
        optimizer.zero_grad()
        (next_loss + head_loss).backward()
        optimizer.step()
        losses = (next_loss.item(), head_loss.item())
    return model.eval(), head.eval(), losses


def random_head(seed: int, hidden: int, vocab: int, layers) -> Eagle3Modules:
    """An untrained head for a target `hidden` wide with `vocab` tokens, drafting over all but
    the first FIRST tokens."""
    torch.manual_seed(seed)
    made = spec(layers=layers, hidden=hidden, vocab=vocab, draft_vocab=vocab - FIRST)
    head = Eagle3Modules(made, layer_config(made)).eval()
    head.d2t.fill_(FIRST)
    return head


def write_head(head: Eagle3Modules, folder: Path, layout: str = "speculators", layers=LAYERS,
               flags: dict | None = None, drop: str = "") -> Path:
    """The head's folder as it is published: speculators' config and names, or EAGLE's."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: value.detach().contiguous() for name, value in head.state_dict().items()}
    hidden, draft_vocab = head.fc.out_features, head.lm_head.out_features
    vocab = draft_vocab + FIRST
    tensors["t2d"] = torch.zeros(vocab, dtype=torch.bool)
    tensors["t2d"][FIRST:] = True
    if layout == "EAGLE":
        tensors = {name.replace("layers.0.", "midlayer."): value for name, value in tensors.items()}
        config = {**layer_dict(hidden, vocab), "architectures": ["LlamaForCausalLMEagle3"],
                  "draft_vocab_size": draft_vocab,
                  # SGLang's convention: the layer whose output is read, one less than ours
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers]}}
    else:
        config = {"speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"],
                  "transformer_layer_config": layer_dict(hidden, vocab), "draft_vocab_size": draft_vocab,
                  "eagle_aux_hidden_state_layer_ids": list(layers), "norm_before_residual": False, **(flags or {})}
    tensors.pop(drop, None)
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder
