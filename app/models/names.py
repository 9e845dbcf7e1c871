"""A model's name as a user knows it, from the folder it loads from. An import's folder is named
for its variant (hf, gguf, mlx) and a hub download for its commit, so a message that names the
folder itself ("gguf has no built-in ...") names nothing the user chose. A leaf module (it imports
nothing of Tandem's), so every loader and drafter, and DraftChoice's labels (app/draft_choice.py),
can name its model in these words."""

from __future__ import annotations

import re
from pathlib import Path

DEMO_NAME = "smollm2-135m-instruct"  # the demo's folder in the model cache (app/models/demo.py)
DEMO_LABEL = "SmolLM2 135M Instruct (demo)"
DEMO_REFERENCE_LABEL = "SmolLM2 135M Instruct (demo, float32 reference)"
DEMO_SHORT = "Demo: SmolLM2 135M"  # where the draft is named beside it (recent pairs)
DEMO_REFERENCE = "demo:float32"  # what a user names the demo's float32 reference by (app/models/demo.py)
# The folders an imported GGUF is converted into: the model's name is the folder above them
VARIANT_WORDS = {"hf": "", "gguf": "", "mlx": "", "mlx-4bit": " (4-bit)"}
IMPORT_DIGEST = re.compile(r"-[0-9a-f]{12}$")  # resolve_model names an import's cache <stem>-<sha256[:12]>


def is_demo_folder(folder: Path) -> bool:
    """A folder the demo was imported into (app/models/demo.py), wherever the cache lives."""
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
    if spec == DEMO_REFERENCE:
        return DEMO_REFERENCE_LABEL
    if spec.startswith(("/", "~", ".")) or "\\" in spec or Path(spec).exists():
        return display_name(Path(spec).expanduser())
    return spec  # a hub repo id, as the hub shows it


def precision_words(precision: str) -> str:
    """"int4 (g32, float32 head)" -> "4-bit": the bits are what a user compares."""
    match = re.match(r"int(\d+)", precision)
    return f"{match.group(1)}-bit" if match else precision.split(" ")[0]
