"""Drafters that live beside or inside the target's checkpoint rather than being a model of their
own: the checkpoint's built-in MTP layer (app/engine/mtp.py) and Gemma 4 assistants
(app/engine/assistant.py). What the runner and pairing ask before anything loads: does the
folder hold one, and what memory does it take."""

from __future__ import annotations

import json
from pathlib import Path

from app.models.errors import ModelFileError
from app.models.integrity import check_weights
from app.models.memory import MemoryEstimate, loaded_dtype, DTYPE_BYTES
from app.models.mtp_weights import find_mtp
from app.models.names import display_name

ASSISTANT_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")


def _config(folder: Path) -> dict:
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return config if isinstance(config, dict) else {}


def is_assistant_folder(folder: str | Path) -> bool:
    """A Gemma 4 assistant (it drafts from the target's state, not from the text)."""
    return _config(Path(folder)).get("model_type") in ASSISTANT_TYPES


def has_mtp(folder: str | Path) -> bool:
    """Whether a checkpoint carries its own MTP layer (a broken one says so when it loads)."""
    try:
        return find_mtp(folder) is not None
    except ModelFileError:  # an unreadable header: the load reports it in full
        return False


def no_mtp_reason(folder: str | Path) -> str:
    name = display_name(Path(folder))
    return (f"{name} has no built-in multi-token-prediction layer (mtp.* weights). Qwen3.5 and Qwen3.6 "
            "checkpoints ship one, but converted copies (mlx-community, GGUF) leave it out: open the original "
            "checkpoint, or choose another draft.")


def assistant_estimate(folder: Path, target_config: dict, backend: str, device: str,
                       precision: str) -> MemoryEstimate:
    """An assistant's weights at the target's compute precision; it keeps no cache of its own."""
    stored = str(_config(folder).get("dtype") or _config(folder).get("torch_dtype") or "float32")
    dtype = loaded_dtype(target_config, backend, device, precision)
    weights = check_weights(folder)
    if dtype in DTYPE_BYTES and stored in DTYPE_BYTES:
        weights = weights * DTYPE_BYTES[dtype] // DTYPE_BYTES[stored]
    return MemoryEstimate("draft", weights, 0, 1)
