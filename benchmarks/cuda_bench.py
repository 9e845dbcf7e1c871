"""The CUDA measurements in one call: what a pass costs against what its weights need.

    python benchmarks/cuda_bench.py --tokenizer TOK [--target t8b --draft d1b] [--out /tmp/cb]
    python benchmarks/cuda_bench.py --quick          # tiny models on the CPU, graphs off (CI)

1. Builds a random-weight Llama target and draft of real shapes on the device (SHAPES: the
   Llama-3.1-8B and Llama-3.2-1B shapes with the demo's 49,152-token vocabulary, bf16), written
   as model folders beside the demo's tokenizer (nothing can be downloaded on a GPU machine).
2. Measures the read bandwidth in the same run with a read-only kernel (a reduction over 2 GiB).
3. The bound of a pass: bytes it must read (weights except the input embedding, plus the KV cache
   at CONTEXT tokens) over that bandwidth.
4. The target's pass cost by width after a CONTEXT-token prefill: transformers' forward, the lean
   step eagerly, the lean step as captured CUDA graphs; the draft's one-token pass; the int4
   target (torchao) at width 1 beside bf16.
5. The loop where drafts are accepted, on a planted pair of the same shapes (`plant`: every
   planted model computes the same token map, so a planted draft is accepted in full): tokens/s,
   acceptance, tokens per target pass and the GPU's idle share of the wall clock (CUDA events
   around every pass) for the target alone, the planted draft, prompt lookup and `self:int4`.
6. `tandem-cli bench` on the planted pair: the draft, `self:int4` and prompt lookup.

Everything prints as it is measured (tee it: a call that runs out of time keeps what it had), then
one summary table. See docs/performance.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {  # ../shared/gpu/make_random.py's shapes
    "t8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, tie_word_embeddings=False),
    "d1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, head_dim=64, tie_word_embeddings=True),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=True),
    "small": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, tie_word_embeddings=True),
}
CONTEXT = 512
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def say(line: str) -> None:
    print(line, flush=True)


def build(shape: str, out: Path, tokenizer: Path, device: torch.device, dtype: torch.dtype,
          planted: bool = False) -> Path:
    """A random-weight Llama of `shape` as a model folder. `planted`: the same shape made to agree
    with every other planted model (see `plant`), for measuring the loop where drafts are accepted."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = out / (shape + ("-planted" if planted else ""))
    if (folder / "config.json").exists():
        return folder
    start = time.perf_counter()
    shape_fields = dict(SHAPES[shape], tie_word_embeddings=False) if planted else SHAPES[shape]
    config = LlamaConfig(vocab_size=49152, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                         bos_token_id=1, eos_token_id=2, **shape_fields)
    torch.manual_seed(0)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    if planted:
        plant(model)
    model.save_pretrained(folder, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, folder / name)
    n = sum(p.numel() for p in model.parameters())
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    say(f"built {shape}: {n / 1e9:.2f}B parameters in {time.perf_counter() - start:.0f} s")
    return folder


