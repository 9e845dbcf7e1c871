"""Are a folder's weights whole? Read from the safetensors headers alone (8 bytes of length,
then JSON naming each tensor's byte range), so multi-gigabyte files are checked in
milliseconds: a corrupt header, a file cut short by an interrupted copy or download, a shard
the index names but the folder lacks."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from app.models.errors import ModelFileError
from app.models.folder import check_model_folder
from app.models.names import display_name

MAX_HEADER = 100 * 1024 * 1024  # the safetensors format's own limit on the JSON header


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 100_000 else f"{n:,} bytes"


def unreadable(path: Path, exc: OSError, name: str | None = None) -> str:
    """Why a model file cannot be opened, in words: a symbolic link that loops or points nowhere,
    a folder where a file belongs, or the system's own reason. `name`: how to name it (its file
    name by default)."""
    name = name or path.name or str(path)
    if path.is_symlink():
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        if exc.errno == errno.ELOOP:
            return (f"{name} is a symbolic link that loops (to {target}, which leads back to itself), so there is "
                    "no file to read. Replace the link with the file itself or a link to the real file.")
        if exc.errno == errno.ENOENT:
            return (f"{name} is a symbolic link to {target}, which does not exist (moved or deleted). Put the file "
                    "back, or replace the link with the file itself.")
    if exc.errno == errno.EISDIR or path.is_dir():
        return f"{name} is a folder, but a weights file is expected there. Copy the model's files again."
    return (f"{name} cannot be read ({exc.strerror or type(exc).__name__}). Check that the file is there and that "
            "you may read it.")


def read_header(path: Path) -> tuple[dict, int, int]:
    """A safetensors file's JSON header, its length and the file's size; ModelFileError naming
    the file when the header is damaged."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise ModelFileError(f"{path.name} is empty or cut short ({size} bytes). Download or copy it again.")
            length = int.from_bytes(head, "little")
            if length > MAX_HEADER or 8 + length > size:
                raise ModelFileError(
                    f"{path.name}: the safetensors header is corrupt (it claims {length:,} bytes of header in a "
                    f"file of {size:,}). The file is damaged or not safetensors; download it again.")
            raw = handle.read(length)
    except OSError as exc:
        raise ModelFileError(unreadable(path, exc)) from exc
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{path.name}: the safetensors header is corrupt ({exc}). Download it again.") from exc
    if not isinstance(header, dict):
        raise ModelFileError(f"{path.name}: the safetensors header is corrupt. Download it again.")
    return header, length, size


def check_safetensors(path: Path) -> int:
    """Bytes of tensor data in `path`; ModelFileError naming the file when it is damaged."""
    header, length, size = read_header(path)
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFileError(f"{path.name}: tensor {name!r} has no valid byte range; the file is corrupt.") from exc
        end = max(end, stop)
    if 8 + length + end > size:
        raise ModelFileError(
            f"{path.name} is truncated: its tensors need {_mb(8 + length + end)} but the file has {_mb(size)}. "
            "The download or copy was interrupted; fetch the file again.")
    return end


def check_weights(folder: str | Path) -> int:
    """Total bytes of weights in a model folder, after checking every safetensors file and, for a
    sharded model, that every shard its index names is there."""
    folder = Path(folder)
    check_model_folder(folder)
    from app.models.gguf_import import gguf_source, inspect_gguf, is_gguf_folder

    if is_gguf_folder(folder):  # weights read from the .gguf itself: check that file is whole
        return inspect_gguf(gguf_source(folder)).size_bytes
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except OSError as exc:
            raise ModelFileError(unreadable(index, exc)) from exc
        except (ValueError, KeyError, AttributeError, TypeError) as exc:
            raise ModelFileError(f"{index.name} is damaged ({exc}); download the model again.") from exc
        if not all(isinstance(shard, str) and shard for shard in shards):
            raise ModelFileError(f"{index.name} is damaged (its weight_map names no files); download the model again.")
        for shard in shards:
            if (folder / shard).is_symlink():  # a link that loops or points nowhere: say so, not "missing"
                check_safetensors(folder / shard)
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            raise ModelFileError(
                f"{display_name(folder)} is a partial download: {len(missing)} of {len(shards)} weight files are "
                f"missing ({', '.join(missing[:3])}). Download the model again; a hub download resumes where it "
                "stopped.")
        files = [folder / s for s in shards]
    else:
        files = sorted(folder.glob("*.safetensors"))
    return sum(check_safetensors(path) for path in files)
