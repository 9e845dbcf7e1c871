"""Turn what a user names (a folder, a .gguf file, "demo") into a folder a backend loads."""

from __future__ import annotations

from pathlib import Path

from app.models.errors import ModelFileError
from app.models.folder import check_model_folder
from app.models.gguf_import import (GGUF_VARIANT, MLX_GGUF_VARIANT, GGUFInfo, file_sha256, import_gguf,
                                    import_variants, imported, inspect_gguf)
# a model's name in a user's words lives in app/models/names.py (a leaf: DraftChoice's labels read
# it without this module's imports); kept importable from here, where it used to live
from app.models.names import DEMO_SHORT as DEMO_SHORT, display_name as display_name, is_demo_folder as is_demo_folder
from app.models.names import model_label as model_label, precision_words as precision_words
from app.paths import models_dir


def resolve_model(spec: str | Path, backend: str, progress=print, precision: str = "auto") -> Path:
    """A .gguf on PyTorch at its own precisions ("auto" or "gguf") becomes a folder without weights
    that points at the file (nothing dequantized); on MLX at "auto", a folder of MLX quantized
    layers at the file's own numbers; at any other precision a folder of float32 weights converted
    once."""
    from app.models.demo import DEMO_SPECS, demo_folder

    if str(spec) in DEMO_SPECS:
        return demo_folder(backend, progress, precision, spec=str(spec))
    if isinstance(spec, str) and not spec.strip():  # Path("") is the current folder, which no one meant
        raise ModelFileError('No model named (the name is empty): give a model folder, a .gguf file or "demo".')
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        info = inspect_gguf(path)
        digest = file_sha256(path)  # hashed once per file, not at every load
        cache = models_dir() / f"{path.stem}-{digest[:12]}"
        mlx = (_mlx_variant(info, precision, progress),) if backend == "mlx" else ()
        torch_variant = None if mlx else (GGUF_VARIANT if precision in ("auto", "gguf") else "hf")
        variants = import_variants(mlx, torch_variant)
        if not imported(cache, digest, variants) and "hf" in variants:
            check_import_fits(info, len(variants))
        folders = import_gguf(info.path, cache, mlx_variants=mlx, torch_variant=torch_variant,
                              progress=progress, digest=digest)
        return folders[mlx[0] if mlx else torch_variant]
    if path.is_dir():
        check_model_folder(path)  # config and safetensors before anything reads the folder
        return path
    if path.is_file():
        raise ModelFileError(
            f"{path}: not a model. Give a model folder (config.json + *.safetensors) or a .gguf file."
        )
    raise ModelFileError(f"{path}: no such file or folder.")


def _mlx_variant(info: GGUFInfo, precision: str, progress) -> str:
    """On MLX a GGUF at its own numbers ("auto") becomes MLX quantized layers read from the file
    (app/models/gguf_mlx.py); float32 and MLX's own int4 start from the float32 folder."""
    from app.models.gguf_mlx import unsupported_reason

    if precision != "auto":
        return "mlx"
    reason = unsupported_reason(info.architecture, info.path)
    if reason is None:
        return MLX_GGUF_VARIANT
    progress(f"{info.path.name}: {reason}: importing it as float32 instead.")
    return "mlx"


def check_import_fits(info: GGUFInfo, folders: int) -> None:
    """A GGUF is imported dequantized to float32 (app/models/gguf_import.py): 4 bytes a weight, in
    memory while converting and on disk once per folder. Say so with numbers before starting,
    rather than run out of either halfway through a large model."""
    import shutil

    from app.models.memory import NotEnoughMemory, free_memory

    need = info.n_params * 4
    free, where = free_memory("torch", "cpu")  # the conversion runs on the CPU whatever the backend
    disk = shutil.disk_usage(models_dir()).free
    billions = f"{info.n_params / 1e9:.1f} billion" if info.n_params >= 1e8 else f"{info.n_params / 1e6:.0f} million"
    advice = ("Importing a GGUF suits small models; for this one use its safetensors version (a model folder "
              "or a Hugging Face link), which loads without conversion.")
    if need > free:
        raise NotEnoughMemory(
            f"{info.path.name} has {billions} weights; importing it dequantizes them to float32, about "
            f"{need / 1e9:.1f} GB in memory while converting, but only {free / 1e9:.1f} GB of {where} is free. "
            f"{advice}")
    if need * folders > disk:
        raise ModelFileError(
            f"{info.path.name}: importing it writes about {need * folders / 1e9:.1f} GB of float32 weights, but "
            f"only {disk / 1e9:.1f} GB of disk is free in {models_dir()}. Free some space. {advice}")
