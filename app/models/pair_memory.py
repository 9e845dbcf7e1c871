"""What Tandem remembers about pairs across sessions: the recent pairs (for the slots' menus) and
each pair's trial result ("accepts 71%, about 2.1x faster here"), in one small JSON file.

A damaged file is set aside and started afresh: it holds nothing a user typed, only what the app
measured and can measure again. Every field is checked where it is read (type and range): an
entry that fails is skipped, the others kept, and `notice` says once, in words, what was skipped
(a number where a list belongs once stopped the demo loading on every start). Drafts are written
in DraftChoice's text form ("ngram", "self:int4", a path), the words every version wrote, and read
back typed.
"""

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from app import data_files
from app.data_files import DataFileError, NotAnswering
from app.draft_choice import PROMPT_LOOKUP, DraftChoice, DraftChoiceError, DraftKind
from app.engine.backends import BACKENDS, PRECISIONS
from app.json_fields import is_number, is_whole, shown
from app.paths import data_dir

MAX_RECENT = 8
FILE_NAME = "pairs.json"


@dataclass(frozen=True)
class TrialResult:
    acceptance: float  # accepted drafts / drafted tokens over the trial prompts
    speedup: float  # speculative tokens/s over the target alone's, same prompts, same run
    tokens_per_pass: float
    tokens: int  # new tokens per run, summed over the prompts
    measured_at: float  # time.time()
    low: float | None = None  # the speedup's range over the trial's passes (app/pair_trial.py);
    high: float | None = None  # None in a trial remembered from before trials had one

    def range(self) -> tuple[float, float]:
        """(low, high): the passes' spread, or the figure alone where none was measured."""
        return (self.speedup if self.low is None else self.low, self.speedup if self.high is None else self.high)

    def clears(self, other: TrialResult, margin: float) -> bool:
        """Whether this pair measured faster than `other` beyond both ranges (app/pair_trial.py);
        where either was remembered without one, its figure must beat the other's by `margin`."""
        if None not in (self.low, other.high):
            return self.low > other.high
        return self.speedup > margin * other.speedup

    def figure(self, digits: int = 1) -> str:
        """"1.2x", with the range where the trial measured one: "1.2x (1.15-1.22x)"."""
        return f"{self.speedup:.{digits}f}x{self._range_text()}"

    def _range_text(self) -> str:
        return "" if self.low is None or self.high is None else f" ({self.low:.2f}-{self.high:.2f}x)"

    def summary(self) -> str:
        """"accepts 71%, 2.1x faster here (2.0-2.2x)": faster or slower only where the whole range
        says so, else about as fast."""
        low, high = self.range()
        ranged = self.low is not None and self.high is not None
        # the side panel's interval rule where the trial measured a range (app/chat/baseline.py:
        # a claim once the whole range is on one side of 1); a figure remembered without one
        # claims only beyond a margin
        floor, ceiling = (1.0, 1.0) if ranged else (1.05, 0.95)
        if low > floor:
            faster = f"{'' if ranged else 'about '}{self.speedup:.1f}x faster here"
        elif high < ceiling:
            faster = f"{self.speedup:.2f}x: slower than the target alone here"
        else:
            faster = "about as fast as the target alone here"
        return f"accepts {self.acceptance:.0%}, {faster}{self._range_text()}"


def read_trial(found) -> TrialResult | None:
    """A trial as stored (pairs.json, the align job's JSON), or None where it is not one: another
    version's fields, a number that is not one, half a range or one upside down (hand-edited or
    damaged: measured again on the next load)."""
    if not isinstance(found, dict):
        return None
    try:
        result = TrialResult(**found)
    except TypeError:
        return None
    fields = TrialResult.__dataclass_fields__
    if not all(value is None and name in ("low", "high") or is_number(value)
               for name, value in ((name, getattr(result, name)) for name in fields)):
        return None
    if (result.low is None) != (result.high is None) or result.low is not None and result.low > result.high:
        return None
    return result


MIN_CONTEXT = 256  # the least context the window offers: a message and an answer of some length
MAX_CONTEXT = 2**31 - 1  # the most a 32-bit count holds (the window's spin boxes, the engines' positions)
LISTED_PROBLEMS = 3  # a notice names this many skipped entries, then counts the rest


def pair_key(backend: str, target: str, draft: DraftChoice) -> str:
    return f"{backend}|{target}|{draft}"