@torch.no_grad()
def plant(model) -> None:
    """Random weights accept nothing, so a loop with a draft can only show its costs. A planted
    model computes a fixed map instead: every layer's output projections (attention's o_proj, the
    MLP's down_proj) are zero, so the residual stream stays the token's embedding, and the head's
    row for token PERMUTATION[t] is the final norm of t's embedding, so the next token after t is
    PERMUTATION[t] by a margin of about sqrt(hidden) standard deviations. Every planted model (any
    width, any depth) computes the same map, so a planted draft is accepted in full: the loop's
    ceiling, at the real shapes' costs (zeros are read like any other weight)."""
    vocab = model.config.vocab_size
    permutation = torch.randperm(vocab, generator=torch.Generator().manual_seed(7)).to(model.device)
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
    model.model.norm.weight.fill_(1.0)
    embed = model.get_input_embeddings().weight
    normed = torch.nn.functional.rms_norm(embed.float(), (embed.shape[1],), eps=model.config.rms_norm_eps)
    head = model.get_output_embeddings().weight
    head[permutation] = normed.to(head.dtype)  # row PERMUTATION[t] matches t


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def read_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes per second a reduction reads (each byte once; a copy would count reads and writes)."""
    x = torch.ones(nbytes // 2, dtype=torch.bfloat16, device=device)
    for _ in range(3):
        x.sum()
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        x.sum()
    sync(device)
    return 10 * x.numel() * 2 / (time.perf_counter() - start)


def pass_bytes(backend, context: int) -> int:
    """What one pass must read: every weight but the input embedding (a lookup reads a row), unless
    the head shares it, plus the keys and values of `context` positions."""
    model = backend.model
    embed = model.get_input_embeddings()
    tied = model.get_output_embeddings() is not None and getattr(model.get_output_embeddings(), "weight", None) is \
        getattr(embed, "weight", None)
    seen, total = set(), 0
    for name, t in [*model.named_parameters(), *model.named_buffers()]:
        if id(t) in seen or (not tied and name.endswith("embed_tokens.weight")):
            continue
        seen.add(id(t))
        total += t.numel() * t.element_size()
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * context
    return total + kv * next(model.parameters()).element_size()


def pass_cost(backend, width: int, repeats: int, device: torch.device) -> float:
    """Median seconds of one pass of `width` tokens after a CONTEXT-token prefill, cut back after each."""
    ids = [(11 + 37 * i) % 40000 for i in range(CONTEXT + width)]
    backend.reset()
    with torch.inference_mode():
        backend.prefill(ids[:CONTEXT])
        times = []
        for i in range(repeats + 3):
            sync(device)
            start = time.perf_counter()
            backend._forward(backend._ids(ids[CONTEXT:CONTEXT + width]), width)
            sync(device)
            if i >= 3:  # the first passes capture graphs and warm the allocator
                times.append(time.perf_counter() - start)
            backend.truncate(CONTEXT)
    backend.reset()
    return statistics.median(times)


class IdleMeter:
    """GPU busy time inside every forward pass (CUDA events, read once at the end) against the
    wall clock of the whole answer: what the GPU waited for the host."""

    def __init__(self, backends):
        self.events, self._originals = [], []
        for backend in backends:
            original = backend._forward
            self._originals.append((backend, original))

            def timed(ids, keep, original=original):
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                out = original(ids, keep)
                end.record()
                self.events.append((begin, end))
                return out

            backend._forward = timed

    def close(self) -> float:
        torch.cuda.synchronize()
        busy = sum(b.elapsed_time(e) for b, e in self.events) / 1e3
        for backend, original in self._originals:
            backend._forward = original
        return busy


def answer_costs(runner, prompt: str, tokens: int, gpu: bool) -> dict:
    """One answer with the loaded pair: tokens/s, acceptance, tokens per target pass and, on a GPU,
    the share of the wall clock the GPU idled (CUDA events around every pass)."""
    from app.engine.events import Finished
    from app.runner import ChatRequest

    draft = getattr(runner.drafter, "backend", None)
    meter = IdleMeter([runner.target] + ([draft] if draft is not None else [])) if gpu else None
    start = time.perf_counter()
    done = None
    request = ChatRequest(messages=({"role": "user", "content": prompt},), max_tokens=tokens)
    for event in runner.chat(request):
        if isinstance(event, Finished):
            done = event
    wall = time.perf_counter() - start
    busy = meter.close() if meter else None
    stats = done.stats
    return {"gpu_idle_share": None if busy is None else max(0.0, 1 - busy / wall),
            "tokens_per_s": stats.decode_tokens / stats.decode_s if stats.decode_s else 0.0,
            "acceptance": stats.accepted / stats.drafted if stats.drafted else None,
            "tokens_per_pass": stats.decode_tokens / stats.rounds if stats.rounds else None}


def _pass_tables(summary: dict, target_shape: str, draft_shape: str, out: Path, tokenizer: Path,
                 device: torch.device, dtype: torch.dtype, widths: list[int], repeats: int, quick: bool) -> None:
    """The read bandwidth, the target's pass by width in each mode, the draft's step, int4 (CUDA)."""
    from app.engine.backends.torch_backend import TorchBackend

    target_dir = build(target_shape, out, tokenizer, device, dtype)
    draft_dir = build(draft_shape, out, tokenizer, device, dtype)

    bandwidth = read_bandwidth(device, (64 << 20) if quick else (2 << 30))
    summary["bandwidth_GBps"] = bandwidth / 1e9
    say(f"read bandwidth {bandwidth / 1e9:.1f} GB/s")

    graph_mode = "auto" if device.type == "cuda" else "static"  # static: the graphs' shapes, not captured
    target = TorchBackend(target_dir, device=str(device), graphs=graph_mode)
    bound = pass_bytes(target, CONTEXT) / bandwidth
    summary["bound_ms"] = bound * 1e3
    say(f"target: {target.precision}; bound of a pass {bound * 1e3:.2f} ms "
        f"({pass_bytes(target, CONTEXT) / 1e9:.2f} GB at {CONTEXT} tokens of context)")
    cuda = device.type == "cuda"
    # (label, step, graphs, glue); the fused glue (layer_glue_torch.py) only where passes are captured
    modes = [("transformers", "transformers", "off", "off"), ("lean eager", "lean", "off", "off"),
             ("lean graphs" if cuda else "lean static shapes", "lean", graph_mode, "off")]
    if cuda:
        modes.append(("graphs, fused glue", "lean", graph_mode, "auto"))
    costs: dict[str, dict[int, float | None]] = {}
    for label, step, graphs, glue in modes:
        def build_mode(t=target, step=step, graphs=graphs, glue=glue):
            start = time.perf_counter()
            t._glue_mode, t._graph_mode = glue, graphs
            t.step = step
            return time.perf_counter() - start
        took = _guarded(f"{label}: set-up", build_mode)
        costs[label] = {}
        for width in widths:
            cost = None if took is None else _guarded(
                f"width {width}, {label}", lambda t=target, w=width: pass_cost(t, w, repeats, device))
            costs[label][width] = None if cost is None else cost * 1e3
        if graphs != "off":  # what really ran: captured, or why not
            captured = sum(c.graph is not None for c in target._graphs.graphs.values()) if target._graphs else 0
            say(f"{label}: {target.precision}; {captured} graphs captured; set-up {took or 0:.1f} s")
    rows = []
    for width in widths:
        row = {"width": width, **{label: costs[label].get(width) for label, *_ in modes}}
        rows.append(row)
        say("width %2d: " % width + ", ".join(f"{k} {v:.2f} ms" if v is not None else f"{k} failed"
                                              for k, v in row.items() if k != "width")
            + f"; bound {bound * 1e3:.2f} ms")
    summary["passes"] = rows
    target._glue_mode, target._graph_mode = "auto", graph_mode
    target.step = "lean"
    target_ms = pass_cost(target, 1, repeats, device) * 1e3
    say(f"target width 1 as Tandem runs it ({target.precision}): {target_ms:.2f} ms = "
        f"{bound * 1e3 / target_ms:.2f} of the bound")

    def draft_step():
        for glue in (("off", "auto") if cuda else ("off",)):
            draft = TorchBackend(draft_dir, device=str(device), graphs=graph_mode, glue=glue)
            draft_ms = pass_cost(draft, 1, repeats, device) * 1e3
            summary[f"draft_step_ms_glue_{glue}"] = draft_ms
            summary["draft_step_ms"], summary["draft_over_target"] = draft_ms, draft_ms / target_ms
            say(f"draft one-token pass {draft_ms:.2f} ms = {draft_ms / target_ms:.2f} of the target's "
                f"{target_ms:.2f} ms ({draft.precision})")
            del draft
            gc.collect()
        if cuda:  # the draft at int4 (a draft may be inexact: the target's verdict keeps the answer exact)
            draft = TorchBackend(draft_dir, device=str(device), precision="int4", graphs=graph_mode)
            draft_ms = pass_cost(draft, 1, repeats, device) * 1e3
            summary["draft_int4_step_ms"] = draft_ms
            say(f"draft at int4, one-token pass {draft_ms:.2f} ms = {draft_ms / target_ms:.2f} of the target's "
                f"{target_ms:.2f} ms ({draft.precision})")
            del draft
            gc.collect()

    _guarded("the draft's step", draft_step)
    if cuda:
        from app.models import torch_quantize

        plain_quantize = torch_quantize.quantize_int4
        # torchao's int4 (tinygemm) at Tandem's group of 32, glue eager and fused; then groups of 128
        for group, glue in ((32, "auto"), (32, "off"), (128, "auto")):
            def int4_pass(group=group, glue=glue):
                torch_quantize.quantize_int4 = lambda model, **kw: plain_quantize(model, group_size=group, **kw)
                try:
                    int4 = TorchBackend(target_dir, device=str(device), precision="int4", graphs=graph_mode, glue=glue)
                finally:
                    torch_quantize.quantize_int4 = plain_quantize
                int4_ms = pass_cost(int4, 1, repeats, device) * 1e3
                summary[f"int4_g{group}_glue_{glue}_ms"] = int4_ms
                if group == 32 and glue == "auto":
                    summary["int4_ms"], summary["int4_speedup"] = int4_ms, target_ms / int4_ms
                say(f"int4 g{group} target ({int4.precision}) width 1: {int4_ms:.2f} ms = "
                    f"{target_ms / int4_ms:.2f}x the bf16 pass")
                del int4
                gc.collect()
                torch.cuda.empty_cache()

            _guarded(f"int4 g{group} glue {glue}", int4_pass)
    del target
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny models on the CPU, graphs off (CI)")
    parser.add_argument("--target", default=None, help="target shape (t8b; quick: small)")
    parser.add_argument("--draft", default=None, help="draft shape (d1b; quick: tiny)")
    parser.add_argument("--tokenizer", default=None, help="a folder with the demo's tokenizer files")
    parser.add_argument("--out", default="/tmp/tandem-cuda-bench", help="where the random models go")
    parser.add_argument("--widths", default="1,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--skip-cli-bench", action="store_true")
    parser.add_argument("--loop-only", action="store_true", help="only the planted pair's loop and the CLI bench")
    parser.add_argument("--skip-probe", action="store_true", help="no kernel profiles (CUDA)")
    parser.add_argument("--smoke", action="store_true",
                        help="a minute's check first: imports, one tiny model's passes captured and eager, compared")
    args = parser.parse_args(argv)
    if args.smoke:
        return smoke(Path(args.tokenizer) if args.tokenizer else _demo_tokenizer(), Path(args.out))

    device = torch.device("cpu" if args.quick or not torch.cuda.is_available() else "cuda")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target_shape = args.target or ("small" if args.quick else "t8b")
    draft_shape = args.draft or ("tiny" if args.quick else "d1b")
    repeats = 3 if args.quick else args.repeats
    widths = [int(w) for w in args.widths.split(",")]
    tokenizer = Path(args.tokenizer) if args.tokenizer else _demo_tokenizer()
    out = Path(args.out)
    card = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    say(f"device: {card}; torch {torch.__version__}; dtype {dtype}")
    summary: dict[str, object] = {"card": card, "target": target_shape, "draft": draft_shape}
    if not args.loop_only:
        _pass_tables(summary, target_shape, draft_shape, out, tokenizer, device, dtype, widths, repeats, args.quick)
    # the loop where drafts are accepted: a planted pair (see `plant`), built now so that the
    # table above comes first in a call that runs out of time
    target_dir = build(target_shape, out, tokenizer, device, dtype, planted=True)
    draft_dir = build(draft_shape, out, tokenizer, device, dtype, planted=True)
    summary["loop"] = _guarded("the loop's costs", lambda: _loop_rows(target_dir, draft_dir, device, args.quick))
    if not args.skip_cli_bench:
        from app.cli import main as cli

        for drafter in (str(draft_dir), "self:int4", "ngram"):
            if args.quick and drafter == "self:int4":
                continue
            say(f"--- tandem-cli bench, draft {drafter}")
            _guarded(f"tandem-cli bench with {drafter}", lambda drafter=drafter: cli(
                ["bench", "--backend", "torch", "--model", str(target_dir), "--draft", drafter, "--no-anchors",
                 "--ks", "", "--repeats", "1" if args.quick else "2", "--prompts", "2" if args.quick else "4",
                 "--max-tokens", "16" if args.quick else "64"]))
            if device.type == "cuda":
                gc.collect()
                torch.cuda.empty_cache()
    if device.type == "cuda" and not args.skip_probe and not args.loop_only:
        _guarded("the kernels of a pass", lambda: kernel_probe(out / target_shape, out / draft_shape, repeats))
    say("=== summary\n" + json.dumps(summary, indent=1))
    return 0


def _guarded(what: str, run):
    """One section of a device call: a failure is printed whole and the call goes on (the rest of
    the table still counts; a GPU call is too dear to lose to one section)."""
    try:
        return run()
    except Exception:
        import traceback

        say(f"{what}: FAILED\n{traceback.format_exc()}")
        return None


def smoke(tokenizer: Path, out: Path) -> int:
    """Imports, a tiny random model built on the device, 40 greedy tokens with captured graphs
    (static shapes on the CPU) against the same model eagerly: exit 0 only when they are equal."""
    from app.engine.backends.torch_backend import TorchBackend
    from app.engine.events import Round
    from app.engine.speculative import generate

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    card = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    say(f"smoke: {card}; torch {torch.__version__}, CUDA {torch.version.cuda}")
    folder = build("tiny", out, tokenizer, device, torch.float32)
    prompt = [1, 969, 198, 20, 300, 301, 2, 198, 1, 520, 198]

    def tokens(graphs: str):
        backend = TorchBackend(folder, device=str(device), graphs=graphs)
        start = time.perf_counter()
        got = [t for e in generate(backend, lambda ids: "", prompt, max_tokens=40) if isinstance(e, Round)
               for t in e.emitted]
        return got, backend, time.perf_counter() - start

    eager, _, eager_s = tokens("off")
    graphed, backend, graphed_s = tokens("auto" if device.type == "cuda" else "static")
    captured = sum(c.graph is not None for c in backend._graphs.graphs.values()) if backend._graphs else 0
    same = graphed == eager
    say(f"smoke: {backend.precision}; {captured} graphs captured; 40 tokens eager {eager_s:.2f} s, graphed "
        f"{graphed_s:.2f} s; {'the same tokens' if same else 'DIFFERENT tokens: ' + str((eager, graphed))}")
    return 0 if same else 1


def kernel_profile(backend, passes: int = 10) -> None:
    """The GPU kernels of one captured width-1 pass (PyTorch's profiler over `passes` replays):
    how many, how long in all, and the names that take the most time."""
    from torch.profiler import ProfilerActivity, profile

    ids = [(11 + 37 * i) % 40000 for i in range(CONTEXT + 1)]
    backend.reset()
    with torch.inference_mode():
        backend.prefill(ids[:CONTEXT])
        for _ in range(3):  # captured before the profile
            backend._forward(backend._ids(ids[CONTEXT:]), 1)
            backend.truncate(CONTEXT)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(passes):
                backend._forward(backend._ids(ids[CONTEXT:]), 1)
                backend.truncate(CONTEXT)
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / passes
    backend.reset()
    kernels = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.device_time_total > 0]
    count = sum(e.count for e in kernels) / passes
    busy = sum(e.device_time_total for e in kernels) / passes / 1e3  # microseconds to ms
    say(f"  {count:.0f} kernels per pass, {busy:.2f} ms of kernel time in {wall * 1e3:.2f} ms of wall clock "
        f"(profiled); the most time:")
    for e in sorted(kernels, key=lambda e: -e.device_time_total)[:12]:
        say(f"    {e.count / passes:5.0f} x {e.device_time_total / e.count:7.1f} us  {e.key[:110]}")


def kernel_probe(target_dir: Path, draft_dir: Path, repeats: int) -> None:
    """What a captured pass is made of, with the glue eager and fused (layer_glue_torch.py): each
    model's kernels per width-1 pass and the pass cost at widths 1 and 4."""
    from app.engine.backends.torch_backend import TorchBackend

    device = torch.device("cuda")
    for name, folder in (("draft", draft_dir), ("target", target_dir)):
        for glue in ("off", "auto"):
            backend = TorchBackend(folder, device="cuda", graphs="auto", glue=glue)
            say(f"--- kernels of the {name}'s captured width-1 pass ({folder.name}; {backend.precision})")
            kernel_profile(backend)
            say("  " + ", ".join(f"width {w} {pass_cost(backend, w, repeats, device) * 1e3:.2f} ms" for w in (1, 4)))
            del backend
            gc.collect()
            torch.cuda.empty_cache()


def _loop_rows(target_dir: Path, draft_dir: Path, device: torch.device, quick: bool) -> list[dict]:
    from app.cli import draft_choice
    from app.runner import Runner

    rows = []
    drafters = ("none", str(draft_dir), "ngram") + (() if quick else ("self:int4",))
    for drafter in drafters:
        runner = Runner()
        runner.load(str(target_dir), "torch", draft=draft_choice(drafter))
        prompt = "Write a Python function that checks whether a number is prime, with a docstring."
        tokens = 16 if quick else 96
        answer_costs(runner, prompt, tokens, False)  # warm: the graphs of the widths it uses captured here
        row = {"draft": Path(drafter).name, **answer_costs(runner, prompt, tokens, device.type == "cuda")}
        for role, backend in (("target", runner.target), ("draft", getattr(runner.drafter, "backend", None))):
            if backend is not None and getattr(backend, "_graphs", None) is not None:
                say(f"  {role}: {backend.precision}; {len(backend._graphs.graphs)} graphs, "
                    f"{backend._graphs.replays} replays, one-time work in {backend.one_time_work} passes")
        rows.append(row)
        say(f"planted pair, draft {row['draft']}: {row['tokens_per_s']:.1f} tok/s, acceptance "
            f"{'-' if row['acceptance'] is None else format(row['acceptance'], '.0%')}, "
            f"{row['tokens_per_pass'] or 0:.2f} tokens per target pass"
            + ("" if row["gpu_idle_share"] is None else f", GPU idle {row['gpu_idle_share']:.1%} of the wall clock"))
        del runner
        if device.type == "cuda":
            # a runner's backends, graphs and drafters hold one another: only the collector frees them,
            # and the next pair's memory check would find the last one's 17 GB still taken
            gc.collect()
            torch.cuda.empty_cache()
    return rows


def _demo_tokenizer() -> Path:
    from app.models.demo import demo_folder

    return demo_folder("torch", precision="float32")


if __name__ == "__main__":
    sys.exit(main())
