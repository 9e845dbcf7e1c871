"""A GGUF on an NVIDIA GPU (docs/gguf.md, "On NVIDIA GPUs"): the 4-bit types packed code for code
for tinygemm's int4 kernel, every other tensor in bfloat16 on the GPU. Without a GPU the same
modules are built on the CPU, whose tinygemm kernel computes the same numbers, so the routing, the
weights, the memory figure and the engine's exactness are checked here; the tests marked `cuda`
run the real thing on a lent GPU machine (`python -m pytest -m cuda tests/test_gguf_gpu_layers.py`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.models.gguf_layers_torch import GGUFInt4Linear, tinygemm_bytes

# a byte-level BPE vocabulary of 64 tokens with real merges, so the import builds its tokenizer
# on a machine without the demo (the GPU machine)
_LETTERS, _DIGITS = list("abcdefghijklmnopqrstuvwxyz"), [str(i) for i in range(10)]
_MERGES = [f"{a} {d}" for a in _LETTERS[:2] for d in _DIGITS]
_TOKENS = ["<unk>", "<s>", "</s>", *_LETTERS, *_DIGITS, *(m.replace(" ", "") for m in _MERGES)]
VOCAB = {"tokens": _TOKENS + [f"x{i}" for i in range(64 - len(_TOKENS))], "types": [3, 3, 3] + [1] * 61,
         "merges": _MERGES, "chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}
PROMPT = [1, 5, 9, 33, 40, 5, 9, 33, 41, 5, 9, 33, 2, 7, 8, 7, 8]


@pytest.fixture(scope="module")
def k_mix(tmp_path_factory):
    """A tiny Llama written as llama.cpp's Q4_K_M writes one (random blocks): Q4_K, with the last
    layer's attn_v and ffn_down and the tied embedding Q6_K. (import folder, GGUF path, types)"""
    from app.bench.gguf_model_files import LlamaShape, write_random_llama
    from app.models.gguf_import import import_gguf

    root = tmp_path_factory.mktemp("k_mix")
    shape = LlamaShape("tiny", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, intermediate=512, tied=True)
    types = write_random_llama(root / "m.gguf", shape, "Q4_K_M", np.random.default_rng(3), tokenizer=VOCAB)
    return import_gguf(root / "m.gguf", root / "import", mlx_variants=())["hf"], root / "m.gguf", types


def _tensors(path) -> dict:
    import gguf

    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def _load(folder, device="cpu"):
    from app.models.gguf_import import gguf_source
    from app.models.gguf_torch import load_gguf_model

    return load_gguf_model(folder, gguf_source(folder), dtype=torch.bfloat16, lean_only=True, device=device,
                           gpu_layers=True)


def test_cuda_packing_takes_even_columns_in_the_high_nibble():
    """CUDA's `_convert_weight_to_int4pack` takes [n][k / 2] bytes, column 2j in the high nibble
    and 2j + 1 in the low one (torchao's order for CUDA; the CPU's op takes int32 codes)."""
    codes = np.random.default_rng(0).integers(0, 16, size=(8, 64), dtype=np.uint8)
    packed = tinygemm_bytes(codes)
    assert packed.shape == (8, 32) and packed.dtype == np.uint8
    assert packed[0, 0] == codes[0, 0] * 16 + codes[0, 1] and packed[7, 31] == codes[7, 62] * 16 + codes[7, 63]
    back = np.empty_like(codes)
    back[:, 0::2], back[:, 1::2] = packed >> 4, packed & 15
    np.testing.assert_array_equal(back, codes)


def test_a_k_quant_mix_loads_into_the_gpu_modules_and_the_memory_check_counts_them(k_mix):
    """4-bit tensors on tinygemm (stacked where a layer's q/k/v or gate/up are all 4-bit), the
    Q6_K ones and the norms dense bfloat16, the embedding a dense table the head shares: no module
    of the CPU path (Tandem's kernel, the screened head, the embedding read from the file). The
    memory check's figure for a GPU is what was built."""
    from app.models.gguf_import import inspect_gguf
    from app.models.gguf_layers_torch import GGUFCodesLinear, GGUFEmbedding, GGUFInt8Linear
    from app.models.gguf_torch import loaded_bytes
    from app.models.screened_head_torch import ScreenedHead

    folder, path, types = k_mix
    model, report = _load(folder)
    assert types["blk.1.attn_v.weight"] == types["blk.1.ffn_down.weight"] == types["token_embd.weight"] == "Q6_K"
    assert report.describe() == ("int4 g32 from Q4_K x12; bfloat16 from F32 x5, Q6_K x3; "
                                 "3 fused q/k/v and gate/up matmuls")
    assert report.short() == "4-bit GGUF"
    cpu_only = (GGUFCodesLinear, GGUFEmbedding, GGUFInt8Linear, ScreenedHead)
    assert not [m for m in model.modules() if isinstance(m, cpu_only)]
    first, last = model.model.layers
    assert first.self_attn.q_proj.shared is first.self_attn.v_proj.shared  # one stacked q/k/v
    assert isinstance(last.self_attn.q_proj, GGUFInt4Linear) and isinstance(last.self_attn.k_proj, GGUFInt4Linear)
    for dense in (last.self_attn.v_proj, last.mlp.down_proj, model.lm_head):
        assert type(dense) is torch.nn.Linear and dense.weight.dtype == torch.bfloat16
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: one table
    assert model.model.norm.weight.dtype == torch.bfloat16
    info = inspect_gguf(path)
    rope = sum(b.numel() * b.element_size() for b in model.model.rotary_emb.buffers())
    assert loaded_bytes(info.elements, info.embedding, info.head, info.head_rows, device="cuda") == \
        report.weights_bytes - rope


