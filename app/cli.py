"""tandem-cli: the headless face of the same runner the window uses."""

from __future__ import annotations

import argparse
import errno
import logging
import re
import sys

# the option types live in app/cli_types.py (app/align/command.py uses them too); still importable from here
from app.cli_types import MODEL, at_least_one, draft_choice, named, real_number, whole_number
from app.engine.backends.base import COMPILE_CHOICES
from app.engine.events import Finished, Notice, PrefillProgress, PromptTooLongError
from app.engine.sampling import SamplingParams
from app.exit_signals import close_engine, exit_code, raise_on_sigterm
from app.remote.command import bench_remote, remote_options, target_spec
from app.models.errors import ModelFileError
from app.models.pairing import PairingError
from app.paths import FolderError


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_demo(args) -> int:
    from app.models.demo import ensure_demo

    for variant, folder in ensure_demo(_progress).items():
        print(f"{variant}\t{folder}")
    return 0


def cmd_import(args) -> int:
    from app.models.gguf_import import import_gguf

    named = [v for v in args.variants.split(",") if v]
    mlx = tuple(v for v in named if v.startswith("mlx"))
    torch_variant = "gguf" if "gguf" in named else ("hf" if "hf" in named else None)
    for variant, folder in import_gguf(args.gguf, args.out, mlx_variants=mlx, torch_variant=torch_variant,
                                       progress=_progress).items():
        print(f"{variant}\t{folder}")
    return 0


# Like the shared types (app/cli_types.py), raises ArgumentTypeError with the words to show.
def _draft_tokens(value: str) -> int | None:
    if value.strip().lower() == "auto":
        return None
    try:
        k = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value[:40]!r} is not a whole number: --draft-tokens takes auto or a "
                                         "number from 1 to 32") from None
    if not 1 <= k <= 32:
        raise argparse.ArgumentTypeError("--draft-tokens takes auto or a number from 1 to 32")
    return k


GRAPHS_HELP = ("how a PyTorch model's decode and verify passes run on an NVIDIA GPU: auto (replayed as captured CUDA "
               "graphs where the model allows it) or off (eagerly); docs/performance.md")
GLUE_HELP = ("the glue between a PyTorch model's matmuls (norms, RoPE, activations): auto (fused by torch.compile "
             "where passes replay as CUDA graphs), on (fused wherever the lean step runs; the CPU needs a C++ "
             "compiler), off (eager ops); docs/performance.md")
COMPILE_HELP = ("how a PyTorch target decodes: auto (compiled where that measured faster; so far nowhere), "
                "on (compiled decoder layers, checked against eager at load), off (eager)")
CONTEXT_HELP = ("the most tokens a chat may hold (default: the model's own, or less where memory holds less); "
                "longer chats leave out their oldest turns")
PRECISION_CHOICES = ["auto", "float32", "bfloat16", "float16", "int4", "int4-bf16-head", "int4-head", "gguf"]


def _text(option: str, value: str | None) -> str | None:
    """Text from the command line as the tokenizer needs it. On Linux, bytes that are not UTF-8
    reach Python as lone surrogates (PEP 383), which tokenizers refuse with a TypeError."""
    if value is None:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{option} is not valid UTF-8 text (an undecodable byte at character {exc.start + 1}). "
                         "Check the terminal's or the script's encoding, and pass the text in UTF-8.") from None
    return value


def _check_link(spec: str | None) -> None:
    """A model named through a symbolic link that loops or points nowhere: say so, rather than
    "no such file" (the loader's checks cover every other case)."""
    from pathlib import Path

    from app.models.integrity import unreadable

    if not spec:
        return
    path = Path(spec).expanduser()
    try:
        broken = path.is_symlink() and not path.exists()
    except OSError:  # a name too long, say: the loader's own message
        return
    if broken:
        try:
            path.stat()
        except OSError as exc:
            raise ModelFileError(unreadable(path, exc, name=str(path))) from exc


def _sampling(args) -> SamplingParams:
    """Checked before any model loads, so a bad value costs no loading time."""
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)


