"""A drafter's own files as read before anything loads (an EAGLE-3 head, a DFlash drafter, an
aligned draft head): its config.json field by field, and its safetensors whole. Array-free.

Each field a drafter's config sets is typed and ranged here, and a refusal is a sentence naming
the file, the field and what to do, so pairing (app/runner.py, app/models/precheck.py), `tandem-cli
models info` and the load refuse the same values in the same words: a list or "64" in quotes for a
width, 0 heads or 0 layers, a width no drafter has, a DFlash block longer than a round drafts. A
width that passes is still counted into what the layers take (LayerShape, each head's
parameter_count) before any layer is built: a config can ask for far more memory than its file
holds, and the memory check is the only thing between that and swapping.

A safetensors file is checked as safetensors' own reader checks it when it opens one (each
tensor's bytes where its type and shape put them, the data covering the file exactly), so a file
cut short is refused here, before the target loads, rather than raised from inside the head's load.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from app.chat.settings import MAX_DRAFT_TOKENS
from app.engine.adaptive import MAX_DRAFT
from app.json_fields import is_number, is_whole, shown
from app.models.errors import ModelFileError
from app.models.integrity import read_header, unreadable

MAX_WIDTH = 2**20  # hidden, intermediate, head widths: published models stay below 2**17
MAX_HEADS = 2**12
MAX_LAYERS = 64  # a drafter's own decoder layers (published ones have 1 to 8)
MAX_TARGET_LAYERS = 2**12  # a target's layers, as a drafter names them
MAX_VOCAB = 2**24
# A DFlash pass computes its whole block and drafts block_size - 1 tokens from it, and a round
# asks for at most this many (adaptive k's longest, or a fixed k's): a longer block costs every
# pass and drafts nothing more (a block of 10**6 stalled the answer).
MAX_BLOCK = max(MAX_DRAFT, MAX_DRAFT_TOKENS) + 1
# What transformers builds where a layer's config leaves a width out (LlamaConfig, Qwen3Config);
# None: from the other widths (num_attention_heads, hidden_size // num_attention_heads).
LAYER_DEFAULTS = {"llama": {"num_key_value_heads": None, "head_dim": None},
                  "qwen3": {"num_key_value_heads": 32, "head_dim": 128}}
BUILT_BYTES = 4  # a number as the layers are built (float32, torch's default) before the file's tensors fill them
# safetensors' dtypes and their bytes (its format's list)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
               "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
_REQUIRED = object()


class ConfigFields:
    """One JSON object of a drafter's config.json (the file's top level, or a section such as
    dflash_config), its fields read typed and ranged: a ModelFileError naming the file and the
    field (dflash_config.block_size) where one is not what a drafter's config holds there. A
    field set to null reads as one left out."""

    def __init__(self, path: Path, values: dict, advice: str, section: str = ""):
        self.path, self.values, self.section = Path(path), values, section
        self.advice = advice  # what to do about a refused field: "Download the EAGLE-3 head again."

    def has(self, field: str) -> bool:
        return self.values.get(field) is not None

    def named(self, field: str) -> str:
        return f"{self.section}.{field}" if self.section else field

    def refuse(self, field: str, wanted: str) -> ModelFileError:
        if self.has(field):
            what = f"{self.path}: {self.named(field)} is {shown(self.values[field])}, not {wanted}"
        else:
            what = f"{self.path} has no {self.named(field)} ({wanted})"
        return ModelFileError(f"{what}. The file is damaged or was edited by hand. {self.advice}")

    def whole(self, field: str, low: int, high: int, default=_REQUIRED) -> int:
        value = self.values.get(field)
        if value is None and default is not _REQUIRED:
            return default
        if not (is_whole(value) and low <= value <= high):
            raise self.refuse(field, f"a whole number from {low:,} to {high:,}")
        return value

    def number(self, field: str, default: float, low: float = -math.inf, high: float = math.inf,
               above: float | None = None) -> float:
        """A finite number from `low` to `high` (and more than `above`, where given)."""
        value = self.values.get(field)
        if value is None:
            return default
        if not (is_number(value) and low <= value <= high and (above is None or value > above)):
            bounds = [f"more than {above:g}" if above is not None else f"of at least {low:g}"] if (
                above is not None or math.isfinite(low)) else []
            bounds += [f"at most {high:g}"] if math.isfinite(high) else []
            raise self.refuse(field, " ".join(["a number", " and ".join(bounds)]).strip())
        return float(value)

    def flag(self, field: str, default: bool) -> bool:
        value = self.values.get(field)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.refuse(field, "true or false")
        return value

    def wholes(self, field: str, low: int, high: int) -> tuple[int, ...] | None:
        """A list of whole numbers from `low` to `high`; None where it is left out (or empty)."""
        value = self.values.get(field)
        if value is None or value == []:
            return None
        if not (isinstance(value, list) and len(value) <= MAX_TARGET_LAYERS
                and all(is_whole(v) and low <= v <= high for v in value)):
            raise self.refuse(field, f"a list of whole numbers from {low:,} to {high:,}")
        return tuple(value)

    def words(self, field: str) -> tuple[str, ...] | None:
        """A list of names (layer_types); None where it is left out."""
        value = self.values.get(field)
        if value is None:
            return None
        if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise self.refuse(field, "a list of names")
        return tuple(value)

    def part(self, field: str) -> ConfigFields:
        """A section (a JSON object; an empty one where it is left out)."""
        value = self.values.get(field)
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self.refuse(field, "a JSON object of settings")
        return ConfigFields(self.path, value, self.advice, self.named(field))


@dataclass(frozen=True)
class LayerShape:
    """The widths a drafter's decoder layers are built at (transformers' Llama and Qwen3 layers),
    each checked: what the memory check counts before any layer is built."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    qk_norm: bool  # Qwen3's q_norm and k_norm
    attention_bias: bool
    mlp_bias: bool

    def layer_numbers(self, reads: int | None = None) -> int:
        """The numbers one decoder layer holds; `reads`: the width its q, k and v projections read
        (EAGLE-3's first layer reads [embedding; state], 2H)."""
        into = reads or self.hidden
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = into * (q + 2 * kv) + q * self.hidden + ((q + 2 * kv + self.hidden) if self.attention_bias else 0)
        mlp = 3 * self.hidden * self.intermediate + ((2 * self.intermediate + self.hidden) if self.mlp_bias else 0)
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return attention + mlp + norms


