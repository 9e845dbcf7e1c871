"""Where a checkpoint keeps its built-in multi-token-prediction (MTP) layers, read from the
safetensors headers alone (no array library): pairing asks before anything loads.

Qwen3.5/3.6 (and Qwen3-Next) ship one MTP layer under `mtp.*`, beside the main model's weights:
`mtp.fc`, `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.layers.0.*` (a full-attention
decoder layer) and `mtp.norm`; the embedding and the head are the main model's. mlx-lm's and
transformers' Qwen3.5 classes drop these weights at load, and mlx-lm's converter does not write
them, so only the original checkpoint has them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from app.models.errors import ModelFileError
from app.models.integrity import read_header

# the parts every Qwen3.5-style MTP layer has (its decoder layer's own names vary with MoE)
REQUIRED = ("fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "norm.weight")
MTP_MODEL_TYPES = ("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next")


@dataclass(frozen=True)
class MTPWeights:
    files: dict[str, Path]  # each MTP tensor's name in the checkpoint (without the prefix) -> its file
    prefix: str  # what comes before those names in the checkpoint ("mtp.")
    layers: int  # MTP decoder layers (Qwen3.5: 1, chained for k > 1)

    def names(self) -> list[str]:
        return sorted(self.files)


def _header(path: Path) -> dict:
    return read_header(path)[0]


def _all_keys(folder: Path) -> dict[str, Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as exc:
            raise ModelFileError(f"{index}: not a valid safetensors index ({exc}).") from exc
        return {k: folder / v for k, v in weight_map.items()}
    return {k: path for path in sorted(folder.glob("*.safetensors")) for k in _header(path) if k != "__metadata__"}


def mtp_model_type(config: dict) -> str:
    return str((config.get("text_config") or {}).get("model_type") or config.get("model_type") or "")


def find_mtp(folder: str | Path) -> MTPWeights | None:
    """The checkpoint's MTP layers, or None where it has none (or a model type whose MTP layout
    Tandem does not know)."""
    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    if mtp_model_type(config) not in MTP_MODEL_TYPES:
        return None
    keys = _all_keys(folder)
    for prefix in ("mtp.", "model.mtp.", "model.language_model.mtp."):
        files = {k[len(prefix):]: path for k, path in keys.items() if k.startswith(prefix)}
        if files:
            break
    else:
        return None
    missing = [name for name in REQUIRED if name not in files]
    if missing:
        raise ModelFileError(f"{folder}: its multi-token-prediction weights are incomplete (no {prefix}"
                             f"{missing[0]}). Download the model again.")
    layers = len({name.split(".")[1] for name in files if name.startswith("layers.")})
    if not layers:
        raise ModelFileError(f"{folder}: its multi-token-prediction weights have no decoder layer "
                             f"({prefix}layers.0.*). Download the model again.")
    return MTPWeights(files, prefix, layers)


def mtp_bytes(weights: MTPWeights) -> int:
    """Bytes the MTP layers' own tensors take (the embedding and head are shared), from the headers."""
    total = 0
    for path in set(weights.files.values()):
        for key, info in _header(path).items():
            if key.startswith(weights.prefix) and isinstance(info, dict):
                start, end = info["data_offsets"]
                total += end - start
    return total


def norms_stored_zero_centered(folder: str | Path) -> bool:
    """Whether the checkpoint stores its RMSNorm weights as offsets from 1 (Qwen3.5's own format,
    which computes x * (1 + w)) rather than as the scale itself (mlx-lm's converted format). The
    rule mlx-lm's qwen3_5 sanitize uses: the original layout's conv1d weights end in the kernel
    axis, the converted ones in a channel axis of 1."""
    folder = Path(folder)
    for path in sorted(folder.glob("*.safetensors")):
        for key, info in _header(path).items():
            if "conv1d.weight" in key and isinstance(info, dict):
                return info["shape"][-1] != 1
    return True  # no recurrent layer to tell by: the MTP weights come only in the original layout


def mtp_misfit(shapes: dict[str, tuple[int, ...]], wanted: dict[str, tuple[int, ...]], prefix: str) -> str | None:
    """Why a checkpoint's MTP tensors (their names without `prefix` -> shapes) do not load into a
    layer that takes `wanted` (the same names -> shapes), in words naming the first tensor that is
    missing, unexpected or of another shape, and how many more are; None where they fit."""
    def size(shape) -> str:
        return " x ".join(str(n) for n in shape) or "a single number"

    problems = [f"{prefix}{name} is missing" for name in sorted(set(wanted) - set(shapes))]
    problems += [f"{prefix}{name} is not part of this model's MTP layer" for name in sorted(set(shapes) - set(wanted))]
    problems += [f"{prefix}{name} is {size(shapes[name])} where this model's MTP layer takes {size(wanted[name])}"
                 for name in sorted(set(shapes) & set(wanted)) if tuple(shapes[name]) != tuple(wanted[name])]
    if not problems:
        return None
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more tensor{'s' if more > 1 else ''} like it)" if more else "")


def misfit_message(name: str, model_type: str, misfit: str) -> str:
    """A ModelFileError's words for mtp_misfit's answer; `name` the model (or head) as the user knows it."""
    return (f"{name}: its MTP weights do not fit {model_type}'s decoder layer: {misfit}. The file is damaged or "
            "was made for another model (another size or kind): download it again, or choose another draft.")