def _show_round(trace) -> None:
    """One line per round on stderr, from its chips (app/chat/trace.py; a remote Tandem's too):
    +accepted -rejected => the target's own token."""
    from app.chat.trace import ACCEPTED, REJECTED, TARGET

    if not trace.drafted:
        return
    accepted = " ".join("+" + repr(c.text) for c in trace.chips if c.kind == ACCEPTED)
    rejected = " ".join("-" + repr(c.text) for c in trace.chips if c.kind == REJECTED)
    own = [c for c in trace.chips if c.kind == TARGET]
    line = f"[round {trace.index} k={trace.k}] {accepted} {rejected}".rstrip()
    if own:
        line += f" => {own[-1].text!r}"
    print(line, file=sys.stderr, flush=True)


def cmd_generate(args) -> int:
    from app.chat.thinking import THINKING
    from app.runner import ChatRequest
    from app.service import RunnerService, Text, Traced

    params = _sampling(args)
    system, prompt = _text("--system", args.system), _text("--prompt", args.prompt)
    _check_link(args.model)
    _check_link(args.draft.source)
    messages = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": prompt})
    target = target_spec(args)
    service = RunnerService()  # the same service the window and the server are clients of
    try:
        loaded = service.load(target, args.backend, draft=args.draft, precision=args.precision,
                              compile=args.compile, progress=_progress, context=args.context,
                              graphs=args.graphs, glue=args.glue).result()
        _progress(f"Loaded {loaded.describe()} in {loaded.load_s:.1f}s")
        request = ChatRequest(tuple(messages), max_tokens=args.max_tokens, params=params,
                              draft_tokens=args.draft_tokens, trees=args.trees)
        handle = service.submit(request, client="cli")
        try:
            midline = False  # answer text written and no line ended since (a server's figures come at the end)
            for event in handle.events():
                if isinstance(event, Notice):
                    _progress(("\n" if midline else "") + event.message)
                    midline = False
                elif isinstance(event, PrefillProgress):  # a prompt of several chunks
                    _progress(f"Reading the prompt: {event.done} of {event.total} parts ...")
                elif isinstance(event, (Traced, Text)):
                    if args.show_rounds and isinstance(event, Traced):
                        _show_round(event.trace)
                    # a reasoning model's thinking goes to stderr: stdout holds the answer alone
                    for kind, text in event.pieces:
                        (sys.stderr if kind == THINKING else sys.stdout).write(text)
                        midline = bool(text) and not text.endswith("\n") or (midline and not text)
                    sys.stdout.flush()
                elif isinstance(event, Finished):
                    sys.stdout.write("\n")
                    print(event.stats.summary(), file=sys.stderr)
        except KeyboardInterrupt:  # Ctrl+C or SIGTERM (app/exit_signals.py): stop the answer, end the line
            handle.cancel()
            sys.stdout.write("\n")
            raise
    finally:
        close_engine(service)
    return 0


def cmd_serve(args) -> int:
    """The loaded pair over an OpenAI-compatible API until Ctrl+C."""
    from app.server.host import ApiServer, ServerError, api_key_from
    from app.service import RunnerService

    from app.remote.endpoint import is_remote

    if is_remote(args.model):
        raise ValueError("tandem-cli serve serves a model on this machine; a server's address is served already: "
                         "point the clients at it.")
    _check_link(args.model)
    _check_link(args.draft.source)
    service = RunnerService()
    try:
        try:  # the address first: a port in use or a missing key costs no loading time
            server = ApiServer(service, args.host, args.port, api_key=api_key_from(args.api_key))
        except ServerError as exc:
            raise ValueError(str(exc)) from None
        loaded = service.load(args.model, args.backend, draft=args.draft, precision=args.precision,
                              compile=args.compile, progress=_progress, context=args.context,
                              graphs=args.graphs, glue=args.glue).result()
        from app.server.openai_api import model_id

        _progress(f"Loaded {loaded.describe()} in {loaded.load_s:.1f}s")
        _progress(f"Serving '{model_id(service)}' on {server.url} (OpenAI API"
                  f"{', API key required' if server.api_key else ''}); Ctrl+C stops.")
        server.serve_forever()
    finally:
        close_engine(service)
    return 0


