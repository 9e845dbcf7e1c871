"""Align draft: the Draft slot's menu starts `tandem-cli align` on the loaded pair's target as a
child process (ui/pairing/align_job.py) and the strip under the header follows it
(ui/pairing/align_card.py). When it is done, the result card shows what it measured; the pair
drafts with the aligned draft at once where it measured at least as fast as the original, and
either draft is one click away. The job records the alignment in pairs.json itself
(app/align/command.py); the card shows again whenever that target is loaded.
"""

from __future__ import annotations

import gc
import os
import threading
from dataclasses import replace

from PySide6.QtCore import QObject, Signal

from app.draft_choice import NO_DRAFT, DraftChoice, DraftKind
from app.models.pair_memory import PairMemory, local_folder, same_pair
from app.models.resolve import display_name, model_label
from ui.pairing.align_card import AlignStrip, as_trial, card_title, measured_faster
from ui.pairing.align_job import (CAN_PAUSE, AlignJob, AlignOptions, align_arguments, aligning_unavailable,
                                  alignment_key, job_target, job_threads)
from ui.pairing.controller import PairController

SLOW_MACHINE_CORES = 4  # at or below: the job's threads and the chat's share too few cores


def _drop_pair(runner) -> None:
    """On the runner's thread: let go of the pair and its caches, as Runner._check_memory does to
    make room for a larger one."""
    runner.kept.forget()
    runner.target = runner.drafter = runner.tokenizer = runner.loaded = None
    runner._controllers.clear()
    gc.collect()


