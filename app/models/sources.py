"""What a user dropped or typed on a model slot, classified before anything is read or fetched:
a model folder, a .gguf file, a Hugging Face repo (id or URL), or one of the draft keywords
(app/draft_choice.py: "ngram", "prompt lookup", "self:int4", "mtp", "none", "auto"). A Gemma 4
assistant's folder (app/models/draft_heads.py) drafts as an assistant, and a published drafter's
(an EAGLE-3 head, a DFlash block drafter: app/models/head_sources.py) as that drafter, not as a
draft model; "eagle3:<hub id>" and "dflash:<hub id>" are fetched from the hub like a model and
then draft as their kind."""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from app.draft_choice import DraftChoice, DraftChoiceError, DraftKind
from app.models.draft_heads import is_assistant_folder
from app.models.errors import ModelFileError
from app.models.folder import PICKLED_SUFFIXES
from app.models.head_sources import HEADS, head_kind
from app.models.hub import HOSTS, HubRef, parse_hub_ref
from app.models.integrity import unreadable

MAX_TEXT = 4096  # PATH_MAX on Linux; longer text dropped on a slot is no path and no link

@dataclass(frozen=True)
class ModelSource:
    kind: str  # "folder" | "gguf" | "hub" | "demo" | "keyword"
    value: str  # a path, a repo id, or a keyword's text form ("ngram")
    ref: HubRef | None = None
    keyword: DraftChoice | None = None  # the way of drafting a "keyword" names
    # the kind a hub id or folder was named as ("eagle3:<hub id>", "dflash:<hub id>"): it drafts as
    # that once fetched, whatever its folder holds (the runner then says in words why it cannot)
    drafts_as: DraftKind | None = None

    @property
    def name(self) -> str:
        """How recents and messages name it: the repo id for the hub, else the path."""
        return self.value

    def as_draft(self, loads: str | None = None) -> tuple[DraftChoice, DraftChoice]:
        """(what the runner loads, how the user named it) for the Draft slot; `loads` is where a
        hub model was fetched to."""
        if self.keyword is not None:
            return self.keyword, self.keyword
        if is_assistant_folder(loads or self.value):  # a Gemma 4 assistant drafts from the target's state
            return DraftChoice.assistant(loads or self.value), DraftChoice.assistant(self.name)
        kind = self.drafts_as or head_kind(loads or self.value)  # a published drafter, named or recognised
        if kind is not None:
            return DraftChoice(kind, source=loads or self.value), DraftChoice(kind, source=self.name)
        return DraftChoice.model(loads or self.value), DraftChoice.model(self.name)


def draft_source(choice: DraftChoice) -> ModelSource:
    """A draft remembered typed (a recent pair, the catalog) as the Draft slot would take it."""
    if choice.kind in (DraftKind.MODEL, DraftKind.ASSISTANT):  # fetched like any model, then as_draft
        return classify(choice.source, "draft")
    if choice.kind in HEADS:
        return classify(str(choice), "draft")  # its hub id fetched like a model's (see classify)
    return ModelSource("keyword", str(choice), keyword=choice)


def _expand(path: Path) -> Path:
    try:
        return path.expanduser()
    except RuntimeError:  # "~someone" with no such user: leave it as written
        return path


def _local_path(text: str) -> Path | None:
    if text.startswith("file:"):
        return Path(unquote(urlparse(text).path))
    if text.startswith(("/", "~", ".")) or (len(text) > 2 and text[1] == ":" and text[2] in "\\/"):
        return _expand(Path(text))
    path = _expand(Path(text))
    try:
        return path if path.exists() or path.is_symlink() else None
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte: not a file here
        return None


def _hub_link_with_dots(text: str) -> bool:
    """A huggingface.co link whose path has a "." or ".." segment: no file of a model is named so,
    and huggingface-hub refuses such names with a bare ValueError."""
    rest = text.split("://", 1)[-1].split("?", 1)[0].split("#", 1)[0]
    host, _, path = rest.partition("/")
    return host.lower() in HOSTS and any(part in (".", "..") for part in path.split("/"))


