"""A draft head's vocabulary (FR-Spec; app/align/draft_vocab.py): the answers' most frequent tokens,
chosen the same way from the same counts, read back without an array library (a damaged file is
refused with what to do), and drafted from on both backends: the subset's logits are the target
head's at those ids and -inf elsewhere, so nothing outside it is drafted while verification stays
exact (tests/test_alignment.py runs the job's head, which has one, through the exactness tests)."""

from __future__ import annotations

import json
import struct
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from app.align.draft_vocab import answer_counts, coverage, frequent, write
from app.models.aligned_head import DRAFT_VOCAB, draft_vocab
from app.models.errors import ModelFileError


def test_the_most_frequent_tokens_are_chosen_ties_by_id_with_the_stop_tokens_added():
    counts = Counter({7: 5, 3: 9, 11: 5, 2: 1, 40: 5})
    assert frequent(counts, 3, 100) == [3, 7, 11]  # 9, then the 5s by id: 7, 11 (40 loses the tie)
    assert frequent(counts, 3, 100, always=[99]) == [3, 7, 11, 99]
    # fewer counted than asked: the lowest ids not counted fill it (a BPE's merge order)
    assert frequent(counts, 7, 100) == [0, 1, 2, 3, 7, 11, 40]
    assert frequent(counts, 7, 10, always=[12]) == [0, 1, 2, 3, 4, 5, 7]  # nothing at or past the vocabulary
    assert coverage([3, 7], counts) == pytest.approx(14 / 25)
    assert coverage([3], Counter()) == 0.0


def test_only_the_answers_tokens_are_counted_not_the_prompts():
    seqs = [SimpleNamespace(ids=torch.tensor([1, 1, 1, 5, 6, 6]), answer_start=3),
            SimpleNamespace(ids=torch.tensor([2, 6]), answer_start=1)]
    assert answer_counts(seqs) == Counter({6: 3, 5: 1})


def test_a_written_vocabulary_reads_back_and_a_folder_without_one_drafts_from_all(tmp_path):
    assert draft_vocab(tmp_path, 100) is None
    write(tmp_path, [0, 4, 17, 99])
    assert draft_vocab(tmp_path, 100) == [0, 4, 17, 99]


