"""Make the demo's aligned draft head once and put it where the app ships it:
resources/aligned/smollm2-135m-instruct-q4_1/ (config.json, model.safetensors in bfloat16,
manifest.json). Never run by the README's set-up or test commands; its output is committed.

    python benchmarks/make_aligned_demo.py --minutes 12
    python benchmarks/make_aligned_demo.py --from FOLDER   # install what `tandem-cli align --target demo` wrote

It runs the same job as `tandem-cli align --target demo` (the GGUF at its own precisions as the
pair runs it; its float32 dequantization as the teacher), with the pair trial before (prompt
lookup, the demo's draft until now) and after, then copies the result in and names the target as
"demo" (the file's SHA-256) instead of this machine's cache folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.align.job import AlignSettings, run  # noqa: E402
from app.models.demo import DEMO_GGUF, DEMO_SHA256, demo_head_dir  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=12.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-trial", action="store_true")
    parser.add_argument("--from", dest="source", type=Path, default=None,
                        help="install this finished `tandem-cli align --target demo` result instead of aligning")
    args = parser.parse_args()
    if args.source is not None:
        install(args.source, f"tandem-cli align --target demo (installed by {Path(__file__).name} --from)")
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        result = run(AlignSettings(target="demo", minutes=args.minutes, seed=args.seed, trial=not args.no_trial,
                                   out=Path(scratch)),
                     lambda p: print(f"[{p.fraction:4.0%}] {p.message}", file=sys.stderr, flush=True))
        install(result.folder, f"benchmarks/make_aligned_demo.py --minutes {args.minutes:g} --seed {args.seed}")
        print(result.card())
    return 0


def install(folder: Path, made_by: str) -> None:
    """Copy an aligned demo head into resources/, its manifest naming the demo, not this machine's cache."""
    manifest = json.loads((folder / "manifest.json").read_text())
    if manifest.get("kind") != "head" or "smollm2-135m-instruct" not in manifest.get("target", {}).get("folder", ""):
        raise SystemExit(f"{folder} is not a draft head aligned to the demo")
    out = demo_head_dir()
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(folder, out)
    manifest["target"] = {"name": "SmolLM2 135M Instruct (demo)", "folder": "demo", "file": DEMO_GGUF,
                          "sha256": DEMO_SHA256}
    manifest["made_by"] = made_by
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"installed {out}")


if __name__ == "__main__":
    sys.exit(main())
