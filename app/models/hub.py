"""Models from the Hugging Face hub, through huggingface-hub: only the files a model needs, into
the hub's own cache (so a model fetched by any other tool is found), with byte progress, cancel,
and resume after an interruption. Qt-free: the window runs `download` on a thread of its own
(ui/pairing/downloads.py).

huggingface-hub 2.x resumes a transfer only within one call and deletes its partial file when
the call fails, so a cancelled 15 GB download would start again from zero. Plain-HTTP files are
therefore fetched by `_fetch_resumable` into `blobs/<etag>.incomplete` in the hub's cache with
its own `http_get` (a ranged request from where the part ends); the finished blob is then handed
to hf_hub_download, which links it into the snapshot as it links any blob it finds. Xet-stored
files go straight to hf_hub_download: hf_xet keeps its own chunk cache, which is its resume."""

from __future__ import annotations

import fnmatch
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from app.models.errors import ModelFileError
from app.models.folder import PICKLED_SUFFIXES
from app.models.hub_progress import DownloadCancelled, DownloadProgress, ProgressCounter

__all__ = ["DownloadCancelled", "DownloadProgress", "HubError", "HubFile", "HubRef", "NeedsToken", "NoNetwork",
           "cached_model", "download", "parse_hub_ref", "plan_download", "save_token", "saved_token"]

# What a model needs and nothing else: weights in safetensors, config, tokenizer, chat template.
NEEDED = ("config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json",
          "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
          "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json")
PROBE_TIMEOUT_S = 8.0
# huggingface-hub's listing waits forever on a hub that accepted the connection and then went
# quiet (its client has no timeout), so the listing is Tandem's own request, with one.
LIST_TIMEOUT_S = 30.0
HOSTS = ("huggingface.co", "www.huggingface.co", "hf.co")
_PART = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"
_REPO_ID = re.compile(rf"^({_PART})/({_PART})$")


class HubError(ModelFileError):
    """A hub model cannot be fetched; the message says why and what to do."""


class NeedsToken(HubError):
    def __init__(self, message: str, repo_id: str):
        super().__init__(message)
        self.repo_id = repo_id


class NoNetwork(HubError):
    pass


@dataclass(frozen=True)
class HubRef:
    repo_id: str
    revision: str | None = None  # from a /tree/<rev>, /blob/<rev>/ or /resolve/<rev>/ link
    filename: str | None = None  # one file named by the link (a .gguf of a GGUF-only repo)


@dataclass(frozen=True)
class HubFile:
    name: str
    size: int


def parse_hub_ref(text: str) -> HubRef | None:
    """ "org/name" or a huggingface.co / hf.co link to a model; None for anything else (local
    paths, other hosts, plain words)."""
    text = text.strip().split("?", 1)[0].split("#", 1)[0].rstrip("/")
    if "://" in text:
        scheme, rest = text.split("://", 1)
        if scheme not in ("http", "https"):
            return None
        text = rest
    host, _, path = text.partition("/")
    if host.lower() in HOSTS:
        parts = [p for p in path.split("/") if p]
        if any(p in (".", "..") or not p.isprintable() for p in parts):
            return None  # names no file of a model (huggingface-hub refuses such names with a ValueError)
        if parts and parts[0] in ("models", "datasets", "spaces"):
            if parts[0] != "models":
                return None
            parts = parts[1:]
        if len(parts) < 2 or not _REPO_ID.match(f"{parts[0]}/{parts[1]}"):
            return None
        repo_id, rest = f"{parts[0]}/{parts[1]}", parts[2:]
        if len(rest) >= 2 and rest[0] in ("tree", "blob", "resolve"):
            filename = "/".join(rest[2:]) or None
            # a link to one file of a model (its config, a shard) means the model; a .gguf is a model
            gguf = rest[0] != "tree" and filename is not None and filename.lower().endswith(".gguf")
            return HubRef(repo_id, rest[1], filename if gguf else None)
        return HubRef(repo_id)
    # a bare id: exactly org/name, and not something that looks like a local path
    if text.startswith((".", "/", "~")) or "\\" in text or ":" in text or text.lower().endswith(".gguf"):
        return None
    return HubRef(text) if _REPO_ID.match(text) else None


