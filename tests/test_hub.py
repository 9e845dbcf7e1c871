"""Hub downloads without a network: links parsed, only the needed files fetched, progress that
adds up, a cancelled download resumed with a ranged request, huggingface-hub's offline mode
over its own cache, and each failure in plain words."""

from __future__ import annotations

import hashlib
import json
import threading

import pytest

from app.models import hub
from tests.fake_hub import FakeHub


@pytest.fixture(autouse=True)
def hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "hub"


@pytest.mark.parametrize("text, ref", [
    ("Qwen/Qwen2.5-0.5B-Instruct", hub.HubRef("Qwen/Qwen2.5-0.5B-Instruct")),
    ("https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct", hub.HubRef("Qwen/Qwen2.5-0.5B-Instruct")),
    ("https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct/", hub.HubRef("Qwen/Qwen2.5-0.5B-Instruct")),
    ("  huggingface.co/org/m/tree/v1.0 ", hub.HubRef("org/m", "v1.0")),
    ("https://hf.co/org/m?library=transformers", hub.HubRef("org/m")),
    ("https://huggingface.co/models/org/m", hub.HubRef("org/m")),
    ("https://huggingface.co/bartowski/x-GGUF/blob/main/x-Q4_K_M.gguf",
     hub.HubRef("bartowski/x-GGUF", "main", "x-Q4_K_M.gguf")),
    ("https://huggingface.co/org/m/resolve/main/sub/y.gguf", hub.HubRef("org/m", "main", "sub/y.gguf")),
])
def test_links_and_ids_name_a_repo(text, ref):
    assert hub.parse_hub_ref(text) == ref


@pytest.mark.parametrize("text", [
    "/home/me/models/qwen", "./model", "~/m", "C:\\models\\qwen", "model.gguf", "just words", "org/name/extra",
    "https://example.com/org/m", "https://huggingface.co/datasets/org/d", "ftp://huggingface.co/org/m", "org",
])
def test_anything_else_is_not_a_hub_model(text):
    assert hub.parse_hub_ref(text) is None


def _repo_files(size: int = 3 * 1024 * 1024) -> dict[str, bytes]:
    weights = bytes(range(256)) * (size // 256)
    return {
        "config.json": json.dumps({"model_type": "llama"}).encode(),
        "tokenizer.json": b'{"model": {}}',
        "tokenizer_config.json": b"{}",
        "model.safetensors": weights,
        "pytorch_model.bin": b"pickle",  # never fetched
        "README.md": b"# card",  # not needed
        "onnx/model.onnx": b"x",
    }


def test_the_plan_takes_only_what_a_model_needs():
    with FakeHub() as server:
        server.add("org/m", _repo_files(1024))
        plan = hub.plan_download(hub.HubRef("org/m"), endpoint=server.endpoint)
    assert sorted(f.name for f in plan) == ["config.json", "model.safetensors", "tokenizer.json",
                                            "tokenizer_config.json"]
    assert {f.name: f.size for f in plan}["model.safetensors"] == 1024


def test_a_cancelled_download_resumes_with_a_ranged_request(hub_cache, monkeypatch):
    from huggingface_hub import constants

    # the hub reads 10 MB at a time, and a cancel lands between reads: small reads for a small file
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 64 * 1024)
    files = _repo_files()
    ref = hub.HubRef("org/m")
    with FakeHub() as server:
        server.add("org/m", files)
        server.delay_s = 0.005
        cancel = threading.Event()
        # the user presses Cancel once half a megabyte of the weights has arrived
        server.on_sent = lambda name, sent: name == "model.safetensors" and sent > 512 * 1024 and cancel.set()
        with pytest.raises(hub.DownloadCancelled):
            hub.download(ref, lambda p: None, cancel, endpoint=server.endpoint)
        server.on_sent = None
        partial = list(hub_cache.rglob("*.incomplete"))
        assert partial and 0 < partial[0].stat().st_size < len(files["model.safetensors"])
        assert hub.cached_model(ref) is None  # half a model is not a model

        server.delay_s = 0.0
        reports: list[hub.DownloadProgress] = []
        folder = hub.download(ref, reports.append, threading.Event(), endpoint=server.endpoint)
    ranges = [r for method, path, r in server.requests if method == "GET" and path.endswith("model.safetensors")]
    assert ranges[0] is None and ranges[-1] is not None and int(ranges[-1][6:].split("-")[0]) > 0
    data = (folder / "model.safetensors").read_bytes()
    assert hashlib.sha256(data).digest() == hashlib.sha256(files["model.safetensors"]).digest()
    total = sum(len(files[n]) for n in ("config.json", "tokenizer.json", "tokenizer_config.json",
                                        "model.safetensors"))
    assert all(r.total == total for r in reports) and reports[-1].done == total
    assert reports[-1].files_done == reports[-1].files_total == 4
    assert [r.done for r in reports] == sorted(r.done for r in reports)  # never goes backwards
    assert not (folder / "pytorch_model.bin").exists()
    assert hub.cached_model(ref) == folder


