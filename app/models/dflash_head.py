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

from dataclasses import dataclass, field
from pathlib import Path

from app.json_fields import read_object
from app.models.errors import ModelFileError
from app.models.head_files import (BUILT_BYTES, MAX_BLOCK, MAX_TARGET_LAYERS, ConfigFields, LayerShape, head_folder,
                                   layer_shape, tensor_files)

ARCHITECTURES = ("DFlashDraftModel",)
LAYER_TENSORS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "self_attn.q_norm.weight", "self_attn.k_norm.weight",
                 "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                 "input_layernorm.weight", "post_attention_layernorm.weight")
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
ADVICE = "Download the DFlash drafter again, or choose the one published for your model."


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
        return int(self.config.get("num_hidden_layers") or 1)

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

    @property
    def shape(self) -> LayerShape:
        return layer_shape(ConfigFields(self.folder / "config.json", self.config, ADVICE), "qwen3")

    @property
    def parameter_count(self) -> int:
        """The numbers the drafter's modules hold as its config shapes them (app/engine/backends/
        dflash_torch.DFlashModules, dflash_mlx's): counted before any is built, whatever its file holds."""
        shape = self.shape
        fc = len(self.layers) * shape.hidden * shape.hidden
        return self.layer_count * shape.layer_numbers() + fc + 2 * shape.hidden  # hidden_norm, norm

    @property
    def memory_bytes(self) -> int:
        """What loading the drafter takes at most, for the memory check: its layers as built (at
        float32, before its tensors fill them), or its files read beside them, whichever is more."""
        return max(self.parameter_count * BUILT_BYTES, self.weights_bytes * 2)


def _value(config: dict, name: str, default=None):
    """A DFlash setting: in dflash_config where newer heads keep it, else at the top level (a
    dflash_config that is no object is refused where the config is read: read_config)."""
    inner = config.get("dflash_config")
    found = inner.get(name) if isinstance(inner, dict) else None
    return found if found is not None else config.get(name, default)


def _setting(fields: ConfigFields, name: str) -> ConfigFields:
    """Where a DFlash setting is read from, as _value reads it: dflash_config, else the top level."""
    inner = fields.part("dflash_config")
    return inner if inner.has(name) else fields


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
    """Every tensor in the folder's safetensors files (each file checked whole first)."""
    return tensor_files(folder, ADVICE)


@dataclass(frozen=True)
class DFlashConfig:
    """What a drafter's config.json says of the drafter alone, each field checked (app/models/
    head_files.py): what `tandem-cli models info` describes, and what read_dflash checks
    against a target."""

    config: dict
    shape: LayerShape
    block_size: int
    mask_token_id: int
    target_layer_count: int | None  # num_target_layers, where it names one
    target_layer_ids: tuple[int, ...] | None  # z-lab's count (the output of layer i), where it names them
    input_scale: float
    output_scale: float
    softcap: float