def cmd_models_info(args) -> int:
    """What a model file holds and what runs of it; with --check, how far from the file's own."""
    from pathlib import Path

    from app.models.gguf_check_torch import check_lines, info_lines
    from app.models.resolve import resolve_model

    path = Path(args.path).expanduser()
    _check_link(str(path))
    from app.models.head_sources import describe_head

    head = describe_head(path)  # a published drafter, not a model: what it reads and drafts, not how a model runs
    if head is not None:
        for line in head:
            print(line)
        return 0
    if path.suffix.lower() != ".gguf":
        from app.models.folder import check_model_folder
        from app.models.integrity import check_weights

        config = check_model_folder(path)
        stored = config.get("dtype") or config.get("torch_dtype") or "?"
        print(f"{path.name}: {config.get('model_type', '?')}, {stored} safetensors, {check_weights(path) / 1e6:.1f} MB "
              "of weights; PyTorch loads them as stored (or at --precision)")
        print(_passes_line(path))
        _print_mlx_trees(config.get("model_type", "?"))
        _print_plan(path)
        return 0
    for line in info_lines(path):
        print(line)
    print(_passes_line(path))
    _print_plan(path)
    from app.engine.backends import default_backend

    if default_backend() == "mlx":  # a Mac opens the file on MLX: what each type becomes there (gguf_mlx.py)
        from app.models.gguf_import import inspect_gguf
        from app.models.gguf_mlx import mlx_info_lines, unsupported_reason

        for line in mlx_info_lines(path, check=args.check):
            print(line)
        architecture = inspect_gguf(path).architecture
        if unsupported_reason(architecture, path) is None:  # (else its lines above say it does not convert)
            # transformers' reader names the model type otherwise for these (modeling_gguf_pytorch_utils)
            _print_mlx_trees(GGUF_MODEL_TYPES.get(architecture, architecture))
    if args.check:
        folder = resolve_model(path, "torch", progress=_progress)
        for line in check_lines(path, folder):
            print(line)
    return 0


GGUF_MODEL_TYPES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "command-r": "cohere"}


def _print_mlx_trees(model_type: str) -> None:
    """On a Mac (MLX the default backend): whether the model verifies trees of drafts there."""
    from app.engine.backends import default_backend

    if default_backend() == "mlx":
        from app.engine.backends.tree_mlx import tree_words

        print(tree_words(model_type))


def _print_plan(path) -> None:
    """How a load would go (app/load_plan.py): the draft "auto" picks and the memory the load's own
    check plans, or why it would not load. Nothing is loaded."""
    from app.draft_choice import AUTO_DRAFT
    from app.load_plan import memory_lines, plan_load
    from app.models.errors import ModelFileError
    from app.models.memory import free_memory

    from app.engine.backends import default_backend

    if default_backend() == "mlx" and str(path).lower().endswith(".gguf"):
        return  # planning would convert the file for MLX (seconds, and disk): its own lines above say the sizes
    try:
        plan = plan_load(path, draft=AUTO_DRAFT, progress=_progress)
    except (ModelFileError, ValueError) as exc:
        print(f"It would not load: {exc}")
        return
    for line in memory_lines(plan, free_memory(plan.backend, plan.device)):
        print(line)


def _passes_line(path) -> str:
    from app.engine.backends.lean_step_torch import passes_line

    line = passes_line(path)
    if path.suffix.lower() == ".gguf":
        from app.models.gguf_import import inspect_gguf
        from app.models.gguf_llama_torch import ARCHITECTURES

        if inspect_gguf(path).architecture in ARCHITECTURES:  # (where its config allows: gguf_llama_torch.why_not)
            line += ("; at the file's own precisions it loads into Tandem's own modules, without transformers' "
                     "model code (docs/gguf.md)")
    return line


def _ks(value: str) -> tuple[int, ...]:
    try:
        ks = tuple(int(k) for k in value.split(",") if k.strip())
    except ValueError:
        ks = (0,)
    if not all(1 <= k <= 16 for k in ks):
        raise argparse.ArgumentTypeError(f"--ks takes a comma list of draft lengths from 1 to 16 (e.g. 2,4,6), "
                                         f"not {value[:40]!r}")
    return ks