class DraftAligner(QObject):
    pair_unloaded = Signal()  # the pair was let go to make room for the job: the window says so
    _unloaded = Signal(str)  # from the runner's thread: "" once the pair is gone, else why not

    def __init__(self, strip: AlignStrip, pairing: PairController, worker, temperature=lambda: 0.0,
                 options: AlignOptions | None = None, parent: QObject | None = None):
        super().__init__(parent)
        self.strip, self.pairing, self.worker = strip, pairing, worker
        self.temperature = temperature  # the open chat's: the job answers at it
        self.options = options or AlignOptions()
        self.job: AlignJob | None = None
        self._args: list[str] = []
        self._for: dict = {}  # the pair the job aligns: spec, name, key, backend, original (its draft)
        self._pending: DraftChoice | None = None  # to pair once the answer streaming now ends
        self._title = ""
        self._unloaded_for_job = False  # the pair is loaded again once the job ends
        self._unloaded_draft = NO_DRAFT  # with the draft it had (what "auto" had decided)
        self._chat_busy = False
        self._timing = False  # the target alone is being timed (on the service's thread)
        self._pause_lock = threading.Lock()  # the GUI thread and the service's both pause the job
        self._pause_for_answers = self._box_pauses()  # the box, as the service's thread may read it
        self._note = ("", "")  # (alignment key, a line about the job just done) for its card
        strip.cancel_requested.connect(self.cancel)
        strip.use_aligned.connect(lambda: self.use(True))
        strip.use_original.connect(lambda: self.use(False))
        strip.unload_and_retry.connect(self.unload_and_retry)
        strip.pause_toggled.connect(lambda _on: self._apply_pause())
        self._unloaded.connect(self._after_unload)

    @staticmethod
    def build_strip() -> AlignStrip:
        cores = os.cpu_count() or 1
        return AlignStrip(slow_machine=cores <= SLOW_MACHINE_CORES, can_pause=CAN_PAUSE)

    # The Draft slot's menu

    def menu_entries(self) -> list[tuple[str, str, object, str]]:
        """(text, tooltip, what it does, why it is off or "") for each way to align the loaded pair."""
        loaded = self.pairing.loaded
        off = aligning_unavailable() or ("Load a target first." if loaded is None else "") or (
            "An alignment is running: see the strip under the header." if self.running else "")
        target = display_name(loaded.folder) if loaded else "the target"
        entries = [("Align a draft head to this target",
                    f"Trains a small draft head on {target}'s own answers, in the background (about 12 minutes, "
                    "chat goes on); the pair drafts with it where it measures faster. The original draft is kept.",
                    lambda: self.start("head", ask=True), off)]
        if loaded is not None and loaded.draft.kind is DraftKind.MODEL:
            name = model_label(loaded.draft.source)
            entries.append((f"Align {name} to this target",
                            f"Fine-tunes a copy of {name} on {target}'s own answers, in the background; the original "
                            "draft model is not changed.", lambda: self.start(loaded.draft.source, ask=True), off))
        return entries

    @property
    def running(self) -> bool:
        return self.job is not None and self.job.running

    # Running the job

    def start(self, draft: str = "head", ask: bool = False) -> str:
        """Align the loaded pair's target: `draft` "head", or the pair's draft model folder. Returns
        why it cannot start ("" when it started). `ask`: first say what it takes and ask (the menu)."""
        loaded, request = self.pairing.loaded, self.pairing.current
        problem = aligning_unavailable() or ("Load a target first." if loaded is None or request is None else "") or (
            "An alignment is already running." if self.running else "")
        if problem:
            self.strip.show_error("Cannot align the draft", problem)
            return problem
        if ask and not self._agreed(draft, loaded):
            return "not started: the user cancelled"
        target = job_target(request.target, loaded.folder)
        self._for = {"spec": request.target, "name": request.named()[0], "key": alignment_key(target),
                     "backend": loaded.backend, "original": loaded.draft}
        self._args = align_arguments(target, draft, loaded.backend, str(loaded.draft), self.options,
                                     float(self.temperature() or 0.0))
        what = "a draft head" if draft == "head" else model_label(draft)
        self._title = f"Aligning {what} to {display_name(loaded.folder)}"
        self._run()
        return ""

    def _agreed(self, draft: str, loaded) -> bool:
        from app.align.job import AlignSettings
        from app.align.store import aligned_dir
        from ui.pairing.align_confirm import confirm_alignment, folder_bytes, head_bytes_for

        minutes = self.options.minutes or AlignSettings.__dataclass_fields__["minutes"].default
        head = draft == "head"
        disk = head_bytes_for(loaded.folder) if head else folder_bytes(draft)
        what = "a draft head" if head else model_label(draft)
        return confirm_alignment(self.strip.window(), what, display_name(loaded.folder), minutes, disk, aligned_dir())

    def _run(self) -> None:
        self.job = job = AlignJob(self._args, job_threads(self.options), self)
        job.progress.connect(self.strip.update_progress)
        job.done.connect(self._done)
        job.failed.connect(self._failed)
        job.cancelled.connect(self._cancelled)
        self.strip.begin(self._title)
        job.start()
        self._apply_pause()

    def cancel(self) -> None:
        if self.running:
            self.strip.cancelling()
            self.job.cancel()

    def on_chat_busy(self, busy: bool) -> None:
        self._chat_busy = busy
        self._apply_pause()
        if not busy and self._pending is not None:
            self._pair_when_idle(self._pending)

    def _box_pauses(self) -> bool:
        box = self.strip.pause_box
        return not box.isHidden() and box.isChecked()

    def _pause_job(self) -> tuple[bool, bool] | None:
        """Pause or continue the job as answers and the timing of the target alone want it:
        (paused before, paused now), None where no job runs."""
        with self._pause_lock:
            job = self.job
            if job is None or not job.running:
                return None
            was = job.paused
            job.pause((self._chat_busy or self._timing) and self._pause_for_answers)
            return was, job.paused

    def _apply_pause(self) -> None:
        self._pause_for_answers = self._box_pauses()  # read here, on the GUI thread, for both threads
        changed = self._pause_job()
        if changed is None:
            return
        was, now = changed
        if now:
            self.strip.eta_label.setText("paused while the answer streams")
        elif was:
            self.strip.refresh_eta()

    def hold_for_timing(self, timing: bool) -> None:
        """On the service's thread, around timing the target alone (ui/worker.py): the speedup's
        yardstick is timed as answers run, so where the job pauses while an answer streams it
        pauses for the timing too. Timed beside a training job, the demo's target read 6-8 tok/s
        against 24 on a quiet machine, and answers timed with the job paused looked 3x faster.
        No widget is touched here: the pause lasts the few seconds of one timing."""
        self._timing = timing
        self._pause_job()

    def shutdown(self) -> None:
        if self.running:
            self.job.stop_at_quit()

    # How it ended

    def _done(self, summary: dict) -> None:
        self.job = None
        job = self._for
        memory = self.pairing.memory = PairMemory(self.pairing.memory.path)  # with what the job recorded
        aligned = DraftChoice.parse_loadable(summary["draft"])
        before, after = as_trial(summary.get("trial_before")), as_trial(summary.get("trial_after"))
        request, loaded = self.pairing.current, self.pairing.loaded
        same_pair_now = request is not None and request.target == job["spec"]  # not another pair loaded meanwhile
        faster = measured_faster(before, after)
        if before is None or after is None:
            note = "Not measured against the original draft: Use aligned draft to try it."
        elif not faster:
            note = ("It measured slower than the original draft here, so the pair keeps the original; "
                    "Use aligned draft to try it anyway.")
        elif same_pair_now:
            note = "It measured at least as fast as the original draft here, so the pair drafts with it now."
        else:
            note = "It measured at least as fast as the original draft: it drafts for this target when it loads."
        self._note = (job["key"], note)
        # as the job recorded it; written here too in case the job could not (its "note" says why)
        problem = memory.set_alignment(job["backend"], job["key"], aligned, job["original"], before, after,
                                       tuple(summary.get("agreement") or (0.0, 0.0)))
        if before is not None and after is not None:
            for draft, result in ((job["original"], before), (aligned, after)):  # measured: no trial again on load
                problem = memory.set_trial(job["backend"], job["name"], draft, result) or problem
        if problem:
            self.pairing.error.emit(problem)
        in_use = loaded.draft == aligned if loaded is not None and same_pair_now else None
        self.strip.show_card(card_title(summary.get("agreement"), before, after), note, in_use)
        if faster and same_pair_now:
            self._unloaded_for_job = False
            self._pair_when_idle(aligned)
        else:
            self._reload_if_unloaded()

    def _pair_when_idle(self, draft: DraftChoice) -> None:
        """Load the pair with `draft`, once the answer being written (if one is) has ended: a new
        pair would stop it."""
        self._pending = draft if self._chat_busy else None
        if not self._chat_busy:
            self.pairing.choose_draft(draft)

    def _failed(self, message: str) -> None:
        self.job = None
        retried = self._unloaded_for_job
        self._reload_if_unloaded()
        offer = ("unload the pair" in message.lower() and self.pairing.loaded is not None and not retried)
        self.strip.show_error("Aligning the draft failed", message, offer_unload=offer)

    def _cancelled(self, message: str) -> None:
        self.job = None
        self._reload_if_unloaded()
        self.strip.show_error(*cancel_words(message))

    def _reload_if_unloaded(self) -> None:
        """The pair let go for the job loads again as it was (unless another was loaded meanwhile)."""
        if self._unloaded_for_job:
            self._unloaded_for_job = False
            if self.pairing.loaded is None and self.pairing.current is not None:
                self.pairing.request_pair.emit(replace(self.pairing.current, draft=self._unloaded_draft,
                                                       keep_draft=False))

    # Not enough memory: let go of the pair while the job runs

    def unload_and_retry(self) -> None:
        if self.running or not self._args:
            return
        self.strip.begin(self._title)
        self.strip.phase_label.setText("Unloading the pair to make room…")
        self._unloaded_draft = self.pairing.loaded.draft if self.pairing.loaded else self._unloaded_draft
        future = self.worker.service.call(_drop_pair, client=self.worker.CLIENT)
        future.add_done_callback(lambda f: self._unloaded.emit(
            "the request was cancelled" if f.cancelled() else str(f.exception() or "")))

    def _after_unload(self, problem: str) -> None:
        if problem:
            self.strip.show_error("Could not unload the pair", problem)
            return
        self._unloaded_for_job = True
        self.pairing.on_unloaded()
        self.pair_unloaded.emit()
        self._run()

    # The card, remembered per target

    def on_paired(self, request, info) -> None:
        """A pair loaded: its target's alignment, if it has one, shows as its card."""
        if self.running or self.strip.state == "error":
            return
        found, _key = self._alignment(request, info)
        key = alignment_key(job_target(request.target, info.folder))
        if found is None:
            if self.strip.state == "result":
                self.strip.dismiss()
            return
        in_use = info.draft == found["aligned"]
        default = ("The pair drafts with the aligned draft." if in_use else
                   f"The pair drafts with {info.draft_words()[0]}; the aligned draft is kept.")
        note = self._note[1] if self._note[0] == key else default
        self._note = ("", "")  # the line about the job shows once, with the pair it chose
        self.strip.show_card(card_title(found["agreement"], found["before"], found["after"]), note, in_use)

    def _alignment(self, request, info) -> tuple[dict | None, str]:
        """The target's alignment and the name it is recorded under (None, "" where it has none)."""
        memory = self.pairing.memory
        for key in (alignment_key(job_target(request.target, info.folder)),  # what the job records it under
                    same_pair(str(request.target), NO_DRAFT, info.backend)[0]):  # what "auto" looks it up by
            found = memory.alignment(info.backend, key)
            if found is not None and local_folder(found["aligned"].source) is not None:
                return found, key
        return None, ""

    def use(self, aligned: bool) -> None:
        """Use aligned draft / Use original draft: load the pair with it, and remember the choice
        ("auto" pairs the target with its aligned draft only while the alignment is active)."""
        request, loaded = self.pairing.current, self.pairing.loaded
        if request is None or loaded is None:
            return
        found, key = self._alignment(request, loaded)
        if found is None:
            return
        problem = self.pairing.memory.set_alignment_active(loaded.backend, key, aligned)
        if problem:
            self.pairing.error.emit(problem)
        self.pairing.choose_draft(found["aligned"] if aligned else found["original"])


def cancel_words(message: str) -> tuple[str, str]:
    """(title, note) for a cancelled job's card, saying "cancelled" once: the job's message
    ("Alignment cancelled: nothing was saved.") splits into its title and the rest."""
    if not message.startswith("Alignment cancelled"):
        return "Alignment cancelled", message
    cut = min((i for i in (message.find(":"), message.find(";")) if i >= 0), default=len(message))
    title, rest = message[:cut].strip().rstrip("."), message[cut + 1:].strip()
    return title, rest[:1].upper() + rest[1:]
