"""llama.cpp on the same GGUF file and the same prompt token ids: what LM Studio, Ollama and Jan
run. The model lives in a worker process (app/bench/llamacpp_worker.py) that answers one request
at a time while this process waits, with as many threads as PyTorch uses here.

llama-cpp-python is optional (`pip install -e '.[bench]'`; it compiles llama.cpp from source);
without it the bench leaves these rows out and says so in one line.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from app.bench.runs import RunResult
from app.engine.sampling import SamplingParams

PLAIN, LOOKUP = "llama.cpp plain", "llama.cpp prompt lookup"
CLOSE_S = 30


def missing_reason() -> str | None:
    """Why the llama.cpp rows cannot run here, or None."""
    if importlib.util.find_spec("llama_cpp") is None:
        return ("llama-cpp-python is not installed (pip install -e '.[bench]'; it builds llama.cpp from "
                "source, about 12 minutes on 2 cores)")
    return None


class LlamaCpp:
    """A worker process holding the GGUF twice: plain decoding and prompt lookup."""

    def __init__(self, gguf: Path, threads: int, context: int = 4096):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app.bench.llamacpp_worker", str(gguf), "--threads", str(threads),
             "--context", str(context)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            cwd=Path(__file__).resolve().parents[2])
        hello = self._read()
        self.version = hello["version"]

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            err = self.process.stderr.read()[-2000:]
            raise RuntimeError(f"the llama.cpp worker stopped: {err.strip() or 'no message'}")
        return json.loads(line)

    def generate(self, mode: str, prompt_ids: Sequence[int], max_tokens: int, params: SamplingParams,
                 stop_ids: frozenset[int]) -> RunResult:
        request = {"mode": mode, "prompt_ids": list(prompt_ids), "max_tokens": max_tokens,
                   "stop_ids": sorted(stop_ids), "temperature": params.temperature, "top_p": params.top_p,
                   "top_k": params.top_k, "seed": params.seed}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        answer = self._read()
        tokens = answer["tokens"]
        # timed from its first token (the prefill's) to its last, as mlx-lm's stream is
        return RunResult(tokens, max(len(tokens) - 1, 0), max(answer["last_s"] - answer["first_s"], 0.0))

    def close(self) -> None:
        """End the worker and reap it: it leaves when its input closes (freeing a model on a busy
        machine can take seconds), or is killed after CLOSE_S."""
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=CLOSE_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