def test_an_untied_files_4_bit_embedding_is_counted_as_the_bfloat16_table_a_gpu_loads(tmp_path):
    """An untied Q4_K_M keeps its token embedding Q4_K (the head is Q6_K): on a GPU that is a dense
    bfloat16 table, not tinygemm's int4, and the memory check and `models info` count it so (an
    8B's would be counted 0.7 GB short otherwise)."""
    from app.bench.gguf_model_files import LlamaShape, write_random_llama
    from app.models.gguf_check_torch import gpu_line
    from app.models.gguf_import import import_gguf, inspect_gguf
    from app.models.gguf_torch import DENSE_BYTES, INT4_BYTES, loaded_bytes

    shape = LlamaShape("tiny", hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, intermediate=512, tied=False)
    types = write_random_llama(tmp_path / "m.gguf", shape, "Q4_K_M", np.random.default_rng(4), tokenizer=VOCAB)
    assert types["token_embd.weight"] == "Q4_K" and types["output.weight"] == "Q6_K"
    folder = import_gguf(tmp_path / "m.gguf", tmp_path / "import", mlx_variants=())["hf"]
    model, report = _load(folder)
    assert type(model.model.embed_tokens) is torch.nn.Embedding
    assert model.model.embed_tokens.weight.dtype == torch.bfloat16
    info = inspect_gguf(tmp_path / "m.gguf")
    size = loaded_bytes(info.elements, info.embedding, info.head, info.head_rows, device="cuda")
    rope = sum(b.numel() * b.element_size() for b in model.model.rotary_emb.buffers())
    assert size == report.weights_bytes - rope
    table = 64 * 256  # the vocabulary times the hidden size
    assert size - loaded_bytes(info.elements, device="cuda") == table * (DENSE_BYTES - INT4_BYTES)
    assert f"on an NVIDIA GPU: {size / 1e6:.1f} MB in the GPU's memory" in gpu_line(info)
    assert gpu_line(info).endswith("; the token embedding in bfloat16")


def test_a_file_without_4_bit_tensors_is_said_to_run_in_bfloat16_on_a_gpu(tmp_path):
    """A Q8_0 file on a GPU is dense bfloat16 throughout: its short words say so, not float32."""
    from app.bench.gguf_model_files import LlamaShape, write_random_llama
    from app.models.gguf_import import import_gguf

    shape = LlamaShape("tiny", hidden=256, layers=1, heads=4, kv_heads=2, head_dim=64, intermediate=512, tied=True)
    write_random_llama(tmp_path / "m.gguf", shape, "Q8_0", np.random.default_rng(5), tokenizer=VOCAB)
    model, report = _load(import_gguf(tmp_path / "m.gguf", tmp_path / "import", mlx_variants=())["hf"])
    assert report.short() == "bfloat16 from a GGUF", report.describe()
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_the_gpu_modules_hold_the_files_weights_within_bfloat16_rounding(k_mix):
    """Through the kernel on the identity: each 4-bit weight is (q - 8) * scale + zero with the
    file's codes and its scale and zero rounded to bfloat16 (then the product's output rounded);
    a dense tensor is the file's weights rounded to bfloat16."""
    import gguf

    from app.models.gguf_blocks import int4_groups

    folder, path, _ = k_mix
    model, _ = _load(folder)
    tensors = _tensors(path)
    first, last = model.model.layers
    checked = 0
    for layer, name in ((first.self_attn.o_proj, "blk.0.attn_output.weight"), (first.mlp.down_proj,
                                                                              "blk.0.ffn_down.weight")):
        tensor = tensors[name]
        rows, cols = layer.out_features, layer.in_features
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(rows, cols)
        got = layer(torch.eye(cols, dtype=torch.bfloat16)).float().T.numpy()  # column j: weight column j
        groups = int4_groups(tensor.tensor_type.name, tensor.data, rows, cols)
        scale = np.repeat(np.abs(groups.scale), 32, axis=1)
        zero = np.repeat(np.abs(groups.zero), 32, axis=1)
        steps = np.abs(groups.codes.astype(np.float32) - 8)
        # bfloat16 keeps 8 significant bits (unit roundoff 2^-8): scale and zero each move by at
        # most 2^-8 of themselves, and the output's rounding by 2^-8 of what the kernel summed
        held = steps * scale * (1 + 2.0 ** -8) + zero * (1 + 2.0 ** -8)
        bound = 2.0 ** -8 * (steps * scale + zero) + 2.0 ** -8 * held
        assert np.all(np.abs(got - expected) <= bound), name
        assert np.abs(got - expected).max() > 0  # (bfloat16 moved something: this is not float32)
        checked += 1
    for dense, name in ((last.mlp.down_proj, "blk.1.ffn_down.weight"), (model.lm_head, "token_embd.weight")):
        tensor = tensors[name]
        expected = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(dense.weight.shape)
        torch.testing.assert_close(dense.weight, torch.from_numpy(expected).to(torch.bfloat16), rtol=0, atol=0)
        checked += 1
    assert checked == 4


