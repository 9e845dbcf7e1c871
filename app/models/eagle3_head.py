"""An EAGLE-3 draft head's folder (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of
Large Language Models via Training-Time Test"), read without an array library: pairing tells one
apart and checks that it fits its target before anything loads.

The head is one decoder layer (rarely more) fed by three of the target's inner states. The states
entering the target's layers `layers` (low, middle, high; by default 2, L // 2 and L - 3 of a
target of L layers, the rule of EAGLE-3's code and vLLM's) are concatenated and projected by `fc`
(3 H_target -> H); the first layer's attention reads the token's embedding beside that fused
state ([embedding; state], 2H wide, each normed: `input_layernorm`, `hidden_norm`), the residual
being the fused state; `norm` and `lm_head` then predict over a draft vocabulary of `draft_vocab`
tokens, mapped to the target's ids by `d2t` (target id = draft id + d2t[draft id]). The embedding
is the target's unless the checkpoint carries its own (`embed_tokens.weight`).

Two published layouts:

    EAGLE (SafeAILab's, SGLang's)   config.json: a Llama config with "draft_vocab_size",
                                    architectures ["LlamaForCausalLMEagle3"]; tensors fc.*,
                                    midlayer.*, norm.*, lm_head.*, d2t, t2d
    speculators (vLLM's)            config.json: "speculators_model_type": "eagle3",
                                    "transformer_layer_config" (a Llama or Qwen3 config),
                                    "draft_vocab_size", "norm_before_residual",
                                    "eagle_aux_hidden_state_layer_ids", ...; tensors layers.0.*

Both are read into the speculators names (`midlayer.` -> `layers.0.`). Pickled checkpoints
(`pytorch_model.bin`) are refused: loading a pickle can run code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from app.json_fields import read_object
from app.models.errors import ModelFileError
from app.models.head_files import (BUILT_BYTES, MAX_TARGET_LAYERS, MAX_VOCAB, MAX_WIDTH, ConfigFields, LayerShape,
                                   head_folder, layer_shape, tensor_files)
from app.models.integrity import read_header

EAGLE_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator",
                       "Eagle3DraftModel")
LAYER_TYPES = ("llama", "qwen3")  # the decoder layers whose attention Tandem's port knows
PICKLES = ("pytorch_model.bin", "pytorch_model.bin.index.json", "model.pt", "model.bin")
# flags of the speculators layout this port reads; any other truthy flag is a variant not read yet
FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
ADVICE = "Download the EAGLE-3 head again, or choose the one published for your model."
LAYER_TENSORS = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                 "mlp.down_proj.weight", "input_layernorm.weight", "post_attention_layernorm.weight")


@dataclass(frozen=True)
class Eagle3Head:
    folder: Path
    layout: str  # "EAGLE" or "speculators"
    layer_config: dict  # a transformers config (model_type llama or qwen3) for the head's layers
    hidden_size: int
    target_hidden_size: int
    draft_vocab: int
    target_vocab: int
    layers: tuple[int, ...]  # the target's inner layers read, in the order fc takes them
    flags: dict = field(default_factory=dict)  # FLAGS, each True or False
    files: dict = field(default_factory=dict)  # tensor name (speculators layout) -> (file, name in it)
    vocab_map: bool = False  # d2t present
    own_embedding: bool = False

    def shown(self, name: str) -> str:
        """A tensor's name as this head's checkpoint writes it (EAGLE's layout: midlayer.*)."""
        return name.replace("layers.0.", "midlayer.") if self.layout == "EAGLE" else name

    @property
    def layer_count(self) -> int:
        return int(self.layer_config.get("num_hidden_layers") or 1)

    def required(self) -> list[str]:
        names = ["fc.weight", "norm.weight", "lm_head.weight", "layers.0.hidden_norm.weight"]
        for index in range(self.layer_count):
            names += [f"layers.{index}.{name}" for name in LAYER_TENSORS]
            if self.layer_config.get("model_type") == "qwen3":
                names += [f"layers.{index}.self_attn.q_norm.weight", f"layers.{index}.self_attn.k_norm.weight"]
        if self.flags.get("norm_before_fc"):
            names.append("input_norm.weight")
        if self.flags.get("fc_norm"):
            names += [f"fc_norm.{i}.weight" for i in range(len(self.layers))]
        return names

    @property
    def weights_bytes(self) -> int:
        total = 0
        for path in {p for p, _ in self.files.values()}:
            try:
                total += path.stat().st_size
            except OSError:
                pass
        return total

    @property
    def shape(self) -> LayerShape:
        return layer_shape(ConfigFields(self.folder / "config.json", self.layer_config, ADVICE),
                           self.layer_config.get("model_type", "llama"))

    @property
    def parameter_count(self) -> int:
        """The numbers the head's modules hold as its config shapes them (app/engine/backends/
        eagle3_torch.Eagle3Modules, eagle3_mlx's): counted before any is built, whatever its file holds."""
        shape, fused = self.shape, len(self.layers) * self.target_hidden_size
        hidden = shape.hidden
        count = fused * hidden  # fc: (3 H_target) -> H
        count += shape.layer_numbers(2 * hidden) + hidden  # the first layer reads [embedding; state], 2H; hidden_norm
        count += (self.layer_count - 1) * shape.layer_numbers()
        count += hidden + hidden * self.draft_vocab  # norm, lm_head: H -> draft vocabulary
        count += fused if self.flags.get("norm_before_fc") or self.flags.get("fc_norm") else 0  # (one or the other)
        count += self.target_vocab * hidden if self.own_embedding else 0
        return count + self.draft_vocab  # d2t

    @property
    def memory_bytes(self) -> int:
        """What loading the head takes at most, for the memory check: its layers as built (at
        float32, before its tensors fill them), or its files read beside them, whichever is more."""
        return max(self.parameter_count * BUILT_BYTES, self.weights_bytes * 2)


def is_eagle3_config(config: dict) -> bool:
    if "speculators_model_type" in config:  # a speculators head says what it is
        return config["speculators_model_type"] == "eagle3"
    architectures = config.get("architectures") or []
    return isinstance(architectures, list) and any(a in EAGLE_ARCHITECTURES for a in architectures)


def is_eagle3_head(folder: str | Path) -> bool:
    return is_eagle3_config(read_object(Path(folder).expanduser() / "config.json"))


def default_layers(count: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high layers of a target of `count` decoder layers (its code's
    rule, and vLLM's and SGLang's default): the states entering layers 2, count // 2, count - 3."""
    return 2, count // 2, count - 3


def _layers(fields: ConfigFields) -> tuple[int, ...] | None:
    """The target layers a head reads, in Tandem's terms (the state entering layer i), where its
    config names them. A top-level `eagle_aux_hidden_state_layer_ids` (speculators, vLLM) counts
    so already; the same key nested in `eagle_config` (SpecForge's heads, for SGLang) names the
    layer whose OUTPUT is read, one less (SGLang adds 1: "for the ith layer, it takes the output
    of the (i-1)th layer")."""
    top = fields.wholes("eagle_aux_hidden_state_layer_ids", 0, MAX_TARGET_LAYERS)
    if top:
        return top
    nested = fields.part("eagle_config").wholes("eagle_aux_hidden_state_layer_ids", -1, MAX_TARGET_LAYERS)
    return tuple(i + 1 for i in nested) if nested else None


def _layer_config(config: dict, layout: str) -> dict:
    if layout == "speculators":
        inner = config.get("transformer_layer_config")
        if not isinstance(inner, dict):
            raise ModelFileError("its config.json has no transformer_layer_config (the speculators layout keeps the "
                                 "decoder layer's config there)")
        return dict(inner)
    return {**config, "model_type": "llama"}  # the EAGLE layout's config is the Llama layer's own


def _tensors(folder: Path) -> dict[str, tuple[Path, str]]:
    """Every tensor in the folder's safetensors files, by its speculators-layout name (each file
    checked whole first)."""
    return {("layers.0." + name[len("midlayer."):]) if name.startswith("midlayer.") else name: (path, name)
            for name, path in tensor_files(folder, ADVICE).items()}


@dataclass(frozen=True)
class Eagle3Config:
    """What a head's config.json says of the head alone, each field checked (app/models/
    head_files.py): what `tandem-cli models info` describes, and what read_eagle3 checks
    against a target."""

    layout: str  # "EAGLE" or "speculators"
    layer_config: dict
    shape: LayerShape
    target_hidden: int
    vocab: int | None  # the target vocabulary it names, where it names one
    draft_vocab: int | None
    layers: tuple[int, ...] | None  # the target layers it reads (Tandem's count), where it names them
    flags: dict


def read_config(folder: Path) -> Eagle3Config:
    """The head's own config, or a ModelFileError naming the file and the field that is wrong."""
    name = folder.name or str(folder)
    path = folder / "config.json"
    config = read_object(path)
    kind = config.get("speculators_model_type")
    if kind not in (None, "eagle3"):
        raise ModelFileError(f"{name} is a speculators head of type {kind!r}; Tandem reads its EAGLE-3 heads, not "
                             "that type yet.")
    if not is_eagle3_config(config):
        raise ModelFileError(f"{name} is not an EAGLE-3 head: its config.json is missing or names another model "
                             "(an EAGLE-3 head's names the architecture LlamaForCausalLMEagle3, or "
                             "\"speculators_model_type\": \"eagle3\").")
    layout = "speculators" if kind else "EAGLE"
    fields = ConfigFields(path, config, ADVICE)
    layer = fields.part("transformer_layer_config") if layout == "speculators" else fields  # an object, if there
    try:
        layer_config = _layer_config(config, layout)
    except ModelFileError as exc:
        raise ModelFileError(f"{name}: {exc}. It may be a newer layout than Tandem reads.") from exc
    model_type = layer_config.get("model_type", "llama")
    if model_type not in LAYER_TYPES:
        raise ModelFileError(f"{name}: its decoder layer is a {model_type} layer; Tandem's EAGLE-3 port reads "
                             f"{' and '.join(LAYER_TYPES)} layers, not that one yet.")
    # vLLM reads a speculators config without norm_before_residual as True (speculators' own
    # training default; one set to null is False, as vLLM reads it); EAGLE's code has no such option (False)
    flags = {flag: fields.flag(flag, flag == "norm_before_residual" and layout == "speculators" and flag not in config)
             for flag in FLAGS}
    if flags["norm_before_fc"] and flags["fc_norm"]:
        raise ModelFileError(f"{name}: its config sets both norm_before_fc and fc_norm, which exclude each other.")
    shape = layer_shape(layer, model_type)
    vocab = (layer if layer.has("vocab_size") else fields).whole("vocab_size", 1, MAX_VOCAB, None)
    draft_vocab = (fields if fields.has("draft_vocab_size") else layer).whole("draft_vocab_size", 1, MAX_VOCAB, None)
    return Eagle3Config(layout, layer_config, shape, fields.whole("target_hidden_size", 1, MAX_WIDTH, shape.hidden),
                        vocab, draft_vocab, _layers(fields), flags)


def read_eagle3(folder: str | Path, target_config: dict, weights: bool = True) -> Eagle3Head:
    """The head in `folder`, checked against the target whose config.json is `target_config`:
    a ModelFileError that says what does not fit and what to do, before any weights load.
    `weights=False` checks the config alone: a hub head whose config is fetched and whose weights
    are not yet (app/models/precheck.py), so a head for another model is refused on kilobytes."""
    folder, name = head_folder(folder, "An EAGLE-3 head", "eagle3")
    own = read_config(folder)
    if weights and not (folder / "model.safetensors").is_file() \
            and not (folder / "model.safetensors.index.json").is_file() and not any(folder.glob("*.safetensors")):
        pickled = next((p for p in PICKLES if (folder / p).is_file()), None)
        if pickled:
            raise ModelFileError(f"{name} holds its weights only as {pickled}, a Python pickle, and loading a pickle "
                                 "can run any code, so Tandem never does. Choose a head published as safetensors "
                                 "(for instance its speculators conversion), or convert this one where you trust it.")
        raise ModelFileError(f"{name}: model.safetensors is missing. Download the head again.")
    text = target_config.get("text_config") or target_config
    hidden, target_hidden = own.shape.hidden, own.target_hidden
    count = int(text.get("num_hidden_layers", 0))
    target_name = str(text.get("_name_or_path") or "this model")
    if int(text.get("hidden_size", -1)) != target_hidden:
        raise ModelFileError(f"{name} drafts for a model {target_hidden} wide; {target_name} is "
                             f"{text.get('hidden_size')} wide. Choose the head published for this model.")
    target_vocab = own.vocab or int(text.get("vocab_size", 0))
    files = _tensors(folder) if weights else {}
    if "t2d" in files:  # the map's own length is the target vocabulary it was made for
        header = read_header(files["t2d"][0])[0].get(files["t2d"][1], {})
        target_vocab = int((header.get("shape") or [target_vocab])[0])
    if target_vocab != int(text.get("vocab_size", 0)):
        raise ModelFileError(f"{name} drafts for a vocabulary of {target_vocab} tokens; {target_name} has "
                             f"{text.get('vocab_size')}. Choose the head published for this model.")
    layers = own.layers or default_layers(count)
    if len(layers) != 3 or min(layers) < 0 or max(layers) > count or len(set(layers)) != 3:
        raise ModelFileError(f"{name} reads the target's layers {list(layers)}; {target_name} has {count} decoder "
                             "layers, so it was made for another model. Choose the head published for this model.")
    head = Eagle3Head(folder, own.layout, own.layer_config, hidden, target_hidden, own.draft_vocab or target_vocab,
                      target_vocab, layers, own.flags, files, "d2t" in files, "embed_tokens.weight" in files)
    if not weights:
        return head  # its tensors are checked once they are here (Runner.load reads it again)
    missing = [tensor for tensor in head.required() if tensor not in files]
    if missing:
        shown = head.shown(missing[0])
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ModelFileError(f"{name}: its weights are incomplete (no {shown}{more}). Download the head again.")
    if head.draft_vocab != target_vocab and not head.vocab_map:
        raise ModelFileError(f"{name} drafts over {head.draft_vocab} tokens but has no d2t map to the target's "
                             f"{target_vocab}. Download the head again.")
    return head
