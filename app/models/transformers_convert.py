"""GGUF -> Hugging Face folder, through transformers' own GGUF reader (PyTorch side).

transformers maps GGUF metadata to a config, builds the tokenizer from the GGUF vocabulary
(special tokens and chat template included), dequantizes every tensor with the gguf package and
undoes llama.cpp's Q/K row permutation for RoPE. We only write the result as safetensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from huggingface_hub import save_torch_state_dict
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

from app.models.errors import ModelFileError


def gguf_to_hf_folder(gguf_path: Path, out_dir: Path, dtype: torch.dtype = torch.float32,
                      weights: bool = True) -> Path:
    """Write config.json, model.safetensors and tokenizer files for `gguf_path` into `out_dir`.
    `weights=False` writes no weights (the PyTorch backend then reads them from the GGUF itself,
    at its own precisions: app/models/gguf_torch.py), so nothing is dequantized."""
    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
    except (ValueError, KeyError) as exc:
        raise ModelFileError(
            f"{name}: transformers cannot read this GGUF's model description ({exc}). "
            "Its architecture may not be supported for import yet."
        ) from exc
    # The folder holds plain dequantized weights: drop the "this is a GGUF" marker.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = dtype
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    if weights:
        _write_weights(gguf_path, skeleton, config, dtype, out_dir)
    config.save_pretrained(out_dir)
    _add_legacy_config_keys(out_dir / "config.json")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.save_pretrained(out_dir)
    if not (out_dir / "tokenizer.json").is_file():
        raise ModelFileError(f"{name}: no tokenizer could be built from the GGUF vocabulary.")
    _embed_chat_template(out_dir)
    return out_dir


def _write_weights(gguf_path: Path, skeleton, config, dtype: torch.dtype, out_dir: Path) -> None:
    name = gguf_path.name
    parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=skeleton)
    tensors = {k: v.to(dtype).contiguous() for k, v in parsed["tensors"].items()}
    expected = set(skeleton.state_dict())
    if getattr(config, "tie_word_embeddings", False):
        expected.discard("lm_head.weight")
    missing = sorted(expected - set(tensors))
    if missing:
        raise ModelFileError(
            f"{name}: the GGUF lacks weights the {config.model_type} model needs: "
            f"{', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}."
        )
    save_torch_state_dict(tensors, out_dir, max_shard_size="4GB", safe_serialization=True)


def _add_legacy_config_keys(config_path: Path) -> None:
    """transformers 5 writes RoPE settings only as `rope_parameters`; mlx-lm and transformers 4
    read `rope_theta` / `rope_scaling` and would silently fall back to theta 10000 without them."""
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters")
    if isinstance(rope, dict) and "rope_theta" in rope:
        config.setdefault("rope_theta", rope["rope_theta"])
        if rope.get("rope_type", "default") != "default":
            config.setdefault("rope_scaling", rope)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _embed_chat_template(out_dir: Path) -> None:
    """Keep the chat template in tokenizer_config.json too, where older readers look for it."""
    template_file = out_dir / "chat_template.jinja"
    config_path = out_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if template_file.is_file() and not config.get("chat_template"):
        config["chat_template"] = template_file.read_text()
        config_path.write_text(json.dumps(config, indent=2) + "\n")
