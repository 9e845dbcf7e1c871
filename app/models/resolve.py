"""Turn what a user names (a folder, a .gguf file, "demo") into a folder a backend loads."""

from __future__ import annotations

import re
from pathlib import Path

from app.models.errors import ModelFileError
from app.models.folder import check_model_folder
from app.models.gguf_import import (GGUF_VARIANT, GGUFInfo, import_gguf, import_variants, imported, inspect_gguf,
                                    sha256_of)
from app.paths import models_dir


def resolve_model(spec: str | Path, backend: str, progress=print, precision: str = "auto") -> Path:
    """A .gguf on PyTorch at its own precisions ("auto" or "gguf") becomes a folder without weights
    that points at the file (nothing dequantized); at any other precision, and on MLX, a folder of
    float32 weights converted once."""
    from app.models.demo import DEMO_SPECS, demo_folder

    if str(spec) in DEMO_SPECS:
        return demo_folder(backend, progress, precision, spec=str(spec))
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        info = inspect_gguf(path)
        digest = sha256_of(path)
        cache = models_dir() / f"{path.stem}-{digest[:12]}"
        mlx = ("mlx",) if backend == "mlx" else ()
        torch_variant = None if mlx else (GGUF_VARIANT if precision in ("auto", "gguf") else "hf")
        variants = import_variants(mlx, torch_variant)
        if not imported(cache, digest, variants) and "hf" in variants:
            check_import_fits(info, len(variants))
        folders = import_gguf(info.path, cache, mlx_variants=mlx, torch_variant=torch_variant,
                              progress=progress, digest=digest)
        return folders["mlx" if mlx else torch_variant]
    if path.is_dir():
        check_model_folder(path)  # config and safetensors before anything reads the folder
        return path
    if path.is_file():
        raise ModelFileError(
            f"{path}: not a model. Give a model folder (config.json + *.safetensors) or a .gguf file."
        )
    raise ModelFileError(f"{path}: no such file or folder.")


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


DEMO_LABEL = "SmolLM2 135M Instruct (demo)"
DEMO_REFERENCE_LABEL = "SmolLM2 135M Instruct (demo, float32 reference)"
DEMO_SHORT = "Demo: SmolLM2 135M"  # where the draft is named beside it (recent pairs)
# The folders an imported GGUF is converted into: the model's name is the folder above them
VARIANT_WORDS = {"hf": "", "gguf": "", "mlx": "", "mlx-4bit": " (4-bit)"}
IMPORT_DIGEST = re.compile(r"-[0-9a-f]{12}$")  # resolve_model names an import's cache <stem>-<sha256[:12]>


def is_demo_folder(folder: Path) -> bool:
    """A folder the demo was imported into (app/models/demo.py), wherever the cache lives."""
    from app.models.demo import DEMO_NAME

    folder = Path(folder)
    return folder.parent.name == DEMO_NAME and folder.name in VARIANT_WORDS


def display_name(folder: Path) -> str:
    """A model's name as a user knows it. Imported folders are named for their variant (hf, mlx,
    mlx-4bit) inside a cache folder named for the file and its hash: show the model. A hub
    download lives in the hub's cache as models--org--name/snapshots/<commit>: show org/name."""
    folder = Path(folder)
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return "/".join(folder.parent.parent.name.split("--")[1:3])
    if is_demo_folder(folder):
        words = {"mlx-4bit": "SmolLM2 135M Instruct (demo, 4-bit)", "hf": DEMO_REFERENCE_LABEL}
        return words.get(folder.name, DEMO_LABEL)
    if folder.name in VARIANT_WORDS or folder.name.startswith("mlx-"):
        words = VARIANT_WORDS.get(folder.name, f" ({folder.name.removeprefix('mlx-')})")
        return IMPORT_DIGEST.sub("", folder.parent.name) + words
    if folder.suffix.lower() == ".gguf":
        return folder.stem
    return folder.name


def model_label(spec: str) -> str:
    """What a user named as a model ("demo", a path, a hub repo id), in the words of display_name."""
    if spec == "demo":
        return DEMO_LABEL
    from app.models.demo import DEMO_REFERENCE

    if spec == DEMO_REFERENCE:
        return DEMO_REFERENCE_LABEL
    if spec.startswith(("/", "~", ".")) or "\\" in spec or Path(spec).exists():
        return display_name(Path(spec).expanduser())
    return spec  # a hub repo id, as the hub shows it


def precision_words(precision: str) -> str:
    """"int4 (g32, float32 head)" -> "4-bit": the bits are what a user compares."""
    match = re.match(r"int(\d+)", precision)
    return f"{match.group(1)}-bit" if match else precision.split(" ")[0]