class PairMemory:
    def __init__(self, path: Path | None = None):
        self.path = path or data_dir() / FILE_NAME
        self.skipped: list[str] = []  # entries (or their figures) refused on read, in words ("contexts “x”: ...")
        self.damage = ""  # why the whole file could not be read ("not JSON"), where it could not
        self.set_aside_as: Path | None = None  # where that file went
        self.unreachable = ""  # why the file did not answer (a stalled network folder), where it did not
        self._data = self._read()

    @property
    def notice(self) -> str | None:
        """What the user should be told, once, about the file as it was read (the window shows it
        as a banner); None where it read whole."""
        parts = []
        if self.unreachable:
            parts.append(f"{self.unreachable}: Tandem left it as it is, and remembers this session's pairs and "
                         "speeds only until it closes.")
        if self.damage:
            where = (f"was set aside as {self.set_aside_as.name}" if self.set_aside_as is not None
                     else "could not be moved aside")
            parts.append(f"Tandem could not read {self.path} ({self.damage}); it {where} and Tandem started afresh. "
                         "It held only pairs and speeds Tandem measured, which it measures again.")
        if self.skipped:
            listed = "; ".join(self.skipped[:LISTED_PROBLEMS])
            if len(self.skipped) > LISTED_PROBLEMS:
                listed += f"; and {len(self.skipped) - LISTED_PROBLEMS} more"
            parts.append(f"Parts of {self.path} could not be read and were left out ({listed}). Everything else "
                         "was kept; the next save writes the file without them.")
        return " ".join(parts) or None

    def _read(self) -> dict:
        """What the file holds that can be used: entries of the wrong shape (hand-edited, another
        version's, damaged) are skipped one by one, so one bad entry costs only itself."""
        try:
            # bounded: a FIFO or a stalled network folder here once kept the window from ever showing
            data = json.loads(data_files.read_text(self.path))
        except FileNotFoundError:
            data = {}
        except NotAnswering as exc:  # left where it is, and not written to this session: a write would hang too
            self.unreachable = str(exc)
            data = {}
        except DataFileError as exc:  # a FIFO, a folder, a file of hundreds of MB
            data = self._set_aside("it " + str(exc).removeprefix(f"{self.path} "))
        except UnicodeDecodeError:
            data = self._set_aside("it is not UTF-8 text")
        except ValueError:
            data = self._set_aside("it is not JSON")
        except RecursionError:  # "[[[[...": nested deeper than the parser goes
            data = self._set_aside("its JSON is nested too deeply")
        except OSError as exc:  # a folder, a file without read permission
            data = self._set_aside(exc.strerror or type(exc).__name__)
        if not isinstance(data, dict):
            data = self._set_aside(f"it holds {shown(data)}, not an object of entries")
        # alignments first: they change what a pair loads with, so the notice names them first
        alignments = {}
        for key, value in self._section(data, "alignments", dict).items():
            entry, problems = _alignment_entry(value)
            self.skipped.extend(f"alignments “{key}”: {problem}" for problem in problems)
            if entry is not None:
                alignments[key] = entry
        recent = []
        for number, item in enumerate(self._section(data, "recent", list), 1):
            entry, problem = _recent_entry(item)
            if problem:
                self.skipped.append(f"recent entry {number}: {problem}")
            elif len(recent) < MAX_RECENT:
                recent.append(entry)
        trials = {}
        for key, value in self._section(data, "trials", dict).items():
            if read_trial(value) is None:
                self.skipped.append(f"trials “{key}”: {shown(value)} is not a trial as Tandem writes it")
            else:
                trials[key] = value
        contexts = {}
        for key, value in self._section(data, "contexts", dict).items():
            if is_whole(value) and MIN_CONTEXT <= value <= MAX_CONTEXT:
                contexts[key] = value
            else:
                self.skipped.append(f"contexts “{key}”: {shown(value)} is not a whole number of tokens from "
                                    f"{MIN_CONTEXT} to {MAX_CONTEXT:,}")
        return {"recent": recent, "trials": trials, "contexts": contexts, "alignments": alignments}

    def _section(self, data: dict, name: str, kind: type) -> list | dict:
        """One of the file's sections, or an empty one where it is missing or of the wrong type."""
        found = data.get(name)
        if isinstance(found, kind):
            return found
        if found is not None:
            self.skipped.append(f"{name}: {shown(found)} is not a {'list' if kind is list else 'JSON object'}")
        return kind()

    def _set_aside(self, why: str) -> dict:
        """Move the unreadable file aside (kept, never deleted) and start afresh: an empty memory."""
        self.damage = why
        aside = self.path.with_suffix(f".damaged-{int(time.time())}")
        try:
            self.path.replace(aside)
            self.set_aside_as = aside
        except OSError:  # a read-only folder: leave it; the notice says so
            pass
        return {}

    def _write(self) -> str | None:
        """None once saved; else a sentence for the user (disk full, read-only folder). What was
        remembered stays in memory for this session, and the previous file stays whole."""
        if self.unreachable:  # the folder did not answer a read: a write would hang the window (the notice says so)
            return None
        # write-then-rename: a crash mid-write leaves the previous file, never half of one
        partial = self.path.with_suffix(".tmp")
        try:
            partial.write_text(json.dumps(self._data, indent=1), encoding="utf-8")
            os.replace(partial, self.path)
        except OSError as exc:
            try:
                partial.unlink(missing_ok=True)
            except OSError:
                pass
            reason = {errno.ENOSPC: "the disk is full", errno.EROFS: "the folder is read-only",
                      errno.EACCES: "no permission to write there", errno.EDQUOT: "the disk quota is used up"}.get(
                exc.errno, exc.strerror or type(exc).__name__)
            return (f"Tandem could not save its recent pairs to {self.path} ({reason}). They are kept until Tandem "
                    "closes; free some disk space or check that you may write to that folder.")
        return None

    def recent(self, backend: str | None = None) -> list[dict]:
        """Newest first: {"backend", "target", "draft" (a DraftChoice), "precision", "title"}."""
        return [{**r, "draft": DraftChoice.parse_loadable(r["draft"]), "precision": r.get("precision", "auto")}
                for r in self._data["recent"] if backend is None or r.get("backend") == backend]

    def recent_pairs(self, backend: str | None = None) -> list[dict]:
        """The recent pairs as a menu lists them: newest first, one entry per pair however it was
        named (the demo by "demo" and by its cache folder are one), titled in names a user knows
        ("Demo: SmolLM2 135M + the same model in 4-bit", a repo id, a model's folder name), with
        the names as given in "tooltip"."""
        listed, seen = [], set()
        for entry in self.recent(backend):
            key = (entry["backend"], *same_pair(entry["target"], entry["draft"], entry["backend"]))
            if key not in seen:
                seen.add(key)
                draft = key[2]
                listed.append({**entry, "title": recent_title(entry["target"], entry["draft"], entry["backend"]),
                               "tooltip": f"Target: {entry['target']}\nDraft: {draft_words(draft)}"})
        return listed

    def last_pair(self, backend: str | None = None) -> dict | None:
        """The pair loaded last (on `backend`, where one is given), what a new session loads again:
        {"backend", "target", "draft" (a DraftChoice), "precision", "title"}; None before any."""
        found = self.recent(backend)
        return found[0] if found else None

    def add_recent(self, backend: str, target: str, draft: DraftChoice, title: str = "",
                   precision: str = "auto") -> str | None:
        """None once saved, else why it could not be (see _write). The entry replaces any naming the
        same pair (see same_pair); `title` defaults to recent_title's; `precision` is the target's
        (a pair taken at int4 to fit loads at int4 again)."""
        entry = {"backend": backend, "target": target, "draft": str(draft), "precision": precision,
                 "title": title or recent_title(target, draft, backend)}
        key = (backend, *same_pair(target, draft, backend))
        kept = [stored for stored, r in zip(self._data["recent"], self.recent(), strict=True)
                if (r["backend"], *same_pair(r["target"], r["draft"], r["backend"])) != key]
        self._data["recent"] = [entry, *kept][:MAX_RECENT]
        return self._write()

    def context(self, target: str) -> int | None:
        """The context length chosen for a model (None: its own, or what memory holds)."""
        return self._data["contexts"].get(target)

    def set_context(self, target: str, tokens: int | None) -> str | None:
        """None once saved, else why it could not be (see _write). None forgets the choice."""
        if tokens is None:
            self._data["contexts"].pop(target, None)
        else:
            self._data["contexts"][target] = int(tokens)
        return self._write()

    def trial(self, backend: str, target: str, draft: DraftChoice) -> TrialResult | None:
        found = self._data["trials"].get(pair_key(backend, target, draft))
        if not isinstance(found, dict):
            return None
        return read_trial(found)

    def trials_of(self, backend: str, target: str) -> list[tuple[DraftChoice, TrialResult]]:
        """Every draft measured with `target` on `backend`, as (the draft as named, its trial)."""
        prefix, found = f"{backend}|{target}|", []
        for key, value in self._data["trials"].items():
            if key.startswith(prefix) and (trial := read_trial(value)) is not None:
                try:
                    found.append((DraftChoice.parse_loadable(key[len(prefix):]), trial))
                except DraftChoiceError:  # a request's word, or an older spelling: no draft to pair with
                    continue
        return found

    def set_trial(self, backend: str, target: str, draft: DraftChoice, result: TrialResult) -> str | None:
        """None once saved, else why it could not be (see _write)."""
        self._data["trials"][pair_key(backend, target, draft)] = asdict(result)
        return self._write()

    def alignment(self, backend: str, target: str) -> dict | None:
        """The target's latest alignment (`tandem-cli align`, the window's Align draft): {"aligned",
        "original" (DraftChoices), "before", "after" (TrialResults or None), "agreement" ([before,
        after], or [] where none was read), "active" (whether "auto" pairs the target with it)};
        None where there is none. Each field was checked as the file was read (_alignment_entry)."""
        found = self._data["alignments"].get(alignment_key(backend, target))
        if found is None:
            return None
        return {"aligned": DraftChoice.parse_loadable(found["aligned"]),
                "original": DraftChoice.parse_loadable(found["original"]),
                "before": read_trial(found.get("before")), "after": read_trial(found.get("after")),
                "agreement": list(found.get("agreement") or []), "active": found.get("active", True) is not False}

    def set_alignment(self, backend: str, target: str, aligned: DraftChoice, original: DraftChoice,
                      before: TrialResult | None, after: TrialResult | None, agreement: tuple[float, float],
                      active: bool = True) -> str | None:
        """None once saved, else why it could not be (see _write)."""
        self._data["alignments"][alignment_key(backend, target)] = {
            "aligned": str(aligned), "original": str(original), "before": before and asdict(before),
            "after": after and asdict(after), "agreement": [float(a) for a in agreement], "active": active}
        return self._write()

    def set_alignment_active(self, backend: str, target: str, active: bool) -> str | None:
        """Undo (False) or redo (True) pairing the target with its aligned draft; the draft stays on disk."""
        found = self._data["alignments"].get(alignment_key(backend, target))
        if isinstance(found, dict):
            found["active"] = active
            return self._write()
        return None


