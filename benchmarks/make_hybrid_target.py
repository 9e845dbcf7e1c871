"""A random-weights Qwen3.5-style hybrid of a few hundred MB with the demo's tokenizer, to measure
what speculation costs on a model with recurrent layers (no real checkpoint can be downloaded
here). Written as real Qwen3.5 checkpoints are laid out, so both transformers and mlx-lm load it.

    python benchmarks/make_hybrid_target.py OUT [--hidden 768 --layers 12] [--mtp]
    tandem-cli bench --backend torch --model OUT --draft self:int4 --ks 1,2,4,8 --no-anchors
    tandem-cli bench --backend torch --model OUT --draft mtp --ks 1,2,4 --no-anchors   (with --mtp)

Gated DeltaNet in three layers of four, full attention in the fourth (Qwen3.5's pattern). The
weights are random but larger than the init, so the answers are not uniform noise; an int4 copy
of the target (self:int4) then agrees with it often, not always: rounds both accept and roll back.
With --mtp the checkpoint also holds a random MTP layer under mtp.* (Qwen3.5's names), so the
built-in MTP drafter's cost per draft can be measured; random, it is rarely accepted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mtp", action="store_true", help="add a random MTP layer (mtp.* weights)")
    args = parser.parse_args()

    import json

    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from app.models.demo import ensure_demo
    from tests.factories import save_qwen35

    tokenizer_from = ensure_demo(progress=print)["hf"]
    demo_config = json.loads((tokenizer_from / "config.json").read_text())
    torch.manual_seed(args.seed)
    heads = args.hidden // 128
    config = Qwen3_5TextConfig(
        vocab_size=demo_config["vocab_size"], hidden_size=args.hidden, intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=max(heads // 4, 1),
        head_dim=128, linear_num_value_heads=heads, linear_num_key_heads=max(heads // 2, 1),
        linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
        max_position_embeddings=4096, tie_word_embeddings=True,
        bos_token_id=demo_config.get("bos_token_id", 1), eos_token_id=demo_config.get("eos_token_id", 2))
    model = Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "linear_attn" not in name:
                p.mul_(4.0)
    extra = {}
    if args.mtp:
        from app.engine.backends.mtp_torch import build_layer, mtp_config, to_checkpoint_name

        layer = build_layer(model.model, mtp_config(model.config))
        with torch.no_grad():
            for p in layer.parameters():
                if p.dim() == 2:
                    p.mul_(4.0)
        extra = {"mtp." + to_checkpoint_name(name): value for name, value in layer.state_dict().items()}
    save_qwen35(model, args.out, tokenizer_from, extra=extra)
    size = sum(f.stat().st_size for f in args.out.iterdir())
    print(f"{args.out}: Qwen3.5-style hybrid, {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters, "
          f"{size / 1e6:.0f} MB, layers {config.layer_types.count('linear_attention')} Gated DeltaNet + "
          f"{config.layer_types.count('full_attention')} full attention" + (" + an MTP layer" if extra else ""))


if __name__ == "__main__":
    main()