def cmd_bench(args) -> int:
    import json
    import platform

    from app.bench.exactness import find_divergences
    from app.bench.harness import build_methods, run_bench
    from app.bench.report import format_table, summarize
    from app.bench.suite import load_suite
    from app.runner import Runner

    params = _sampling(args)
    prompts = load_suite(args.suite, prompts=args.prompts, max_tokens=args.max_tokens, quick=args.quick)
    runner = Runner()
    target = target_spec(args)
    if not isinstance(target, str):
        return bench_remote(args, runner, target, prompts, params, _progress)
    # transformers' anchors run its forward on the loaded models: they need transformers' classes
    loaded = runner.load(args.model, args.backend, draft=args.draft, precision=args.precision, progress=_progress,
                         compile=args.compile, context=args.context, graphs=args.graphs, glue=args.glue,
                         model_code="auto" if args.no_anchors else "transformers")
    _progress(f"Loaded {loaded.describe()} in {loaded.load_s:.1f}s")
    methods = build_methods(runner, ks=args.ks, anchors=not args.no_anchors, progress=_progress)
    bench = run_bench(runner, prompts, methods, params=params, repeats=args.repeats,
                      progress=_progress if args.verbose else (lambda message: None))
    divergences = find_divergences(bench, runner.target) if params.greedy else []
    config = {"target": str(args.model), "target_precision": runner.target.dtype, "draft": loaded.draft_words()[0],
              "backend": loaded.backend, "device": loaded.device, "temperature": args.temperature,
              "top_p": args.top_p, "top_k": args.top_k, "repeats": args.repeats, "prompts": len(prompts),
              "max_tokens": max(p.max_tokens for p in prompts), "ks": list(args.ks),
              "machine": f"{platform.system()} {platform.machine()}, {_cpu_count()} cores",
              "command": "tandem-cli " + " ".join(sys.argv[1:])}
    summary = summarize(bench, divergences, config)
    print(format_table(summary))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(summary, out, indent=1)
        _progress(f"wrote {args.json}")
    return 1 if summary["exactness"]["bugs"] else 0


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem-cli", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="fetch and convert the offline demo model (once)")
    demo.set_defaults(func=cmd_demo)

    imp = sub.add_parser("import", help="convert a .gguf file into model folders")
    imp.add_argument("gguf", type=named("a .gguf file"))
    imp.add_argument("out", type=named("the folder to write the model folders into"))
    imp.add_argument("--variants", default="hf,mlx",
                     help="comma list of hf (float32), gguf (no weights: PyTorch reads the file itself), "
                          "mlx, mlx-4bit")
    imp.set_defaults(func=cmd_import)

    gen = sub.add_parser("generate", help="stream an answer to one prompt")
    gen.add_argument("--model", "--target", dest="model", default="demo", type=MODEL,
                     help='model folder, .gguf file, "demo" (default), or a server\'s address (http(s)://...: '
                          'another Tandem, vLLM, SGLang, llama.cpp\'s server; docs/remote.md)')
    remote_options(gen)
    gen.add_argument("--draft", type=draft_choice, default="auto",
                     help='draft model folder or .gguf, "self:int4" / "self:int4-head" / "self:bfloat16" '
                          '(a copy of the target at that precision), "mtp" (the checkpoint\'s own MTP layer), '
                          '"assistant:<folder>" (a Gemma 4 assistant), "eagle3:<folder or hub id>" (an EAGLE-3 '
                          'head), "dflash:<folder or hub id>" (a DFlash drafter), "ngram" (prompt lookup), "none", '
                          'or "auto" (default: the demo\'s measured best draft, else prompt lookup)')
    gen.add_argument("--precision", default="auto",
                     choices=PRECISION_CHOICES,
                     help="the target's precision: auto (its weights' own), a float type, int4 weight-only, "
                          "or gguf (a .gguf file's own: its 4-bit tensors stay 4-bit; PyTorch on the CPU)")
    gen.add_argument("--compile", choices=COMPILE_CHOICES, default="auto", help=COMPILE_HELP)
    gen.add_argument("--graphs", choices=("auto", "off"), default="auto", help=GRAPHS_HELP)
    gen.add_argument("--glue", choices=("auto", "on", "off"), default="auto", help=GLUE_HELP)
    gen.add_argument("--context", type=at_least_one("context token"), default=None, metavar="N", help=CONTEXT_HELP)
    gen.add_argument("--draft-tokens", type=_draft_tokens, default=None, metavar="auto|N",
                     help="draft length: auto (adaptive, the default) or a fixed N")
    gen.add_argument("--trees", choices=("auto", "on", "off"), default="auto",
                     help="trees of drafts, verified in one pass (docs/trees.md): auto (the alternatives that "
                          "measured worth their place in the pass), on (every alternative the drafter has), off "
                          "(chains)")
    gen.add_argument("--show-rounds", action="store_true",
                     help="print each round's accepted (+) and rejected (-) drafts to stderr")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--system", default=None)
    gen.add_argument("--backend", choices=["mlx", "torch"], default=None)
    gen.add_argument("--max-tokens", type=at_least_one("new token"), default=256)
    gen.add_argument("--temperature", type=real_number, default=0.0)
    gen.add_argument("--top-p", type=real_number, default=1.0)
    gen.add_argument("--top-k", type=whole_number, default=0)
    gen.add_argument("--seed", type=whole_number, default=None)
    gen.set_defaults(func=cmd_generate)

    bench = sub.add_parser("bench", help="measure Tandem against the target alone and the anchors")
    bench.add_argument("--model", "--target", dest="model", default="demo", type=MODEL,
                       help='as for generate; a server\'s address benches the rows that apply to it and says '
                            'which it left out')
    remote_options(bench)
    bench.add_argument("--draft", type=draft_choice, default="auto",
                       help='draft model, "self:<precision>", "mtp", "assistant:<folder>", '
                            '"eagle3:<folder or hub id>", "dflash:<folder or hub id>", "ngram", or "auto" '
                            '(as for generate)')
    bench.add_argument("--precision", default="auto", choices=PRECISION_CHOICES)
    bench.add_argument("--compile", choices=COMPILE_CHOICES, default="auto", help=COMPILE_HELP)
    bench.add_argument("--graphs", choices=("auto", "off"), default="auto", help=GRAPHS_HELP)
    bench.add_argument("--glue", choices=("auto", "on", "off"), default="auto", help=GLUE_HELP)
    bench.add_argument("--context", type=at_least_one("context token"), default=None, metavar="N",
                       help=CONTEXT_HELP)
    bench.add_argument("--backend", choices=["mlx", "torch"], default=None)
    bench.add_argument("--temperature", type=real_number, default=0.0)
    bench.add_argument("--top-p", type=real_number, default=1.0)
    bench.add_argument("--top-k", type=whole_number, default=0)
    bench.add_argument("--seed", type=whole_number, default=0)
    bench.add_argument("--repeats", type=at_least_one("repeat"), default=3)
    bench.add_argument("--ks", type=_ks, default=(2, 4, 6), help="fixed draft lengths to run besides adaptive")
    bench.add_argument("--suite", default=None, type=named("a prompt suite's JSON file"),
                       help="prompt suite JSON (default: benchmarks/suite.json)")
    bench.add_argument("--prompts", type=at_least_one("prompt"), default=None, help="use only the first N prompts")
    bench.add_argument("--max-tokens", type=at_least_one("new token"), default=None,
                       help="new tokens per prompt (default: the suite's)")
    bench.add_argument("--quick", action="store_true", help="2 prompts, 16 tokens (smoke test)")
    bench.add_argument("--no-anchors", action="store_true", help="skip transformers / mlx-lm")
    bench.add_argument("--json", default=None, type=named("a file to write"), metavar="OUT",
                       help="write every figure to this file")
    bench.add_argument("--verbose", action="store_true", help="print each run as it finishes")
    bench.set_defaults(func=cmd_bench)

    serve = sub.add_parser("serve", help="serve the pair over an OpenAI-compatible API (/v1/chat/completions)")
    serve.add_argument("--model", "--target", dest="model", default="demo", type=MODEL,
                       help='model folder, .gguf file, or "demo" (default)')
    serve.add_argument("--draft", type=draft_choice, default="auto",
                       help='draft model, "self:<precision>", "mtp", "assistant:<folder>", '
                            '"eagle3:<folder or hub id>", "dflash:<folder or hub id>", "ngram", "none" or "auto"')
    serve.add_argument("--precision", default="auto", choices=PRECISION_CHOICES)
    serve.add_argument("--compile", choices=COMPILE_CHOICES, default="auto", help=COMPILE_HELP)
    serve.add_argument("--graphs", choices=("auto", "off"), default="auto", help=GRAPHS_HELP)
    serve.add_argument("--glue", choices=("auto", "on", "off"), default="auto", help=GLUE_HELP)
    serve.add_argument("--context", type=at_least_one("context token"), default=None, metavar="N",
                       help="the most tokens a request may hold (default: the model's own, or what memory holds)")
    serve.add_argument("--backend", choices=["mlx", "torch"], default=None)
    serve.add_argument("--host", default="127.0.0.1",
                       help="the address to serve on (default 127.0.0.1, this computer only; any other needs a key)")
    serve.add_argument("--port", type=whole_number, default=8080)
    serve.add_argument("--api-key", default=None,
                       help="a key every request must send as 'Authorization: Bearer KEY' (default: $TANDEM_API_KEY)")
    serve.set_defaults(func=cmd_serve)

    from app.remote.command import add_parser as add_remote

    add_remote(sub)

    from app.align.command import add_parser as add_align

    add_align(sub)

    models = sub.add_parser("models", help="what a model file holds and what runs of it")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    info = models_sub.add_parser("info", help="tensor types, sizes and what PyTorch runs them as")
    info.add_argument("path", type=named("a .gguf file or a model folder"), help="a .gguf file or a model folder")
    info.add_argument("--check", action="store_true",
                      help="also measure the loaded weights' error and perplexity against the file's own "
                           "dequantized weights in float32")
    info.set_defaults(func=cmd_models_info)

    check = sub.add_parser("self-test", help="load the demo's float32 reference pair, check speculative == target "
                                             "alone (exit 0/1)")
    check.add_argument("--backend", choices=["mlx", "torch"], default=None)
    check.set_defaults(func=lambda args: __import__("app.self_test", fromlist=["self_test"]).self_test(
        backend=args.backend))
    return parser


