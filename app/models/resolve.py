"""Turn what a user names (a folder, a .gguf file, "demo") into a folder a backend loads."""

from __future__ import annotations

from pathlib import Path

from app.models.errors import ModelFileError
from app.models.folder import check_model_folder
from app.models.gguf_import import import_gguf, inspect_gguf, sha256_of
from app.paths import models_dir


def resolve_model(spec: str | Path, backend: str, progress=print) -> Path:
    if str(spec) == "demo":
        from app.models.demo import demo_folder

        return demo_folder(backend, progress)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        info = inspect_gguf(path)
        digest = sha256_of(path)
        cache = models_dir() / f"{path.stem}-{digest[:12]}"
        variants = ("mlx",) if backend == "mlx" else ()
        folders = import_gguf(info.path, cache, mlx_variants=variants, progress=progress,
                              digest=digest)
        return folders["mlx" if backend == "mlx" else "hf"]
    if path.is_dir():
        check_model_folder(path)  # config and safetensors before anything reads the folder
        return path
    if path.is_file():
        raise ModelFileError(
            f"{path}: not a model. Give a model folder (config.json + *.safetensors) or a .gguf file."
        )
    raise ModelFileError(f"{path}: no such file or folder.")


def display_name(folder: Path) -> str:
    """Imported folders are named for their variant (hf, mlx, mlx-4bit): show the model too.
    A hub download lives in the hub's cache as models--org--name/snapshots/<commit>: show org/name."""
    folder = Path(folder)
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return "/".join(folder.parent.parent.name.split("--")[1:3])
    if folder.name in ("hf", "mlx") or folder.name.startswith("mlx-"):
        return f"{folder.parent.name}/{folder.name}"
    return folder.name
