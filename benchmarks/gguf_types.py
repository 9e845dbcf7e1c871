"""Tandem against llama.cpp on the GGUF types PC users have, on files this command makes itself.

    python benchmarks/gguf_types.py [--out DIR] [--budget-min 55] [--only NAME,...] [--json OUT]
    python benchmarks/gguf_types.py --quick          # a smoke run: the 1B shape's Q4_K_M, 8 tokens

Files, made once into --out (default: tandem-gguf-types under the system's temp folder) and reused:

- demo-Q4_1: the demo model's own GGUF (SmolLM2-135M-Instruct, Q4_1), the reference;
- demo-Q4_K_M, demo-Q5_K_M, demo-Q6_K, demo-Q8_0, demo-IQ4_XS: the demo re-quantized by llama.cpp's
  own quantizer (llama-cpp-python, the `bench` extra; without it these files are left out and the
  table says why). The demo's hidden size, 576, is not whole blocks of 256, so llama.cpp falls
  back on most tensors (Q4_K -> Q5_0 ...): the files' real type mix is printed beside each;
- llama1b-Q4_K_M, llama1b-Q8_0, llama3b-Q4_K_M, llama3b-Q8_0: random-weight Llama-3.2-1B and -3B
  shapes with the demo's vocabulary and tokenizer (49,152 tokens), written block by block at the
  types llama.cpp's quantizer picks (app/bench/gguf_model_files.py);
- llama8b-Q4_K_M: the Llama-3.1-8B shape (untied head), for plain decoding and load only;
- llama1b-Q3_K_M, llama1b-Q2_K: the 1B shape at the 2- and 3-bit presets people take for big
  models on small machines (the demo's rows would fall back to IQ4_NL at these types).

Rows per file, measured in one process with the bench's harness (app/bench/harness.py: warm-up,
then methods interleaved A B C / C B A over the repeats): Tandem plain (the GGUF at its own
precisions, `--precision gguf`), Tandem's default pair (adaptive prompt lookup; not on the 8B
shape) and llama.cpp plain on the same file, prompt ids and threads (when importable). The
answer's stop token is ignored, so every method writes the same number of tokens. On the demo's
files the two prompts the model copies from also get rows of their own. transformers' rows are
left out (the bench's own command has them).

Per file also: a one-shot load (`tandem-cli generate --max-tokens 1` in a process of its own, its
wall clock and Tandem's own "Loaded in" figure, and its peak resident memory from wait4's
ru_maxrss; the same for llama.cpp: load and one token), the screened head's candidates per scored
position (counted in the runs), and the bandwidth bound: what one pass reads over the read
bandwidth measured in this run (a PyTorch sum over a 1 GiB float32 array, best of 5, with the
bench's threads). What a pass reads: every tensor in the file's own encoding except the input
embedding, whose lookup reads one row, but where the head is tied to the embedding its bytes once
(the head reads the whole table each pass), plus keys and values of 512 positions in float32.

--budget-min (default 55) is the whole run's time: files are estimated before they run and the
largest are dropped first (the table says which); a Tandem row that fails is reported with its
error's first line and the run goes on.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.bench.gguf_model_files import (SHAPES, file_facts, llama_tensors, planned_bytes,  # noqa: E402
                                        requantized_types, type_map, write_random_llama)
from app.bench.harness import TARGET_ALONE, BenchRun, Method, _run_all, measure_costs  # noqa: E402
from app.bench.runs import RunResult  # noqa: E402
from app.bench.suite import load_suite  # noqa: E402

ADAPTIVE = "tandem adaptive"
LABELS = {TARGET_ALONE: "Tandem plain", ADAPTIVE: "Tandem adaptive, prompt lookup",
          "llama.cpp plain": "llama.cpp plain"}
COPY_PROMPTS = ("copy-email", "copy-poem")
NO_STOP: frozenset[int] = frozenset()  # the answer's stop token is ignored: fixed token counts
CONTEXT = 2048  # Tandem's and llama.cpp's context for every file (prompts + 128 tokens fit)
KV_TOKENS = 512  # the bound's KV cache
RANDOM_WIDTHS = (1, 2, 5, 9)  # pass costs measured on the random shapes (the demo's: 1 .. 17)
DEMO_TYPES = ("Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0", "IQ4_XS")
# the rough shares of the bound each side reaches, for the budget's estimates only
TANDEM_SHARE, LLAMA_SHARE = 0.25, 0.6


@dataclass(frozen=True)
class FileSpec:
    name: str
    family: str  # "demo" or "random"
    file_type: str  # FILE_TYPES' key, or "Q4_1" (the demo's own)
    shape: str | None = None  # SHAPES' key for random files
    speculative: bool = True  # whether the default pair runs

    @property
    def filename(self) -> str:
        return f"{self.name}.gguf"


def all_files() -> list[FileSpec]:
    files = [FileSpec("demo-Q4_1", "demo", "Q4_1")]
    files += [FileSpec(f"demo-{t}", "demo", t) for t in DEMO_TYPES]
    for size, shape in (("1b", "llama-3.2-1b"), ("3b", "llama-3.2-3b")):
        files += [FileSpec(f"llama{size}-{t}", "random", t, shape) for t in ("Q4_K_M", "Q8_0")]
    # the presets for big models on small machines (the demo's 576-wide rows would fall back to IQ4_NL)
    files += [FileSpec(f"llama1b-{t}", "random", t, "llama-3.2-1b") for t in ("Q3_K_M", "Q2_K")]
    files.append(FileSpec("llama8b-Q4_K_M", "random", "Q4_K_M", "llama-3.1-8b", speculative=False))
    return files


@dataclass
class Settings:
    prompts: list  # BenchPrompt
    repeats: int
    threads: int
    quick: bool


@dataclass
class FileResult:
    spec: FileSpec
    path: str = ""
    skipped: str = ""  # why the file did not run
    facts: dict = field(default_factory=dict)
    loaded: str = ""  # Tandem's words for what it loaded
    errors: dict = field(default_factory=dict)  # method -> first line of its error
    summary: dict | None = None
    candidates: float | None = None  # the screened head's candidates per scored position
    load: dict = field(default_factory=dict)  # "tandem" / "llama.cpp" -> one-shot load figures
    costs_ms: dict = field(default_factory=dict)  # width -> ms
    exactness: str = ""
    settings: str = ""  # prompts, tokens, repeats
    wall_s: float = 0.0


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def first_line(exc: BaseException | str) -> str:
    text = str(exc).strip() or type(exc).__name__
    line = text.splitlines()[0]
    return f"{type(exc).__name__}: {line}" if isinstance(exc, BaseException) else line


# --- making the files --------------------------------------------------------------------------------

def demo_gguf() -> Path:
    from app.models.demo import find_demo_gguf

    path = find_demo_gguf()
    if path is None:
        raise SystemExit("The demo's GGUF is not on this computer: run `tandem-cli demo` first.")
    return path


def llama_cpp_missing() -> str | None:
    from app.bench.anchors_llamacpp import missing_reason

    return missing_reason()


def planned_file_bytes(spec: FileSpec) -> int:
    """The file's size before it is made (tensor bytes; metadata is a few MB at most)."""
    import gguf

    if spec.family == "random":
        shape = SHAPES[spec.shape]
        return planned_bytes(dict(llama_tensors(shape, 49152)), type_map(shape, spec.file_type, 49152))
    reader = gguf.GGUFReader(demo_gguf())
    if spec.file_type == "Q4_1":
        return sum(int(t.n_bytes) for t in reader.tensors)
    types = requantized_types(demo_gguf(), spec.file_type)
    return planned_bytes({t.name: tuple(int(d) for d in t.shape[::-1]) for t in reader.tensors}, types)