class _NotTheUsersBusiness(logging.Filter):
    """Log lines libraries write at import on every start that a user can do nothing about:
    torchao's C++ kernels built for other hardware ("Failed to load .../torchao/_C_mxfp8...so":
    its Python code runs without them), and torch's deprecation of pytree registrations of enums
    that torchao still makes. Anything else from those loggers still shows."""

    LINES = re.compile(r"Failed to load \S*torchao\S*_C\w*\S*\.(so|pyd|dylib)\b"
                       r"|.* is an Enum subclass and is now natively supported by torch\.compile")

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return not self.LINES.match(record.getMessage())
        except Exception:  # noqa: BLE001 - a record that cannot format is shown as it is
            return True


def quiet_libraries() -> None:
    """Filter those lines where they are logged, before the libraries are imported (torch's own
    handler prints its records: a filter on the emitting logger is seen before any handler)."""
    for name in ("torchao", "torch.utils._pytree"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NotTheUsersBusiness) for f in logger.filters):
            logger.addFilter(_NotTheUsersBusiness())


def main(argv: list[str] | None = None) -> int:
    quiet_libraries()
    args = build_parser().parse_args(argv)
    raise_on_sigterm()
    try:
        return args.func(args)
    except (ModelFileError, PairingError, PromptTooLongError, ValueError) as exc:
        print(f"tandem-cli: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file that cannot be read (a symlink loop, permissions), a folder not made
        print(f"tandem-cli: {_os_message(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # Ctrl+C, or SIGTERM as Terminated
        return exit_code(exc)
    finally:
        if argv is None:  # the command line's own run (not a caller's): the process ends next
            _before_exit()


def _before_exit() -> None:
    """The interpreter's teardown runs the cyclic garbage collector over every object the run
    made (torch's, transformers', sympy's, the model's) while it clears the modules: 1.2 s after
    a one-shot `generate` on the demo, after the answer was written. Frozen, they are left out of
    those collections (objects are still freed as their references go, and atexit runs as ever)."""
    import gc

    gc.freeze()


WRONG_KIND = {
    errno.EEXIST: "a file of that name is there, where a folder is to be made. Give a folder's path, or move the file.",
    errno.ENOTDIR: "part of the path is a file, not a folder. Check the path.",
    errno.EISDIR: "it is a folder, where a file belongs. Give a file's path.",
}


def _os_message(exc: OSError) -> str:
    if isinstance(exc, FolderError) or not exc.strerror:
        return str(exc)
    name = str(exc.filename or "")
    where = f" {name[:120]}…" if len(name) > 120 else f" {name}" if name else ""
    if exc.errno == errno.ENAMETOOLONG:
        return (f"cannot use{where}: File name too long for this computer's file system ({len(name):,} characters). "
                "Check the path.")
    if exc.errno in WRONG_KIND:  # a file where a folder belongs, or the reverse: no link or permission is at fault
        return f"cannot use{where}: {WRONG_KIND[exc.errno]}"
    return (f"cannot read or write{where}: {exc.strerror}. Check that the path exists, is not a broken "
            "or looping symbolic link, and that you may read it.")


if __name__ == "__main__":
    sys.exit(main())
