"""Write an unrelated draft for the demo model: random weights, the demo's own tokenizer.

The bench's "bad pair" case (the draft shares the vocabulary and nothing else, so almost nothing
is accepted): Tandem must stay within a few percent of the target alone thanks to adaptive k.

    python benchmarks/make_unrelated_draft.py OUT_FOLDER
    tandem-cli bench --draft OUT_FOLDER --ks 2,4
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from app.models.demo import ensure_demo

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")


def main(out: str) -> None:
    demo = ensure_demo(progress=print)["hf"]
    folder = Path(out)
    base = LlamaConfig.from_pretrained(demo)
    config = LlamaConfig(vocab_size=base.vocab_size, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=base.max_position_embeddings,
                         bos_token_id=base.bos_token_id, eos_token_id=base.eos_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)  # safetensors
    for name in TOKENIZER_FILES:
        if (demo / name).exists():
            shutil.copy(demo / name, folder / name)
    print(folder)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "unrelated-draft")
