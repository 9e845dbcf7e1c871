"""Where a published drafter that reads the target's inner states comes from, and how it is named
outside the engine: an EAGLE-3 head (app/models/eagle3_head.py) or a DFlash block drafter
(app/models/dflash_head.py). The folder an "eagle3:<folder or hub id>" or "dflash:<folder or hub
id>" choice loads (a hub id from the hub's cache: the window downloads it first, the runner never
fetches), the drafters that fit a target found in the folders beside it (one is usually
downloaded next to its model), and what `tandem-cli models info` says of one. Array-free, like the
two modules that read and check each kind's folder."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.json_fields import read_object
from app.draft_choice import DraftChoice, DraftKind
from app.models import dflash_head, eagle3_head
from app.models.errors import ModelFileError
from app.models.integrity import read_header

# Folders looked at beside a target: the Draft slot's menu opens at once even where the model
# sits in a crowded Downloads folder (a drafter is found among its first few hundred neighbours).
BESIDE_LIMIT = 256
SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}  # a header's names, in torch's words


def describe_eagle3(folder: Path) -> list[str]:
    """A head's layout, layer, vocabularies, the target layers it reads and its weights; a
    ModelFileError naming the file and the field where Tandem would refuse the head whatever its
    target (a damaged config or weights file)."""
    own = eagle3_head.read_config(folder)
    files = eagle3_head._tensors(folder)
    # the layers' precision, from fc (d2t and t2d are integer and boolean maps beside them)
    fc = files.get("fc.weight")
    stored = str(read_header(fc[0])[0].get(fc[1], {}).get("dtype", "?")) if fc else "?"
    size = sum(path.stat().st_size for path in {p for p, _ in files.values()})
    hidden, vocab = own.shape.hidden, own.vocab or 0
    draft_vocab = own.draft_vocab or vocab
    if own.layers:  # named in the config (either convention): the target's size is moot
        reads = f"the states entering the target's layers {', '.join(str(i) for i in own.layers)}"
    else:
        reads = "the target's layers 2, L // 2 and L - 3 (EAGLE-3's rule, for a target of L layers)"
    count = own.shape.layers
    mapped = f"{draft_vocab:,} of the target's {vocab:,} tokens (d2t map)" if "d2t" in files else f"{vocab:,} tokens"
    embedding = "its own copy of the embedding" if "embed_tokens.weight" in files else "the target's embedding"
    return [f"{folder.name}: EAGLE-3 head ({own.layout} layout), {count} {own.layer_config.get('model_type', 'llama')} "
            f"decoder layer{'s' if count != 1 else ''} {hidden} wide for a target {own.target_hidden} wide, "
            f"{size / 1e6:.1f} MB of {SAFETENSORS_DTYPES.get(stored, stored)} safetensors",
            f"drafts over {mapped}, reading {reads}, with {embedding}"]


def describe_dflash(folder: Path) -> list[str]:
    """A drafter's layers, block, mask token, the target layers it reads and its weights; a
    ModelFileError naming the file and the field where Tandem would refuse the drafter whatever
    its target (a damaged config or weights file, a block longer than a round drafts)."""
    own = dflash_head.read_config(folder)
    files = dflash_head._tensors(folder)
    fc = files.get("fc.weight")
    stored = str(read_header(fc)[0].get("fc.weight", {}).get("dtype", "?")) if fc else "?"
    size = sum(path.stat().st_size for path in set(files.values()))
    count, block, target_count = own.shape.layers, own.block_size, own.target_layer_count
    target = f" for a target of {target_count} layers" if target_count is not None else ""
    theirs = own.target_layer_ids or (dflash_head.default_layers(target_count, count)
                                      if target_count is not None else None)
    if theirs:  # z-lab names the output of layer i, the state entering layer i + 1 in Tandem's count
        reads = f"the states entering the target's layers {', '.join(str(int(i) + 1) for i in theirs)}"
    else:
        reads = f"{count} of the target's layers spread from 2 to L - 2 (z-lab's rule, for a target of L layers)"
    return [f"{folder.name}: DFlash block drafter, {count} qwen3 decoder layer{'s' if count != 1 else ''} "
            f"{own.shape.hidden} wide{target}, {size / 1e6:.1f} MB of {SAFETENSORS_DTYPES.get(stored, stored)} "
            "safetensors",
            f"drafts a block of {block} (up to {block - 1} tokens a pass) from mask token {own.mask_token_id}, "
            f"reading {reads}, with the target's embedding and head"]


def check_tensors(name: str, what: str, found: dict, wanted: dict, shown: Callable[[str], str] = str) -> None:
    """Every tensor a loader's modules want (`wanted`: name -> shape) in what the folder `name`
    holds (`found`: name -> shape), each named as the checkpoint names it (`shown`); a
    ModelFileError for the first one missing or of another shape, before any is loaded."""
    for tensor, shape in wanted.items():
        if tensor not in found:
            raise ModelFileError(f"{name}: its weights are incomplete (no {shown(tensor)}). Download the {what} again.")
        if tuple(found[tensor]) != tuple(shape):
            raise ModelFileError(f"{name}: {shown(tensor)} is {list(found[tensor])}, where a {what} of its config has "
                                 f"{list(shape)}. The file is damaged or belongs to another {what}.")


@dataclass(frozen=True)
class HeadKind:
    words: str  # what messages and the Draft slot's menu call one
    is_head: Callable[[str | Path], bool]  # from its config alone
    # (folder, target_config, weights=True): the drafter checked against a target, a ModelFileError
    # in words where it does not fit; weights=False checks its config alone (a hub download's first files)
    read: Callable[..., object]
    describe: Callable[[Path], list[str]]


HEADS = {DraftKind.EAGLE3: HeadKind("EAGLE-3 head", eagle3_head.is_eagle3_head, eagle3_head.read_eagle3,
                                    describe_eagle3),
         DraftKind.DFLASH: HeadKind("DFlash drafter", dflash_head.is_dflash_head, dflash_head.read_dflash,
                                    describe_dflash)}


def head_kind(folder: str | Path) -> DraftKind | None:
    """The kind of published drafter `folder` holds (its config says), or None for anything else."""
    return next((kind for kind, head in HEADS.items() if head.is_head(folder)), None)


def find_head(source: str, kind: DraftKind) -> Path:
    """The folder `source` names, or, for a Hugging Face id that is no folder here, its snapshot in
    the hub's cache; a ModelFileError in words where the hub drafter is not downloaded yet."""
    path = Path(source).expanduser()
    if path.exists():
        return path
    from app.models.hub import cached_model, parse_hub_ref

    ref = parse_hub_ref(source)
    if ref is None:
        return path  # reading it says there is no such folder
    cached = cached_model(ref)
    if cached is None:
        raise ModelFileError(f"The {HEADS[kind].words} {ref.repo_id} is not downloaded yet. Choose it in Tandem's "
                             "window (the Draft slot's menu downloads it), or fetch it with `hf download "
                             f"{ref.repo_id}`, then name it again.")
    return cached


