"""A DFlash block drafter's folder (z-lab, "DFlash: Block Diffusion for Flash Speculative
Decoding", 2026), read without an array library: pairing tells one apart and checks that it fits
its target before anything loads.

The drafter is a few Qwen3-style decoder layers that denoise a whole block in one pass: the block
is the last committed token (the anchor) followed by block_size - 1 mask tokens, embedded by the
TARGET's embedding; the target's states from the layers it names, side by side, are projected by
`fc` and normed (`hidden_norm`) into context features that enter every draft layer as extra keys
and values (the block's queries attend to the context and to the whole block, not causally). The
draft's normed output at block position j, through the TARGET's head, drafts the token at the
anchor's position + j. z-lab's published layout (what its hub heads hold):

    config.json   a Qwen3 config of the draft layers ("architectures": ["DFlashDraftModel"],
                  "auto_map" to remote code Tandem never runs), "block_size", "num_target_layers",
                  "dflash_config": {"mask_token_id", "target_layer_ids"} (block_size there too in
                  newer heads); a target layer id i names the OUTPUT of layer i (z-lab reads
                  hidden_states[i + 1]), which Tandem counts as the state entering layer i + 1
    model.safetensors   fc, hidden_norm, norm, layers.N.*; no embedding and no head
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from app.json_fields import read_object
from app.models.errors import ModelFileError
from app.models.integrity import read_header

ARCHITECTURES = ("DFlashDraftModel",)
LAYER_TENSORS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                 "input_layernorm.weight", "post_attention_layernorm.weight")
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json")


@dataclass(frozen=True)
class DFlashHead:
    folder: Path
    config: dict  # the draft layers' Qwen3 config (model_type qwen3)
    block_size: int
    mask_token_id: int
    layers: tuple[int, ...]  # the target's layers read, Tandem's count (the state entering each)
    input_scale: float = 1.0  # input_embedding_scale
    output_scale: float = 1.0  # output_multiplier
    softcap: float = 0.0  # final_logit_softcapping (0: none)
    files: dict = field(default_factory=dict)  # tensor name -> file

    @property
    def layer_count(self) -> int:
        return int(self.config.get("num_hidden_layers", 1))

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    def required(self) -> list[str]:
        names = ["fc.weight", "hidden_norm.weight", "norm.weight"]
        for index in range(self.layer_count):
            names += [f"layers.{index}.{name}" for name in LAYER_TENSORS]
        return names

    @property
    def weights_bytes(self) -> int:
        total = 0
        for path in set(self.files.values()):
            try:
                total += path.stat().st_size
            except OSError:
                pass
        return total


def _value(config: dict, name: str, default=None):
    """A DFlash setting: in dflash_config where newer heads keep it, else at the top level."""
    inner = config.get("dflash_config") or {}
    return inner.get(name, config.get(name, default))


def is_dflash_config(config: dict) -> bool:
    architectures = config.get("architectures") or []
    return (config.get("speculators_model_type") == "dflash"
            or (isinstance(architectures, list) and any(a in ARCHITECTURES for a in architectures))
            or (isinstance(config.get("dflash_config"), dict) and "target_layer_ids" in config["dflash_config"]))


def is_dflash_head(folder: str | Path) -> bool:
    return is_dflash_config(read_object(Path(folder).expanduser() / "config.json"))


def default_layers(target_layers: int, draft_layers: int) -> list[int]:
    """z-lab's rule for a head that names no layers (build_target_layer_ids), in z-lab's count
    (the output of layer i): one per draft layer, spread from layer 1 to L - 3."""
    if draft_layers == 1:
        return [target_layers // 2]
    start, end = 1, target_layers - 3
    return [round(start + (i * (end - start)) / (draft_layers - 1)) for i in range(draft_layers)]


def _tensors(folder: Path) -> dict[str, Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, UnicodeDecodeError) as exc:
            raise ModelFileError(f"{index}: not a valid safetensors index ({exc}).") from exc
        return {name: folder / file for name, file in weight_map.items()}
    return {name: path for path in sorted(folder.glob("*.safetensors"))
            for name in read_header(path)[0] if name != "__metadata__"}


def read_dflash(folder: str | Path, target_config: dict, weights: bool = True) -> DFlashHead:
    """The drafter in `folder`, checked against the target whose config.json is `target_config`:
    a ModelFileError that says what does not fit and what to do, before any weights load.
    `weights=False` checks the config alone: a hub drafter whose config is fetched and whose
    weights are not yet (app/models/precheck.py), so one for another model is refused on kilobytes."""
    folder = Path(folder).expanduser()
    name = folder.name or str(folder)
    if not folder.is_dir():
        wrong = " is a file, not a folder" if folder.exists() else ": no such folder"
        raise ModelFileError(f"{folder}{wrong}. A DFlash drafter is a folder with its config.json and "
                             "model.safetensors (dflash:<folder>); check the path.")
    config = read_object(folder / "config.json")
    if not is_dflash_config(config):
        raise ModelFileError(f"{name} is not a DFlash drafter: its config.json is missing or names another model "
                             "(a DFlash drafter's names DFlashDraftModel and carries a dflash_config).")
    if config.get("speculators_model_type") == "dflash":
        raise ModelFileError(f"{name} is a DFlash drafter in vLLM's speculators layout, which Tandem does not read "
                             "yet; choose the head as z-lab publishes it.")
    extras = [key for key in ("conv_kernel_size", "selector_rank") if _value(config, key) is not None]
    if extras:
        raise ModelFileError(f"{name} is a DFlash-2 drafter (its config sets {extras[0]}), a layout Tandem does not "
                             "read yet.")
    layer_types = set(config.get("layer_types") or ["full_attention"])
    if layer_types != {"full_attention"} or config.get("is_causal"):
        raise ModelFileError(f"{name} has sliding-window or causal draft layers, which Tandem's DFlash port does not "
                             "read yet.")
    files = _tensors(folder) if weights else {}
    if weights and not files:
        pickled = next((p for p in PICKLES if (folder / p).is_file()), None)
        if pickled:
            raise ModelFileError(f"{name} holds its weights only as {pickled}, a Python pickle, and loading a pickle "
                                 "can run any code, so Tandem never does. Choose a drafter published as safetensors.")
        raise ModelFileError(f"{name}: model.safetensors is missing. Download the drafter again.")
    text = target_config.get("text_config") or target_config
    target_name = str(text.get("_name_or_path") or "this model")
    count = int(text.get("num_hidden_layers", 0))
    hidden = int(config.get("hidden_size", 0))
    if int(text.get("hidden_size", -1)) != hidden:
        raise ModelFileError(f"{name} drafts for a model {hidden} wide; {target_name} is {text.get('hidden_size')} "
                             "wide. Choose the drafter published for this model.")
    expected = config.get("num_target_layers")
    if expected is not None and int(expected) != count:
        raise ModelFileError(f"{name} was made for a model of {expected} layers; {target_name} has {count}. Choose "
                             "the drafter published for this model.")
    mask = _value(config, "mask_token_id")
    vocab = int(text.get("vocab_size", 0))
    if mask is None or not 0 <= int(mask) < vocab:
        raise ModelFileError(f"{name}: its mask token {mask} is not one of {target_name}'s {vocab} embedding rows. "
                             "Choose the drafter published for this model.")
    draft_layers = int(config.get("num_hidden_layers", 1))
    theirs = _value(config, "target_layer_ids") or default_layers(count, draft_layers)
    layers = tuple(int(i) + 1 for i in theirs)  # z-lab counts the output of layer i
    if min(layers) < 1 or max(layers) >= count or len(set(layers)) != len(layers):
        # (the last layer's output reaches z-lab's drafter through the final norm: not handed over)
        raise ModelFileError(f"{name} reads the target's layers {list(theirs)}; {target_name} has {count} decoder "
                             "layers, so it was made for another model. Choose the drafter published for this model.")
    block = int(_value(config, "block_size", 16))
    if block < 2:
        raise ModelFileError(f"{name}: a block of {block} drafts nothing.")
    head = DFlashHead(folder, {**config, "model_type": "qwen3"}, block, int(mask), layers,
                      float(_value(config, "input_embedding_scale", 1.0) or 1.0),
                      float(_value(config, "output_multiplier", 1.0) or 1.0),
                      float(_value(config, "final_logit_softcapping", 0.0) or 0.0), files)
    if not weights:
        return head  # its tensors are checked once they are here (Runner.load reads it again)
    missing = [tensor for tensor in head.required() if tensor not in files]
    if missing:
        raise ModelFileError(f"{name}: its weights are incomplete (no {missing[0]}"
                             f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}). Download the drafter "
                             "again.")
    return head