def classify(text: str, role: str = "target") -> ModelSource:
    """Raise ModelFileError, in plain words, for what cannot be a model; `role` is "target" or
    "draft" (only a draft can be a keyword such as prompt lookup)."""
    text = text.strip().strip('"').strip("'")
    if not text:
        raise ModelFileError("Nothing to load: drop a model folder, a .gguf file or a Hugging Face link.")
    if len(text) > MAX_TEXT:
        raise ModelFileError(
            f"Not a model: the text dropped is {len(text):,} characters long, too long for a file name or a link. "
            "Drop a model folder, a .gguf file, or a link such as https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct.")
    if _hub_link_with_dots(text):
        raise ModelFileError(
            f"Not a model: “{text[:80]}” has “..” or “.” in its path, which names no file of a model. Drop the "
            "model's page link, such as https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct.")
    from app.models.demo import DEMO_SPECS

    if text in DEMO_SPECS:
        return ModelSource("demo", text)
    try:
        keyword = DraftChoice.keyword(text)
        if keyword is not None and role == "draft":
            keyword = DraftChoice.parse_loadable(text)  # "pair" and "model" load nothing
    except DraftChoiceError as exc:
        raise ModelFileError(f"“{text[:80]}”: {exc}.") from None
    if keyword is not None:
        if role != "draft":
            raise ModelFileError(f"“{text}” is a way of drafting, not a target model: drop it on the Draft slot.")
        if keyword.kind in HEADS and (ref := _hub_head(keyword.source)) is not None:
            return ModelSource("hub", ref.repo_id, ref, drafts_as=keyword.kind)  # downloaded, then drafts as named
        return ModelSource("keyword", str(keyword), keyword=keyword)
    path = _local_path(text)
    if path is not None:
        try:
            return _classify_path(path)
        except OSError as exc:  # a name too long for the file system, a link that loops, no permission
            raise ModelFileError(_not_readable(path, exc)) from exc
    ref = parse_hub_ref(text)
    if ref is not None:
        return ModelSource("hub", ref.repo_id, ref)
    raise ModelFileError(
        f"“{text[:80]}” is neither a file on this computer nor a Hugging Face model. Drop a model folder, "
        "a .gguf file, or a link such as https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct.")


def _hub_head(source: str) -> HubRef | None:
    """The hub drafter "eagle3:<source>" or "dflash:<source>" names, where <source> is a hub id or
    link and no path here."""
    if _local_path(source) is not None:
        return None
    return parse_hub_ref(source)


def _not_readable(path: Path, exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        return (f"Not a model: “{str(path)[:80]}…” is too long to be a file name on this computer. Drop a model "
                "folder, a .gguf file, or a Hugging Face link.")
    return unreadable(path, exc)


def _classify_path(path: Path) -> ModelSource:
    if path.is_symlink() and not path.exists():  # exists() follows the link: it loops or points nowhere
        os.stat(path)  # raises the OSError that says which
    if path.is_dir():
        return ModelSource("folder", str(path))
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return ModelSource("gguf", str(path))
        if path.suffix.lower() in PICKLED_SUFFIXES:
            raise ModelFileError(
                f"{path.name} is a pickled checkpoint. Tandem loads only safetensors and GGUF, because a "
                "pickled file can run arbitrary code when loaded. Look for a safetensors or GGUF version.")
        if path.name in ("config.json",) or path.suffix.lower() == ".safetensors":
            return ModelSource("folder", str(path.parent))  # a file from a model folder: the folder
        raise ModelFileError(
            f"{path.name} is not a model. Drop a model folder (config.json, *.safetensors and tokenizer "
            "files), a .gguf file, or a Hugging Face link.")
    raise ModelFileError(f"{path}: no such file or folder.")


def drag_verdict(text: str, role: str) -> str:
    """A short reason shown while dragging over a slot, or "" when it looks usable. Cheap: only
    file names and the presence of config.json are looked at; the full checks run on drop."""
    from app.remote.endpoint import is_server_address

    if is_server_address(text):  # asked about when dropped (app/remote/)
        return "" if role == "target" else "a server's address goes on the Target slot"
    try:
        source = classify(text, role)
    except ModelFileError as exc:
        return str(exc).split(". ")[0]
    if source.kind == "folder" and not (Path(source.value) / "config.json").is_file():
        return "no config.json: not a model folder"
    return ""


def model_size(text: str) -> int:
    """Bytes of weights on disk, for telling a dropped target from its draft; 0 when unknown
    (a hub model not fetched yet)."""
    try:
        path = _local_path(text.strip())
        if path is None or not path.exists():
            return 0
        if path.is_file():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.glob("*.safetensors") if p.is_file())
    except OSError:  # unreadable: the drop's own checks say why
        return 0