def _cache_dir() -> str:
    from huggingface_hub import constants

    # read at call time: huggingface-hub reads its environment once, at import
    return os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def _translate(exc: Exception, ref: HubRef) -> HubError:
    """huggingface-hub's errors in plain words."""
    from huggingface_hub import errors

    repo = ref.repo_id
    if isinstance(exc, errors.GatedRepoError):
        return NeedsToken(f"{repo} is gated: accept its licence on https://huggingface.co/{repo} while signed in, "
                          "then give Tandem an access token.", repo)
    if isinstance(exc, errors.RepositoryNotFoundError):
        return NeedsToken(f"{repo} was not found on the hub. Check the name; if it is private, give Tandem an "
                          "access token that can read it.", repo)
    if isinstance(exc, errors.RevisionNotFoundError):
        return HubError(f"{repo} has no revision {ref.revision!r}. Drop the model's main page link instead.")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if status in (401, 403):
        return NeedsToken(f"The hub refused access to {repo} ({status}): it needs an access token that can "
                          "read it.", repo)
    if isinstance(exc, OSError) and getattr(exc, "errno", None) == 28:
        return HubError(f"The disk is full while downloading {repo}. Free some space and choose the model again: "
                        "the download resumes where it stopped.")
    if _is_network_error(exc):
        return NoNetwork(f"Cannot reach huggingface.co to fetch {repo} ({type(exc).__name__}), and it is not "
                         "downloaded yet. Check the network connection; models already on this computer still "
                         "work.")
    return HubError(f"Fetching {repo} failed: {exc}")


def _is_network_error(exc: Exception) -> bool:
    import httpx2
    from huggingface_hub import errors

    if isinstance(exc, (errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError, httpx2.TransportError,
                        ConnectionError, TimeoutError)):
        return True
    cause = exc.__cause__ or exc.__context__
    return cause is not None and cause is not exc and _is_network_error(cause)


def _probe(endpoint: str | None, ref: HubRef) -> None:
    """One quick request before the listing: huggingface-hub retries a refused connection with
    back-off for about 20 s, too long to wait for "no network"."""
    import httpx2
    from huggingface_hub import constants

    try:
        httpx2.head(endpoint or constants.ENDPOINT, timeout=PROBE_TIMEOUT_S)
    except httpx2.TransportError as exc:
        raise _translate(exc, ref) from exc


