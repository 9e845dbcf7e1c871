"""`tandem-cli align`: align a draft to its target headless, and what the window's Align draft runs
as a child process (`--json-progress`: one JSON object a line on stdout, ui/pairing/align.py)."""

from __future__ import annotations

import json
import signal
import sys
import threading

from app.align.cancel import steps_left_running
from app.align.job import DEVICES, AlignCancelled, AlignProgress, AlignSettings, run
from app.exit_signals import exit_code, leave_now
from app.cli_types import MODEL, at_least_one, named, real_number, whole_number


def add_parser(sub) -> None:
    align = sub.add_parser("align", help="align a draft to its target on the target's own answers")
    align.add_argument("--model", "--target", dest="target", default="demo", type=MODEL,
                       help='the target: model folder, .gguf file, or "demo" (default)')
    align.add_argument("--draft", default="head", type=named('"head" or a draft model\'s folder or .gguf'),
                       help='"head" (default: train a draft head on the target\'s hidden states, EAGLE-style) or '
                            "a draft model's folder or .gguf to distil the target into (same tokenizer)")
    align.add_argument("--minutes", type=real_number, default=12.0, help="the job's time budget (default 12)")
    align.add_argument("--prompts", type=at_least_one("prompt"), default=None,
                       help="answers to collect (default: what the budget allows)")
    align.add_argument("--steps", type=at_least_one("step"), default=None,
                       help="training steps (default: what the budget allows)")
    align.add_argument("--max-tokens", type=at_least_one("token"), default=128, help="tokens per answer (default 128)")
    align.add_argument("--batch", type=at_least_one("answer"), default=None,
                       help="answers generated together (default: 64 for a target under 2 GB in float32, fewer above)")
    align.add_argument("--temperature", type=real_number, default=0.0,
                       help="the temperature you chat at: answers are sampled at it, 0 greedy (default)")
    align.add_argument("--history", action="store_true",
                       help="also use your own chat messages as prompts (they never leave this computer)")
    align.add_argument("--self-prompts", type=at_least_one("ask", least=0), default=None, metavar="N",
                       help="asks the target writes itself to answer beside the built-in ones (Magpie; default: on "
                            "a GPU as many as 15%% of the answering time allows, on a CPU none; 0: none)")
    align.add_argument("--device", default="auto", choices=DEVICES,
                       help='where the teacher and training compute: "auto" (a CUDA GPU where PyTorch has one, '
                            'default), "cpu" or "cuda"')
    align.add_argument("--batch-tokens", type=at_least_one("token"), default=None,
                       help="tokens a training step (default: 512 on the CPU, 8192 on a GPU)")
    align.add_argument("--draft-vocab", type=at_least_one("token", least=0), default=None, metavar="N",
                       help="a head drafts from the N tokens the target's answers use most, and the conversation's "
                            "(FR-Spec; default 8192; 0: the whole vocabulary)")
    align.add_argument("--threads", type=at_least_one("thread"), default=None,
                       help="PyTorch threads (default: all cores)")
    align.add_argument("--seed", type=whole_number, default=0)
    align.add_argument("--no-trial", action="store_true", help="skip the pair trial before and after")
    align.add_argument("--backend", choices=["mlx", "torch"], default="torch", help="what the pair trial runs on")
    align.add_argument("--original-draft", default="ngram",
                       help='the draft the pair had before ("ngram" default), measured as "before"')
    align.add_argument("--out", default=None, type=named("the folder to write the aligned draft into"),
                       help="where to write the aligned draft (default: Tandem's data folder)")
    align.add_argument("--json-progress", action="store_true", help="progress as JSON lines on stdout")
    align.set_defaults(func=cmd_align)


