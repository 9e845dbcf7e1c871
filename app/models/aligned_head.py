"""A draft head aligned to a target (app/align/): what its folder holds, read without any array
library, so pairing can tell one apart and check it fits before anything loads.

    config.json        {"model_type": "tandem_draft_head", "hidden_size", "vocab_size",
                        "target_model_type", "target": <the target's name>}
    model.safetensors  one decoder layer under the MTP layer's checkpoint names (mtp.fc, mtp.norm,
                       mtp.layers.0.*, ...): it drafts through the MTP drafter
    manifest.json      what it was aligned to, on what, for how long, and what it measured
    draft_vocab.safetensors  (optional) one int32 tensor "ids": the tokens it drafts from
                       (app/align/draft_vocab.py); without it, the whole vocabulary
"""

from __future__ import annotations

from pathlib import Path

from app.json_fields import read_object
from app.models.errors import ModelFileError
from app.models.head_files import MAX_VOCAB, MAX_WIDTH, ConfigFields, check_safetensors_file
from app.models.integrity import read_header, unreadable
from app.models.mtp_weights import REQUIRED, MTPWeights

HEAD_TYPE = "tandem_draft_head"
WEIGHTS = "model.safetensors"
MANIFEST = "manifest.json"
DRAFT_VOCAB = "draft_vocab.safetensors"
DRAFT_VOCAB_EXTRA = 4096  # conversation tokens a draft vocabulary takes on beyond its fixed part, until a new one


def is_aligned_head(folder: str | Path) -> bool:
    return read_object(Path(folder) / "config.json").get("model_type") == HEAD_TYPE


def read_manifest(folder: str | Path) -> dict:
    return read_object(Path(folder) / MANIFEST)


def head_weights(folder: str | Path, target_config: dict) -> MTPWeights:
    """The head's tensors, checked against the target it is to draft for (its width and
    vocabulary): a ModelFileError that says which and what to do where they do not fit."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():  # said as it is: "its config.json is missing" reads as a damaged head
        if folder.is_symlink():
            try:
                folder.stat()
            except OSError as exc:
                raise ModelFileError(unreadable(folder, exc, name=str(folder))) from exc
        wrong = " is a file, not a folder" if folder.exists() else ": no such folder"
        raise ModelFileError(f"{folder}{wrong}. An aligned draft head is the folder `tandem-cli align` wrote "
                             "(head:<folder>); check the path.")
    config = read_object(folder / "config.json")
    if config.get("model_type") != HEAD_TYPE:
        raise ModelFileError(f"{folder.name} is not an aligned draft head (its config.json is missing or "
                             f"names another model type). Choose the folder `tandem-cli align` wrote.")
    text = target_config.get("text_config") or target_config
    fields = ConfigFields(folder / "config.json", config, "Align the draft again.")
    for key, most in (("hidden_size", MAX_WIDTH), ("vocab_size", MAX_VOCAB)):
        value = fields.whole(key, 1, most, None)  # typed first: "abc" is no width to compare
        if value is not None and key in text and value != int(text[key]):
            raise ModelFileError(
                f"{folder.name} was aligned to {config.get('target', 'another model')}, whose {key} is "
                f"{config[key]}; this model's is {text[key]}. Align a head to this model instead.")
    path = folder / WEIGHTS
    if not path.is_file():
        raise ModelFileError(f"{folder.name}: {WEIGHTS} is missing. Align the draft again.")
    # whole, as safetensors checks it on opening: a head cut short is refused before the target loads
    header = check_safetensors_file(path, "Align the draft again.")
    files = {key[len("mtp."):]: path for key in header if key.startswith("mtp.")}
    missing = [name for name in REQUIRED if name not in files]
    if missing or not any(name.startswith("layers.0.") for name in files):
        raise ModelFileError(f"{folder.name}: its weights are incomplete (no mtp.{(missing or ['layers.0.*'])[0]}). "
                             "Align the draft again.")
    return MTPWeights(files, "mtp.", 1)


def head_bytes(folder: str | Path) -> int:
    header = read_header(Path(folder) / WEIGHTS)[0]
    return sum(info["data_offsets"][1] - info["data_offsets"][0] for key, info in header.items()
               if key != "__metadata__" and isinstance(info, dict))


def subset_bytes(vocab: list[int] | None, text_config: dict) -> int:
    """At most what drafting from `vocab` holds beside the target (app/engine/backends/
    subset_head_*.py): copies of the target head's rows for the vocabulary and up to
    DRAFT_VOCAB_EXTRA of the conversation's tokens, counted at float32, the widest a head's rows
    are kept at (a screened head's are int8, a bfloat16 target's half this)."""
    if not vocab:
        return 0
    rows = min(len(vocab) + DRAFT_VOCAB_EXTRA, int(text_config.get("vocab_size", 2 ** 31)))
    return rows * int(text_config.get("hidden_size", 0)) * 4


def draft_vocab(folder: str | Path, vocab_size: int) -> list[int] | None:
    """The token ids the head drafts from (ascending, each below `vocab_size`), or None where the
    folder has no draft vocabulary (it drafts over the whole vocabulary). A damaged file is a
    ModelFileError that says how to go on without it."""
    import array
    import sys

    path = Path(folder) / DRAFT_VOCAB
    if not path.is_file():
        return None
    fix = (f"Delete {DRAFT_VOCAB} from {Path(folder).name} to draft over the whole vocabulary, "
           "or align the draft again.")
    header, length, size = read_header(path)
    info = header.get("ids")
    try:
        if not isinstance(info, dict) or info.get("dtype") != "I32" or len(info.get("shape", ())) != 1:
            raise ValueError("no int32 vector")
        count = int(info["shape"][0])
        start, stop = (int(x) for x in info["data_offsets"])
    except (KeyError, TypeError, ValueError):
        raise ModelFileError(f"{path.name} holds no int32 \"ids\" vector. {fix}") from None
    if not 0 <= start <= stop or stop - start != 4 * count or 8 + length + stop > size:
        raise ModelFileError(f"{path.name} is cut short or damaged. {fix}")
    ids = array.array("i")
    try:
        with open(path, "rb") as handle:
            handle.seek(8 + length + start)
            ids.frombytes(handle.read(stop - start))
    except OSError as exc:
        raise ModelFileError(unreadable(path, exc)) from exc
    if sys.byteorder == "big":  # safetensors is little-endian
        ids.byteswap()
    out = ids.tolist()
    if not out or any(b <= a for a, b in zip(out, out[1:], strict=False)) or out[0] < 0 or out[-1] >= vocab_size:
        raise ModelFileError(f"{path.name}: its ids are not distinct ascending tokens of this model's "
                             f"{vocab_size:,}. {fix}")
    return out