def _needed(name: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return "/" not in name and any(fnmatch.fnmatch(base, pattern) for pattern in NEEDED)


def _listing_stalled(ref: HubRef, what: str = "the file list") -> NoNetwork:
    return NoNetwork(f"The hub did not send {what} of {ref.repo_id} within {LIST_TIMEOUT_S:.0f} s. It may be "
                     "busy or the connection poor: choose the model again in a moment. Models already on this "
                     "computer still work.")


def _list_files(ref: HubRef, token: str | None, endpoint: str | None) -> dict[str, HubFile]:
    """The repo's files at the top level (or in the folder of the linked file), as the hub's tree
    API lists them (what HfApi.list_repo_tree asks), each page with LIST_TIMEOUT_S to answer."""
    from urllib.parse import quote

    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    folder = ref.filename.rsplit("/", 1)[0] if ref.filename and "/" in ref.filename else None
    revision = quote(ref.revision or constants.DEFAULT_REVISION, safe="")
    url: str | None = (f"{endpoint or constants.ENDPOINT}/api/models/{ref.repo_id}/tree/{revision}"
                       + (f"/{quote(folder, safe='')}" if folder else ""))
    params: dict | None = {"recursive": False, "expand": False}
    files: dict[str, HubFile] = {}
    while url:
        try:
            response = get_session().get(url, params=params, headers=build_hf_headers(token=token),
                                         timeout=httpx2.Timeout(LIST_TIMEOUT_S, connect=PROBE_TIMEOUT_S))
        except httpx2.TimeoutException as exc:
            raise _listing_stalled(ref) from exc
        hf_raise_for_status(response)
        for entry in response.json():
            if isinstance(entry, dict) and entry.get("type") == "file" and isinstance(entry.get("path"), str):
                files[entry["path"]] = HubFile(entry["path"], int(entry.get("size") or 0))
        url, params = response.links.get("next", {}).get("url"), None
    return files


def unless_cancelled(work: Callable, cancel: threading.Event, deadline_s: float, on_deadline: Callable[[], Exception]):
    """work() on a thread of its own, waited for until it ends, `cancel` is set (DownloadCancelled
    at once: the request is left to end on its own timeout, its answer unused) or `deadline_s`
    passes (on_deadline()'s exception). So Cancel answers while a request hangs."""
    result: dict = {}
    finished = threading.Event()

    def run() -> None:
        try:
            result["value"] = work()
        except BaseException as exc:  # handed to the waiting thread as it is
            result["error"] = exc
        finally:
            finished.set()

    threading.Thread(target=run, name="tandem-hub-request", daemon=True).start()
    waited = 0.0
    while not finished.wait(0.05):
        waited += 0.05
        if cancel.is_set():
            raise DownloadCancelled()
        if waited > deadline_s:
            raise on_deadline()
    if "error" in result:
        raise result["error"]
    return result["value"]


def plan_download(ref: HubRef, token: str | None = None, endpoint: str | None = None) -> list[HubFile]:
    """The files to fetch, with their sizes, from the hub's listing of the repo."""
    if _offline():
        raise NoNetwork(f"Hugging Face offline mode is on (HF_HUB_OFFLINE), and {ref.repo_id} is not downloaded.")
    _probe(endpoint, ref)
    try:
        files = _list_files(ref, token, endpoint)
    except HubError:
        raise
    except Exception as exc:
        raise _translate(exc, ref) from exc
    if ref.filename:
        if ref.filename not in files:
            raise HubError(f"{ref.repo_id} has no file {ref.filename}.")
        if not ref.filename.lower().endswith(".gguf"):
            return [f for name, f in files.items() if _needed(name)] or [files[ref.filename]]
        return [files[ref.filename]]
    plan = [f for name, f in files.items() if _needed(name)]
    if any(f.name.endswith(".safetensors") for f in plan) and "config.json" in files:
        return plan
    pickled = [n for n in files if n.endswith(PICKLED_SUFFIXES)]
    ggufs = [n for n in files if n.lower().endswith(".gguf")]
    if ggufs:
        examples = ", ".join(ggufs[:4])
        raise HubError(f"{ref.repo_id} holds only GGUF files ({len(ggufs)}: {examples}…). Drop the link of one of "
                       "them, e.g. https://huggingface.co/" + f"{ref.repo_id}/blob/main/{ggufs[0]}")
    if pickled:
        raise HubError(f"{ref.repo_id} has its weights only in pickled form ({', '.join(pickled[:3])}). Tandem "
                       "loads only safetensors and GGUF, because a pickled checkpoint can run arbitrary code when "
                       "loaded. Look for a safetensors version of this model.")
    raise HubError(f"{ref.repo_id} holds no model weights Tandem can load (no config.json with *.safetensors, "
                   "no .gguf).")


def _complete(folder: Path) -> bool:
    import json

    if not (folder / "config.json").is_file() or not any(folder.glob("*.safetensors")):
        return False
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError):
            return False
        return all((folder / shard).is_file() for shard in shards)
    return True


def cached_model(ref: HubRef) -> Path | None:
    """The model in huggingface-hub's cache, complete, with no network: its snapshot folder, or
    the .gguf file the link named. None when anything needed is missing."""
    from huggingface_hub import snapshot_download, try_to_load_from_cache

    if ref.filename:
        found = try_to_load_from_cache(ref.repo_id, ref.filename, cache_dir=_cache_dir(),
                                       revision=ref.revision)
        return Path(found) if isinstance(found, str) else None
    try:
        folder = Path(snapshot_download(ref.repo_id, revision=ref.revision, cache_dir=_cache_dir(),
                                        local_files_only=True))
    except Exception:  # not cached (LocalEntryNotFoundError and kin)
        return None
    return folder if _complete(folder) else None


def _is_weights(name: str) -> bool:
    return name.endswith(".safetensors") or name.lower().endswith(".gguf")


