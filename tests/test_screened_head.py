"""The screened output head (app/models/screened_head_torch.py) and the stacked projections
(app/models/fused_projections_torch.py) of a GGUF loaded at its own precisions."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from app.models.screened_head_torch import ScreenedHead
from tests.factories import tiny_llama, write_gguf

Q = gguf.GGMLQuantizationType


def _near_ties(vocab: int = 4096, dim: int = 256, cases: int = 64, seed: int = 0):
    """A head and hidden states where, for each state, a second row trails or leads the best row
    by 1e-4: far below what int8 weights or bfloat16 logits can tell apart."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn(vocab, dim, generator=g) * 0.05
    hidden = torch.randn(cases, dim, generator=g) * 3
    for i in range(cases):
        best = int(torch.argmax(hidden[i] @ weights.T))
        rival = (best + 1 + i) % vocab
        direction = hidden[i] / hidden[i].norm() ** 2
        # the rival's float32 logit is the best one's +-1e-4: it wins on even cases, loses on odd
        margin = 1e-4 if i % 2 == 0 else -1e-4
        weights[rival] = weights[best] + margin * direction
    return weights, hidden


def test_the_screened_head_picks_the_float32_argmax_at_near_ties():
    weights, hidden = _near_ties()
    head = ScreenedHead(weights, lambda rows: weights.index_select(0, rows))
    exact = hidden @ weights.T
    got = head(hidden)
    assert got.dtype == torch.float32 and got.shape == exact.shape
    assert torch.equal(got.argmax(-1), exact.argmax(-1))
    # the rows that decide carry float32 values, not the screen's
    top = exact.argmax(-1)
    torch.testing.assert_close(got.gather(1, top[:, None]), exact.gather(1, top[:, None]), rtol=1e-6, atol=1e-5)
    # the check can fail: the int8 screen alone gets the near-ties wrong
    screen = torch.ops.aten._weight_int8pack_mm(hidden.bfloat16(), head.codes, head.scales).float()
    assert (screen.argmax(-1) != exact.argmax(-1)).sum() >= 8


@pytest.mark.parametrize("kernel", ["compiled", "pytorch"])
def test_either_screen_keeps_the_float32_argmax_among_few_rows(kernel):
    """Tandem's CPU kernel (float32 sums, a bound of their rounding only) and PyTorch's int8
    kernel (bfloat16 activations and output, a wider bound): the float32 argmax is always a
    candidate, few rows are, and the compiled screen gives a token the same bits at any width."""
    from app.models import int4_cpu_torch

    weights, hidden = _near_ties()
    head = ScreenedHead(weights, lambda rows: weights.index_select(0, rows))
    if kernel == "pytorch":
        head._compiled = (False,)
    elif int4_cpu_torch.why_not_available():
        pytest.skip(f"the kernel does not run here: {int4_cpu_torch.why_not_available()}")
    screen, mask = head.candidates(hidden)
    exact = (hidden.double() @ weights.double().T).argmax(-1)
    assert mask[torch.arange(len(hidden)), exact].all()
    assert mask.sum(dim=1).max() <= 16  # of 4,096 rows (up to 9 measured on either kernel)
    if kernel == "compiled":
        alone = torch.cat([head.candidates(hidden[i:i + 1])[0] for i in range(5)])
        assert torch.equal(alone, screen[:5])