def alignment_key(backend: str, target: str) -> str:
    """One key per target however it is named: "demo" and the demo's folders as same_pair names
    them, any other folder by its resolved path (a relative path, a trailing slash, a symlink)."""
    from app.draft_choice import NO_DRAFT
    from app.models.demo import DEMO_SPECS

    target = str(target)
    if target not in DEMO_SPECS and Path(target).expanduser().exists():
        target = str(Path(target).expanduser().resolve())
    return f"{backend}|{same_pair(target, NO_DRAFT, backend)[0]}"


def _alignment_entry(value) -> tuple[dict | None, list[str]]:
    """An alignment as alignment() reads it, and what was wrong with it in words. Without a draft
    to load for "aligned" and "original" the entry is skipped; a figure of the wrong shape
    (before, after, agreement, active) is dropped to its default and the entry kept."""
    if not isinstance(value, dict):
        return None, [f"{shown(value)} is not an alignment (a JSON object)"]
    drafts = {}
    for name in ("aligned", "original"):
        try:
            drafts[name] = DraftChoice.parse_loadable(value.get(name))
        except DraftChoiceError:
            return None, [f"{name} is {shown(value.get(name))}, not a draft Tandem can load"]
        if drafts[name].source and not _nameable(drafts[name].source):
            return None, [f"{name} is {shown(value.get(name))}, which no folder or model can be named"]
    aligned = drafts["aligned"]
    why = not_aligned(aligned)
    if why:  # paired at every start, it would stop its target loading every time
        return None, [f"aligned names {aligned}, {why}; its target drafts with its default draft"]
    entry, problems = {**value}, []
    for name in ("before", "after"):
        if entry.get(name) is not None and read_trial(entry[name]) is None:
            problems.append(f"{name} is {shown(entry[name])}, not a trial as Tandem writes it (left out)")
            entry[name] = None
    agreement = entry.get("agreement")
    if agreement is None:
        entry["agreement"] = []
    elif not (isinstance(agreement, list) and len(agreement) in (0, 2)
              and all(is_number(a) and 0 <= a <= 1 for a in agreement)):
        problems.append(f"agreement is {shown(agreement)}, not two fractions from 0 to 1 (left out)")
        entry["agreement"] = []
    if not isinstance(entry.get("active", True), bool):
        problems.append(f"active is {shown(entry['active'])}, not true or false (read as true)")
        entry["active"] = True
    return entry, problems


