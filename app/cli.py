"""tandem-cli: the headless face of the same runner the window uses."""

from __future__ import annotations

import argparse
import sys

from app.engine.events import Finished, Notice, PromptTooLongError, Round
from app.engine.sampling import SamplingParams
from app.models.errors import ModelFileError
from app.models.pairing import PairingError


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_demo(args) -> int:
    from app.models.demo import ensure_demo

    for variant, folder in ensure_demo(_progress).items():
        print(f"{variant}\t{folder}")
    return 0


def cmd_import(args) -> int:
    from app.models.gguf_import import import_gguf

    variants = tuple(v for v in args.variants.split(",") if v and v != "hf")
    for variant, folder in import_gguf(args.gguf, args.out, mlx_variants=variants,
                                       progress=_progress).items():
        print(f"{variant}\t{folder}")
    return 0


def _draft_tokens(value: str) -> int | None:
    if value == "auto":
        return None
    k = int(value)
    if not 1 <= k <= 32:
        raise argparse.ArgumentTypeError("--draft-tokens takes auto or a number from 1 to 32")
    return k


def _show_round(event: Round, token_text) -> None:
    """One line per round on stderr: +accepted -rejected => the target's own token."""
    if not event.drafted:
        return
    accepted = " ".join("+" + repr(token_text(t)) for t in event.drafted[: event.accepted])
    rejected = " ".join("-" + repr(token_text(t)) for t in event.drafted[event.accepted :])
    own = event.emitted[event.accepted :] if len(event.emitted) > event.accepted else ()
    line = f"[round {event.index} k={event.k}] {accepted} {rejected}".rstrip()
    if own:
        line += f" => {token_text(own[-1])!r}"
    print(line, file=sys.stderr, flush=True)


def cmd_generate(args) -> int:
    from app.runner import ChatRequest, Runner

    runner = Runner()
    loaded = runner.load(args.model, args.backend, draft=args.draft, progress=_progress)
    _progress(f"Loaded {loaded.describe()} in {loaded.load_s:.1f}s")
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    messages.append({"role": "user", "content": args.prompt})
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            seed=args.seed)
    request = ChatRequest(tuple(messages), max_tokens=args.max_tokens, params=params,
                          draft_tokens=args.draft_tokens)
    for event in runner.chat(request):
        if isinstance(event, Notice):
            _progress(event.message)
        elif isinstance(event, Round):
            if args.show_rounds:
                _show_round(event, runner.tokenizer.token_text)
            sys.stdout.write(event.text)
            sys.stdout.flush()
        elif isinstance(event, Finished):
            sys.stdout.write("\n")
            print(event.stats.summary(), file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem-cli", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="fetch and convert the offline demo model (once)")
    demo.set_defaults(func=cmd_demo)

    imp = sub.add_parser("import", help="convert a .gguf file into model folders")
    imp.add_argument("gguf")
    imp.add_argument("out")
    imp.add_argument("--variants", default="hf,mlx", help="comma list of hf, mlx, mlx-4bit")
    imp.set_defaults(func=cmd_import)

    gen = sub.add_parser("generate", help="stream an answer to one prompt")
    gen.add_argument("--model", "--target", dest="model", default="demo",
                     help='model folder, .gguf file, or "demo" (default)')
    gen.add_argument("--draft", default="none",
                     help='draft model folder or .gguf, "ngram" (prompt lookup), or "none"')
    gen.add_argument("--draft-tokens", type=_draft_tokens, default=None, metavar="auto|N",
                     help="draft length: auto (adaptive, the default) or a fixed N")
    gen.add_argument("--show-rounds", action="store_true",
                     help="print each round's accepted (+) and rejected (-) drafts to stderr")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--system", default=None)
    gen.add_argument("--backend", choices=["mlx", "torch"], default=None)
    gen.add_argument("--max-tokens", type=int, default=256)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(func=cmd_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ModelFileError, PairingError, PromptTooLongError, ValueError) as exc:
        print(f"tandem-cli: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