def test_the_compiled_fill_writes_pytorchs_codes_and_scales_bit_for_bit():
    """ScreenedHead.fill's one compiled pass a row (repack_numba.screen_rows) against its PyTorch
    ops: the same int8 codes and bfloat16 scales, bit for bit, on rows that round at exact halves,
    a zero row, a row of one tiny value and rows spanning magnitudes; the norms within float32's
    rounding of the sums (the bound's SLACK covers that)."""
    from app.models import int4_cpu_torch

    if int4_cpu_torch.why_not_available():
        pytest.skip(f"the kernel does not run here: {int4_cpu_torch.why_not_available()}")
    g = torch.Generator().manual_seed(3)
    rows = torch.randn(300, 96, generator=g) * torch.logspace(-6, 3, 300)[:, None]
    rows[0] = 0.0
    rows[1] = 0.0
    rows[1, 7] = 1e-35
    rows[2, :6] = torch.tensor([127.0, 0.5, 1.5, -2.5, 63.5, -0.5])  # scale 1: codes at exact halves
    rows[2, 6:] = 0.25
    rows[3] = 0.5
    rows[3, 0] = 127.49609375  # max / 127 = 1 + 2**-8, half way between two bfloat16s: to even, 1.0
    compiled, reference = (ScreenedHead.empty(300, 96, lambda r: r) for _ in range(2))
    compiled.fill(0, rows[:150])
    compiled.fill(150, rows[150:])
    reference._fill_compiled = lambda *args: False  # PyTorch's ops
    reference.fill(0, rows)
    assert torch.equal(compiled.codes, reference.codes)
    assert torch.equal(compiled.scales.view(torch.int16), reference.scales.view(torch.int16))
    assert compiled.codes[2, :6].tolist() == [127, 0, 2, -2, 64, 0]  # rint: halves to even
    assert compiled.scales[3].item() == 1.0
    for name in ("error_norm", "screen_norm"):
        torch.testing.assert_close(getattr(compiled, name), getattr(reference, name), rtol=1e-5, atol=1e-30)
    # a damaged row (NaN, an infinity) is filled as PyTorch's ops fill it: the compiled max would skip a NaN
    rows[4, 5], rows[7, 0], rows[9, 1] = float("nan"), float("inf"), -float("inf")
    compiled.fill(0, rows)
    reference.fill(0, rows)
    assert torch.equal(compiled.codes, reference.codes)
    assert torch.equal(compiled.scales.view(torch.int16), reference.scales.view(torch.int16))
    assert torch.equal(compiled.error_norm.isnan(), reference.error_norm.isnan())


def test_the_screen_rescores_few_rows_and_never_misses_the_argmax():
    """On states drawn at random the bound keeps a handful of rows per position, and always the
    float32 argmax among them (a bound set to zero would miss it: see the test above)."""
    g = torch.Generator().manual_seed(1)
    weights = torch.randn(8192, 128, generator=g) * 0.05
    hidden = torch.randn(200, 128, generator=g) * 4
    head = ScreenedHead(weights, lambda rows: weights.index_select(0, rows))
    _, mask = head.candidates(hidden)
    exact = hidden @ weights.T
    assert mask.gather(1, exact.argmax(-1, keepdim=True)).all()
    assert mask.sum(1).max() < 0.02 * weights.shape[0]  # a few rows, not the vocabulary


def test_rows_past_the_vocabulary_limit_are_never_picked():
    weights, hidden = _near_ties(vocab=512, cases=16)
    head = ScreenedHead(weights, lambda rows: weights.index_select(0, rows))
    exact = hidden @ weights.T
    head.limit = 300
    got = head(hidden)
    assert torch.equal(got[:, :300].argmax(-1), exact[:, :300].argmax(-1))
    assert (got.argmax(-1) < 300).all()


def test_the_backend_passes_its_vocabulary_limit_to_the_head(tmp_path, tiny_fields):
    from app.engine.backends.torch_backend import TorchBackend
    from app.models.gguf_import import import_gguf

    write_gguf(tiny_llama(seed=6), tmp_path / "m.gguf", tiny_fields, Q.Q4_0, embedding_qtype=Q.Q8_0)
    folders = import_gguf(tmp_path / "m.gguf", tmp_path / "i", mlx_variants=(), torch_variant="gguf")
    backend = TorchBackend(folders["gguf"])
    backend.vocab_limit = 500
    assert backend.model.get_output_embeddings().limit == 500
    assert int(torch.argmax(backend.forward_last([1, 2, 3]))) < 500


@pytest.fixture(scope="module")
def untied(tmp_path_factory, tiny_fields):
    """A tiny Llama with its own output head, written as output.weight in Q4_0."""
    from app.models.gguf_import import import_gguf

    root = tmp_path_factory.mktemp("untied")
    model = tiny_llama(seed=5)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight) * 0.5)
    write_gguf(model, root / "u.gguf", tiny_fields, Q.Q4_0, embedding_qtype=Q.Q8_0, head_qtype=Q.Q4_0)
    own = import_gguf(root / "u.gguf", root / "imp", mlx_variants=(), torch_variant="gguf")["gguf"]
    reference = import_gguf(root / "u.gguf", root / "imp", mlx_variants=())["hf"]
    return root / "u.gguf", own, reference


