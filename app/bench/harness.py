"""The benchmark run: every method on every prompt, interleaved in one process.

Order per repeat: prompt by prompt, methods A B C ... then C B A on the next repeat, so slow
drift of the machine (thermal, other processes) falls on every method alike. Each method runs
once on a short prompt first (warm-up: allocators, kernels, lazy imports).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from app.bench.costs import measure_draft_cost, measure_target_costs
from app.bench.runs import RunResult, run_tandem
from app.bench.suite import BenchPrompt
from app.engine.adaptive import MAX_DRAFT, DraftLengthController
from app.engine.drafters import LookupThenModelDrafter, ModelDrafter, chat_lookup
from app.engine.sampling import SamplingParams

TARGET_ALONE = "target alone"
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class Method:
    name: str
    family: str  # "target" (Tandem plain), "tandem" (speculative), "anchor"
    run: Callable[[BenchPrompt, list[int], SamplingParams], RunResult]
    k: int | None = None  # fixed draft length; None: adaptive (Tandem) or the anchor's own
    anchor: str | None = None  # the anchor this method is compared with
    close: Callable[[], None] | None = None  # frees what it holds (a worker process) once the runs are done


@dataclass
class Record:
    prompt: str
    method: str
    repeat: int
    result: RunResult


@dataclass
class BenchRun:
    methods: list[Method]
    prompts: list[BenchPrompt]
    prompt_ids: dict[str, list[int]]
    records: list[Record] = field(default_factory=list)
    target_costs: dict[int, float] = field(default_factory=dict)
    draft_cost: float | None = None
    # a draft model's cost is its own decoding, timed alone; a model-free drafter's (prompt
    # lookup) is what its proposals took in the runs
    draft_is_model: bool = False
    draft_name: str = ""  # the drafter that is not prompt lookup ("built-in MTP head"), for the cost line
    draft_block: int = 0  # a block drafter's (DFlash): drafts one pass makes; its cost is per pass
    wall_s: float = 0.0


def build_methods(runner, ks=(2, 4, 6), anchors: bool = True, progress=print) -> list[Method]:
    """Tandem's target alone, adaptive and fixed-k speculation with the loaded drafter, the
    anchors of the runner's backend on the same model objects, and llama.cpp on the same GGUF
    file where the target came from one (family "external": other weights' numerics)."""
    target, drafter, tok = runner.target, runner.drafter, runner.tokenizer
    stop = tok.stop_ids

    def tandem(draft, k, trees="auto"):
        # adaptive k keeps what it measured across runs, as the runner does across a chat's turns
        controller = DraftLengthController() if draft is not None and k is None else None
        return lambda prompt, ids, params: run_tandem(target, tok.decode, ids, draft, prompt.max_tokens,
                                                      params, stop, k, controller, trees)

    is_model = _draft_model(drafter) is not None  # an MTP layer or assistant has no model the anchors could run
    anchor_spec = anchor_lookup = anchor_plain = None
    methods = [Method(TARGET_ALONE, "target", tandem(None, None))]
    if anchors and target.name == "torch" and not hasattr(target.model, "generate"):
        # Tandem's own modules for a GGUF (gguf_llama_torch.py) have no forward for transformers to run
        progress("transformers' anchors left out: the target was loaded without transformers' model classes "
                 "(Runner.load's model_code=\"transformers\" loads them)")
    elif anchors and target.name == "torch":
        from app.bench.anchors_torch import transformers_generate

        anchor_plain = "transformers plain"
        methods.append(Method(anchor_plain, "anchor", lambda p, ids, params: transformers_generate(
            target.model, ids, p.max_tokens, params, stop)))
        anchor_lookup = "transformers prompt lookup"
        methods.append(Method(anchor_lookup, "anchor", lambda p, ids, params: transformers_generate(
            target.model, ids, p.max_tokens, params, stop, prompt_lookup=True)))
        if is_model:
            anchor_spec = "transformers assisted"
            methods.append(Method(anchor_spec, "anchor", lambda p, ids, params: transformers_generate(
                target.model, ids, p.max_tokens, params, stop, assistant=drafter.backend.model)))
    elif anchors and target.name == "mlx":
        from app.bench.anchors_mlx import mlx_generate

        anchor_plain = "mlx-lm plain"
        methods.append(Method(anchor_plain, "anchor", lambda p, ids, params: mlx_generate(
            target.model, tok.hf, ids, p.max_tokens, params, stop)))
        if is_model:
            anchor_spec = "mlx-lm speculative"
            methods.append(Method(anchor_spec, "anchor", lambda p, ids, params: mlx_generate(
                target.model, tok.hf, ids, p.max_tokens, params, stop, draft_model=drafter.backend.model)))
    if anchors:
        methods += llamacpp_methods(runner, stop, progress)
    if drafter is not None:
        matching = anchor_spec if is_model else anchor_lookup
        methods.append(Method("tandem adaptive", "tandem", tandem(drafter, None), None, matching))
        if isinstance(drafter, LookupThenModelDrafter):  # what the draft model does on its own
            methods.append(Method("tandem adaptive, model only", "tandem", tandem(drafter.model, None),
                                  None, matching))
            # and what the pair gets without it: the drafter `ngram` loads, the best that costs no model
            methods.append(Method("tandem adaptive, prompt lookup only", "tandem",
                                  tandem(chat_lookup(), None), None, anchor_lookup))
        if drafter.drafts_trees and not target.tree_note():  # issue 48: trees beside chains, same run
            methods.append(Method("tandem adaptive, chains", "tandem", tandem(drafter, None, "off"), None, matching))
            methods.append(Method("tandem adaptive, trees", "tandem", tandem(drafter, None, "on"), None, matching))
        for k in ks:
            methods.append(Method(f"tandem k={k}", "tandem", tandem(drafter, k), k, matching))
    methods[0] = replace(methods[0], anchor=anchor_plain)
    return methods


def llamacpp_methods(runner, stop: frozenset[int], progress) -> list[Method]:
    """llama.cpp plain and with prompt lookup, on the GGUF the target was opened from, with the
    threads PyTorch uses; none (and one line saying why) where that cannot be."""
    import atexit

    from app.bench.anchors_llamacpp import LOOKUP, PLAIN, LlamaCpp, missing_reason
    from app.models.errors import ModelFileError
    from app.models.gguf_import import gguf_source

    if runner.target.name != "torch":
        return []
    why = missing_reason()
    try:
        source = gguf_source(runner.loaded.folder)
    except ModelFileError:
        source, why = None, why or "the target was not opened from a .gguf file"
    if why:
        progress(f"llama.cpp rows left out: {why}.")
        return []
    threads = runner.target.threads
    worker = LlamaCpp(source, threads=threads, context=runner.target.context_length)
    atexit.register(worker.close)  # also when the bench is interrupted
    progress(f"llama.cpp {worker.version} on {source.name}, {threads} threads")

    def run(mode):
        return lambda prompt, ids, params: worker.generate(mode, ids, prompt.max_tokens, params, stop)

    return [Method(PLAIN, "external", run("plain"), close=worker.close),
            Method(LOOKUP, "external", run("lookup"), anchor=PLAIN, close=worker.close)]


def run_bench(runner, prompts: list[BenchPrompt], methods: list[Method], *, params: SamplingParams,
              repeats: int = 3, progress=print) -> BenchRun:
    start = time.perf_counter()
    tok = runner.tokenizer
    bench = BenchRun(methods, prompts, {p.name: tok.render_chat(list(p.messages)) for p in prompts})
    try:
        _run_all(bench, methods, prompts, params, repeats, progress)
    finally:  # a llama.cpp worker does not idle on beside a caller that lives on (tests, a window)
        for method in methods:
            if method.close is not None:
                method.close()
    bench.target_costs, bench.draft_cost = measure_costs(runner, bench)
    bench.draft_is_model = _draft_model(runner.drafter) is not None
    inner = getattr(runner.drafter, "model", runner.drafter)
    bench.draft_name = "" if inner is None or inner.name == "prompt lookup" else inner.name
    if inner is not None and inner.drafts_in_one_pass(None):
        bench.draft_block = inner.drafts_per_pass
    bench.wall_s = time.perf_counter() - start
    return bench


def _run_all(bench: BenchRun, methods: list[Method], prompts: list[BenchPrompt], params: SamplingParams,
             repeats: int, progress) -> None:
    first = prompts[0]
    for method in methods:  # warm-up, not recorded
        method.run(replace(first, max_tokens=WARMUP_TOKENS), bench.prompt_ids[first.name], params)
    for repeat in range(repeats):
        order = methods if repeat % 2 == 0 else methods[::-1]
        for prompt in prompts:
            for method in order:
                # at a temperature each repeat has its own seed, the same for every method
                seeded = params if params.greedy else replace(params, seed=(params.seed or 0) + repeat)
                result = method.run(prompt, bench.prompt_ids[prompt.name], seeded)
                bench.records.append(Record(prompt.name, method.name, repeat, result))
                progress(f"repeat {repeat + 1}/{repeats}  {prompt.name:<12} {method.name:<28} "
                         f"{result.tokens_per_s:6.1f} tok/s  ({len(result.tokens)} tokens)")


def _draft_model(drafter):
    """The draft model's backend (ModelDrafter, or one beside prompt lookup), else None."""
    if isinstance(drafter, (ModelDrafter, LookupThenModelDrafter)):
        return drafter.backend
    return None


def measure_costs(runner, bench: BenchRun) -> tuple[dict[int, float], float | None]:
    """t_t(w) for w = 1 .. max k + 1 and t_d(1), at the first prompt's length plus its answer."""
    first = bench.prompts[0]
    answer = next(r.result.tokens for r in bench.records if r.prompt == first.name and r.method == TARGET_ALONE)
    context = bench.prompt_ids[first.name] + answer[: len(answer) // 2 or 1]
    widest = max([m.k or MAX_DRAFT for m in bench.methods if m.family == "tandem"], default=MAX_DRAFT)
    costs = measure_target_costs(runner.target, context, range(1, widest + 2))
    drafter = runner.drafter
    if _draft_model(drafter) is not None:
        return costs, measure_draft_cost(drafter.backend, context)
    # a drafter that is not a model of its own (prompt lookup, an MTP layer): its measured time per
    # proposed token in the runs (a block drafter's: per pass, the rounds that drafted)
    drafted = [r.result for r in bench.records if r.result.drafted]
    inner = getattr(drafter, "model", drafter)
    if inner is not None and inner.drafts_in_one_pass(None):
        total = sum(r.drafted_by_position[0] for r in drafted if r.drafted_by_position)
    else:
        total = sum(r.drafted for r in drafted)
    return costs, (sum(r.draft_s for r in drafted) / total if total else None)