def layer_shape(fields: ConfigFields, model_type: str) -> LayerShape:
    """The checked widths of the layers `fields` (a Llama or Qwen3 config) describes; a missing
    hidden_size, intermediate_size or num_attention_heads is refused (every published drafter's
    config sets them; transformers' defaults would build a 4096-wide layer the file does not fill)."""
    hidden = fields.whole("hidden_size", 1, MAX_WIDTH)
    intermediate = fields.whole("intermediate_size", 1, MAX_WIDTH)
    heads = fields.whole("num_attention_heads", 1, MAX_HEADS)
    defaults = LAYER_DEFAULTS.get(model_type, LAYER_DEFAULTS["llama"])
    kv_heads = fields.whole("num_key_value_heads", 1, heads, defaults["num_key_value_heads"] or heads)
    if fields.has("num_key_value_heads") and heads % kv_heads:
        raise fields.refuse("num_key_value_heads", f"a number that divides num_attention_heads ({heads})")
    head_dim = fields.whole("head_dim", 1, MAX_WIDTH, defaults["head_dim"] or max(hidden // heads, 1))
    if head_dim % 2:  # rotary embeddings turn pairs of a head's numbers
        raise fields.refuse("head_dim", "an even number")
    layers = fields.whole("num_hidden_layers", 1, MAX_LAYERS, 1)
    fields.number("rms_norm_eps", 1e-6, high=1.0, above=0.0)
    fields.number("rope_theta", 10000.0, above=0.0)
    fields.whole("max_position_embeddings", 1, 2**31 - 1, 0)
    rope = fields.part("rope_parameters")
    rope.number("rope_theta", 10000.0, above=0.0)
    return LayerShape(hidden, intermediate, heads, kv_heads, head_dim, layers, model_type == "qwen3",
                      fields.flag("attention_bias", False), model_type == "llama" and fields.flag("mlp_bias", False))


def check_safetensors_file(path: Path, advice: str) -> dict:
    """The header of a safetensors file whose every tensor lies where its type and shape say and
    whose data covers the file exactly, as safetensors checks it on opening; else a
    ModelFileError naming the file and what to do (a copy or download cut short, damage)."""
    header, length, size = read_header(path)
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = info["dtype"], info["shape"]
            start, stop = info["data_offsets"]
            if dtype not in DTYPE_BYTES or not all(is_whole(n) and n >= 0 for n in shape) \
                    or not (is_whole(start) and is_whole(stop) and 0 <= start <= stop):
                raise ValueError(name)
        except (KeyError, TypeError, ValueError):
            raise ModelFileError(f"{path}: tensor {shown(name)} has no valid type, shape or byte range; the file is "
                                 f"damaged. {advice}") from None
        if stop - start != math.prod(shape) * DTYPE_BYTES[dtype]:
            raise ModelFileError(f"{path}: tensor {shown(name)} takes {stop - start:,} bytes where its shape "
                                 f"{list(shape)} of {dtype} needs {math.prod(shape) * DTYPE_BYTES[dtype]:,}; the file "
                                 f"is damaged. {advice}")
        spans.append((start, stop))
    end = 0
    for start, stop in sorted(spans):
        if start != end:
            raise ModelFileError(f"{path}: its tensors' bytes overlap or leave gaps; the file is damaged. {advice}")
        end = stop
    data = size - 8 - length
    if end != data:
        said = "is cut short" if end > data else "has bytes after its last tensor"
        raise ModelFileError(f"{path} {said}: its tensors take {end:,} bytes and it holds {data:,}. The copy or "
                             f"download was interrupted or the file is damaged. {advice}")
    return header


def tensor_files(folder: Path, advice: str) -> dict[str, Path]:
    """Each tensor in a drafter's safetensors files -> its file: the files its index names
    (model.safetensors.index.json), else every *.safetensors in the folder; each file checked
    whole first (check_safetensors_file). A tensor is found where a file's header holds it."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            if not names or not all(isinstance(name, str) and name for name in names):
                raise ValueError("its weight_map names no files")
        except OSError as exc:
            raise ModelFileError(unreadable(index, exc)) from exc
        except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise ModelFileError(f"{index}: not a valid safetensors index ({exc}). {advice}") from exc
        paths = [folder / name for name in names]
        missing = [path.name for path in paths if not path.is_file()]
        if missing:
            raise ModelFileError(f"{index} names {missing[0]}, which is not in the folder. {advice}")
    else:
        paths = sorted(folder.glob("*.safetensors"))
    return {name: path for path in paths for name in check_safetensors_file(path, advice) if name != "__metadata__"}


def head_folder(folder, what: str, prefix: str) -> tuple[Path, str]:
    """(the folder, its name) of a draft head `what` ("An EAGLE-3 head"), written `prefix:<folder>`;
    a ModelFileError that says what such a folder holds where it is none."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        wrong = " is a file, not a folder" if folder.exists() else ": no such folder"
        raise ModelFileError(f"{folder}{wrong}. {what} is a folder with its config.json and model.safetensors "
                             f"({prefix}:<folder>); check the path.")
    return folder, folder.name or str(folder)
