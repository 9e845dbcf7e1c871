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
    return _scaled(LlamaForCausalLM(config).eval())


def near_copy(model: LlamaForCausalLM, seed: int = 9, noise: float = 0.35) -> LlamaForCausalLM:
    """`model` with noise added to its matrices, in place: a draft that agrees with it often but
    not always."""
    with torch.no_grad():
        torch.manual_seed(seed)
        for p in model.parameters():
            if p.dim() == 2:
                p.add_(torch.randn_like(p) * noise * p.std())
    return model


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute: HF's rotate-half RoPE rows -> GGML's
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama_writer(path: Path, fields: dict, layers: int, context: int, hidden: int, intermediate: int,
                  heads: int, kv_heads: int, rope_theta: float, eps: float, vocab: int,
                  arch: str = "llama", head_dim: int | None = None) -> gguf.GGUFWriter:
    """A GGUF writer with a llama (or qwen3) model's metadata and the demo's tokenizer, as llama.cpp
    writes it."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-test-{arch}")
    if head_dim is not None:  # Qwen3 states its heads' width (it need not be hidden / heads)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_block_count(layers)
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(rope_theta)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(fields["tokens"])
    writer.add_token_types(fields["types"])
    writer.add_token_merges(fields["merges"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(fields["chat_template"])
    return writer


def write_random_q4_gguf(path: Path, fields: dict, hidden: int = 2048, intermediate: int = 5632,
                         layers: int = 8, heads: int = 16, kv_heads: int = 4, seed: int = 0) -> int:
    """A llama GGUF of a real model's shape with random weights: linear layers Q4_0 (random codes,
    small fp16 scales), the embedding Q8_0, norms F32; written block by block, with no float copy.
    Returns the file's size in bytes."""
    rng = np.random.default_rng(seed)
    vocab = len(fields["tokens"])
    writer = _llama_writer(path, fields, layers, 4096, hidden, intermediate, heads, kv_heads, 10000.0, 1e-5, vocab)
    head_dim = hidden // heads

    def blocks(rows: int, cols: int, kind) -> np.ndarray:
        per_block, block_bytes = gguf.GGML_QUANT_SIZES[kind]
        raw = rng.integers(0, 256, (rows, cols // per_block * block_bytes), dtype=np.uint8)
        scales = rng.uniform(0.002, 0.02, rows * cols // per_block).astype(np.float16)
        raw.reshape(-1, block_bytes)[:, 0:2] = scales.view(np.uint8).reshape(-1, 2)
        return raw

    writer.add_tensor("token_embd.weight", blocks(vocab, hidden, Q8_0), raw_dtype=Q8_0)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    shapes = {"attn_q": (hidden, hidden), "attn_k": (kv_heads * head_dim, hidden),
              "attn_v": (kv_heads * head_dim, hidden), "attn_output": (hidden, hidden),
              "ffn_gate": (intermediate, hidden), "ffn_up": (intermediate, hidden), "ffn_down": (hidden, intermediate)}
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        for name, (rows, cols) in shapes.items():
            writer.add_tensor(f"blk.{i}.{name}.weight", blocks(rows, cols, Q4_0), raw_dtype=Q4_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.stat().st_size


Q4_0, Q8_0 = gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q8_0


def write_gguf(model: LlamaForCausalLM, path: Path, fields: dict,
               qtype: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.F32,
               embedding_qtype: gguf.GGMLQuantizationType | None = None,
               head_qtype: gguf.GGMLQuantizationType | None = None,
               types: dict[str, gguf.GGMLQuantizationType] | None = None) -> dict:
    """Write `model` as a llama GGUF; 2-D weights in `qtype` (the embedding in `embedding_qtype`
    when given, as llama.cpp's Q4 files keep it in Q8_0 or Q6_K; an untied model's head in
    `head_qtype`, as output.weight, Q6_K in llama.cpp's Q4_K_M files; `types` gives any weight,
    by its HF name, a type of its own, as the K-quant presets mix them). Returns the weights as
    written (dequantized, in HF layout) for comparison."""
    cfg = model.config
    writer = _llama_writer(path, fields, cfg.num_hidden_layers, cfg.max_position_embeddings, cfg.hidden_size,
                           cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                           cfg.rope_parameters["rope_theta"], cfg.rms_norm_eps, cfg.vocab_size)
    writer.add_tokenizer_pre("smollm")
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
                 "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in per_layer.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    written = {}
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # tied: llama.cpp omits output.weight
        w = tensor.float().numpy().copy()
        if hf_name.endswith("q_proj.weight"):
            w = _permute(w, cfg.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            w = _permute(w, cfg.num_key_value_heads)
        kind = embedding_qtype if embedding_qtype is not None and hf_name == "model.embed_tokens.weight" else qtype
        kind = head_qtype if head_qtype is not None and hf_name == "lm_head.weight" else kind
        kind = (types or {}).get(hf_name, kind)
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


def tiny_qwen35(seed: int, vocab: int = TINY_VOCAB, hidden: int = 64, layers: int = 4, scale: float = 16.0,
                context: int = 512, full_attention_interval: int = 4):
    """A tiny Qwen3.5 hybrid from transformers' own classes: Gated DeltaNet (linear attention with
    a recurrent state) in three layers of four, full attention in the fourth, random weights."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_value_heads=4,
        linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        full_attention_interval=full_attention_interval, max_position_embeddings=context, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():  # larger weights than the init, so greedy choices are not near-ties
        for name, p in model.named_parameters():
            if p.dim() == 2 and "linear_attn" not in name:
                p.mul_(scale)
    return model


def add_noise(model, amount: float, seed: int):
    """The same model with noise on its matrices: a draft the target often, not always, accepts."""
    with torch.no_grad():
        torch.manual_seed(seed)
        for p in model.parameters():
            if p.dim() == 2:
                p.add_(torch.randn_like(p) * amount * p.std())
    return model


def save_qwen35(model, folder: Path, tokenizer_from: Path | None = None, extra: dict | None = None) -> Path:
    """Write a tiny Qwen3.5 as the real checkpoints are laid out (model_type "qwen3_5", the text
    model's config under text_config, weights named model.language_model.*), which both
    transformers and mlx-lm load; the tokenizer files copied from `tokenizer_from`; `extra`
    tensors (an MTP layer's mtp.*) written beside the model's."""
    import json
    import shutil

    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    text = model.config.to_dict()
    # mlx-lm reads the pattern from full_attention_interval, which transformers keeps as layer_types
    text["full_attention_interval"] = text["layer_types"].index("full_attention") + 1
    config = {"model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
              "text_config": text, "tie_word_embeddings": text["tie_word_embeddings"],
              "vision_config": {"depth": 1, "hidden_size": 32, "num_heads": 2, "out_hidden_size": text["hidden_size"],
                                "intermediate_size": 64},
              "dtype": "float32"}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    weights = {(k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v.contiguous()
               for k, v in model.state_dict().items() if not (k == "lm_head.weight" and text["tie_word_embeddings"])}
    weights.update({k: v.detach().contiguous() for k, v in (extra or {}).items()})
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if tokenizer_from is not None and (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, folder / name)
    return folder


def tiny_qwen3(seed: int, vocab: int = TINY_VOCAB, hidden: int = 128, layers: int = 2, heads: int = 2,
               kv_heads: int = 1, head_dim: int = 128, context: int = 512):
    """A tiny Qwen3 from transformers' own classes (q and k normalised per head), random weights.
    Heads 128 wide, as every Qwen3's: transformers' GGUF import reads no head width from the file
    and keeps Qwen3Config's default of 128."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim, max_position_embeddings=context,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    return _scaled(Qwen3ForCausalLM(config).eval())


def tiny_family(kind: str, seed: int, vocab: int = TINY_VOCAB, hidden: int = 64, layers: int = 2):
    """A tiny random model of `kind` (FAMILY_CLASSES) from transformers' own classes: families the
    PyTorch lean step does not cover, so transformers' forward runs them, and mlx-lm's families
    for tests/test_tree_mlx.py."""
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=1, eos_token_id=2, pad_token_id=2)
    config_name, model_name, extra = FAMILY_CLASSES[kind]
    config = getattr(transformers, config_name)(**common, **extra)
    return _scaled(getattr(transformers, model_name)(config).eval())


MOE = dict(num_experts_per_tok=2)
# kind: (config class, model class, its own fields). gemma: GeLU MLP, a scaled embedding; phi3:
# fused qkv and gate/up; gemma2: sliding-window layers beside global ones, soft-capped logits;
# cohere: a parallel block, LayerNorm, scaled logits; stablelm: RoPE on a quarter of each head;
# glm4: RoPE on half; granite: scaled residuals and logits; the MoE families: experts routed per token
FAMILY_CLASSES = {
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(head_dim=16)),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16, sliding_window=8)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "granite": ("GraniteConfig", "GraniteForCausalLM", dict(residual_multiplier=0.5, logits_scaling=2.0)),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", {}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {}),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(partial_rotary_factor=0.25)),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", dict(head_dim=16)),
    "helium": ("HeliumConfig", "HeliumForCausalLM", dict(head_dim=16)),
    "ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", dict(head_dim=16)),
    "seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", dict(head_dim=16)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=4, **MOE)),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(num_experts=4, moe_intermediate_size=32, shared_expert_intermediate_size=32, **MOE)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(num_experts=4, moe_intermediate_size=32, head_dim=16, **MOE)),
}