def test_an_untied_head_screens_in_int8_and_rescores_rows_read_from_the_file(untied):
    from app.engine.backends.torch_backend import TorchBackend
    from app.models.gguf_import import inspect_gguf
    from app.models.gguf_layers_torch import GGUFRows
    from app.models.gguf_torch import loaded_bytes

    path, folder, reference_folder = untied
    own = TorchBackend(folder)
    head = own.model.get_output_embeddings()
    assert isinstance(head, ScreenedHead) and isinstance(head.exact_rows, GGUFRows)
    assert "int8 screen + float32 argmax from Q4_0 x1" in own.dtype
    # the rescored rows are gguf's own dequantization of the file, in any order, repeated or not
    output = next(t for t in gguf.GGUFReader(path, "r").tensors if t.name == "output.weight")
    expected = gguf.quants.dequantize(output.data, output.tensor_type)
    rows = torch.tensor([7, 3, 7, 1000])
    np.testing.assert_array_equal(head.exact_rows(rows).numpy(), expected[rows.numpy()])
    # and the loaded model decides as the file's weights in float32 do, with a memory check that counts it
    float32 = TorchBackend(reference_folder)
    for ids in ([1, 900, 198, 300], [5, 6, 7, 8, 9, 10], [40, 41, 42]):
        assert torch.argmax(own.forward_last(ids)) == torch.argmax(float32.forward_last(ids))
        own.reset(), float32.reset()
    info = inspect_gguf(path)
    assert info.head == {"Q4_0": output.n_elements}
    predicted = loaded_bytes(info.elements, info.embedding, info.head, info.head_rows)
    assert abs(predicted - own.weights_bytes) <= 0.05 * own.weights_bytes


def test_stacked_projections_compute_what_the_separate_ones_do(tiny_q4_big, monkeypatch):
    """q/k/v and gate/up stacked into one matmul each give the logits of the separate matmuls, and
    keep no product past the layer (a long prefill's activations are not held)."""
    import app.models.gguf_torch as gguf_torch
    from app.engine.backends.torch_backend import TorchBackend
    from app.models.fused_projections_torch import ProjectionSlice, SharedProduct

    fused = TorchBackend(tiny_q4_big)
    slices = [m for m in fused.model.modules() if isinstance(m, ProjectionSlice)]
    assert len(slices) == 5 * 2  # q k v and gate up, both layers
    monkeypatch.setattr(gguf_torch, "_plan_fusion", lambda *a, **k: ({}, 0))
    separate = TorchBackend(tiny_q4_big)
    assert not any(isinstance(m, ProjectionSlice) for m in separate.model.modules())
    ids = list(range(10, 60))
    # the stacked model's layers would run as one compiled call (compiled_layers_torch.py, its own
    # float32 glue); here the same PyTorch body on both sides, so only the stacking differs
    fused._lean.native = None
    a, b = fused.forward_last(ids), separate.forward_last(ids)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert all(m.latest.input is None and m.latest.output is None
               for m in fused.model.modules() if isinstance(m, SharedProduct))


@pytest.fixture(scope="module")
def tiny_q4_big(tmp_path_factory, tiny_fields):
    """A tiny Llama whose k/v rows are whole blocks of 64 (the int4 layout's), so q/k/v stack too."""
    from app.models.gguf_import import import_gguf

    root = tmp_path_factory.mktemp("q4big")
    write_gguf(tiny_llama(seed=9, hidden=128, heads=4, kv_heads=2), root / "m.gguf", tiny_fields, Q.Q4_0,
               embedding_qtype=Q.Q8_0)
    return import_gguf(root / "m.gguf", root / "imp", mlx_variants=(), torch_variant="gguf")["gguf"]