def make_file(spec: FileSpec, out: Path, threads: int) -> Path:
    """The file, made where it is not there yet (a demo re-quantization in a process of its own)."""
    if spec.file_type == "Q4_1":
        return demo_gguf()
    path = out / spec.filename
    if path.is_file():
        return path
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    if spec.family == "random":
        say(f"writing {path.name} (random weights, {spec.shape}) ...")
        write_random_llama(path, spec.shape, spec.file_type, np.random.default_rng(0))
    else:
        say(f"re-quantizing the demo to {spec.file_type} with llama.cpp ...")
        run = subprocess.run([sys.executable, "-m", "app.bench.gguf_model_files", "requantize", str(demo_gguf()),
                              str(path), spec.file_type, "--threads", str(threads)], cwd=ROOT,
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise RuntimeError(_last_line(run.stderr) or f"the quantizer exited with {run.returncode}")
    say(f"made {path.name}: {path.stat().st_size / 1e6:.0f} MB in {time.perf_counter() - start:.0f} s")
    return path


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


# --- measurements --------------------------------------------------------------------------------------

def read_bandwidth(nbytes: int, repeats: int) -> float:
    """Bytes per second a float32 sum reads (each byte once), best of `repeats`, PyTorch's threads."""
    x = torch.ones(nbytes // 4, dtype=torch.float32)
    x.sum()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    del x
    return nbytes / best


def timed_process(command: list[str], timeout: float) -> dict:
    """Run `command` to its end: wall seconds, peak resident bytes (wait4's ru_maxrss), exit code,
    and its stderr's text."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=err, text=True)
        status = usage = None
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:
                process.kill()
                pid, status, usage = os.wait4(process.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read()
        # the child's own high-water mark, which it writes as it exits (PEAK_AT_EXIT): wait4's
        # ru_maxrss also counts the forked copy of this process that exec replaced (Linux keeps
        # the larger), so every child looked as large as the benchmark itself
        found = re.findall(r"^peak VmHWM (\d+) kB$", text, re.M)
        peak = int(found[-1]) * 1024 if found else usage.ru_maxrss * 1024
        return {"wall_s": wall, "rss_bytes": peak, "rc": process.returncode, "stderr": text,
                "timed_out": wall > timeout}


PEAK_AT_EXIT = """import atexit, sys

def _peak():
    try:
        with open("/proc/self/status") as status:
            kb = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
        print(f"peak VmHWM {kb} kB", file=sys.stderr, flush=True)
    except (OSError, StopIteration):
        pass

atexit.register(_peak)
"""


def tandem_load(path: Path, timeout: float) -> dict:
    start_cli = PEAK_AT_EXIT + "import runpy; runpy.run_module('app.cli', run_name='__main__')"
    run = timed_process([sys.executable, "-c", start_cli, "generate", "--backend", "torch", "--model", str(path),
                         "--precision", "gguf", "--draft", "none", "--context", str(CONTEXT), "--max-tokens", "1",
                         "--prompt", "Hello"], timeout)
    found = re.search(r"Loaded .* in ([0-9.]+)s", run["stderr"])
    result = {"wall_s": run["wall_s"], "rss_bytes": run["rss_bytes"],
              "loaded_s": float(found.group(1)) if found else None}
    if run["rc"] != 0:
        result["error"] = "timed out" if run["timed_out"] else _last_line(run["stderr"]) or f"exit {run['rc']}"
    return result


LLAMA_LOAD = """import sys
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[3]), n_threads=int(sys.argv[2]),
            n_threads_batch=int(sys.argv[2]), verbose=False)