def heads_beside(target: str | Path) -> list[DraftChoice]:
    """The published drafters in the folders beside `target` (its siblings) that fit it, as the
    choices that load them: one made for another model is left out rather than offered to fail."""
    target = Path(target)
    config = read_object(target / "config.json")
    try:
        siblings = sorted(p for p in itertools.islice(target.parent.iterdir(), BESIDE_LIMIT)
                          if p != target and p.is_dir())
    except OSError:  # an unreadable parent: nothing found beside it
        return []
    found = []
    for folder in siblings:
        kind = head_kind(folder)
        if kind is None:
            continue
        try:
            HEADS[kind].read(folder, config)
        except (ModelFileError, OSError, ValueError, TypeError):  # ValueError, TypeError: a config's odd field
            continue
        found.append(DraftChoice(kind, source=str(folder)))
    return found


def describe_head(folder: str | Path) -> list[str] | None:
    """What `tandem-cli models info` says of a published drafter (None: the folder holds none);
    it fits a target only as Runner.load checks against one."""
    folder = Path(folder).expanduser()
    kind = head_kind(folder)
    if kind is None:
        return None
    return HEADS[kind].describe(folder) + [f"a drafter, not a model of its own: pair it with its target "
                                           f"(--draft {DraftChoice(kind, source=str(folder))})"]