def _raw(path, header: dict, data: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize("case", ["unsorted", "too large", "float", "cut short", "no ids", "shape not a list",
                                  "offsets missing", "negative offset"])
def test_a_damaged_vocabulary_is_refused_with_how_to_go_on(tmp_path, case):
    path = tmp_path / DRAFT_VOCAB
    ids = {"unsorted": [5, 3, 9], "too large": [1, 2, 100]}.get(case, [1, 2, 3])
    data = np.asarray(ids, dtype=np.int32).tobytes()
    info = {"dtype": "I32", "shape": [3], "data_offsets": [0, 12]}
    if case == "float":
        info["dtype"] = "F32"
    if case == "cut short":
        data = data[:8]
    if case == "shape not a list":
        info["shape"] = 3
    if case == "offsets missing":
        del info["data_offsets"]
    if case == "negative offset":
        info["data_offsets"] = [-4, 8]
    _raw(path, {"other" if case == "no ids" else "ids": info}, data)
    with pytest.raises(ModelFileError) as caught:
        draft_vocab(tmp_path, 100)
    assert f"Delete {DRAFT_VOCAB}" in str(caught.value) and "align the draft again" in str(caught.value)


def test_the_torch_subset_head_gives_the_heads_logits_at_its_ids_and_minus_infinity_elsewhere(tiny_pair, tiny_q4):
    from app.engine.backends.subset_head_torch import SubsetHead
    from app.engine.backends.torch_backend import TorchBackend
    from app.models.screened_head_torch import ScreenedHead

    ids = [0, 3, 17, 250, 1000, 1023]
    hidden = torch.randn(64, generator=torch.Generator().manual_seed(0))
    kinds = []
    for folder, precision in ((tiny_pair["target"], "auto"), (tiny_q4[0], "gguf")):
        backend = TorchBackend(folder, precision=precision)
        head = backend.model.get_output_embeddings()
        kinds.append(type(head))
        limit = backend.vocab_limit
        with torch.inference_mode():
            full = head(hidden.view(1, 1, -1))[0, -1, :limit].float()
            logits = SubsetHead(head, ids, limit)(hidden)
        assert logits.shape == (limit,) and logits.dtype == torch.float32
        inside = torch.zeros(limit, dtype=torch.bool)
        inside[ids] = True
        assert torch.isinf(logits[~inside]).all() and (logits[~inside] < 0).all()
        # a screened head's rows are its int8 screen (bfloat16 output): close to its float32 logits
        tolerance = 0.05 * float(full.abs().max()) if isinstance(head, ScreenedHead) else 1e-5
        assert torch.allclose(logits[inside], full[inside], atol=tolerance)
    assert ScreenedHead in kinds and torch.nn.Linear in kinds  # both kinds of head were taken apart


def test_the_mlx_subset_head_matches_the_torch_one(tiny_pair):
    pytest.importorskip("mlx_lm")
    import mlx.core as mx

    from app.engine.backends import load_backend
    from app.engine.backends.subset_head_mlx import SubsetHead as MLXSubset
    from app.engine.backends.subset_head_torch import SubsetHead

    ids, said = [2, 9, 64, 511, 1023], [9, 700, 701]  # the conversation's tokens: one fixed, two new
    hidden = np.random.default_rng(1).standard_normal(64).astype(np.float32)
    torch_target = load_backend(tiny_pair["target"], "torch")
    ours_head = SubsetHead(torch_target.model.get_output_embeddings(), ids, torch_target.vocab_limit)
    ours_head.add(said)
    with torch.inference_mode():
        ours = ours_head(torch.tensor(hidden)).numpy()
    mlx_target = load_backend(tiny_pair["target_mlx"], "mlx")
    language = getattr(mlx_target.model, "language_model", mlx_target.model)
    module = language.model.embed_tokens if language.args.tie_word_embeddings else language.lm_head
    theirs_head = MLXSubset(module, ids, mlx_target.vocab_limit)
    theirs_head.add(said)
    theirs = np.array(theirs_head(mx.array(hidden).reshape(1, 1, -1)))
    inside = sorted({*ids, *said})
    assert np.isinf(theirs).sum() == np.isinf(ours).sum() == mlx_target.vocab_limit - len(inside)
    assert np.abs(ours[inside] - theirs[inside]).max() < 1e-4
    theirs_head.clear()
    assert np.isinf(np.array(theirs_head(mx.array(hidden)))[[700, 701]]).all()


def test_the_conversations_tokens_join_the_subset_until_a_new_conversation(tiny_pair, monkeypatch):
    from app.engine.backends import subset_head_torch
    from app.engine.backends.subset_head_torch import SubsetHead
    from app.engine.backends.torch_backend import TorchBackend

    backend = TorchBackend(tiny_pair["target"])
    head = backend.model.get_output_embeddings()
    hidden = torch.randn(64, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        full = head(hidden.view(1, 1, -1))[0, -1].float()
        subset = SubsetHead(head, [1, 2, 3], backend.vocab_limit)
        subset.add([3, 500, 600, 500])
        logits = subset(hidden)
        assert torch.isfinite(logits).sum() == 5  # 1, 2, 3 and the two new ones, once each
        assert torch.allclose(logits[[500, 600]], full[[500, 600]], atol=1e-5)
        subset.add([700])
        assert torch.isfinite(subset(hidden)[[1, 500, 700]]).all()  # added to, not replaced
        subset.clear()
        assert torch.isfinite(subset(hidden)).sum() == 3
        monkeypatch.setattr(subset_head_torch, "EXTRA", 2)  # no more than EXTRA beyond the fixed part
        subset.add([10, 11, 12, 13])
        assert torch.isfinite(subset(hidden)).sum() == 5


def test_the_conversations_rows_are_written_in_place_as_they_come(tiny_pair, tiny_q4):
    """A round's new tokens are written into buffers that double, not the rows already held
    copied again at every round (for a wide head, tens of MB a round)."""
    from app.engine.backends.subset_head_torch import GROWTH_FLOOR, SubsetHead
    from app.engine.backends.torch_backend import TorchBackend

    hidden = torch.randn(64, generator=torch.Generator().manual_seed(5))
    for folder, precision in ((tiny_pair["target"], "auto"), (tiny_q4[0], "gguf")):
        backend = TorchBackend(folder, precision=precision)
        head = backend.model.get_output_embeddings()
        subset = SubsetHead(head, [1, 2], backend.vocab_limit)
        buffers = set()
        said = list(range(100, 100 + GROWTH_FLOOR + 300))
        with torch.inference_mode():
            for i in range(0, len(said), 3):  # a few new tokens a round
                subset.add(said[i:i + 3])
                buffers.add(subset.extra_rows[0].data_ptr())
            logits = subset(hidden)
            reference = SubsetHead(head, [1, 2, *said], backend.vocab_limit)(hidden)
        assert len(buffers) <= 3  # 256 rows, then 2x what was held: not one buffer per round
        assert torch.isfinite(logits).sum() == 2 + len(said)
        torch.testing.assert_close(logits, reference)  # the same logits as a subset holding them all