next(iter(llm.generate([1, 9690, 198], temp=0.0, top_k=1)))
"""


def llama_load(path: Path, threads: int, timeout: float) -> dict:
    run = timed_process([sys.executable, "-c", PEAK_AT_EXIT + LLAMA_LOAD, str(path), str(threads), str(CONTEXT)],
                        timeout)
    result = {"wall_s": run["wall_s"], "rss_bytes": run["rss_bytes"]}
    if run["rc"] != 0:
        result["error"] = "timed out" if run["timed_out"] else _last_line(run["stderr"]) or f"exit {run['rc']}"
    return result


class HeadCounter:
    """Counts the screened head's candidates (rows that could be the argmax, rescored from the
    file) per scored position, by wrapping each ScreenedHead's candidate step on this instance."""

    def __init__(self, model):
        from app.models.screened_head_torch import ScreenedHead

        self.positions = self.candidates = 0
        self.heads = [m for m in model.modules() if isinstance(m, ScreenedHead) and hasattr(m, "_candidate_pairs")]
        for head in self.heads:
            head._candidate_pairs = self._counted(head._candidate_pairs)

    def _counted(self, original):
        def counted(hidden):
            screen, pos, rows = original(hidden)
            self.positions += int(screen.shape[0])
            self.candidates += int(rows.numel())
            return screen, pos, rows
        return counted

    def per_position(self) -> float | None:
        return self.candidates / self.positions if self.positions else None


