"""What goes into a package, shared by tandem.spec, build.py and the tests that keep them valid."""

from __future__ import annotations

import re
from pathlib import Path

APP_NAME = "Tandem"
BUNDLE_ID = "app.tandem.desktop"
ROOT = Path(__file__).resolve().parent.parent
VERSION = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
DEMO_STAGE = ROOT / "build" / "stage" / "models"  # build.py copies the verified demo GGUF here
VERSION_FILE = ROOT / "build" / "stage" / "version_info.txt"  # Windows version resource, from VERSION

# Model families bundled for the PyTorch backend: transformers imports a model's module only when
# a config names it, so PyInstaller cannot see them. The catalog's families and their kin.
TORCH_FAMILIES = ("llama", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_5", "mistral", "mixtral",
                  "gemma", "gemma2", "gemma3", "phi3", "smollm3", "granite", "olmo2")
MLX_PACKAGES = ("mlx", "mlx_lm")
# Distributions whose metadata transformers, huggingface-hub and accelerate read at run time.
METADATA = ("transformers", "tokenizers", "huggingface-hub", "safetensors", "numpy", "tqdm", "regex", "packaging",
            "filelock", "pyyaml", "accelerate", "torch", "torchao", "gguf", "mlx", "mlx-lm",
            "hf-xet",  # huggingface-hub uses Xet downloads only when it finds hf-xet's metadata
            "keyring")  # finds the system's credential store through its entry points (app/remote/keys.py)
EXCLUDES = ("tkinter", "matplotlib", "IPython", "pytest", "hypothesis", "scipy", "pandas", "torchvision",
            "torchaudio", "tensorboard", "triton", "sympy.testing", "PyInstaller", "setuptools", "pip",
            "tests", "benchmarks")


def resources_datas(root: Path = ROOT) -> list[tuple[str, str]]:
    """(source, folder inside the bundle) pairs: app.paths.resources_dir() finds them there."""
    res = root / "resources"
    datas = [(str(res / "styles"), "resources/styles"), (str(res / "icons"), "resources/icons"),
             (str(res / "aligned"), "resources/aligned")]  # the demo's draft head (app/models/demo.demo_head)
    datas += [(str(res / name), "resources") for name in ("catalog.json", "NOTICE-SmolLM2.txt", "README.md")]
    datas += [(str(gguf), "resources/models") for gguf in sorted(DEMO_STAGE.glob("*.gguf"))]
    return datas


def installed(dist: str) -> bool:
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        distribution(dist)
    except PackageNotFoundError:
        return False
    return True