def _backend_with_gpu_layers(folder, monkeypatch):
    from app.engine.backends.torch_backend import TorchBackend

    monkeypatch.setattr(TorchBackend, "_gguf_gpu_layers", lambda self: True)
    return TorchBackend(folder, device="cpu", precision="gguf")


def test_logits_of_the_gpu_modules_follow_the_files_weights(k_mix, monkeypatch):
    """The lean step over the GPU's modules against the file's weights dequantized to float32:
    the same argmax at every position of a prompt, logits within bfloat16's reach."""
    from app.engine.backends.torch_backend import TorchBackend

    folder, _, _ = k_mix
    reference = TorchBackend(folder, device="cpu", precision="auto", model_code="transformers", step="transformers")
    backend = _backend_with_gpu_layers(folder, monkeypatch)
    assert backend.dtype.startswith("4-bit GGUF (int4 g32 from Q4_K x12; bfloat16 from")
    assert backend.logits_dtype == "bfloat16" and getattr(backend, "near_tie_gap", None) is None
    for end in range(4, len(PROMPT) + 1, 4):
        backend.reset(), reference.reset()
        got, want = backend.forward_last(PROMPT[:end]).float(), reference.forward_last(PROMPT[:end]).float()
        assert torch.argmax(got) == torch.argmax(want)
        assert (got - want).abs().max() <= 0.05 * want.abs().max()


def test_a_gguf_on_the_gpu_modules_speculates_what_it_writes_alone(k_mix, monkeypatch):
    """Prompt lookup over the GPU's modules, temperature 0: the answer is the target's own
    one-token steps' argmax, token for token, except where bfloat16's near-tie rule allows."""
    from app.bench.exactness import tie_limit
    from app.engine.drafters import PromptLookupDrafter
    from app.engine.events import Round
    from app.engine.speculative import generate

    folder, _, _ = k_mix
    target = _backend_with_gpu_layers(folder, monkeypatch)
    rounds = [e for e in generate(target, lambda ids: "", PROMPT, drafter=PromptLookupDrafter(), max_tokens=120)
              if isinstance(e, Round)]
    tokens = [t for r in rounds for t in r.emitted]
    assert len(tokens) == 120 and sum(r.accepted for r in rounds) > 0  # lookup was taken
    target.reset()
    logits = target.forward_last(PROMPT)
    for i, token in enumerate(tokens):
        top = torch.topk(logits.float(), 2)
        if int(top.indices[0]) != token:
            gap = float(top.values[0] - top.values[1])
            assert gap < tie_limit("bfloat16", float(top.values[0])), f"token {i}: a top-2 gap of {gap}"
        logits = target.forward_last([token])


def test_the_runner_plans_a_gpu_load_at_the_gpu_size(k_mix, monkeypatch):
    """The memory check of a GGUF headed for a GPU counts bfloat16 and tinygemm's bytes, not the
    CPU kernel's, and a bfloat16 KV cache."""
    from app.load_plan import gguf_loaded_bytes

    folder, _, _ = k_mix
    on_gpu = gguf_loaded_bytes(folder, "torch", "gguf", device="cuda:0")
    on_cpu = gguf_loaded_bytes(folder, "torch", "gguf")
    model, report = _load(folder)
    rope = sum(b.numel() * b.element_size() for b in model.model.rotary_emb.buffers())
    assert on_gpu == report.weights_bytes - rope and on_gpu != on_cpu
    # and its KV cache in the GPU's bfloat16 (2 bytes a number), where the CPU's is float32
    import json

    from app.models.memory import estimate, kv_bytes_per_token

    config = json.loads((folder / "config.json").read_text())
    assert estimate("target", config, 0, "torch", "cuda:0", "gguf", on_gpu).kv_per_token == \
        kv_bytes_per_token(config, 2)
    assert estimate("target", config, 0, "torch", "cpu", "gguf", on_cpu).kv_per_token == kv_bytes_per_token(config, 4)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")