def save_for_mlx(model, folder: Path) -> Path:
    """`model` saved as a Hugging Face folder that mlx-lm loads: transformers 5 writes RoPE's
    theta (and a partial rotary factor) under `rope_parameters`, and Qwen's expert count as
    `num_local_experts`, where the hub's configs, written by earlier versions, have `rope_theta`
    and `num_experts` at the top level, which mlx-lm's model arguments read."""
    import json

    model.save_pretrained(folder)
    path = folder / "config.json"
    config = json.loads(path.read_text())
    rope = config.get("rope_parameters") or {}
    config.setdefault("rope_theta", rope.get("rope_theta", 10000.0))
    config.setdefault("partial_rotary_factor", rope.get("partial_rotary_factor", 1.0))
    if config["model_type"] in ("qwen2_moe", "qwen3_moe") and "num_local_experts" in config:
        config.setdefault("num_experts", config["num_local_experts"])  # transformers 5's name for it
    path.write_text(json.dumps(config, indent=2))
    return folder


def _scaled(model, factor: float = 4.0):
    """`model` with its matrices scaled up from the init, so greedy choices are not near-ties."""
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(factor)
    return model


def write_qwen3_gguf(model, path: Path, fields: dict, qtype: gguf.GGMLQuantizationType,
                     embedding_qtype: gguf.GGMLQuantizationType) -> None:
    """Write a Qwen3 as llama.cpp's converter does: arch "qwen3", Q/K rows as they are (no
    permutation: llama.cpp ropes Qwen in NeoX order), q/k norms as attn_q_norm/attn_k_norm."""
    cfg = model.config
    writer = _llama_writer(path, fields, cfg.num_hidden_layers, cfg.max_position_embeddings, cfg.hidden_size,
                           cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                           cfg.rope_parameters["rope_theta"], cfg.rms_norm_eps, cfg.vocab_size, arch="qwen3",
                           head_dim=cfg.head_dim)
    writer.add_tokenizer_pre("smollm")
    per_layer = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
                 "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
                 "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm",
                 "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    for i in range(cfg.num_hidden_layers):
        names.update({f"model.layers.{i}.{hf}.weight": f"blk.{i}.{gg}.weight" for hf, gg in per_layer.items()})
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight":
            continue  # tied
        w = tensor.float().numpy().copy()
        kind = embedding_qtype if hf_name == "model.embed_tokens.weight" else qtype
        if w.ndim == 2:
            writer.add_tensor(names[hf_name], gguf.quants.quantize(w, kind), raw_dtype=kind)
        else:
            writer.add_tensor(names[hf_name], w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
