"""Where an EAGLE-3 head comes from, and how it is named outside the engine: the folder an
"eagle3:<folder or hub id>" choice loads (a hub id from the hub's cache: the window downloads it
first, the runner never fetches), the heads that fit a target found in the folders beside it (a
head is usually downloaded next to its model), and its description for `tandem-cli models info`.
Array-free, like app/models/eagle3_head.py, which reads and checks the head itself."""

from __future__ import annotations

import itertools
from pathlib import Path

from app.models.eagle3_head import _json, _layer_config, _layers, _tensors, is_eagle3_head, read_eagle3
from app.models.errors import ModelFileError
from app.models.integrity import read_header

# Folders looked at beside a target: the Draft slot's menu opens at once even where the model
# sits in a crowded Downloads folder (a head is found among its first few hundred neighbours).
BESIDE_LIMIT = 256
SAFETENSORS_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}  # a header's names, in torch's words


def find_eagle3(source: str) -> Path:
    """The folder `source` names, or, for a Hugging Face id that is no folder here, its snapshot in
    the hub's cache; a ModelFileError in words where the hub head is not downloaded yet."""
    path = Path(source).expanduser()
    if path.exists():
        return path
    from app.models.hub import cached_model, parse_hub_ref

    ref = parse_hub_ref(source)
    if ref is None:
        return path  # read_eagle3 says there is no such folder
    cached = cached_model(ref)
    if cached is None:
        raise ModelFileError(f"The EAGLE-3 head {ref.repo_id} is not downloaded yet. Choose it in Tandem's window "
                             "(the Draft slot's menu downloads it), or fetch it with `hf download "
                             f"{ref.repo_id}`, then name it again.")
    return cached


def heads_beside(target: str | Path) -> list[Path]:
    """The EAGLE-3 heads in the folders beside `target` (its siblings) that fit it: a head made
    for another model is left out rather than offered to fail."""
    target = Path(target)
    config = _json(target / "config.json")
    try:
        siblings = sorted(p for p in itertools.islice(target.parent.iterdir(), BESIDE_LIMIT)
                          if p != target and p.is_dir())
    except OSError:  # an unreadable parent: nothing found beside it
        return []
    found = []
    for folder in siblings:
        if not is_eagle3_head(folder):
            continue
        try:
            read_eagle3(folder, config)
        except (ModelFileError, OSError, ValueError, TypeError):  # ValueError, TypeError: a config's odd field
            continue
        found.append(folder)
    return found


def describe_eagle3(folder: str | Path) -> list[str]:
    """What `tandem-cli models info` says of a head: its layout, layer, vocabularies, the target
    layers it reads and its weights; it fits a target only as Runner.load checks against one."""
    folder = Path(folder).expanduser()
    config = _json(folder / "config.json")
    layout = "speculators" if "speculators_model_type" in config else "EAGLE"
    layer = _layer_config(config, layout)
    files = _tensors(folder)
    # the layers' precision, from fc (d2t and t2d are integer and boolean maps beside them)
    fc = files.get("fc.weight")
    stored = str(read_header(fc[0])[0].get(fc[1], {}).get("dtype", "?")) if fc else "?"
    size = sum(path.stat().st_size for path in {p for p, _ in files.values()})
    hidden = int(layer.get("hidden_size", 0))
    target_hidden = int(config.get("target_hidden_size") or hidden)
    vocab = int(layer.get("vocab_size") or config.get("vocab_size") or 0)
    draft_vocab = int(config.get("draft_vocab_size") or layer.get("draft_vocab_size") or vocab)
    if config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
            "eagle_aux_hidden_state_layer_ids"):  # named in the config (either convention): the target's size is moot
        reads = f"the states entering the target's layers {', '.join(str(i) for i in _layers(config, 0))}"
    else:
        reads = "the target's layers 2, L // 2 and L - 3 (EAGLE-3's rule, for a target of L layers)"
    count = int(layer.get("num_hidden_layers", 1))
    mapped = f"{draft_vocab:,} of the target's {vocab:,} tokens (d2t map)" if "d2t" in files else f"{vocab:,} tokens"
    embedding = "its own copy of the embedding" if "embed_tokens.weight" in files else "the target's embedding"
    return [f"{folder.name}: EAGLE-3 head ({layout} layout), {count} {layer.get('model_type', 'llama')} decoder "
            f"layer{'s' if count != 1 else ''} {hidden} wide for a target {target_hidden} wide, {size / 1e6:.1f} MB "
            f"of {SAFETENSORS_DTYPES.get(stored, stored)} safetensors",
            f"drafts over {mapped}, reading {reads}, with {embedding}",
            f"a drafter, not a model of its own: pair it with its target (--draft eagle3:{folder})"]