@pytest.mark.cuda
@cuda
def test_on_a_gpu_the_int4_layers_compute_what_the_cpus_tinygemm_computes(k_mix):
    """The same codes, scales and zeros packed for CUDA: each layer's output on the identity equals
    the CPU's tinygemm's within one bfloat16 step (the two kernels sum in their own orders)."""
    folder, _, _ = k_mix
    on_gpu, _ = _load(folder, device="cuda")
    on_cpu, _ = _load(folder)
    pairs = [(a, b) for a, b in zip(on_gpu.modules(), on_cpu.modules(), strict=True) if isinstance(a, GGUFInt4Linear)]
    assert len(pairs) == sum(isinstance(m, GGUFInt4Linear) for m in on_cpu.modules()) == 8
    assert all(a.packed.is_cuda and a.packed.dtype == torch.int32 for a, _ in pairs)
    for a, b in pairs:
        eye = torch.eye(a.in_features, dtype=torch.bfloat16)
        got, want = a(eye.cuda()).float().cpu(), b(eye).float()
        assert ((got - want).abs() <= 2.0 ** -7 * want.abs() + 1e-6).all()


@pytest.mark.cuda
@cuda
def test_on_a_gpu_a_gguf_speculates_what_it_writes_alone_with_graphs(k_mix):
    """The runner on CUDA: the GGUF loads without refusal, passes are captured, and prompt lookup's
    answer is the target's own one-token steps' argmax up to bfloat16's near-ties."""
    from app.bench.exactness import tie_limit
    from app.engine.backends import load_backend
    from app.engine.drafters import PromptLookupDrafter
    from app.engine.events import Round
    from app.engine.speculative import generate

    folder, _, _ = k_mix
    target = load_backend(folder, "torch", device="cuda")
    assert target.dtype.startswith("4-bit GGUF (int4 g32 from Q4_K x12; bfloat16 from")
    tokens = [t for e in generate(target, lambda ids: "", PROMPT, drafter=PromptLookupDrafter(), max_tokens=200)
              if isinstance(e, Round) for t in e.emitted]
    assert len(tokens) == 200
    target.reset()
    logits = target.forward_last(PROMPT)
    for i, token in enumerate(tokens):
        top = torch.topk(logits.float(), 2)
        if int(top.indices[0]) != token:
            assert float(top.values[0] - top.values[1]) < tie_limit("bfloat16", float(top.values[0])), i
        logits = target.forward_last([token])



def test_models_info_says_what_a_gpu_runs_and_check_measures_its_rounding(k_mix, capsys):
    """`models info` names a GPU's modules and size (the memory check's figure); --check gives the
    GPU's error per type: bfloat16's rounding, nonzero and under 2^-8 of the tensor's largest
    weight for a dense tensor, under 2^-8 (8 scale + zero) for tinygemm's int4."""
    from app.cli import main
    from app.models.gguf_import import inspect_gguf
    from app.models.gguf_torch import loaded_bytes

    _, path, _ = k_mix
    assert main(["models", "info", "--check", str(path)]) == 0
    out = capsys.readouterr().out
    info = inspect_gguf(path)
    size = loaded_bytes(info.elements, device="cuda")
    assert (f"on an NVIDIA GPU: {size / 1e6:.1f} MB in the GPU's memory; Q4_K as int4 in groups of 32 on PyTorch's "
            "tinygemm kernel, the file's codes with their scales and zeros in bfloat16; Q6_K, F32 in bfloat16") in out
    rows = {line.split(":")[0].strip(): line for line in out.splitlines() if "on an NVIDIA GPU as" in line}
    assert set(rows) == {"Q4_K on an NVIDIA GPU as int4 g32", "Q6_K on an NVIDIA GPU as bfloat16"}
    assert "12 tensors" in rows["Q4_K on an NVIDIA GPU as int4 g32"]
    assert "3 tensors" in rows["Q6_K on an NVIDIA GPU as bfloat16"]
    for line in rows.values():
        error = float(line.split("largest error ")[1].split(" ")[0])
        assert 0 < error < 2.0 ** -8 * 9