def _kernel_or_skip():
    from app.models import int4_cpu_torch

    if int4_cpu_torch.why_not_available():
        pytest.skip(f"the kernel does not run here: {int4_cpu_torch.why_not_available()}")
    return int4_cpu_torch.compiled()


def test_the_compiled_candidates_are_the_rows_the_bound_keeps():
    """kernels_numba.screen_candidates against the rule written out in NumPy on the same screen:
    the same (token, row) pairs, token by token, and none from the padding past the limit."""
    kernel = _kernel_or_skip()
    rng = np.random.default_rng(3)
    screen = (rng.standard_normal((7, 3000)) * 2).astype(np.float32)
    row_bound = (rng.random(3000) * 0.05).astype(np.float32)
    h_norm = (rng.random(7) * 20 + 1).astype(np.float32)
    limit = 2900
    screen[:, limit:] = np.float32(np.inf)  # padding: would be picked were it read
    pos, rows = kernel.screen_candidates(screen, row_bound, h_norm, np.float32(1e-3), limit)
    bound = row_bound[None, :limit] * h_norm[:, None] + np.float32(1e-3)
    floor = (screen[:, :limit] - bound).max(axis=1, keepdims=True)
    want_pos, want_rows = np.nonzero(screen[:, :limit] + bound >= floor)
    np.testing.assert_array_equal(pos, want_pos)
    np.testing.assert_array_equal(rows, want_rows)
    assert 7 < len(rows) < 7 * 3000 // 4  # the rule keeps some rows and drops most


def test_q8_rows_are_read_as_gguf_reads_them_and_dotted_pair_by_pair():
    """The head's rescoring and the embedding's lookup straight from Q8_0 bytes: gguf's own
    dequantization exactly, and each pair's dot the same bits alone or among others."""
    from types import SimpleNamespace

    from app.models.gguf_layers_torch import GGUFRows

    _kernel_or_skip()
    g = torch.Generator().manual_seed(2)
    weights = torch.randn(500, 96, generator=g)
    data = gguf.quants.quantize(weights.numpy(), Q.Q8_0)
    rows = GGUFRows(SimpleNamespace(data=data, tensor_type=Q.Q8_0), 96)
    assert rows._kernel() is not None
    ids = torch.tensor([[3, 499], [3, 0]])
    reference = torch.from_numpy(gguf.quants.dequantize(data, Q.Q8_0).reshape(500, 96).astype(np.float32))
    assert torch.equal(rows(ids), reference[ids])
    hidden = torch.randn(4, 96, generator=g) * 3
    pos, picked = torch.tensor([0, 0, 1, 3, 3, 2]), torch.tensor([7, 499, 7, 250, 0, 13])
    dots = rows.dots(hidden, pos, picked)
    torch.testing.assert_close(dots, (hidden[pos].double() * reference[picked].double()).sum(1).float(),
                               rtol=1e-5, atol=1e-4)
    for k in range(len(pos)):
        assert torch.equal(rows.dots(hidden, pos[k:k + 1], picked[k:k + 1]), dots[k:k + 1])


def test_the_compiled_screen_gives_a_token_its_bits_in_every_tile_and_leftover_row():
    """Widths 1 to 13 (tiles of 6 and every smaller one) over a vocabulary that is no multiple of
    the 8-row block, against each token screened alone."""
    kernel = _kernel_or_skip()
    rng = np.random.default_rng(4)
    codes = rng.integers(-127, 128, (1003, 96)).astype(np.int8)
    scales = (rng.random(1003) * 0.01).astype(np.float32)
    x = rng.standard_normal((13, 96)).astype(np.float32)
    alone = np.empty((13, 1003), np.float32)
    for t in range(13):
        kernel.screen(codes, scales, np.ascontiguousarray(x[t:t + 1]), alone[t:t + 1], 2)
    expected = (x.astype(np.float64) @ codes.T.astype(np.float64)) * scales
    assert np.abs(alone - expected).max() <= 1e-5 * np.abs(expected).max()
    for width in range(1, 14):
        together = np.empty((width, 1003), np.float32)
        kernel.screen(codes, scales, np.ascontiguousarray(x[:width]), together, 2)
        np.testing.assert_array_equal(together, alone[:width])