def test_offline_mode_finds_the_model_in_the_hub_cache(monkeypatch):
    ref = hub.HubRef("org/m")
    with FakeHub() as server:
        server.add("org/m", _repo_files(4096))
        folder = hub.download(ref, lambda p: None, threading.Event(), endpoint=server.endpoint)
        count = len(server.requests)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        assert hub.cached_model(ref) == folder
        assert hub.download(ref, lambda p: None, threading.Event(), endpoint=server.endpoint) == folder
        assert len(server.requests) == count  # not one request in offline mode
        with pytest.raises(hub.NoNetwork, match="offline"):
            hub.download(hub.HubRef("org/other"), lambda p: None, threading.Event(), endpoint=server.endpoint)


def test_pickled_only_and_gguf_only_repos_say_what_to_do():
    with FakeHub() as server:
        server.add("org/pickled", {"config.json": b"{}", "pytorch_model.bin": b"x"})
        server.add("org/x-GGUF", {"x-Q4_K_M.gguf": b"GGUF", "x-Q8_0.gguf": b"GGUF"})
        with pytest.raises(hub.HubError, match="arbitrary code"):
            hub.plan_download(hub.HubRef("org/pickled"), endpoint=server.endpoint)
        with pytest.raises(hub.HubError, match="x-Q4_K_M.gguf"):
            hub.plan_download(hub.HubRef("org/x-GGUF"), endpoint=server.endpoint)
        plan = hub.plan_download(hub.HubRef("org/x-GGUF", "main", "x-Q8_0.gguf"), endpoint=server.endpoint)
        assert [f.name for f in plan] == ["x-Q8_0.gguf"]


def test_gated_missing_and_unreachable_repos():
    with FakeHub() as server:
        server.gated.add("meta/gated")
        with pytest.raises(hub.NeedsToken, match="accept its licence") as gated:
            hub.download(hub.HubRef("meta/gated"), lambda p: None, threading.Event(), endpoint=server.endpoint)
        assert gated.value.repo_id == "meta/gated"
        with pytest.raises(hub.NeedsToken, match="not found"):
            hub.plan_download(hub.HubRef("org/nope"), endpoint=server.endpoint)
    with pytest.raises(hub.NoNetwork, match="models already on this computer still work"):
        hub.download(hub.HubRef("org/m"), lambda p: None, threading.Event(), endpoint="http://127.0.0.1:9")


def test_a_token_is_stored_where_huggingface_hub_reads_it(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf" / "token"))
    hub.save_token("hf_abc123 \n")
    assert (tmp_path / "hf" / "token").read_text() == "hf_abc123"
    assert hub.saved_token() == "hf_abc123"


def test_xet_progress_reaches_our_counter_and_cancel():
    """Most hub weights are Xet-stored: hf_xet reports through huggingface-hub's reporter, which
    drives the progress class it is given (and calls more of tqdm's interface on it)."""
    from types import SimpleNamespace

    from huggingface_hub.utils._xet_progress_reporting import XetDownloadProgressReporter

    from app.models.hub_progress import ProgressCounter

    reports, cancel = [], threading.Event()
    counter = ProgressCounter([hub.HubFile("model.safetensors", 1000)], reports.append, cancel)
    counter.begin(hub.HubFile("model.safetensors", 1000))
    reporter = XetDownloadProgressReporter(reconstruction_desc="model.safetensors", total=1000, log_level=30,
                                           tqdm_class=counter.tqdm_class())

    def report(done: int) -> SimpleNamespace:
        return SimpleNamespace(total_bytes_completed=done, total_transfer_bytes_completed=done, total_bytes=1000,
                               total_bytes_completion_rate=1e6, total_transfer_bytes_completion_rate=1e6)

    reporter.update_progress(report(400))
    assert counter.file_done == 400  # written bytes, counted once (not once more for the transfer)
    cancel.set()
    with pytest.raises(hub.DownloadCancelled):
        reporter.update_progress(report(700))
    reporter.close()
