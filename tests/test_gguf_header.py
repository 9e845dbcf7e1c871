"""The GGUF reader without metadata arrays (app/models/gguf_header.py): the same tensors, views and
scalar fields as gguf's own reader, the arrays stepped over, in either byte order; a file cut short
inside an array is refused, not read past its end."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from app.models.gguf_header import TensorsReader, open_tensors

Q = gguf.GGMLQuantizationType


def _write(path, endianess=gguf.GGUFEndian.LITTLE):
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endianess)
    writer.add_name("header-test")
    writer.add_block_count(2)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("test.flag", True)
    writer.add_string("tokenizer.chat_template", "{{ messages }}")
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" * (i % 5 + 1) for i in range(300)] + [""])
    writer.add_array("tokenizer.ggml.scores", [float(i) for i in range(300)])
    writer.add_array("tokenizer.ggml.token_type", list(range(300)))
    writer.add_array("test.nested", [[1, 2, 3], [4], [5, 6]])
    writer.add_array("test.nested_strings", [["a", "bc"], ["def"]])
    writer.add_string("general.after_arrays", "still read")
    rng = np.random.default_rng(0)
    writer.add_tensor("blk.0.attn_q.weight", gguf.quants.quantize(rng.standard_normal((64, 64), np.float32), Q.Q8_0),
                      raw_dtype=Q.Q8_0)
    writer.add_tensor("blk.0.ffn_up.weight", gguf.quants.quantize(rng.standard_normal((32, 64), np.float32), Q.Q4_1),
                      raw_dtype=Q.Q4_1)
    writer.add_tensor("output_norm.weight", np.ones(64, np.float32))
    writer.add_tensor("token_embd.weight", rng.standard_normal((10, 64)).astype(np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _arrays(reader) -> set[str]:
    return {name for name, f in reader.fields.items() if f.types and f.types[0] == gguf.GGUFValueType.ARRAY}


def _same_as_gguf(path):
    full, fast = gguf.GGUFReader(path, "r"), open_tensors(path)
    assert isinstance(fast, TensorsReader)
    assert (fast.data_offset, fast.alignment, fast.byte_order) == (full.data_offset, full.alignment, full.byte_order)
    assert [t.name for t in fast.tensors] == [t.name for t in full.tensors]
    for a, b in zip(fast.tensors, full.tensors, strict=True):
        assert (a.tensor_type, a.n_elements, a.n_bytes, a.data_offset) == (b.tensor_type, b.n_elements, b.n_bytes,
                                                                           b.data_offset)
        assert a.shape.tolist() == b.shape.tolist()
        assert (a.data.shape, a.data.dtype) == (b.data.shape, b.data.dtype)
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
    arrays = _arrays(full)
    assert set(fast.skipped_arrays) == arrays
    assert set(fast.fields) == set(full.fields) - arrays
    for name, field in fast.fields.items():
        assert field.contents() == full.fields[name].contents(), name
        assert field.types == full.fields[name].types and field.offset == full.fields[name].offset
    return fast


@pytest.mark.parametrize("endianess", [gguf.GGUFEndian.LITTLE, gguf.GGUFEndian.BIG], ids=["little", "big"])
def test_the_tensors_and_scalar_fields_are_ggufs_own_and_arrays_are_stepped_over(tmp_path, endianess):
    fast = _same_as_gguf(_write(tmp_path / "m.gguf", endianess))
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "test.nested", "test.nested_strings"} <= set(
        fast.skipped_arrays)
    assert fast.fields["general.after_arrays"].contents() == "still read"  # the offsets after the arrays hold
    assert fast.fields["general.architecture"].contents() == "llama"


def test_the_demo_reads_as_gguf_reads_it_without_its_vocabulary(demo_gguf):
    fast = _same_as_gguf(demo_gguf)
    assert {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"} <= set(fast.skipped_arrays)


def test_a_file_cut_inside_an_array_is_refused(tmp_path):
    whole = _write(tmp_path / "whole.gguf").read_bytes()
    start = whole.index(b"tokenizer.ggml.tokens")
    for cut in (start + 40, start + 600):  # inside the count, inside the strings
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(whole[:cut])
        with pytest.raises(ValueError, match="metadata array"):
            TensorsReader(path, "r")


def test_inspect_refuses_a_file_cut_inside_its_vocabulary_naming_it(tmp_path):
    from app.models.errors import ModelFileError
    from app.models.gguf_import import inspect_gguf

    whole = _write(tmp_path / "whole.gguf").read_bytes()
    path = tmp_path / "vocab.gguf"
    path.write_bytes(whole[:whole.index(b"tokenizer.ggml.tokens") + 600])
    with pytest.raises(ModelFileError, match="vocab.gguf: the GGUF header cannot be read"):
        inspect_gguf(path)


def test_a_files_digest_is_hashed_once_while_it_stays_the_same_file(tmp_path, monkeypatch):
    """Opening a .gguf names its import by the file's SHA-256: hashed once, not at every load, and
    again whenever the file may have changed (its size, mtime, ctime or inode), even where its
    mtime was set back as `cp -p` sets it; a damaged record is hashed again, not trusted."""
    import hashlib
    import os
    import time

    from app.models import gguf_import

    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path / "cache"))
    hashed = []
    real = gguf_import.sha256_of
    monkeypatch.setattr(gguf_import, "sha256_of", lambda path: hashed.append(path) or real(path))
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 40)
    want = hashlib.sha256(path.read_bytes()).hexdigest()
    assert gguf_import.file_sha256(path) == want and len(hashed) == 1
    assert gguf_import.file_sha256(path) == want and len(hashed) == 1  # remembered
    stamp = path.stat()
    time.sleep(0.05)
    with open(path, "r+b") as handle:  # the same size, in place, its mtime set back
        handle.write(b"GGUX")
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    changed = hashlib.sha256(path.read_bytes()).hexdigest()
    assert gguf_import.file_sha256(path) == changed and len(hashed) == 2
    other = tmp_path / "other.gguf"  # another file put in its place, its mtime copied (cp -p; mv)
    other.write_bytes(b"GGUF" + bytes(reversed(range(256))) * 40)
    os.utime(other, ns=(stamp.st_atime_ns, path.stat().st_mtime_ns))
    os.replace(other, path)
    assert gguf_import.file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest() and len(hashed) == 3
    (tmp_path / "cache" / gguf_import.DIGESTS).write_text('{"' + str(path.resolve()) + '": {"file": 1}}')
    assert gguf_import.file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest() and len(hashed) == 4
    (tmp_path / "cache" / gguf_import.DIGESTS).write_text("not json")
    assert gguf_import.file_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest() and len(hashed) == 5
    assert gguf_import.file_sha256(path) and len(hashed) == 5  # written afresh