def not_aligned(draft: DraftChoice) -> str:
    """Why `draft`, an alignment's "aligned", is not a draft `tandem-cli align` wrote, in words;
    "" where it is, or where it names no folder here to look at (a hub id, a folder since
    removed, prompt lookup: aligned_draft pairs none of them). Align writes "head:<folder>" or an
    aligned draft model's folder; anything else named there ("eagle3:<a model>", a folder of no
    model) stopped its target loading at every start."""
    from app.models.aligned_head import is_aligned_head, read_manifest

    if draft.kind not in (DraftKind.HEAD, DraftKind.MODEL):
        return ("which is not a kind of draft `tandem-cli align` writes (head:<folder>, or an aligned draft model's "
                "folder)") if draft.source else ""
    folder = local_folder(draft.source)
    if folder is None:
        return ""
    if draft.kind is DraftKind.HEAD:  # a plain model named as a head never loads
        return "" if is_aligned_head(folder) else ("which is not an aligned draft head (its config.json is not the "
                                                   "one `tandem-cli align` writes)")
    if is_aligned_head(folder) or read_manifest(folder).get("kind") == "model":  # a head named as a model drafts as one
        return ""
    return "which is not a draft `tandem-cli align` wrote (it holds no manifest.json of an aligned draft model)"


def _nameable(name: str) -> bool:
    """Whether a file system takes `name` as a path (the menus look it up): not too long, no
    "~nobody/" home, no NUL."""
    try:
        Path(name).expanduser().exists()
    except (OSError, RuntimeError, ValueError):
        return False
    return True