def download(ref: HubRef, progress: Callable[[DownloadProgress], None], cancel: threading.Event,
             token: str | None = None, endpoint: str | None = None,
             before_weights: Callable[[Path, int], None] | None = None) -> Path:
    """Fetch what `plan_download` lists into the hub's cache; the snapshot folder (or .gguf
    path). Raises DownloadCancelled (the partial file is kept for resuming), NeedsToken,
    NoNetwork or HubError.

    Config and tokenizer files come first; `before_weights(folder, weight_bytes)` then runs
    and may raise to stop before the gigabytes: a pair is checked (tokenizers, architecture,
    memory) while only kilobytes have been fetched."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    try:  # on a thread of its own, so Cancel answers at once even while the hub does not
        plan = unless_cancelled(lambda: plan_download(ref, token, endpoint), cancel,
                                PROBE_TIMEOUT_S + 2 * LIST_TIMEOUT_S, lambda: _listing_stalled(ref))
    except NoNetwork:
        if (cached := cached_model(ref)) is not None:
            return cached
        raise
    plan = sorted(plan, key=lambda f: _is_weights(f.name))  # small files first (a stable sort)
    counter = ProgressCounter(plan, progress, cancel)
    last = None
    checked = before_weights is None or ref.filename is not None
    for item in plan:
        if not checked and _is_weights(item.name):
            checked = True
            config = try_to_load_from_cache(ref.repo_id, "config.json", cache_dir=_cache_dir(), revision=ref.revision)
            if isinstance(config, str):
                before_weights(Path(config).parent, sum(f.size for f in plan if _is_weights(f.name)))
        if cancel.is_set():
            raise DownloadCancelled()
        if isinstance(try_to_load_from_cache(ref.repo_id, item.name, cache_dir=_cache_dir(),
                                             revision=ref.revision), str):
            counter.skip(item)  # already here: counts as done
            continue
        counter.begin(item)
        try:
            _fetch_resumable(ref, item.name, counter, token, endpoint)
            last = hf_hub_download(ref.repo_id, item.name, revision=ref.revision, cache_dir=_cache_dir(),
                                   token=token, endpoint=endpoint, tqdm_class=counter.tqdm_class())
        except DownloadCancelled:
            raise
        except Exception as exc:
            if cancel.is_set():  # hf_xet may wrap or swallow the exception raised in its callback
                raise DownloadCancelled() from exc
            raise _translate(exc, ref) from exc
        if cancel.is_set():
            raise DownloadCancelled()
        counter.end(item)
    if ref.filename and ref.filename.lower().endswith(".gguf"):
        return Path(last) if last else cached_model(ref)
    found = cached_model(ref)
    if found is None:
        raise HubError(f"{ref.repo_id} downloaded, but the files in the cache are incomplete. Choose it again.")
    return found


def _fetch_resumable(ref: HubRef, name: str, counter: ProgressCounter, token: str | None,
                     endpoint: str | None) -> None:
    """Bring one plain-HTTP file's blob into the cache, continuing a part left by an earlier
    attempt; xet-stored files are left to hf_hub_download (see the module's docstring)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get, repo_folder_name
    from huggingface_hub.utils import build_hf_headers
    from huggingface_hub.utils._runtime import is_xet_available
    from huggingface_hub.utils._http import _is_same_or_hub_host

    url = hf_hub_url(ref.repo_id, name, revision=ref.revision, endpoint=endpoint)
    meta = unless_cancelled(lambda: get_hf_file_metadata(url, token=token, timeout=LIST_TIMEOUT_S), counter.cancel,
                            2 * LIST_TIMEOUT_S, lambda: _listing_stalled(ref, f"the details of {name}"))
    if (meta.xet_file_data is not None and is_xet_available()) or not meta.etag:
        return
    blob = Path(_cache_dir()) / repo_folder_name(repo_id=ref.repo_id, repo_type="model") / "blobs" / meta.etag
    if blob.exists():
        return
    blob.parent.mkdir(parents=True, exist_ok=True)
    part = blob.with_name(blob.name + ".incomplete")
    done = part.stat().st_size if part.exists() else 0
    if meta.size is not None and done > meta.size:  # not a part of this file: start over
        part.unlink()
        done = 0
    headers = build_hf_headers(token=token)
    if not _is_same_or_hub_host(url, meta.location):  # a signed CDN link: never send the token there
        headers.pop("authorization", None)
    with open(part, "ab") as handle:
        http_get(meta.location, handle, resume_size=done, headers=headers,
                 expected_size=meta.size, displayed_filename=name, tqdm_class=counter.tqdm_class())
    os.replace(part, blob)


def saved_token() -> str | None:
    """The token huggingface-hub would use: HF_TOKEN, or the one its login stored."""
    from huggingface_hub import get_token

    return get_token()


def save_token(token: str) -> None:
    """Store `token` where huggingface-hub's own login stores it, so other tools share it too."""
    from huggingface_hub import constants

    path = Path(constants.HF_TOKEN_PATH)  # where get_token() reads it
    try:
        from huggingface_hub.utils._auth import _write_secret  # owner-only permissions, as `hf auth login`
    except ImportError:  # a later huggingface-hub moved it: the same file, written plainly
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(token.strip())
        return
    _write_secret(path, token.strip())
