"""One alignment job, start to end: check, load the target as teacher, collect its answers, train,
measure, save (whole or not at all), then the pair trial before and after.

Headless and Qt-free: `tandem-cli align` runs it in the foreground, and the window runs that
command as a child process (its own threads, capped; ui/pairing/align.py reads its progress as
JSON lines). Progress is reported as a fraction of the whole job with a time estimate; a
cancel (`cancelled()` true, or the process killed) leaves no draft folder behind. Each step hears
a cancel within about a second (app/align/cancel.py); one in the pair trial, after the draft is
saved, ends the trial and keeps the draft.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from app.align.cancel import AlignCancelled, stop_if_cancelled, until_cancelled
from app.models.errors import ModelFileError
from app.paths import make_output_folder

HELD_OUT = 0.1  # of the answers: agreement is measured on these, never trained on
# where the time goes when the job plans by the clock: answering, then training, then the rest. Data is
# what limits a head (demo, held-out agreement: half the answers 0.42, all 0.45, while training had
# converged within 150 s), so most of the budget goes to the target's answers.
ANSWER_SHARE = 0.6
SELF_PROMPT_SHARE = 0.15  # of the answering budget, at most, for the target to write its own asks
# By default only on a GPU, where answers are cheap and the built-in asks run out: there 15% of a
# 7.5-minute job wrote 10,669 asks (H200) and the demo's head went from 0.23 to 0.42 of first
# drafts taken on the bench's prompts. On this 2-core CPU the same share cost a quarter of the
# answers (384 against 512 in 12 minutes) and the head read 0.20 against 0.23: too few answers of
# any kind to gain from their variety.
SELF_PROMPTS_GPU = 40_000  # as many as the share allows
TRIAL_CANCELLED = "Alignment cancelled during the pair trial; the aligned draft was kept."
DEVICES = ("auto", "cpu", "cuda")  # where alignment may compute (app/align/teacher_torch.resolve_device)


@dataclass
class AlignSettings:
    target: str  # a folder, .gguf or "demo" (PyTorch's: the GGUF at its own precisions)
    draft: str = "head"  # "head" (a draft head on the target's states) or a draft model's folder/.gguf
    minutes: float = 12.0  # the whole job's budget when prompts/steps are not fixed
    prompts: int | None = None  # answers to collect (None: as many as the budget allows)
    steps: int | None = None  # training steps (None: as many as the budget allows)
    max_tokens: int = 128  # per answer
    batch: int | None = None  # answers generated together (None: by the target's size, answer_batch)
    temperature: float = 0.0  # the temperature the user chats at: answers are sampled at it
    history: bool = False  # the user's own chat messages as prompts too (opt-in)
    self_prompts: int | None = None  # asks the target writes itself (None: on a GPU as many as the
    # share of the budget allows in a job planned by the clock; on a CPU, or where prompts are counted, none)
    device: str = "auto"  # where the teacher and training compute: "auto" (a CUDA GPU if any), "cpu", "cuda"
    batch_tokens: int | None = None  # tokens a training step (None: 512 on the CPU, 8192 on a GPU)
    draft_vocab: int | None = None  # a head drafts from the answers' most frequent tokens, at most this many
    # (None: app/align/draft_vocab.DEFAULT_SIZE; 0: the whole vocabulary). Not for a draft model.
    threads: int | None = None  # PyTorch threads (None: PyTorch's default)
    seed: int = 0
    trial: bool = True  # the pair trial before and after (loads the pair twice)
    backend: str = "torch"  # what the trial measures on
    precision: str = "auto"
    original_draft: str = "ngram"  # the pair's draft before alignment, measured for "before"
    out: Path | None = None  # the aligned drafts' folder (None: the data folder's aligned/)


@dataclass
class AlignProgress:
    phase: str  # checking, loading, prompting, answering, training, measuring, saving, trial, done
    fraction: float  # of the whole job
    eta_s: float | None  # seconds left, once there is a rate to go by
    message: str


@dataclass
class AlignResult:
    folder: Path
    kind: str  # "head" or "model"
    agreement_before: float
    agreement_after: float
    held_out_positions: int
    answers: int
    tokens: int
    steps: int
    seconds: float
    trial_before: dict | None = None
    trial_after: dict | None = None
    draft_choice: str = ""  # how to pair it: "head:<folder>" or the folder
    draft_vocab: int = 0  # tokens a head drafts from (0: the whole vocabulary)
    agreement_in_vocab: float | None = None  # the agreement when it drafts from those tokens only
    notes: list[str] = field(default_factory=list)

    def card(self) -> str:
        """One line for the result card: "agrees 12% -> 64%; accepts 31% -> 64%, 0.9x -> 1.5x here"."""
        from app.models.pair_memory import read_trial

        line = f"agrees {self.agreement_before:.0%} -> {self.agreement_after:.0%}"
        before, after = read_trial(self.trial_before), read_trial(self.trial_after)
        if before and after:
            line += (f"; accepts {before.acceptance:.0%} -> {after.acceptance:.0%}, "
                     f"{before.figure()} -> {after.figure()} here")
        return line


def split(sequences: list, prompts: list[str], seed: int) -> tuple[list, list]:
    """(held out, trained on): the answers to held-out prompts (app/align/prompts.held_out: whole
    subjects), or, where those are too few (a short job, a few prompts), a random tenth."""
    from app.align.prompts import held_out

    held, trained = [], []
    for s in sequences:
        (held if held_out(prompts[s.prompt], seed) else trained).append(s)
    if len(held) >= 2 and len(trained) >= 2:
        return held, trained
    shuffled = list(sequences)
    random.Random(seed).shuffle(shuffled)
    count = max(1, int(len(shuffled) * HELD_OUT))
    return shuffled[:count], shuffled[count:]


def resolve_target(spec: str, progress=lambda message: None) -> Path:
    from app.models.resolve import resolve_model

    return resolve_model(spec, "torch", progress)


def check(settings: AlignSettings):
    """Everything that can be refused before weights load: the folders, the tokenizers (a draft
    model must share the target's), the device, and memory there for the teacher and the training
    copy. Returns (target, draft or None, device)."""
    from app.models.folder import check_model_folder
    from app.models.memory import NotEnoughMemory, free_memory, size_text
    from app.models.pairing import check_tokenizers
    from app.models.resolve import resolve_model
    from app.models.transformers_tokenizer import ChatTokenizer

    target = resolve_target(settings.target)
    check_model_folder(target)
    draft = None
    if settings.draft != "head":
        draft = resolve_model(settings.draft, "torch", lambda message: None)
        check_model_folder(draft)
        check_tokenizers(ChatTokenizer(target), ChatTokenizer(draft))  # PairingError, with the reason
    need = _float32_bytes(target) * 2  # the teacher, and the generation's caches and activations
    if draft is not None:
        need += _float32_bytes(draft) * 4  # weights, gradients and AdamW's two moments
    else:
        need += 64 << 20
    from app.align.teacher_torch import resolve_device

    device = resolve_device(settings.device)  # a GPU asked for where there is none: refused here
    free, where = free_memory("torch", str(device))
    if need > free:
        raise NotEnoughMemory(
            f"Aligning needs about {size_text(need)} of {where} for the target in float32 and the training copy, "
            f"but only {size_text(free)} is free. Unload the pair (or close other apps) while it trains, then "
            "try again.")
    return target, draft, device


def answer_batch(float32_bytes: int, gpu: bool = False) -> int:
    """Answers the teacher generates together: 64 for a small target on a CPU (the demo answered
    1.5x the tokens a second of 32 at a time), fewer for larger ones, whose caches for 64 answers
    would not fit beside them; four times as many on a GPU, whose step costs about the same for
    one row or hundreds."""
    return (64 if float32_bytes < 2 << 30 else 32 if float32_bytes < 8 << 30 else 16) * (4 if gpu else 1)


def self_prompt_count(settings: AlignSettings, device_type: str) -> int:
    """Asks the target is to write itself: as asked, else on a GPU as many as the share of a
    budget planned by the clock allows (SELF_PROMPT_SHARE), else none."""
    if settings.self_prompts is not None:
        return settings.self_prompts
    return SELF_PROMPTS_GPU if settings.prompts is None and device_type == "cuda" else 0


def mixed(first: list[str], second: list[str]) -> list[str]:
    """Two prompt lists taken in turn (whatever part of it a budget answers has both kinds)."""
    out = [p for pair in zip(first, second, strict=False) for p in pair]
    return out + first[len(second):] + second[len(first):]


def _float32_bytes(folder: Path) -> int:
    from app.models.gguf_import import gguf_source, inspect_gguf, is_gguf_folder
    from app.models.integrity import read_header

    if is_gguf_folder(folder):
        return inspect_gguf(gguf_source(folder)).n_params * 4
    elements = 0
    for path in folder.glob("*.safetensors"):
        for key, info in read_header(path)[0].items():
            if key != "__metadata__" and isinstance(info, dict):
                count = 1
                for n in info.get("shape", []):
                    count *= int(n)
                elements += count
    return elements * 4


class Clock:
    """The job's fraction done and time left, from the phases' shares of the whole. The fraction
    never goes back (a phase planned by the clock can run past its share: its last batch)."""

    def __init__(self, report: Callable[[AlignProgress], None]):
        self.report, self.started = report, time.perf_counter()
        self.base, self.share, self.phase_started = 0.0, 0.0, self.started
        self.shown = 0.0

    def _send(self, phase: str, fraction: float, eta: float | None, message: str) -> None:
        self.shown = max(self.shown, min(fraction, 1.0))
        self.report(AlignProgress(phase, self.shown, eta, message))

    def phase(self, name: str, share: float, message: str) -> None:
        self.base = max(self.base + self.share, self.shown)
        self.share, self.name, self.phase_started = share, name, time.perf_counter()
        self._send(name, self.base, None, message)

    def finish(self, message: str) -> None:
        self._send("done", 1.0, 0.0, message)

    def within(self, done: float, message: str) -> None:
        """`done` of the current phase (0..1); the estimate extrapolates the whole job's pace."""
        fraction = min(self.base + self.share * min(max(done, 0.0), 1.0), 1.0)
        spent = time.perf_counter() - self.started
        eta = spent * (1 - fraction) / fraction if fraction > 0.02 else None
        self._send(self.name, fraction, eta, message)


def run(settings: AlignSettings, report: Callable[[AlignProgress], None] = lambda p: None,
        cancelled: Callable[[], bool] = lambda: False) -> AlignResult:
    from app.align.teacher_torch import threads

    with threads(settings.threads):  # a job inside a longer-lived process (tests) gives them back
        return _run(settings, report, cancelled)


def _run(settings: AlignSettings, report: Callable[[AlignProgress], None],
         cancelled: Callable[[], bool]) -> AlignResult:
    from app.align import store
    from app.align.prompts import builtin_prompts, history_prompts
    from app.align.teacher_torch import Teacher, collect, device_name
    from app.pair_trial import TRIAL_PROMPTS
    from app.models.resolve import display_name

    def cancellable(call):
        """`call()` on a helper thread, the job ending the moment `cancelled()` turns true
        (app/align/cancel.py). Each step also checks `cancelled()` between its own units, so one
        left behind stops soon; but a unit can be one call of seconds on a CPU: hashing the demo's
        GGUF, loading weights (11 s for the demo's teacher on 2 cores), generate's first step
        (the prefill of a whole batch of prompts: 8 s for 48 of them), a chunk through the head."""
        return until_cancelled(call, cancelled)

    started = time.perf_counter()
    clock = Clock(report)
    clock.phase("checking", 0.0, "Checking the pair ...")
    target, draft, device = cancellable(lambda: check(settings))
    root = make_output_folder(settings.out, "the aligned draft") if settings.out else store.aligned_dir()
    store.remove_stale_partials(root)

    where = "" if device.type == "cpu" else f" on {device_name(device)}"
    clock.phase("loading", 0.03, f"Loading {display_name(target)} as the teacher (float32){where} ...")

    def load_teacher():
        loaded = Teacher(target, device)
        return loaded, loaded.tokenizer()

    teacher, tokenizer = cancellable(load_teacher)

    builtin = builtin_prompts(settings.seed)
    budget = settings.minutes * 60
    timed = settings.prompts is None or settings.steps is None
    batch = settings.batch or answer_batch(_float32_bytes(target), device.type == "cuda")
    wanted = self_prompt_count(settings, device.type)
    own: list[str] = []
    data_from = time.perf_counter()  # the answering budget covers the asks the target writes too
    answer_until = data_from + budget * ANSWER_SHARE
    if wanted:
        from app.align.self_prompts_torch import self_prompts

        clock.phase("prompting", ANSWER_SHARE * SELF_PROMPT_SHARE if timed else 0.05,
                    f"The target writes up to {wanted} asks of its own ...")
        prompt_until = data_from + budget * ANSWER_SHARE * SELF_PROMPT_SHARE

        def prompting_done(done: int, total: int) -> None:
            # by the clock where the clock ends the phase (else the estimate reads the budget's share
            # of asks not written as time still to come: "36 min left" in a 12-minute job)
            spent = (time.perf_counter() - data_from) / max(prompt_until - data_from, 1e-6)
            clock.within(done / total if settings.prompts is not None else max(done / total, spent),
                         f"The target wrote {done} asks")

        own = cancellable(lambda: self_prompts(
            teacher, tokenizer, wanted, batch, settings.seed, cancelled=cancelled,
            enough=lambda: settings.prompts is None and time.perf_counter() > prompt_until,
            progress=prompting_done, exclude=frozenset(builtin) | frozenset(TRIAL_PROMPTS)))
        stop_if_cancelled(cancelled)
    prompts = mixed(builtin, own)
    if settings.history:
        from app.chat.history import default_path

        prompts = history_prompts(default_path()) + prompts
    if settings.prompts is not None:
        prompts = prompts[: settings.prompts]
    clock.phase("answering", ANSWER_SHARE * (1 - SELF_PROMPT_SHARE if wanted else 1) if timed else 0.3,
                f"The target answers up to {len(prompts)} prompts ...")
    answering_from = time.perf_counter()

    def answering_done(done: int, total: int) -> None:
        left = (answer_until - time.perf_counter()) / max(answer_until - answering_from, 1e-6)
        clock.within(done / total if settings.prompts is not None else max(done / total, 1 - left),
                     f"The target answered {done} of {total} prompts")

    def enough() -> bool:
        return settings.prompts is None and time.perf_counter() > answer_until

    sequences = cancellable(lambda: collect(teacher, tokenizer, prompts, settings.max_tokens, batch,
                                            settings.temperature, answering_done, cancelled, enough))
    stop_if_cancelled(cancelled)  # collect returns the whole answers it had
    if len(sequences) < 2:
        raise ModelFileError("The target gave too few answers to align a draft on (every answer ended at once). "
                             "Check that the model chats (its chat template), or give it more time.")
    held_out, train_set = split(sequences, prompts, settings.seed)
    tokens = sum(len(s.ids) for s in train_set)
    vocab, vocab_note = _draft_vocab(settings, draft, tokenizer, train_set, held_out, teacher.head_weight.shape[0])
    stop_if_cancelled(cancelled)  # counting tokens is quick (0.1 s for 512 answers); its end is the check

    batch_tokens = settings.batch_tokens or (8192 if device.type == "cuda" else 512)
    if draft is None:
        from app.align.head_train_torch import HeadTrainer

        trainer = HeadTrainer(teacher, settings.seed, temperature=max(settings.temperature, 1.0),
                              batch_tokens=batch_tokens)
    else:
        from app.align.distill_torch import DraftTrainer

        trainer = cancellable(lambda: DraftTrainer(teacher, draft, settings.seed, batch_tokens=batch_tokens,
                                                   temperature=max(settings.temperature, 1.0)))
    # both read every held-out / trained position through the target's whole head (9.5 s to rank 64
    # of the demo's answers here, minutes for a 12-minute job's)
    agreed, positions = cancellable(lambda: trainer.agreement(held_out, cancelled=cancelled))
    before = agreed / max(positions, 1)
    clock.within(1.0, f"Ranking the target's likely next tokens at {tokens:,} positions ...")
    cancellable(lambda: teacher.rank(train_set, cancelled=cancelled))
    train_share = 1 - ANSWER_SHARE - 0.08 if timed else 0.6
    clock.phase("training", train_share, f"Training on {tokens:,} tokens of the target's answers ...")
    train_until = started + budget * (1 - 0.05)
    steps = settings.steps

    def on_step(step: int, loss: float) -> None:
        if steps is not None:
            done = step / steps
        else:
            done = 1 - max(0.0, train_until - time.perf_counter()) / max(train_until - clock.phase_started, 1e-6)
        if step % 5 == 0 or done >= 1:
            clock.within(done, f"Training: step {step}, loss {loss:.3f}")

    cancellable(lambda: trainer.train(
        train_set, steps if steps is not None else 10 ** 9,
        lambda: cancelled() or (steps is None and time.perf_counter() > train_until), on_step))
    stop_if_cancelled(cancelled)  # train returns at the step it heard a cancel at
    if trainer.steps == 0:
        raise ModelFileError(f"The {settings.minutes:g}-minute budget ran out before training began (the target's "
                             "answers took it all): nothing was saved. Give the job more minutes.")
    clock.phase("measuring", 0.02, "Measuring agreement on held-out answers ...")
    trainer.round_to_saved()
    agreed, positions = cancellable(lambda: trainer.agreement(held_out, cancelled=cancelled))
    after = agreed / max(positions, 1)
    in_vocab = None
    if vocab:
        in_vocab = cancellable(lambda: trainer.agreement(held_out, vocab, cancelled=cancelled))[0] / max(positions, 1)

    clock.phase("saving", 0.01, "Saving the aligned draft ...")
    kind = trainer.kind
    manifest = {
        "kind": kind,
        "target": {"name": display_name(target), "folder": str(target.resolve())},
        "original_draft": settings.original_draft if draft is None else str(draft.resolve()),
        "data": {"prompts": len(prompts), "self_prompts": len(own), "answers": len(train_set),
                 "held_out": len(held_out), "tokens": tokens,
                 "history": settings.history, "temperature": settings.temperature,
                 "max_tokens": settings.max_tokens},
        "steps": trainer.steps,
        "device": device_name(device),
        "seconds": round(time.perf_counter() - started, 1),
        "agreement": {"before": round(before, 4), "after": round(after, 4), "positions": positions},
        "created_at": time.time(),
    }
    if vocab:
        manifest["agreement"]["in_draft_vocab"] = round(in_vocab, 4)
        manifest["draft_vocab"] = vocab_note
    folder = store.write_result(store.result_name(display_name(target), kind),
                                lambda path: _write(trainer, teacher, target, draft, path, vocab), manifest, root,
                                cancelled)
    choice = f"head:{folder}" if kind == "head" else str(folder)
    result = AlignResult(folder, kind, before, after, positions, len(train_set), tokens, trainer.steps,
                         time.perf_counter() - started, draft_choice=choice, draft_vocab=len(vocab or ()),
                         agreement_in_vocab=in_vocab)
    if settings.trial:
        del teacher, trainer
        clock.phase("trial", 0.04, "Measuring the pair before and after (the pair trial) ...")
        try:  # on a helper thread too: each of its two loads is one call of 7 s for the demo here
            result.trial_before, result.trial_after = until_cancelled(
                lambda: _trials(settings, target, choice, clock, cancelled), cancelled, TRIAL_CANCELLED)
        except AlignCancelled:
            result.notes.append("The pair trial was cancelled; the aligned draft is saved.")
        except Exception as exc:  # the draft is whole and saved: say why it was not measured, keep it
            result.notes.append(f"The pair trial failed ({type(exc).__name__}: {exc}); the aligned draft is "
                                "saved, and the pair trial runs when it is loaded.")
        else:
            store.update_manifest(folder, trial={"before": result.trial_before, "after": result.trial_after})
    result.seconds = time.perf_counter() - started
    clock.finish(f"Aligned: {result.card()}")
    return result


def _draft_vocab(settings: AlignSettings, draft: Path | None, tokenizer, train_set: list, held_out: list,
                 vocab_size: int) -> tuple[list[int] | None, dict]:
    """A head's draft vocabulary (app/align/draft_vocab.py): the trained answers' most frequent
    tokens and the stop tokens, with what it covers of the held-out answers; None for a draft
    model, where 0 was asked, or where it would be the whole vocabulary anyway."""
    from app.align.draft_vocab import DEFAULT_SIZE, answer_counts, coverage, coverage_in_context, frequent
    from app.align.teacher_torch import stop_ids

    size = DEFAULT_SIZE if settings.draft_vocab is None else settings.draft_vocab
    if draft is not None or not size:
        return None, {}
    vocab = frequent(answer_counts(train_set), size, vocab_size, stop_ids(tokenizer))
    if len(vocab) >= vocab_size:
        return None, {}
    return vocab, {"size": len(vocab), "held_out_coverage": round(coverage(vocab, answer_counts(held_out)), 4),
                   "held_out_coverage_in_context": round(coverage_in_context(vocab, held_out), 4),
                   "from": "the trained answers' most frequent tokens, then the lowest ids, and the stop tokens"}


def _write(trainer, teacher, target: Path, draft: Path | None, path: Path, vocab: list[int] | None = None) -> None:
    import json
    import shutil

    from safetensors.torch import save_file

    from app.models.aligned_head import HEAD_TYPE, WEIGHTS
    from app.models.resolve import display_name

    if draft is None:
        save_file(trainer.tensors(), str(path / WEIGHTS), metadata={"format": "pt"})
        text = teacher.config.get_text_config() if hasattr(teacher.config, "get_text_config") else teacher.config
        config = {"model_type": HEAD_TYPE, "hidden_size": int(text.hidden_size),
                  "vocab_size": int(teacher.head_weight.shape[0]), "target_model_type": text.model_type,
                  "target": display_name(target), "architecture": "eagle-1 head: one decoder layer, MTP names"}
        if vocab:
            from app.align.draft_vocab import write

            write(path, vocab)
            config["draft_vocab"] = len(vocab)
        (path / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    else:
        trainer.save(path)
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                     "generation_config.json", "vocab.json", "merges.txt", "tokenizer.model"):
            if (draft / name).is_file():
                shutil.copyfile(draft / name, path / name)


def _trials(settings: AlignSettings, target: Path, choice: str, clock: Clock, cancelled) -> tuple[dict, dict]:
    from app.draft_choice import DraftChoice
    from app.pair_trial import run_trial
    from app.runner import Runner

    runner = Runner()  # made, loaded and used on one thread (until_cancelled's), as a runner must be
    results = []
    for i, draft in enumerate((settings.original_draft, choice)):
        stop_if_cancelled(cancelled, TRIAL_CANCELLED)
        runner.load(str(target), settings.backend, DraftChoice.parse_loadable(draft), settings.precision,
                    progress=lambda message: None)
        stop_if_cancelled(cancelled, TRIAL_CANCELLED)
        trial = run_trial(runner, cancelled)
        # run_trial gives None when cancelled too: that is no measurement, not one of 0% accepted
        stop_if_cancelled(cancelled, TRIAL_CANCELLED)
        results.append(asdict(trial) if trial is not None else {"acceptance": 0.0, "speedup": 1.0,
                                                                "tokens_per_pass": 1.0, "tokens": 0,
                                                                "measured_at": time.time()})
        clock.within((i + 1) / 2, f"Pair trial {'after' if i else 'before'}: accepts {results[-1]['acceptance']:.0%}, "
                                  f"{results[-1]['speedup']:.2f}x")
    return results[0], results[1]
