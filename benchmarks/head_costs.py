"""What an EAGLE-3 head's drafted token and a DFlash drafter's block cost against the target's pass,
and the speedup bound those costs allow at the acceptance the papers report.

    python benchmarks/head_costs.py                          # the demo's 4-bit GGUF on this machine
    python benchmarks/head_costs.py --shape t8b --dtype bfloat16   # Llama-3.1-8B's shape, random
    python benchmarks/head_costs.py --shape t8b --device cuda --whole   # on a GPU, all 32 layers

Random-weight heads of the published shapes for the target (EAGLE-3: one layer of the target's
width and MLP over a 32,000-token draft vocabulary, reading three layers; DFlash: five Qwen3 layers
of the target's width, blocks of 16, as z-lab's 8B drafters are), written in their published
layouts and loaded as the app loads them: random weights accept nothing, so only costs count. An
8B-shape target does not fit this machine's memory whole: `--shape` builds it with 6 and with 8
decoder layers (enough for the drafter's five distinct layers) and extrapolates the pass linearly
to the full count (the head and embedding are in both), which the output says.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {  # as benchmarks/cuda_bench.py's, with Llama-3.1-8B's own vocabulary
    "t8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
    "small": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=8, num_attention_heads=8,  # a check
                  num_key_value_heads=2, vocab_size=2048, tie_word_embeddings=False),
}
EAGLE_VOCAB = 32000
DFLASH_LAYERS, DFLASH_BLOCK = 5, 16
# Published acceptance, per position, chain drafting (see docs/drafters.md for the sources)
ACCEPTANCE = (0.6, 0.7, 0.8)


def timed(run, repeats: int) -> float:
    run()  # warm-up
    samples = []
    for _ in range(repeats):
        _sync()
        start = time.perf_counter()
        run()
        _sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def write_eagle3(folder: Path, config: dict, layers: tuple[int, ...], dtype: torch.dtype) -> Path:
    from safetensors.torch import save_file

    from app.engine.backends.eagle3_torch import Eagle3Modules, layer_config
    from app.models.eagle3_head import Eagle3Head

    hidden, vocab = config["hidden_size"], config["vocab_size"]
    layer = {"model_type": "llama", "hidden_size": hidden, "intermediate_size": config["intermediate_size"],
             "num_hidden_layers": 1, "num_attention_heads": config["num_attention_heads"],
             "num_key_value_heads": config["num_key_value_heads"], "rms_norm_eps": 1e-5, "vocab_size": vocab,
             "max_position_embeddings": 4096, "rope_theta": 500000.0,
             "head_dim": config.get("head_dim") or hidden // config["num_attention_heads"]}
    draft_vocab = min(EAGLE_VOCAB, vocab)
    spec = Eagle3Head(folder, "speculators", layer, hidden, hidden, draft_vocab, vocab, layers,
                      {"norm_before_residual": True})
    with torch.device("meta"):
        modules = Eagle3Modules(spec, layer_config(spec))
    modules = modules.to_empty(device="cpu").to(dtype)
    with torch.no_grad():
        for p in modules.parameters():
            p.normal_(0, 0.02)
        modules.d2t.copy_(torch.arange(draft_vocab) * (vocab // draft_vocab) - torch.arange(draft_vocab))
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in modules.state_dict().items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "speculators_model_type": "eagle3", "architectures": ["Eagle3Speculator"], "transformer_layer_config": layer,
        "draft_vocab_size": draft_vocab, "norm_before_residual": True,
        "eagle_aux_hidden_state_layer_ids": list(layers)}))
    return folder


def write_dflash(folder: Path, config: dict, count: int, dtype: torch.dtype) -> Path:
    from safetensors.torch import save_file

    from app.engine.backends.dflash_torch import DFlashModules, layer_config
    from app.models.dflash_head import DFlashHead, default_layers

    hidden = config["hidden_size"]
    theirs = default_layers(count, DFLASH_LAYERS)
    if len(set(theirs)) < DFLASH_LAYERS or max(theirs) + 1 >= count:  # a cut-down target: spread evenly
        theirs = sorted({round(i * (count - 2) / (DFLASH_LAYERS - 1)) for i in range(DFLASH_LAYERS)})
    draft = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
             "intermediate_size": config["intermediate_size"], "num_hidden_layers": DFLASH_LAYERS,
             "num_attention_heads": config["num_attention_heads"], "num_key_value_heads": config["num_key_value_heads"],
             "head_dim": config.get("head_dim") or hidden // config["num_attention_heads"], "rms_norm_eps": 1e-6,
             "vocab_size": config["vocab_size"], "max_position_embeddings": 4096, "rope_theta": 1000000.0,
             "block_size": DFLASH_BLOCK, "num_target_layers": count,
             "dflash_config": {"mask_token_id": config["vocab_size"] - 1, "target_layer_ids": theirs}}
    spec = DFlashHead(folder, draft, DFLASH_BLOCK, config["vocab_size"] - 1, tuple(i + 1 for i in theirs))
    with torch.device("meta"):
        modules = DFlashModules(spec, layer_config(spec))
    modules = modules.to_empty(device="cpu").to(dtype)
    with torch.no_grad():
        for name, p in modules.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.02)
    modules.rotary_emb = type(modules.rotary_emb)(config=layer_config(spec))
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in modules.state_dict().items() if not k.startswith("rotary_emb.")},
              str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(draft))
    return folder


def random_target(folder: Path, shape: str, layers: int, dtype: torch.dtype, device: str = "cpu") -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**{**SHAPES[shape], "num_hidden_layers": layers}, max_position_embeddings=4096,
                         rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device=device).to(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if "norm" in name else 0.0, 0.02)
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    model.save_pretrained(folder)
    return folder


def measure(target_folder: Path, heads: Path, count: int, dtype_name: str, repeats: int, context: int,
            device: str = "cpu", graphs: str = "auto") -> dict:
    """Costs in seconds on one target: its pass by width, an EAGLE-3 proposal by k, a DFlash block."""
    from app.engine.backends import load_backend
    from app.engine.dflash import load_dflash_drafter
    from app.engine.drafters import Proposal
    from app.engine.mtp import load_eagle3_drafter
    from app.engine.sampling import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    target = load_backend(target_folder, "torch", precision=dtype_name, graphs=graphs,
                          **({"device": device} if device != "cpu" else {}))
    config = json.loads((target_folder / "config.json").read_text())
    config = config.get("text_config") or config
    ids = [(11 + 37 * i) % 1000 + 3 for i in range(context)]
    eagle = load_eagle3_drafter(target, write_eagle3(heads / "eagle3", config, (1, count // 2, count - 1),  # any 3
                                                     target.model.model.norm.weight.dtype))
    block = load_dflash_drafter(target, write_dflash(heads / "dflash", config, count,
                                                     target.model.model.norm.weight.dtype))
    target.reset()
    assert target.capture_hidden(True, eagle.target_layers) == ""
    target.prefill(ids)
    rows_e = target.last_hidden()
    costs: dict = {"target": {}}
    for width in (1, 2, 3, 4, 5, 8, 9, 16):
        def one_pass(width=width, mark=target.checkpoint()):
            if width > 1:
                target.verify(ids[-width:], Proposal(tuple(ids[-width + 1:]), (1.0,) * (width - 1)), greedy)
            else:
                target.next_token([ids[-1]], greedy)
            target.rewind(mark, mark.length)

        costs["target"][width] = timed(one_pass, repeats)
    # each head as it runs (replayed as CUDA graphs where the target's passes are), and eagerly over
    # transformers' DynamicCache (as every head ran before)
    def as_run_and_eager(name: str, live, eager, measure) -> None:
        costs[name] = measure(live)
        costs[f"{name} eager"] = measure(eager) if live.graph_mode else costs[name]  # else: the same passes

    def proposals(head) -> dict[int, float]:
        head.reset()
        with torch.inference_mode():
            head.draft(ids[1:-1], rows_e[:-2], 1, greedy)  # the conversation read: steady state from here
            base = head.length

            def propose(k):
                head.draft([ids[-1]], rows_e[-2:-1], k, greedy)
                head.trim(base)
            return {k: timed(lambda k=k: propose(k), repeats) for k in (1, 2, 4, 8)}

    eager = load_eagle3_drafter(target, heads / "eagle3").head
    eager.eager()
    as_run_and_eager("eagle3", eagle.head, eager, proposals)
    target.capture_hidden(True, block.target_layers)
    target.reset()
    target.prefill(ids)
    rows_d = target.last_hidden()

    def blocks(drafter) -> float:
        with torch.inference_mode():
            drafter.reset()
            drafter.draft(ids[-1], rows_d[:-1], 0, 1, greedy)  # the conversation read

            def one_block():
                drafter.draft(ids[-1], rows_d[-1:], len(ids) - 1, DFLASH_BLOCK - 1, greedy)
                drafter.trim(len(ids) - 1)
            return timed(one_block, repeats)

    eager_block = load_dflash_drafter(target, heads / "dflash").block
    eager_block.eager()
    as_run_and_eager("dflash", block.block, eager_block, blocks)
    target.capture_hidden(False)
    return costs


def bound(a: float, k: int, draft: float, t1: float, tk: float) -> float:
    expected = sum(a ** j for j in range(k + 1))
    return expected * t1 / (draft + tk)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None, help="a random target of this shape")
    parser.add_argument("--dtype", default="bfloat16", help="the random target's precision")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--graphs", default="auto", choices=("auto", "off", "static"),
                        help="the target's graphs mode (static: the graphs' shapes, eagerly; a check off the GPU)")
    parser.add_argument("--whole", action="store_true",
                        help="build the target whole (a GPU's memory), no extrapolation")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if args.shape is None:
            from app.models.demo import demo_folder

            folder = demo_folder("torch", lambda m: None, "gguf")
            config = json.loads((folder / "config.json").read_text())
            count = int((config.get("text_config") or config)["num_hidden_layers"])
            costs = measure(folder, root / "heads", count, "gguf", args.repeats, args.context)
            label = "the demo (SmolLM2-135M, its 4-bit GGUF)"
        else:
            full = SHAPES[args.shape]["num_hidden_layers"]
            parts = {}
            for layers in ((full,) if args.whole else (6, 8)):
                folder = random_target(root / f"target{layers}", args.shape, layers, getattr(torch, args.dtype),
                                       args.device)
                parts[layers] = measure(folder, root / f"heads{layers}", layers, args.dtype, args.repeats, args.context,
                                        args.device, args.graphs)
                import shutil

                shutil.rmtree(folder)
            label = f"a random {args.shape} target in {args.dtype} on {args.device}"
            if args.whole:
                costs = parts[full]
            else:  # the pass grows by one layer's cost per layer; heads do not depend on the target's depth
                costs = parts[8]
                six, eight = parts[6]["target"], parts[8]["target"]
                costs["target"] = {w: eight[w] + (full - 8) * (eight[w] - six[w]) / 2 for w in eight}
                label += f", its pass extrapolated from 6 and 8 layers to {full}"
    t = costs["target"]
    print(f"# {label}; context {args.context} tokens; medians of {args.repeats}")
    print("target pass (ms) by width: " + " ".join(f"{w}:{s * 1000:.1f}" for w, s in t.items()))
    how = (("replayed as CUDA graphs" if args.device == "cuda" else "static shapes, eagerly")
           if costs["eagle3"] is not costs["eagle3 eager"] else "as the head runs here")
    for k, s in costs["eagle3"].items():
        eager = costs["eagle3 eager"][k]
        print(f"EAGLE-3 proposal of k={k} ({how}): {s * 1000:.1f} ms = {s / k * 1000:.2f} ms per drafted token "
              f"= {s / k / t[1]:.3f} of a target pass (eager over a DynamicCache: {eager / k * 1000:.2f} ms "
              f"= {eager / k / t[1]:.3f})")
    d, eager = costs["dflash"], costs["dflash eager"]
    print(f"DFlash block of {DFLASH_BLOCK} ({DFLASH_BLOCK - 1} drafts, {how}): {d * 1000:.1f} ms = {d / t[1]:.3f} "
          f"of a target pass (eager over a DynamicCache: {eager * 1000:.1f} ms = {eager / t[1]:.3f})")
    for a in ACCEPTANCE:
        e3 = max((bound(a, k, s, t[1], t[k + 1]), k) for k, s in costs["eagle3"].items())
        df = max((bound(a, k, d, t[1], t[k + 1]), k) for k in (1, 3, 7, 15))
        print(f"acceptance {a:.1f} per position: EAGLE-3 bound {e3[0]:.2f}x at k={e3[1]}, "
              f"DFlash bound {df[0]:.2f}x at k={df[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
