"""Tiny real models for tests: transformers' own Llama classes with random weights, written to
GGUF the way llama.cpp's converter writes them (Q/K rows permuted for its RoPE layout), with a
1024-token slice of the demo model's BPE vocabulary so chat templates and specials are real."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

TINY_VOCAB = 1024


def tokenizer_fields(demo_gguf: Path, n_tokens: int = TINY_VOCAB) -> dict:
    """The first `n_tokens` of the demo vocabulary and the merges that stay inside it."""
    reader = gguf.GGUFReader(demo_gguf)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()[:n_tokens]
    types = reader.fields["tokenizer.ggml.token_type"].contents()[:n_tokens]
    kept = set(tokens)
    merges = [m for m in reader.fields["tokenizer.ggml.merges"].contents()
              if all(part in kept for part in m.split(" ")) and m.replace(" ", "") in kept]
    template = reader.fields["tokenizer.chat_template"].contents()
    return {"tokens": tokens, "types": types, "merges": merges, "chat_template": template}


def tiny_llama(seed: int, vocab: int = TINY_VOCAB, hidden: int = 64, layers: int = 2,
               heads: int = 4, kv_heads: int = 2, context: int = 512) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=context, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger weights than the init, so greedy choices are not near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    return model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF's rotate-half RoPE rows -> GGML's
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model: LlamaForCausalLM, path: Path, fields: dict,
               qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
               embedding_qtype: gguf.GGMLQuantizationType | None = None) -> dict:
    """Write `model` as a llama GGUF; 2-D weights in `qtype` (the embedding in `embedding_qtype`
    when given, as llama.cpp's Q4 files keep it in Q8_0 or Q6_K). Returns the weights as written
    (dequantized, in HF layout) for comparison."""
    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-test-llama")
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_vocab_size(cfg.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(fields["tokens"])
    writer.add_token_types(fields["types"])
    writer.add_token_merges(fields["merges"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(fields["chat_template"])

    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    written = {}
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight":
            continue  # tied: llama.cpp omits output.weight
        w = tensor.float().numpy().copy()
        if hf_name.endswith("q_proj.weight"):
            w = _permute(w, cfg.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            w = _permute(w, cfg.num_key_value_heads)
        kind = embedding_qtype if embedding_qtype is not None and hf_name == "model.embed_tokens.weight" else qtype
        if w.ndim == 2 and kind != gguf.GGMLQuantizationType.F32:
            if kind == gguf.GGMLQuantizationType.F16:
                data = w.astype(np.float16)
                writer.add_tensor(names[hf_name], data)
                deq = data.astype(np.float32)
            else:
                data = gguf.quants.quantize(w, kind)
                writer.add_tensor(names[hf_name], data, raw_dtype=kind)
                deq = gguf.quants.dequantize(data, kind)
        else:
            writer.add_tensor(names[hf_name], w)
            deq = w
        written[hf_name] = deq
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return written