def local_folder(source: str) -> Path | None:
    """The folder a draft names, where it is one on this computer; None for a hub id, a missing
    folder, or a name no file system takes (too long, "~nobody/...")."""
    if not source:  # a draft without a folder (prompt lookup): Path("") would be the current folder
        return None
    try:
        path = Path(source).expanduser()
        return path if path.is_dir() else None
    except (OSError, RuntimeError, ValueError):
        return None




def same_pair(target: str, draft: DraftChoice, backend: str | None = None) -> tuple[str, DraftChoice]:
    """One name for each way of naming a pair on `backend`: the demo's cache folders are "demo"
    (its gguf folder on PyTorch, mlx on MLX) and "demo:float32" (PyTorch's hf folder), and "auto"
    is the draft it stands for (app/runner.auto_draft: the demo's measured best, a checkpoint's own
    MTP layer, prompt lookup for others)."""
    from app.models.demo import DEMO_REFERENCE, DEMO_SPECS, demo_draft
    from app.models.resolve import is_demo_folder

    backend = backend or "torch"
    if target not in DEMO_SPECS and is_demo_folder(Path(target)):
        name = Path(target).name
        if name in ("gguf", "mlx"):
            target = "demo"  # what "demo" loads on PyTorch and on MLX; its 4-bit folder is another target
        elif name == "hf":
            target = DEMO_REFERENCE if backend == "torch" else target
    if draft.kind is DraftKind.AUTO:
        from app.models.draft_heads import has_mtp

        draft = (demo_draft(target, backend, measured=False) if target in DEMO_SPECS
                 else DraftChoice(DraftKind.MTP) if has_mtp(target) else PROMPT_LOOKUP)
    return target, draft


def draft_words(draft: DraftChoice) -> str:
    """"self:int4 (the same model in 4-bit)"; a draft model's whole path as it is."""
    return str(draft) if draft.kind is DraftKind.MODEL else f"{draft} ({draft.label})"


def recent_title(target: str, draft: DraftChoice, backend: str | None = None) -> str:
    """"Demo: SmolLM2 135M + prompt lookup", "Qwen/Qwen2.5-7B-Instruct + prompt lookup"."""
    from app.models.resolve import DEMO_SHORT, model_label

    target, draft = same_pair(target, draft, backend)
    from app.models.demo import DEMO_REFERENCE

    names = {"demo": DEMO_SHORT, DEMO_REFERENCE: DEMO_SHORT + " in float32"}
    name = names.get(target) or model_label(target)
    return f"{name} alone" if draft.kind is DraftKind.NONE else f"{name} + {draft.label}"


