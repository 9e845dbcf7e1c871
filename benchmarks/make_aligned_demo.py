"""Make the demo's aligned draft head once and put it where the app ships it:
resources/aligned/smollm2-135m-instruct-q4_1/ (config.json, model.safetensors in bfloat16,
manifest.json). Never run by the README's set-up or test commands; its output is committed.

    python benchmarks/make_aligned_demo.py --minutes 12
    python benchmarks/make_aligned_demo.py --from FOLDER   # install what `tandem-cli align --target demo` wrote
    python benchmarks/make_aligned_demo.py --device cuda --minutes 7 --self-prompts 40000 --batch 512 --no-trial
    python benchmarks/make_aligned_demo.py --measure        # the installed head's pair trial, here

On a CUDA GPU the same job answers tens of times more prompts in the same minutes (the shipped head
was made so, then measured on the CPU with --measure: the trial is this computer's, not the GPU's).

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
    parser.add_argument("--target", default="demo", help="the demo's GGUF folder, where it is not Tandem's cache")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--self-prompts", type=int, default=None)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--batch-tokens", type=int, default=None)
    parser.add_argument("--measure", action="store_true",
                        help="run the pair trial (prompt lookup, then the installed head) here and record it")
    parser.add_argument("--from", dest="source", type=Path, default=None,
                        help="install this finished `tandem-cli align --target demo` result instead of aligning")
    args = parser.parse_args()
    if args.measure:
        measure()
        return 0
    if args.source is not None:
        install(args.source, f"tandem-cli align --target demo (installed by {Path(__file__).name} --from)")
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        result = run(AlignSettings(target=args.target, minutes=args.minutes, seed=args.seed, trial=not args.no_trial,
                                   out=Path(scratch), device=args.device, self_prompts=args.self_prompts,
                                   batch=args.batch, batch_tokens=args.batch_tokens),
                     lambda p: print(f"[{p.fraction:4.0%}] {p.message}", file=sys.stderr, flush=True))
        install(result.folder, "benchmarks/make_aligned_demo.py " + " ".join(sys.argv[1:]))
        print(result.card())
    return 0


def measure() -> None:
    """The installed head's pair trial on this computer, before (prompt lookup) and after, into its
    manifest: what docs/alignment.md and the Draft slot's tooltip quote."""
    from app.align import store
    from app.align.job import Clock, _trials

    folder = demo_head_dir()
    settings = AlignSettings(target="demo")
    clock = Clock(lambda p: print(p.message))
    clock.phase("trial", 1.0, "The pair trial: prompt lookup, then the head ...")
    before, after = _trials(settings, Path("demo"), f"head:{folder}", clock, lambda: False)
    store.update_manifest(folder, trial={"before": before, "after": after})
    print(f"prompt lookup {before['speedup']:.2f}x (accepts {before['acceptance']:.0%}); "
          f"head {after['speedup']:.2f}x (accepts {after['acceptance']:.0%})")


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