def read_config(folder: Path) -> DFlashConfig:
    """The drafter's own config, or a ModelFileError naming the file and the field that is wrong."""
    name = folder.name or str(folder)
    path = folder / "config.json"
    config = read_object(path)
    if not is_dflash_config(config):
        raise ModelFileError(f"{name} is not a DFlash drafter: its config.json is missing or names another model "
                             "(a DFlash drafter's names DFlashDraftModel and carries a dflash_config).")
    if config.get("speculators_model_type") == "dflash":
        raise ModelFileError(f"{name} is a DFlash drafter in vLLM's speculators layout, which Tandem does not read "
                             "yet; choose the head as z-lab publishes it.")
    fields = ConfigFields(path, config, ADVICE)
    fields.part("dflash_config")  # an object, where there is one: each setting is looked for in it first
    extras = [key for key in ("conv_kernel_size", "selector_rank") if _value(config, key) is not None]
    if extras:
        raise ModelFileError(f"{name} is a DFlash-2 drafter (its config sets {extras[0]}), a layout Tandem does not "
                             "read yet.")
    layer_types = set(fields.words("layer_types") or ["full_attention"])
    if layer_types != {"full_attention"} or config.get("is_causal"):
        raise ModelFileError(f"{name} has sliding-window or causal draft layers, which Tandem's DFlash port does not "
                             "read yet.")
    shape = layer_shape(fields, "qwen3")
    at = _setting(fields, "block_size")
    block = at.whole("block_size", 2, 2**31 - 1, 16)
    if block > MAX_BLOCK:  # a pass computes its whole block: a longer one than a round drafts costs every pass
        raise ModelFileError(f"{path}: {at.named('block_size')} is {block:,}, but Tandem drafts at most "
                             f"{MAX_BLOCK - 1} tokens a round and a pass computes the drafter's whole block, so it "
                             f"reads blocks of 2 to {MAX_BLOCK} tokens. Choose a drafter published with a shorter "
                             "block.")
    mask = _setting(fields, "mask_token_id").whole("mask_token_id", 0, 2**31 - 1)
    count = _setting(fields, "num_target_layers").whole("num_target_layers", 1, MAX_TARGET_LAYERS, None)
    ids = _setting(fields, "target_layer_ids").wholes("target_layer_ids", 0, MAX_TARGET_LAYERS)
    if ids is not None and len(ids) != len(set(ids)):
        raise _setting(fields, "target_layer_ids").refuse("target_layer_ids", "distinct layers")
    scales = [_setting(fields, key).number(key, default) for key, default in
              (("input_embedding_scale", 1.0), ("output_multiplier", 1.0))]
    softcap = _setting(fields, "final_logit_softcapping").number("final_logit_softcapping", 0.0, low=0.0)
    return DFlashConfig({**config, "model_type": "qwen3"}, shape, block, mask, count, ids,
                        scales[0] or 1.0, scales[1] or 1.0, softcap)


def read_dflash(folder: str | Path, target_config: dict, weights: bool = True) -> DFlashHead:
    """The drafter in `folder`, checked against the target whose config.json is `target_config`:
    a ModelFileError that says what does not fit and what to do, before any weights load.
    `weights=False` checks the config alone: a hub drafter whose config is fetched and whose
    weights are not yet (app/models/precheck.py), so one for another model is refused on kilobytes."""
    folder, name = head_folder(folder, "A DFlash drafter", "dflash")
    own = read_config(folder)
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
    hidden = own.shape.hidden
    if int(text.get("hidden_size", -1)) != hidden:
        raise ModelFileError(f"{name} drafts for a model {hidden} wide; {target_name} is {text.get('hidden_size')} "
                             "wide. Choose the drafter published for this model.")
    expected = own.target_layer_count
    if expected is not None and expected != count:
        raise ModelFileError(f"{name} was made for a model of {expected} layers; {target_name} has {count}. Choose "
                             "the drafter published for this model.")
    mask = own.mask_token_id
    vocab = int(text.get("vocab_size", 0))
    if not 0 <= mask < vocab:
        raise ModelFileError(f"{name}: its mask token {mask} is not one of {target_name}'s {vocab} embedding rows. "
                             "Choose the drafter published for this model.")
    theirs = own.target_layer_ids or default_layers(count, own.shape.layers)
    layers = tuple(int(i) + 1 for i in theirs)  # z-lab counts the output of layer i
    if min(layers) < 1 or max(layers) >= count or len(set(layers)) != len(layers):
        # (the last layer's output reaches z-lab's drafter through the final norm: not handed over)
        raise ModelFileError(f"{name} reads the target's layers {list(theirs)}; {target_name} has {count} decoder "
                             "layers, so it was made for another model. Choose the drafter published for this model.")
    head = DFlashHead(folder, own.config, own.block_size, mask, layers, own.input_scale, own.output_scale,
                      own.softcap, files)
    if not weights:
        return head  # its tensors are checked once they are here (Runner.load reads it again)
    missing = [tensor for tensor in head.required() if tensor not in files]
    if missing:
        raise ModelFileError(f"{name}: its weights are incomplete (no {missing[0]}"
                             f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}). Download the drafter "
                             "again.")
    return head