def cmd_align(args) -> int:
    from pathlib import Path

    from app.draft_choice import DraftChoice
    from app.models.pair_memory import PairMemory, TrialResult

    cancel = threading.Event()
    main_thread = threading.current_thread() is threading.main_thread()
    if main_thread:
        # the window cancels a child with SIGTERM: the job ends within about a second, with no folder, exit 3
        signal.signal(signal.SIGTERM, lambda signum, frame: cancel.set())
    settings = AlignSettings(
        target=args.target, draft=args.draft, minutes=args.minutes, prompts=args.prompts, steps=args.steps,
        max_tokens=args.max_tokens, batch=args.batch, temperature=args.temperature, history=args.history,
        self_prompts=args.self_prompts, device=args.device, batch_tokens=args.batch_tokens,
        draft_vocab=args.draft_vocab,
        threads=args.threads, seed=args.seed, trial=not args.no_trial, backend=args.backend,
        original_draft=str(DraftChoice.parse_loadable(args.original_draft)),
        out=Path(args.out) if args.out else None)

    # Steps report from the job's helper threads (app/align/cancel.py), and one left behind by a
    # cancel may still report: one line at a time, and nothing after the job's last event.
    output = threading.Lock()
    ended = threading.Event()

    def say(text: str, stream=sys.stdout, last: bool = False) -> None:
        with output:
            if not ended.is_set():
                print(text, file=stream, flush=True)
            if last:
                ended.set()

    def report(progress: AlignProgress) -> None:
        if args.json_progress:
            say(json.dumps({"event": "progress", "phase": progress.phase, "fraction": round(progress.fraction, 4),
                            "eta_s": None if progress.eta_s is None else round(progress.eta_s, 1),
                            "message": progress.message}))
        else:
            eta = f", about {progress.eta_s / 60:.0f} min left" if progress.eta_s else ""
            say(f"[{progress.fraction:4.0%}{eta}] {progress.message}", sys.stderr)

    try:
        result = run(settings, report, cancel.is_set)
    except AlignCancelled as exc:
        if args.json_progress:
            say(json.dumps({"event": "cancelled", "message": str(exc)}), last=True)
        else:
            say(f"tandem-cli: {exc}", sys.stderr, last=True)
        if main_thread:  # a command of its own (the window's child): nothing is left to write
            _leave_now(3)
        return 3
    except KeyboardInterrupt as exc:  # Ctrl+C in a terminal: as before, but without a step left in PyTorch
        if main_thread and steps_left_running():
            _leave_now(exit_code(exc))
        raise
    except Exception as exc:
        if args.json_progress:  # the window shows the message; the exit code says it failed
            say(json.dumps({"event": "error", "message": str(exc) or type(exc).__name__}), last=True)
        raise
    trials = [TrialResult(**t) if t else None for t in (result.trial_before, result.trial_after)]
    memory_note = PairMemory().set_alignment(
        args.backend, args.target, DraftChoice.parse_loadable(result.draft_choice),
        DraftChoice.parse_loadable(settings.original_draft), *trials,
        (result.agreement_before, result.agreement_after))
    summary = {"event": "done", "folder": str(result.folder), "draft": result.draft_choice, "kind": result.kind,
               "agreement": [result.agreement_before, result.agreement_after], "answers": result.answers,
               "tokens": result.tokens, "steps": result.steps, "seconds": round(result.seconds, 1),
               "trial_before": result.trial_before, "trial_after": result.trial_after, "card": result.card(),
               "note": " ".join(filter(None, [*result.notes, memory_note]))}
    if args.json_progress:
        say(json.dumps(summary), last=True)
    else:
        with output:
            ended.set()
        print(f"Aligned draft: {result.folder}")
        print(f"  {result.card()}")
        print(f"  {result.answers} answers, {result.tokens:,} tokens, {result.steps} steps, {result.seconds:.0f} s")
        print(f"  pair it with: --model {args.target} --draft {result.draft_choice}"
              " (\"auto\" now picks it where it measured faster)")
        for note in [*result.notes, memory_note]:
            if note:
                print(f"  {note}", file=sys.stderr)
    if main_thread and steps_left_running():  # a pair trial's load, cancelled: the draft is saved
        _leave_now(0)
    return 0


def _leave_now(code: int) -> None:
    """End the process without tearing the interpreter down. After a cancel the job has nothing
    left to write, and the teardown cost more than the rest of a cancel (1.7 s here, after the
    job's last line), or aborted it while a step left behind was inside PyTorch
    (app/align/cancel.py)."""
    leave_now(code)