def _recent_entry(item) -> tuple[dict | None, str]:
    """A recent pair as the menus need it, or None and why it cannot name a pair; a missing title
    is made from the names (older files had none)."""
    if not isinstance(item, dict):
        return None, f"{shown(item)} is not a pair (a JSON object)"
    for key in ("backend", "target", "draft"):
        if not isinstance(item.get(key), str) or not item[key].strip():
            return None, f"{key} is {shown(item.get(key))}, not a name"
    if item["backend"] not in BACKENDS:
        return None, f"backend is {shown(item['backend'])}, not one of {', '.join(BACKENDS)}"
    if not _nameable(item["target"]):
        return None, f"target is {shown(item['target'])}, which no folder or model can be named"
    try:
        draft = DraftChoice.parse_loadable(item["draft"])  # recent() reads it typed
    except DraftChoiceError:
        return None, f"draft is {shown(item['draft'])}, not a draft Tandem can load"
    if draft.source and not _nameable(draft.source):
        return None, f"draft is {shown(item['draft'])}, which no folder or model can be named"
    title = item.get("title")
    if not isinstance(title, str) or not title.strip():
        title = f"{item['target']} + {item['draft']}"
    precision = item.get("precision", "auto")  # older files wrote none: the weights' own
    if precision not in PRECISIONS:
        return None, f"precision is {shown(precision)}, not one of {', '.join(PRECISIONS)}"
    return {**item, "title": title, "precision": precision}, ""


def aligned_draft(backend: str, target: str, memory: PairMemory | None = None) -> DraftChoice | None:
    """The draft an alignment made for `target`, where "auto" should pair them: the alignment is
    active (not undone), its draft is still on disk, and it did not measure slower than the
    original draft in its own before/after trial."""
    found = (memory or PairMemory()).alignment(backend, str(target))
    folder = None if found is None else local_folder(found["aligned"].source)
    if found is None or not found["active"] or folder is None:
        return None
    if not_aligned(found["aligned"]):
        return None  # replaced by another folder since pairs.json was read: the default draft instead
    before, after = found["before"], found["after"]
    if before is not None and after is not None and after.speedup < before.speedup:
        return None
    return found["aligned"]


def measured_head(backend: str, target: str, memory: PairMemory | None = None) -> DraftChoice | None:
    """The published drafter (an EAGLE-3 head, a DFlash drafter) "auto" pairs `target` with: one
    this computer's pair trials measured faster than prompt lookup alone beyond both ranges
    (TrialResult.clears; the demo's head is held to the same rule, app/models/demo.py), and still
    here (its folder, or its hub download). Prompt lookup costs no memory and no pass per token, so
    a tie keeps it; of several drafters that clear, the fastest. A hub target is named by its id in
    trials and by its cache folder when it loads: both are looked up."""
    from app.models.demo import HEAD_MARGIN
    from app.models.errors import ModelFileError
    from app.models.head_sources import HEADS, find_head, head_kind

    memory = memory or PairMemory()
    target = str(target)
    found = []
    for name in _trial_names(target):
        # prompt lookup's own trial, else "auto"'s from while it meant prompt lookup (a target with
        # its own MTP layer meant that instead, and is left as it is)
        lookup = memory.trial(backend, name, PROMPT_LOOKUP)
        if lookup is None and not _has_mtp(target):
            lookup = memory.trial(backend, name, DraftChoice(DraftKind.AUTO))
        if lookup is None:
            continue
        for head, trial in memory.trials_of(backend, name):
            if head.kind not in HEADS or not trial.clears(lookup, HEAD_MARGIN):
                continue
            try:
                here = head_kind(find_head(head.source, head.kind)) is head.kind
            except ModelFileError:  # a hub drafter no longer in the cache
                here = False
            if here:
                found.append((trial.speedup, head))
    return max(found, key=lambda pair: pair[0])[1] if found else None


def _trial_names(target: str) -> list[str]:
    """A target as trials name it: as it loads, and a hub download's cache folder also by its id
    (models--org--name/snapshots/<commit>: the window remembers the id the user chose)."""
    from app.models.names import display_name

    folder = Path(target)
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return [target, display_name(folder)]
    return [target]


def _has_mtp(target: str) -> bool:
    from app.models.draft_heads import has_mtp

    return Path(target).is_dir() and has_mtp(target)
