"""Pairing: what happens when a model is dropped on a slot, chosen from a menu, or picked from
the catalog. Hub models are fetched first (ui/pairing/downloads.py, off the engine's thread);
then the worker loads the pair, which runs every check (files, architecture, tokenizers,
memory) before anything replaces the pair in use. After a pair loads, a short trial measures
it once and the result is remembered per pair (app/models/pair_memory.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.draft_choice import AUTO_DRAFT, NO_DRAFT, DraftChoice, DraftKind
from app.engine.backends import default_backend
from app.models import hub
from app.models.catalog import CatalogPair
from app.models.errors import ModelFileError
from app.models.head_sources import HEADS
from app.models.pair_memory import PairMemory
from app.models.precheck import PairPart, local_part, precheck_pair
from app.models.sources import ModelSource, classify, draft_source
from app.remote.endpoint import is_server_address
from app.runner import LoadedModel
from ui.pairing.downloads import DownloadJob, DownloadStrip
from ui.worker import PairRequest

TOKEN_RETRIES = 2  # a wrong token is asked for again, but not forever


def _named(role: str, source: ModelSource, loads: str | None = None) -> tuple:
    """(what the runner loads, how the user named it) for a role: paths or hub ids for the target,
    DraftChoices for the draft; `loads` is where a hub model was fetched to."""
    if role == "draft":
        return source.as_draft(loads)
    return loads or source.value, source.name


class PairController(QObject):
    request_pair = Signal(object)  # PairRequest, to the worker's thread
    request_trial = Signal(object)  # PairRequest just loaded: measure it
    error = Signal(str)  # a message for a banner; the pair in use is untouched
    info = Signal(str)  # something to know, not wrong (a download cancelled, a fallback)
    trial_shown = Signal(str)  # the Draft slot's detail line: "accepts 71%, 2.1x faster here (2.0-2.2x)"

    def __init__(self, strip: DownloadStrip, backend: str = "", memory: PairMemory | None = None,
                 ask_token: Callable[[str, str], str | None] = lambda repo, why: None,
                 endpoint: str | None = None, parent: QObject | None = None,
                 ask_remote: Callable[[str], object] = lambda address: None):
        super().__init__(parent)
        self.strip = strip
        self.backend = backend
        self.memory = memory or PairMemory()
        self.ask_token = ask_token  # the window's dialog: (repo id, why) -> a token or None
        self.endpoint = endpoint  # tests point the hub at a local server
        # the window's server dialog (ui/pairing/remote_dialog.py): an address -> a RemoteChoice or None
        self.ask_remote = ask_remote
        self.current: PairRequest | None = None
        self.loaded: LoadedModel | None = None
        self.job: DownloadJob | None = None
        # what the running job was started for: (sources, missing, resolved, tries, the target's precision)
        self._pending: tuple = ()
        self._new_token: str | None = None
        self.trial_running = False
        self.trial_text = ""  # what the Draft slot last showed of the trial, to show again
        self.remembered: dict | None = None  # the last session's pair, while it loads at start
        self.trial_shown.connect(lambda text: setattr(self, "trial_text", text))
        strip.cancel_requested.connect(self.cancel_download)

    # What the user did

    def drop(self, role: str, texts: list[str]) -> None:
        """Texts dropped on a slot ("target"/"draft"), or anywhere on the window ("window"):
        there two models pair by size (the larger is the target), one model is a target."""
        if role == "window":
            if len(texts) >= 2:
                self.choose_pair(*_by_size(texts[:2]))
                return
            role = "target"
        self.choose(role, texts[0])

    def choose(self, role: str, text: str) -> None:
        if is_server_address(text):
            if role == "draft":
                self.error.emit("A server's address goes on the Target slot: the server drafts as it was started, "
                                "and the panel shows what it reports.")
                return
            self.choose_server(text)
            return
        try:
            source = classify(text, role)
        except ModelFileError as exc:
            self.error.emit(str(exc))
            return
        self._fetch([(role, source)])

    def choose_server(self, address: str = "") -> None:
        """A model on a server as the target: the window asks which (and its key), then it loads."""
        choice = self.ask_remote(address)
        if choice is not None:
            self.choose_remote(choice)

    def choose_remote(self, choice) -> None:
        """Load a RemoteChoice (ui/pairing/remote_dialog.py). A key to remember is kept first; where
        the store refuses it, the load still uses it, and the banner says it was not kept."""
        from app.remote import keys
        from app.remote.endpoint import parse_endpoint

        key = choice.key
        if key and choice.remember:
            try:
                keys.save(parse_endpoint(choice.address).origin, key)
                key = None  # the load reads it back from the store
            except keys.KeyStoreError as exc:
                self.error.emit(f"{exc} It is used for this connection only.")
        self.request_pair.emit(PairRequest(choice.address, NO_DRAFT, self.backend, choice.address, NO_DRAFT,
                                           remote_model=choice.model, ca_file=choice.ca_file, remote_key=key))

    def choose_draft(self, draft: DraftChoice) -> None:
        """A way of drafting picked from the Draft slot's menu."""
        self._choose_sources(lambda: [("draft", draft_source(draft))])

    def choose_pair(self, target: str, draft: str) -> None:
        """Two texts dropped together: the larger model is the target."""
        self._choose_sources(lambda: [("target", classify(target, "target")), ("draft", classify(draft, "draft"))])

    def choose_known(self, target: str, draft: DraftChoice, precision: str = "auto") -> None:
        """A pair named before (the catalog, a recent pair, at the precision it was loaded at):
        its files are checked again."""
        self._choose_sources(lambda: [("target", classify(target, "target")), ("draft", draft_source(draft))],
                             precision)

    def _choose_sources(self, sources: Callable[[], list[tuple[str, ModelSource]]], precision: str = "auto") -> None:
        try:
            chosen = sources()
        except ModelFileError as exc:
            self.error.emit(str(exc))
            return
        self._fetch(chosen, precision=precision)

    def choose_catalog(self, pair: CatalogPair) -> None:
        self.choose_known(*pair.specs)

    def choose_recent(self, entry: dict) -> None:
        self.choose_known(entry["target"], entry["draft"], entry.get("precision", "auto"))

    def start(self, target: str | None, draft: DraftChoice | None) -> None:
        """The session's first pair: what the command line named, else the pair loaded last (its
        precision and context too, remembered in pairs.json), else the demo with "auto"."""
        try:
            backend = self.backend or default_backend()
        except RuntimeError:  # no array library at all: the load says so
            backend = None
        last = self.memory.last_pair(backend) if target is None and draft is None and backend else None
        if last is None:
            self.request_pair.emit(PairRequest(target or "demo", draft or AUTO_DRAFT, self.backend,
                                               context=self.memory.context(target or "demo")))
            return
        self.remembered = last
        try:
            sources = [("target", classify(last["target"], "target")), ("draft", draft_source(last["draft"]))]
        except ModelFileError as exc:  # its folder is gone: the demo, saying why
            self.remembered_failed(str(exc))
            return
        self._fetch(sources, precision=last["precision"])

    def remembered_failed(self, why: str) -> bool:
        """The pair remembered from the last session could not load: say why and load the demo.
        False where no remembered pair was being loaded (the failure is the user's new choice)."""
        last, self.remembered = self.remembered, None
        if last is None:
            return False
        self.error.emit(f"The pair you used last, {last['title']}, could not be loaded ({why.rstrip('.')}). "
                        "Tandem loads the demo instead; the pair stays in the Recent pairs menu.")
        self.request_pair.emit(PairRequest("demo", AUTO_DRAFT, self.backend, context=self.memory.context("demo")))
        return True

    def cancel_download(self) -> None:
        if self.job is not None:
            self.job.cancel()
            self.strip.cancel_button.setEnabled(False)
            self.strip.file_label.setText("Cancelling…")

    # Fetching what the hub holds, then loading

    def _fetch(self, sources: list[tuple[str, ModelSource]], token: str | None = None, tries: int = 0,
               precision: str = "auto") -> None:
        if self.job is not None:
            self.error.emit("A download is already running: wait for it or cancel it first.")
            return
        missing = []
        resolved: dict[str, tuple] = {}  # role -> (what to load, how the user named it): see _named
        for role, source in sources:
            if source.kind != "hub":
                resolved[role] = _named(role, source)
            elif (cached := hub.cached_model(source.ref)) is not None:
                resolved[role] = _named(role, source, str(cached))
            else:
                missing.append((role, source))
        if not missing:
            self._load(resolved, precision)
            return
        job = DownloadJob([source.ref for _, source in missing], token=token or hub.saved_token(),
                          endpoint=self.endpoint, precheck=self._precheck_for(missing, resolved), parent=self)
        self.job = job
        self._pending = (sources, missing, resolved, tries, precision)
        self._new_token = token if tries else None  # one the user just gave
        self.strip.begin(" and ".join(source.name for _, source in missing))
        # Bound methods of objects on the GUI thread: the job emits from its own thread, and Qt
        # queues such signals to the receiver's thread (a plain function would run on the job's).
        job.progress.connect(self.strip.update_progress)
        job.warning.connect(self._job_warning)
        job.done.connect(self._job_done)
        job.failed.connect(self._job_failed)
        job.cancelled.connect(self._job_cancelled)
        job.start()

    def _job_warning(self, message: str) -> None:
        self.info.emit(message)

    def _job_done(self, paths: list) -> None:
        _sources, missing, resolved, _tries, precision = self._pending
        self._end_job()
        if self._new_token:
            hub.save_token(self._new_token)  # where huggingface-hub keeps it, for every tool
        for (role, source), path in zip(missing, paths, strict=True):
            resolved[role] = _named(role, source, str(path))
        self._load(resolved, precision)

    def _job_failed(self, exc: Exception) -> None:
        sources, _missing, _resolved, tries, precision = self._pending
        self._end_job()
        if isinstance(exc, hub.NeedsToken) and tries < TOKEN_RETRIES:
            new_token = self.ask_token(exc.repo_id, str(exc))
            if new_token:  # saved once it has worked, never over a good token the user already has
                self._fetch(sources, new_token, tries + 1, precision)
                return
        message = str(exc) if isinstance(exc, (ModelFileError, ValueError)) else f"The download failed: {exc}"
        if not self.remembered_failed(message):
            self.error.emit(message)

    def _job_cancelled(self) -> None:
        self._end_job()
        if self.remembered_failed("its download was cancelled"):
            return
        self.info.emit("Download cancelled. What was fetched is kept: choosing the model again resumes it.")

    def _precheck_for(self, missing: list[tuple[str, ModelSource]], resolved: dict[str, tuple]):
        """The check to run (on the download thread) once the hub models' configs and tokenizers
        are in: the pair as it will be, with the models that stay (or are on disk) beside them."""
        current = self.current
        loaded = self.loaded
        backend = loaded.backend if loaded else self.backend or default_backend()

        def check(found: list) -> str:
            parts = {role: PairPart(folder, size) for (role, _), got in zip(missing, found, strict=True)
                     if got is not None for folder, size in [got]}
            for role, (value, _) in resolved.items():
                folder = value.source if role == "draft" else value  # a keyword's is ""
                if folder and Path(folder).is_dir():
                    parts[role] = local_part(folder)
            target_missing = any(role == "target" for role, _ in missing)
            if "target" not in parts and loaded is not None and "target" not in resolved and not target_missing:
                parts["target"] = local_part(loaded.folder)
            if "target" not in parts:
                return ""  # a .gguf or the demo: Runner.load checks it once it is converted
            draft = parts.get("draft")
            if draft is None and "draft" not in resolved and current is not None:
                if current.draft.kind is DraftKind.SELF:
                    draft = replace(parts["target"], precision=current.draft.precision)
                elif (current.draft.kind in (DraftKind.MODEL, DraftKind.ASSISTANT)
                      and Path(current.draft.source).is_dir()):
                    draft = local_part(current.draft.source)
            return precheck_pair(parts["target"], draft, backend, self.held_bytes)

        return check

    @property
    def held_bytes(self) -> int:
        """What the pair in use holds (target and draft model), which a new pair replaces."""
        return (self.loaded.weights_bytes + self.loaded.draft_bytes) if self.loaded else 0

    def on_unloaded(self) -> None:
        self.loaded = None

    def _end_job(self) -> None:
        self.job = None
        self.strip.end()

    def _load(self, resolved: dict[str, tuple], precision: str = "auto") -> None:
        """Load what was resolved; `precision` is the target's ("auto" but for a recent pair's)."""
        current = self.current or PairRequest("demo", AUTO_DRAFT, self.backend)
        target, target_name = resolved.get("target", (current.target, current.named()[0]))
        draft, draft_name = resolved.get("draft", (current.draft, current.named()[1]))
        # A new target alone keeps the draft model in use only when their tokenizers agree.
        keep_draft = "target" in resolved and "draft" not in resolved
        # the old target's own layer, or a published drafter made for the old target (it reads that
        # model's layers): the new target's own choice instead, its MTP layer or a drafter measured with it
        if keep_draft and (draft.kind is DraftKind.MTP or draft.kind in HEADS):
            draft, draft_name = AUTO_DRAFT, AUTO_DRAFT
        self.request_pair.emit(PairRequest(target, draft, self.backend, target_name, draft_name, keep_draft,
                                           precision=precision, context=self.memory.context(target_name)))

    def set_context(self, tokens: int | None) -> None:
        """A context length for the loaded target (None: its own), remembered for that model; the
        pair loads again with it (the memory check plans for it)."""
        if self.current is None:
            return
        target_name = self.current.named()[0]
        problem = self.memory.set_context(target_name, tokens)
        if problem:
            self.error.emit(problem)
        self.request_pair.emit(replace(self.current, keep_draft=False, context=tokens))

    # What the worker reported

    def on_paired(self, request: PairRequest, info: LoadedModel) -> None:
        self.current, self.loaded, self.remembered = request, info, None
        if info.remote:  # nothing of it is on this machine to remember or to try
            self.trial_running, self.trial_text = False, ""
            return
        target_name, draft_name = request.named()
        problem = self.memory.add_recent(info.backend, target_name, draft_name, precision=request.precision)
        if problem:  # the pair works; only remembering it failed (a full or read-only folder)
            self.error.emit(problem)
        remembered = self.memory.trial(info.backend, target_name, draft_name)
        # the previous pair's trial, if one ran, ended with it (the worker drops it unreported)
        self.trial_running = False
        if remembered is not None:
            self.trial_shown.emit(remembered.summary())
        elif info.draft == NO_DRAFT:
            self.trial_text = ""
        else:
            self.trial_running = True
            self.trial_shown.emit("trying the pair on a few prompts…")
            self.request_trial.emit(request)

    def on_trial_done(self, request: PairRequest, result) -> None:
        self.trial_running = False
        if request != self.current:
            return  # another pair was loaded meanwhile
        if result is None:
            self.trial_shown.emit("the trial did not finish: it runs again next time this pair loads")
            return
        target_name, draft_name = request.named()
        problem = self.memory.set_trial(self.loaded.backend, target_name, draft_name, result)
        if problem:
            self.error.emit(problem)
        self.trial_shown.emit(result.summary())


def _by_size(texts: list[str]) -> tuple[str, str]:
    """Two dropped models: the larger on disk is the target."""
    from app.models.sources import model_size

    return tuple(sorted(texts, key=model_size, reverse=True))  # type: ignore[return-value]