def guarded(method: Method, errors: dict) -> Method:
    """The method's runs, or after its first failure an empty result and the error's first line
    in `errors` (the kernels of some types are being rewritten: a failed row is reported, the
    run goes on)."""
    def run(prompt, ids, params):
        if method.name in errors:
            return RunResult([], 0, 0.0)
        try:
            return method.run(prompt, ids, params)
        except Exception as exc:  # noqa: BLE001 - any failure is the row's result
            errors[method.name] = first_line(exc)
            say(f"  {method.name} FAILED: {errors[method.name]}")
            return RunResult([], 0, 0.0)
    return replace(method, run=run)


PROMPT_IDS: dict[str, list[int]] = {}  # every file has the demo's tokenizer: the first load's ids serve all


def bench_file(spec: FileSpec, path: Path, settings: Settings, llama_why: str | None) -> FileResult:
    from app.bench.anchors_llamacpp import PLAIN, LlamaCpp
    from app.bench.costs import measure_target_costs
    from app.bench.exactness import find_divergences
    from app.bench.report import summarize
    from app.bench.runs import run_tandem
    from app.draft_choice import NO_DRAFT, PROMPT_LOOKUP
    from app.engine.adaptive import DraftLengthController
    from app.engine.sampling import SamplingParams
    from app.runner import Runner

    result = FileResult(spec, str(path))
    tokens = sorted({p.max_tokens for p in settings.prompts})
    result.settings = (f"{len(settings.prompts)} prompt(s) ({', '.join(p.name for p in settings.prompts)}) x "
                       f"{'/'.join(map(str, tokens))} tokens, {settings.repeats} repeat(s)")
    facts = file_facts(path, KV_TOKENS)
    result.facts = {"types": dict(facts.types), "file_bytes": facts.file_bytes, "pass_bytes": facts.pass_bytes,
                    "kv_bytes": facts.kv_bytes, "tied": facts.tied}
    params = SamplingParams()
    start = time.perf_counter()
    runner: Runner | None = Runner()
    try:
        loaded = runner.load(str(path), "torch", draft=PROMPT_LOOKUP if spec.speculative else NO_DRAFT,
                             precision="gguf", progress=lambda message: None, context=CONTEXT)
        result.loaded = loaded.describe()
        say(f"  Tandem loaded {result.loaded} in {loaded.load_s:.1f} s")
        for prompt in settings.prompts:
            PROMPT_IDS.setdefault(prompt.name, runner.tokenizer.render_chat(list(prompt.messages)))
    except Exception as exc:  # noqa: BLE001
        result.errors[TARGET_ALONE] = "load: " + first_line(exc)
        say(f"  Tandem could not load {path.name}: {result.errors[TARGET_ALONE]}")
        runner = None
    methods: list[Method] = []
    counter = None
    if runner is not None:
        target, tok = runner.target, runner.tokenizer
        counter = HeadCounter(target.model) if hasattr(target, "model") else None

        def tandem(draft):
            controller = DraftLengthController() if draft is not None else None
            return lambda prompt, ids, p: run_tandem(target, tok.decode, ids, draft, prompt.max_tokens, p, NO_STOP,
                                                     None, controller)

        methods.append(Method(TARGET_ALONE, "target", tandem(None), anchor=None if llama_why else PLAIN))
        if spec.speculative:
            methods.append(Method(ADAPTIVE, "tandem", tandem(runner.drafter), anchor=None if llama_why else PLAIN))
    missing_ids = [p.name for p in settings.prompts if p.name not in PROMPT_IDS]
    if not llama_why and not missing_ids:
        try:
            worker = LlamaCpp(path, threads=settings.threads, context=CONTEXT)
            methods.append(Method(PLAIN, "external", lambda prompt, ids, p: worker.generate(
                "plain", ids, prompt.max_tokens, p, NO_STOP), close=worker.close))
        except Exception as exc:  # noqa: BLE001
            result.errors[PLAIN] = "load: " + first_line(exc)
    elif not llama_why:
        result.errors[PLAIN] = "not run: no prompt ids (Tandem loaded no file before this one)"
    methods = [guarded(m, result.errors) for m in methods]
    if not methods:
        result.wall_s = time.perf_counter() - start
        return result
    bench = BenchRun(methods, settings.prompts, {p.name: PROMPT_IDS[p.name] for p in settings.prompts})
    try:
        _run_all(bench, methods, settings.prompts, params, settings.repeats,
                 lambda message: say("  " + message))
    finally:
        for method in methods:
            if method.close is not None:
                method.close()
    result.candidates = counter.per_position() if counter is not None else None  # the runs' passes only
    if runner is not None and TARGET_ALONE not in result.errors:
        try:
            if spec.family == "demo" and not settings.quick:
                bench.target_costs, bench.draft_cost = measure_costs(runner, bench)
            else:
                first = settings.prompts[0]
                answer = next(r.result.tokens for r in bench.records if r.prompt == first.name
                              and r.method == TARGET_ALONE)
                context = bench.prompt_ids[first.name] + answer[: len(answer) // 2 or 1]
                widths = RANDOM_WIDTHS[:2] if settings.quick else RANDOM_WIDTHS
                bench.target_costs = measure_target_costs(runner.target, context, widths,
                                                          repeats=2 if settings.quick else 5)
            result.costs_ms = {w: s * 1000 for w, s in bench.target_costs.items()}
        except Exception as exc:  # noqa: BLE001
            result.errors["pass costs"] = first_line(exc)
    divergences = []
    if runner is not None and spec.speculative and not result.errors.get(ADAPTIVE) \
            and TARGET_ALONE not in result.errors:
        try:
            divergences = find_divergences(bench, runner.target)
            bugs = sum(not d.near_tie for d in divergences if d.family != "external")
            result.exactness = ("identical to Tandem plain" if not divergences else
                                f"{len(divergences)} divergence(s), {bugs} at a clear gap, first at token "
                                f"{min(d.position for d in divergences)} (top-2 gap "
                                f"{min(d.top2_gap for d in divergences):.3f})")
        except Exception as exc:  # noqa: BLE001
            result.exactness = "not checked: " + first_line(exc)
    bench.wall_s = time.perf_counter() - start
    config = {"temperature": 0.0, "file": path.name, "repeats": settings.repeats, "prompts": len(settings.prompts),
              "max_tokens": max(p.max_tokens for p in settings.prompts), "threads": settings.threads}
    result.summary = summarize(bench, divergences, config)
    result.wall_s = time.perf_counter() - start
    return result


def measure_loads(result: FileResult, path: Path, settings: Settings, llama_why: str | None) -> None:
    """One-shot loads in processes of their own, after the bench's models are gone."""
    gc.collect()
    start = time.perf_counter()
    result.load["tandem"] = tandem_load(path, timeout=300 if settings.quick else 900)
    if not llama_why:
        result.load["llama.cpp"] = llama_load(path, settings.threads, timeout=300)
    result.wall_s += time.perf_counter() - start


# --- the budget -----------------------------------------------------------------------------------------

def estimate_s(spec: FileSpec, file_bytes: int, made: bool, bandwidth: float, settings: Settings,
               llama: bool) -> float:
    """A rough wall-clock estimate of one file's part of the run, for the budget only."""
    pass_s = file_bytes / bandwidth
    tokens = sum(p.max_tokens for p in settings.prompts) * settings.repeats + 8
    tandem = (2 if spec.speculative else 1) * tokens * pass_s / TANDEM_SHARE
    other = tokens * pass_s / LLAMA_SHARE if llama else 0.0
    costs = (6 * 17 * 2 if spec.family == "demo" else 6 * len(RANDOM_WIDTHS) * 3) * pass_s / TANDEM_SHARE
    gigabytes = file_bytes / 1e9
    loads = 2 * (15 + 30 * gigabytes) + ((5 + 3 * gigabytes) * 2 if llama else 0)
    making = 0.0 if made else (40.0 if spec.family == "demo" else 10 * gigabytes)
    return 1.2 * (tandem + other + costs + loads + making)


# --- the table --------------------------------------------------------------------------------------------

def _spread(s: dict | None, digits: int = 1, suffix: str = "") -> str:
    if not s or s.get("median") is None:
        return "-"
    if s["min"] == s["max"]:
        return f"{s['median']:.{digits}f}{suffix}"
    return f"{s['median']:.{digits}f}{suffix} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def _method(summary: dict | None, name: str) -> dict | None:
    return next((m for m in (summary or {}).get("methods", []) if m["name"] == name), None)


def _types_text(types: dict) -> str:
    return ", ".join(f"{k} x{n}" for k, n in sorted(types.items(), key=lambda kv: (-kv[1], kv[0])))


def _load_text(load: dict | None) -> tuple[str, str]:
    if not load:
        return "-", "-"
    if load.get("error"):
        return f"FAILED: {load['error'][:100]}", f"{load['rss_bytes'] / 1e6:,.0f}"
    own = f" ({load['loaded_s']:.1f})" if load.get("loaded_s") is not None else ""
    return f"{load['wall_s']:.1f}{own}", f"{load['rss_bytes'] / 1e6:,.0f}"


def rows_of(r: FileResult, bandwidth: float) -> list[list[str]]:
    from app.bench.anchors_llamacpp import PLAIN

    bound_tps = bandwidth / r.facts["pass_bytes"] if r.facts else None
    head = [f"{r.spec.name}", _types_text(r.facts.get("types", {})), f"{r.facts.get('file_bytes', 0) / 1e6:,.0f}",
            f"{bound_tps:.1f}" if bound_tps else "-"]
    blank = ["", "", "", ""]
    summary = r.summary
    external = (summary or {}).get("llama_cpp") or {}
    ratios = external.get("ratios", {})
    names = [TARGET_ALONE] + ([ADAPTIVE] if r.spec.speculative else []) + [PLAIN]
    out = []
    for name in names:
        label = LABELS[name]
        m = _method(summary, name)
        if name in r.errors:
            cells = [label, f"FAILED: {r.errors[name][:110]}", "-", "-", "-", "-", "-"]
        elif m is None:
            continue
        else:
            vs = "1.00x" if name == PLAIN else _spread((ratios.get(name) or {}).get("vs_plain"), 2, "x")
            tps = m["tokens_per_s"]
            of_bound = f"{tps['median'] / bound_tps:.2f}" if bound_tps and tps["median"] else "-"
            load = r.load.get("tandem" if name == TARGET_ALONE else "llama.cpp" if name == PLAIN else "")
            load_s, rss = _load_text(load)
            cands = f"{r.candidates:,.0f}" if name == TARGET_ALONE and r.candidates is not None else "-"
            cells = [label, _spread(tps), vs, of_bound, load_s, rss, cands]
        out.append((head if not out else blank) + cells)
        if r.spec.family == "demo" and name == ADAPTIVE and m is not None and name not in r.errors:
            for prompt in COPY_PROMPTS:
                per = m["per_prompt"].get(prompt)
                if per is None:
                    continue
                vs = _spread(((ratios.get(name) or {}).get("copy_prompts_vs_plain") or {}).get(prompt), 2, "x")
                tps = per["tokens_per_s"]["median"]
                of_bound = f"{tps / bound_tps:.2f}" if bound_tps and tps else "-"
                out.append(blank + [f"{label}, {prompt} alone", _spread(per["tokens_per_s"]), vs, of_bound,
                                    "-", "-", "-"])
    if not out:
        out.append(head + ["-", "no rows ran", "-", "-", "-", "-", "-"])
    return out


HEADER = ["file", "tensor types", "MB", "bound tok/s", "method", "tok/s", "vs llama.cpp plain", "of bound",
          "load s, wall (Tandem's own)", "peak RSS MB", "head candidates / position"]


def format_report(results: list[FileResult], skipped: list[tuple[str, str]], bandwidth: float, threads: int,
                  quick: bool, llama_why: str | None, bandwidth_bytes: int, wall_s: float) -> str:
    from importlib.metadata import PackageNotFoundError, version

    lines = []
    try:
        llama_text = f"llama-cpp-python {version('llama_cpp_python')}"
    except PackageNotFoundError:
        llama_text = f"llama.cpp rows left out: {llama_why}"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines.append(f"{datetime.date.today()}, {platform.system()} {platform.machine()}, {cores} cores, torch "
                 f"{torch.__version__}, {threads} threads; {llama_text}")
    lines.append("T = 0, the stop token ignored (fixed token counts); tok/s: median [min-max] over repeats, ratios "
                 "taken within a repeat; prompts and tokens per file below the table")
    lines.append(f"read bandwidth {bandwidth / 1e9:.1f} GB/s (a float32 sum over {bandwidth_bytes / 2**30:.2f} GiB, "
                 f"best of {3 if quick else 5}); bound tok/s = that / bytes a pass reads (the weights in the "
                 "file's own encoding, less the input embedding unless the head is tied to it, plus a 512-token "
                 "float32 KV cache)")
    lines.append("")
    lines.append("| " + " | ".join(HEADER) + " |")
    lines.append("|" + " --- |" * len(HEADER))
    for r in results:
        if r.skipped:
            continue
        for row in rows_of(r, bandwidth):
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
    lines.append("")
    for r in results:
        if r.skipped:
            continue
        notes = [r.settings] if r.settings else []
        if r.loaded:
            notes.append(f"Tandem ran {r.loaded}")
        if r.costs_ms:
            notes.append("pass ms by width " + " ".join(f"{w}:{ms:.0f}" for w, ms in sorted(r.costs_ms.items())))
        adaptive = _method(r.summary, ADAPTIVE)
        if adaptive and adaptive.get("bound"):
            notes.append(f"adaptive lookup: acceptance {adaptive.get('acceptance', 0):.0%}, "
                         f"{adaptive.get('tokens_per_pass', 0):.2f} tokens a pass, speculative bound "
                         f"{adaptive['bound']['speedup']:.2f}x at k {adaptive['bound']['k']}")
        if r.exactness:
            notes.append(f"adaptive vs plain: {r.exactness}")
        for who, load in r.load.items():
            if load.get("error"):
                notes.append(f"{who} one-shot load FAILED: {load['error']}")
        if "pass costs" in r.errors:
            notes.append(f"pass costs FAILED: {r.errors['pass costs']}")
        notes.append(f"{r.wall_s:.0f} s")
        lines.append(f"- {r.spec.name}: " + "; ".join(notes))
    for name, why in skipped + [(r.spec.name, r.skipped) for r in results if r.skipped]:
        lines.append(f"- {name}: left out, {why}")
    lines.append(f"\nwall time {wall_s / 60:.1f} min")
    return "\n".join(lines)


# --- the command --------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "tandem-gguf-types"),
                        help="where the files are made and kept (reused when present)")
    parser.add_argument("--budget-min", type=float, default=55.0,
                        help="the run's time budget in minutes: the largest files are dropped first to fit")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: the 1B shape's Q4_K_M, one prompt, 8 tokens, one repeat")
    parser.add_argument("--only", default=None, help="comma list of file names (e.g. demo-Q4_1,llama1b-Q4_K_M)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats (default 2; quick 1)")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="new tokens per prompt (default: 128 on the demo's files, 64 on the random shapes)")
    parser.add_argument("--threads", type=int, default=2, help="threads for Tandem and llama.cpp (default 2)")
    parser.add_argument("--json", default=None, help="write every figure to this file")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the files, their estimated times and what the budget leaves out, then stop")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    files = all_files()
    if args.quick:
        files = [f for f in files if f.name == "llama1b-Q4_K_M"]
    if args.only:
        wanted = {n.strip() for n in args.only.split(",") if n.strip()}
        unknown = wanted - {f.name for f in all_files()}
        if unknown:
            parser.error(f"no such file: {', '.join(sorted(unknown))}; known: {', '.join(f.name for f in all_files())}")
        files = [f for f in all_files() if f.name in wanted]
    llama_why = llama_cpp_missing()
    repeats = args.repeats or (1 if args.quick else 2)
    suite = load_suite()
    by_name = {p.name: p for p in suite}

    def prompts_for(spec: FileSpec) -> list:
        if args.quick:
            chosen, tokens = [by_name["code-write"]], args.max_tokens or 8
        elif spec.family == "demo":
            chosen, tokens = suite, args.max_tokens or 128
        else:
            chosen, tokens = suite[:2], args.max_tokens or 64
        return [replace(p, max_tokens=tokens) for p in chosen]

    bandwidth_bytes = (256 << 20) if args.quick else (1 << 30)
    bandwidth = read_bandwidth(bandwidth_bytes, 3 if args.quick else 5)
    say(f"read bandwidth {bandwidth / 1e9:.1f} GB/s ({args.threads} threads)")

    skipped: list[tuple[str, str]] = []
    plan = []
    for spec in files:
        if spec.family == "demo" and spec.file_type != "Q4_1" and llama_why and not (out / spec.filename).is_file():
            skipped.append((spec.name, f"no quantizer to make it: {llama_why}"))
            continue
        path = demo_gguf() if spec.file_type == "Q4_1" else out / spec.filename
        made = path.is_file()
        size = path.stat().st_size if made else planned_file_bytes(spec)
        settings = Settings(prompts_for(spec), repeats, args.threads, args.quick)
        plan.append((spec, size, made, settings, estimate_s(spec, size, made, bandwidth, settings, not llama_why)))
    plan.sort(key=lambda item: item[1])  # smallest first: the budget drops the largest
    budget_s, total = args.budget_min * 60, time.perf_counter() - began
    kept = []
    for item in plan:
        if total + item[4] <= budget_s:
            kept.append(item)
            total += item[4]
        else:
            skipped.append((item[0].name, f"dropped for the {args.budget_min:g}-minute budget (about "
                                          f"{item[4] / 60:.0f} min estimated, {item[1] / 1e9:.1f} GB)"))
    for spec, size, _, _, estimate in kept:
        say(f"planned: {spec.name} ({size / 1e6:,.0f} MB), about {estimate / 60:.1f} min")
    for name, why in skipped:
        say(f"left out: {name}: {why}")
    if args.dry_run:
        return 0

    results: list[FileResult] = []
    try:
        for spec, _size, _, settings, estimate in kept:
            elapsed = time.perf_counter() - began
            if elapsed + estimate > budget_s * 1.1:
                skipped.append((spec.name, f"dropped during the run for the {args.budget_min:g}-minute budget "
                                           f"({elapsed / 60:.0f} min gone, about {estimate / 60:.0f} min estimated)"))
                continue
            say(f"=== {spec.name}")
            try:
                path = make_file(spec, out, args.threads)
            except Exception as exc:  # noqa: BLE001
                results.append(FileResult(spec, skipped=f"could not be made: {first_line(exc)}"))
                continue
            try:
                results.append(bench_file(spec, path, settings, llama_why))
                measure_loads(results[-1], path, settings, llama_why)
            except Exception as exc:  # noqa: BLE001 - one file's failure is its rows', not the run's
                results.append(FileResult(spec, str(path), skipped=f"FAILED: {first_line(exc)}"))
            done = results[-1]
            say(f"  {spec.name}: {done.wall_s:.0f} s (estimated {estimate:.0f} s)")
    except KeyboardInterrupt:
        say("interrupted: the table has what was measured")
    report = format_report(results, skipped, bandwidth, args.threads, args.quick, llama_why, bandwidth_bytes,
                           time.perf_counter() - began)
    print(report)
    if args.json:
        payload = {"bandwidth_Bps": bandwidth, "skipped": skipped, "command": " ".join(sys.argv),
                   "files": [{"name": r.spec.name, "path": r.path, "skipped": r.skipped, "facts": r.facts,
                              "loaded": r.loaded, "errors": r.errors, "candidates_per_position": r.candidates,
                              "load": r.load, "pass_ms_by_width": r.costs_ms, "exactness": r.exactness,
                              "wall_s": r.wall_s, "summary": r.summary} for r in results]}
        Path(args.json).write_text(json.dumps(payload, indent=1, default=str))
        say(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
