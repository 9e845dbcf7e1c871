"""Import a .gguf file into model folders the backends load natively.

One path for every GGUF: the file is checked (magic, header, every tensor's bytes present),
transformers' own GGUF reader dequantizes it into a Hugging Face folder (safetensors only), and
mlx-lm's converter turns that folder into MLX folders. Folders are built in a temporary sibling
and renamed into place only when complete, so a failed import leaves nothing half-written.

A staging folder is named for the process that builds it (pid and start time), so one left by
an import that was killed (SIGKILL, a power cut: no cleanup ran) is known for what it is and
removed by the next import, while a live import's folder is never touched.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from app.models.errors import ModelFileError
from app.models.names import display_name
from app.paths import make_output_folder

GGUF_MAGIC = b"GGUF"
IMPORT_MARKER = "tandem-import.json"
GGUF_VARIANT = "gguf"  # the import folder without weights: PyTorch reads them from the .gguf itself
GGUF_WEIGHTS = "gguf-weights.json"  # in that folder: which file holds its weights
MLX_GGUF_VARIANT = "mlx-gguf"  # MLX's quantized layers at the file's own numbers (app/models/gguf_mlx.py)
STAGING = re.compile(r"^\.[A-Za-z0-9-]+-staging-(\d+)-(\d+)-")  # .<variant>-staging-<pid>-<start>-<random>


def _started(pid: int) -> int | None:
    """A process's start time in whole seconds, or None when no such process runs."""
    import psutil

    try:
        return int(psutil.Process(pid).create_time())
    except psutil.NoSuchProcess:
        return None
    except psutil.Error:  # another user's process, a zombie: alive as far as we can tell
        return -1


def staging_prefix(variant: str) -> str:
    pid = os.getpid()
    return f".{variant}-staging-{pid}-{_started(pid)}-"


def _owner_alive(name: str) -> bool:
    found = STAGING.match(name)
    if found is None:
        return True  # not named by this scheme: not ours to judge
    started = _started(int(found.group(1)))
    # the pid may have been reused by a later process: then the start time differs
    return started is not None and started in (-1, int(found.group(2)))


def remove_stale_staging(folder: Path) -> list[Path]:
    """Remove staging folders in `folder` whose import process is gone; the ones removed."""
    removed = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:  # not there yet, or unreadable: nothing to clean
        return removed
    for entry in entries:
        if STAGING.match(entry.name) and entry.is_dir() and not entry.is_symlink() and not _owner_alive(entry.name):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


@dataclass(frozen=True)
class GGUFInfo:
    path: Path
    architecture: str
    name: str
    tensor_types: dict[str, int]  # quantization type name -> number of tensors
    n_tensors: int
    size_bytes: int
    n_params: int = 0  # elements over all tensors: what the import writes, times 4 bytes (float32)
    elements: dict[str, int] | None = None  # quantization type name -> elements stored in it
    embedding: dict[str, int] | None = None  # the same for the token embedding alone (stays float)
    head: dict[str, int] | None = None  # the same for an untied output head ("output.weight")
    head_rows: int = 0  # the output head's rows (the vocabulary): those of the embedding when tied
    stored: dict[str, int] | None = None  # quantization type name -> bytes in the file
    tokens: int = 0  # the vocabulary's tokens (tokenizer.ggml.tokens): 0 where the file holds none


