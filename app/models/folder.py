"""Checks on a model folder before any array library touches it."""

from __future__ import annotations

import json
from pathlib import Path

from app.models.errors import ModelFileError
from app.models.gguf_import import gguf_source, is_gguf_folder

PICKLED_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def check_model_folder(folder: str | Path, weights: bool = True) -> dict:
    """Return the folder's config.json, or raise ModelFileError saying what is missing.

    Only safetensors weights are accepted: pickled checkpoints can run code when loaded.
    `weights=False` checks the config alone (a hub model whose weights are not fetched yet).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise ModelFileError(f"{folder}: not a folder. Choose a model folder or a .gguf file.")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelFileError(
            f"{folder}: no config.json, so this is not a model folder. A model folder holds "
            "config.json, *.safetensors and tokenizer files."
        )
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{config_path}: not valid JSON ({exc}).") from exc
    if weights and is_gguf_folder(folder):
        gguf_source(folder)  # the file its weights are read from is still there
        return config
    if weights and not any(folder.glob("*.safetensors")):
        pickled = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLED_SUFFIXES)
        if pickled:
            raise ModelFileError(
                f"{folder}: weights only in pickled form ({', '.join(pickled[:3])}). Tandem loads "
                "only safetensors, because a pickled checkpoint can run arbitrary code when "
                "loaded. Look for a safetensors version of this model."
            )
        raise ModelFileError(f"{folder}: no *.safetensors weights. The download may be incomplete.")
    return config


def context_length_of(config: dict) -> int:
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = config.get(key) or (config.get("text_config") or {}).get(key)
        if isinstance(value, int) and value > 0:
            return value
    return 2048