def sha256_of(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


DIGESTS = "gguf-digests.json"  # in the cache folder: {resolved path: {"file": [...], "sha256": ...}}
DIGESTS_KEPT = 64  # files remembered (the most recently hashed)


def _identity(stat: os.stat_result) -> list[int]:
    """What changes when a file's bytes may have: its size, its modification time, and its inode's
    change time and number (no program can set ctime back, as `touch -d` or `cp -p` set mtime)."""
    return [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a model file, hashed once for as long as the file stays the same file
    (`_identity`): opening a .gguf named its import folder by hashing all of it at every load,
    1.0 s for a 0.67 GB file here, about 7 s for an 8B model's 4.9 GB. Remembered in the cache
    folder; a record that cannot be read or written is hashed again, never trusted."""
    from app.paths import cache_dir

    path = Path(path)
    key = str(path.resolve())
    identity = _identity(path.stat())
    try:
        records = json.loads((cache_dir() / DIGESTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # none yet, or damaged: hashed, and written afresh
        records = {}
    records = records if isinstance(records, dict) else {}
    record = records.get(key)
    if (isinstance(record, dict) and record.get("file") == identity and isinstance(record.get("sha256"), str)
            and re.fullmatch(r"[0-9a-f]{64}", record["sha256"])):
        return record["sha256"]
    digest = sha256_of(path)
    records.pop(key, None)
    records[key] = {"file": identity, "sha256": digest}  # the newest last: the oldest are dropped first
    try:
        store = cache_dir() / DIGESTS
    except OSError:  # no cache folder: hashed again next time
        return digest
    partial = store.with_name(f".{DIGESTS}.{os.getpid()}.partial")
    try:
        partial.write_text(json.dumps(dict(list(records.items())[-DIGESTS_KEPT:])), encoding="utf-8")
        os.replace(partial, store)
    except OSError:  # a read-only cache or a full disk: hashed again next time
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
    return digest


def inspect_gguf(path: str | Path) -> GGUFInfo:
    """Check that `path` is a complete GGUF file and describe it. Raises ModelFileError.
    The header is read without its metadata arrays (app/models/gguf_header.py: 0.03 s for the
    demo's, where gguf's reader parsed its vocabulary in 2.3 s), and opening a model asks several
    times (resolving, importing, the weights check, the memory check): the answer is kept for as
    long as the file's size and modification time stay the same."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file. Check the path and try again.")
    stat = path.stat()
    return replace(_inspect(str(path.resolve()), stat.st_size, stat.st_mtime_ns), path=path)


@functools.lru_cache(maxsize=8)
def _inspect(resolved: str, size: int, _mtime_ns: int) -> GGUFInfo:
    path = Path(resolved)
    with open(path, "rb") as handle:
        head = handle.read(4)
    if size == 0:
        raise ModelFileError(f"{path.name} is empty (0 bytes): the download or copy did not finish. Fetch it again.")
    if head != GGUF_MAGIC:
        raise ModelFileError(
            f"{path.name} is not a GGUF file: it starts with {head!r} instead of b'GGUF'. "
            "Choose a .gguf model file (or a model folder with config.json and safetensors)."
        )
    import gguf  # the reference reader from llama.cpp; numpy only

    from app.models.gguf_header import open_tensors, token_count  # gguf's reader, without the metadata arrays

    if size < 24:  # magic, version, tensor count and metadata count
        raise ModelFileError(f"{path.name} is truncated: {size} bytes, too few for a GGUF header. Fetch it again.")
    try:
        reader = open_tensors(path)
    except Exception as exc:  # the reader raises bare ValueError/IndexError on damaged headers
        raise ModelFileError(
            f"{path.name}: the GGUF header cannot be read ({exc}). The file is damaged or "
            "truncated; download it again."
        ) from exc
    counts: dict[str, int] = {}
    elements: dict[str, int] = {}
    embedding: dict[str, int] = {}
    head: dict[str, int] = {}
    head_rows = 0
    stored: dict[str, int] = {}
    n_params = 0
    for tensor in reader.tensors:
        n_params += int(tensor.n_elements)
        elements[tensor.tensor_type.name] = elements.get(tensor.tensor_type.name, 0) + int(tensor.n_elements)
        stored[tensor.tensor_type.name] = stored.get(tensor.tensor_type.name, 0) + int(tensor.n_bytes)
        if tensor.name.startswith("token_embd"):
            embedding[tensor.tensor_type.name] = embedding.get(tensor.tensor_type.name, 0) + int(tensor.n_elements)
        if tensor.name == "output.weight":
            head[tensor.tensor_type.name] = head.get(tensor.tensor_type.name, 0) + int(tensor.n_elements)
        if tensor.name in ("output.weight", "token_embd.weight") and len(tensor.shape) == 2:
            head_rows = max(head_rows, int(tensor.shape[1]))
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size or tensor.data.nbytes != tensor.n_bytes:
            raise ModelFileError(
                f"{path.name} is truncated: tensor '{tensor.name}' needs bytes up to {end:,} but "
                f"the file has {size:,}. The download is incomplete; fetch the file again."
            )
        kind = tensor.tensor_type.name
        _check_type(gguf, path, tensor)
        counts[kind] = counts.get(kind, 0) + 1
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise ModelFileError(f"{path.name}: GGUF metadata has no general.architecture.")
    architecture = str(arch_field.contents())
    name_field = reader.fields.get("general.name")
    name = str(name_field.contents()) if name_field is not None else path.stem
    return GGUFInfo(path, architecture, name, counts, len(reader.tensors), size, n_params, elements=elements,
                    embedding=embedding, head=head, head_rows=head_rows, stored=stored, tokens=token_count(reader))


def check_vocabulary(info: GGUFInfo) -> None:
    """A model file needs its vocabulary to be imported or loaded: without one, transformers' GGUF
    reader failed deep inside (KeyError: 'tokens'; "Padding_idx must be within num_embeddings" where
    the model was built with no rows). Describing it (`models info`) needs none."""
    if info.tokens == 0:
        raise ModelFileError(
            f"{info.path.name}: this GGUF holds no vocabulary (its tokenizer.ggml.tokens list is empty or "
            "missing), so no text can be turned into its tokens. Choose the model's complete .gguf file.")


def _check_type(gguf, path: Path, tensor) -> None:
    """A tensor of a type nothing here reads (Tandem's kernel takes gguf_codes.KERNEL_TYPES, gguf's
    own dequantization the rest of its table), or whose rows are not whole blocks of its type, is
    refused before anything loads, naming the tensor."""
    kind = tensor.tensor_type.name
    if kind not in ("F32", "F16") and tensor.tensor_type not in gguf.quants._type_traits:
        readable = sorted({"F32", "F16"} | {t.name for t in gguf.quants._type_traits})
        raise ModelFileError(
            f"{path.name}: tensor '{tensor.name}' is stored as {kind}, a type Tandem cannot read (it reads "
            f"{', '.join(readable)}). Choose a file of another quantization, such as Q4_K_M.")
    block = gguf.GGML_QUANT_SIZES[tensor.tensor_type][0]
    if len(tensor.shape) and int(tensor.shape[0]) % block:
        raise ModelFileError(
            f"{path.name}: tensor '{tensor.name}' ({kind}) has rows of {int(tensor.shape[0])} weights, not whole "
            f"blocks of {block}: the file is damaged. Fetch it again.")


def is_gguf_folder(folder: Path) -> bool:
    """An import folder whose weights stay in the .gguf (GGUF_VARIANT)."""
    return (Path(folder) / GGUF_WEIGHTS).is_file()


def imported_from_gguf(folder: Path) -> bool:
    """A folder Tandem's GGUF import wrote (either PyTorch variant: its tokenizer files are ours)."""
    return is_gguf_folder(folder) or (Path(folder).parent / IMPORT_MARKER).is_file()


def gguf_source(folder: Path) -> Path:
    """The .gguf file an imported folder came from (its import record, or the file beside it, as
    the demo keeps it). Raises ModelFileError when neither is there any more."""
    folder = Path(folder)
    recorded = None
    for marker in (folder / GGUF_WEIGHTS, folder.parent / IMPORT_MARKER):
        if recorded is None and marker.is_file():
            try:
                recorded = json.loads(marker.read_text()).get("source")
            except (OSError, ValueError, AttributeError):
                recorded = None
    if recorded and Path(recorded).is_file():
        return Path(recorded)
    name = display_name(folder)  # the model, not the cache folder an import's variants sit in
    # a folder no import made has no .gguf of its own: one that happens to lie beside it is another model
    if not is_gguf_folder(folder) and not (folder.parent / IMPORT_MARKER).is_file():
        raise ModelFileError(
            f"{name} is a folder of safetensors weights, not imported from a .gguf file, so it has no GGUF "
            "precisions to load at (precision gguf, self:gguf). Choose another precision (e.g. int4, or self:int4 "
            "as the draft), or open the model's .gguf file itself.")
    beside = sorted(folder.parent.glob("*.gguf"))
    if len(beside) == 1:
        return beside[0]
    where = f" ({recorded} is gone)" if recorded else ""
    raise ModelFileError(
        f"{name}: loading at the GGUF's own precisions needs the .gguf file it was imported "
        f"from{where}. Open the .gguf file itself, or choose another precision.")


def import_variants(mlx_variants: tuple[str, ...] = ("mlx",), torch_variant: str | None = "hf") -> tuple[str, ...]:
    """The folders an import builds, in order: MLX's are converted from "hf", so it comes first
    (all but MLX_GGUF_VARIANT, which reads the .gguf itself)."""
    wanted = [torch_variant] if torch_variant else []
    if any(v != MLX_GGUF_VARIANT for v in mlx_variants) and "hf" not in wanted:
        wanted.insert(0, "hf")
    return (*wanted, *mlx_variants)


def imported(out_dir: Path, digest: str, variants: tuple[str, ...]) -> bool:
    """Whether `out_dir` already holds a complete import of the file with this SHA-256, with
    every folder in `variants` (import_variants)."""
    marker = Path(out_dir) / IMPORT_MARKER
    if not marker.is_file():
        return False
    record = json.loads(marker.read_text())
    return record.get("sha256") == digest and all(
        v in record.get("variants", {}) and (Path(out_dir) / v).is_dir() for v in variants)


def import_gguf(
    gguf_path: str | Path,
    out_dir: str | Path,
    *,
    mlx_variants: tuple[str, ...] = ("mlx",),
    torch_variant: str | None = "hf",
    progress=None,
    digest: str | None = None,
) -> dict[str, Path]:
    """Convert `gguf_path` into `out_dir/<torch_variant>` (+ `out_dir/<variant>` for MLX variants).

    PyTorch's folder is "hf" (the weights dequantized to float32 safetensors, the reference) or
    "gguf" (config and tokenizer only: PyTorch reads the weights from the GGUF at their own
    precisions, app/models/gguf_torch.py; nothing is dequantized or copied). MLX's are "mlx-gguf"
    (MLX quantized layers at the file's own numbers, written from the .gguf itself:
    app/models/gguf_mlx.py), and "mlx" (float32) and "mlx-4bit" (affine, group 32: the same grid as
    GGUF's Q4_0/Q4_1 blocks), built from "hf". Returns {"hf": path, "mlx": path, ...}. Idempotent: an existing
    complete import of the same file (checked by size and hash) is reused. `digest`: the file's
    SHA-256 when the caller has already computed it.
    """
    info = inspect_gguf(gguf_path)
    check_vocabulary(info)  # before any folder is made
    out_dir = make_output_folder(Path(out_dir), "the imported model folders")  # before hashing a large file
    say = progress or (lambda message: None)
    digest = digest or file_sha256(info.path)
    marker = out_dir / IMPORT_MARKER
    wanted = {v: out_dir / v for v in import_variants(mlx_variants, torch_variant)}
    done: dict[str, str] = {}
    if marker.is_file():
        record = json.loads(marker.read_text())
        if record.get("sha256") == digest:
            done = record.get("variants", {})
    result: dict[str, Path] = {}
    for folder in (out_dir, *_sibling_imports(out_dir)):
        for stale in remove_stale_staging(folder):
            say(f"Removed {stale}, left by an import that did not finish.")
    for variant, target in wanted.items():
        if variant in done and target.is_dir():
            result[variant] = target
            continue
        say(f"Reading the model description and vocabulary of {info.path.name} ..." if variant == GGUF_VARIANT
            else f"Converting {info.path.name} to {variant} ...")
        with tempfile.TemporaryDirectory(prefix=staging_prefix(variant), dir=out_dir) as tmp:
            staging = Path(tmp) / variant
            if variant in ("hf", GGUF_VARIANT):
                from app.models.transformers_convert import gguf_to_hf_folder

                if variant == "hf":
                    gguf_to_hf_folder(info.path, staging)
                else:
                    gguf_to_hf_folder(info.path, staging, weights=False)
                    (staging / GGUF_WEIGHTS).write_text(json.dumps(
                        {"source": str(info.path.resolve()), "sha256": digest, "bytes": info.size_bytes}))
            elif variant == MLX_GGUF_VARIANT:
                from app.models.gguf_mlx import gguf_to_mlx_folder

                gguf_to_mlx_folder(info.path, staging, progress=say)
            else:
                from app.models.mlx_convert import hf_to_mlx_folder

                bits = 4 if variant.endswith("4bit") else None
                hf_to_mlx_folder(result["hf"], staging, bits=bits)
            if target.exists():
                shutil.rmtree(target)
            staging.rename(target)
        done[variant] = "ok"
        marker.write_text(json.dumps({"source": str(info.path), "sha256": digest, "variants": done}))
        result[variant] = target
    return result



def _sibling_imports(out_dir: Path) -> list[Path]:
    """Other imports in the model cache (an import killed there may be of another file); only
    inside Tandem's own cache, never across a user's folder."""
    from app.paths import models_dir

    try:
        cache = models_dir().resolve()
        if out_dir.resolve().parent != cache:
            return []
        return [entry for entry in cache.iterdir() if entry.is_dir() and entry.resolve() != out_dir.resolve()]
    except OSError:
        return []
