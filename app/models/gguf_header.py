"""A GGUF's tensors and scalar metadata without its metadata arrays (the vocabulary, the merges,
the scores), read in milliseconds.

gguf's own reader (gguf.GGUFReader) parses every metadata field into numpy views, one view per
string: the demo's 49,152 tokens and 48,900 merges are some 300,000 small arrays, 2.8 s of a
one-shot load each time the file is opened, and loading a model opened it twice (the file check
and the weights). Checking the file and loading its weights need the tensors and a few scalar
fields (the architecture, the name, the alignment) only; the vocabulary and the chat template
reach the tokenizer through the imported folder.

`TensorsReader` is gguf's reader with one step replaced: metadata arrays are stepped over (their
lengths read, nothing built) and named in `skipped_arrays`, not `fields`. Every scalar and string
field and every tensor (`tensors`, `data`, `data_offset`, `alignment`) are gguf's own, built by
gguf's own code, so its tensor views are the very ones GGUFReader gives.
"""

from __future__ import annotations

import logging
import struct
import sys
from pathlib import Path

import gguf
import numpy as np
from gguf.constants import GGUFValueType
from gguf.gguf_reader import ReaderField

log = logging.getLogger(__name__)

# bytes of one element of each fixed-size metadata type
_SIZES = {kind: np.dtype(np_type).itemsize for kind, np_type in gguf.GGUFReader.gguf_scalar_to_np.items()}


class TensorsReader(gguf.GGUFReader):
    """gguf.GGUFReader without the metadata arrays: `fields` holds the scalar and string fields,
    `skipped_arrays` the arrays' names (-> where each field starts in the file), `array_lengths`
    their items (-> how many)."""

    def _build_fields(self, offs: int, count: int) -> int:  # gguf.GGUFReader's, arrays stepped over
        self.skipped_arrays: dict[str, int] = {}
        self.array_lengths: dict[str, int] = {}
        order = "<" if (self.byte_order == "I") == (sys.byteorder == "little") else ">"
        view = memoryview(self.data).cast("B")
        try:
            return self._fields(view, offs, count, order)
        finally:
            view.release()  # the map stays closable

    def _fields(self, view: memoryview, offs: int, count: int, order: str) -> int:
        for _ in range(int(count)):
            start = offs
            key_len, key = self._get_str(offs)
            offs += int(key_len.nbytes + key.nbytes)
            raw_type = self._get(offs, np.uint32)
            offs += int(raw_type.nbytes)
            name = str(bytes(key), encoding="utf-8")
            if name in self.fields or name in self.skipped_arrays:
                raise KeyError(f"Duplicate {name} already in list at offset {start}")
            if int(raw_type[0]) == GGUFValueType.ARRAY:
                items = offs + 4  # after the items' type: how many (read once _past_array has checked it)
                offs = _past_array(view, offs, order)
                self.skipped_arrays[name] = start
                self.array_lengths[name] = struct.unpack_from(f"{order}Q", view, items)[0]
                continue
            size, parts, indices, types = self._get_field_parts(offs, raw_type[0])
            self._push_field(ReaderField(start, name, [key_len, key, raw_type, *parts], [i + 3 for i in indices],
                                         types), skip_sum=True)
            offs += size
        return offs


def _past_array(view: memoryview, offs: int, order: str) -> int:
    """The offset just past the metadata array whose item type starts at `offs`."""
    try:
        item_type, count = struct.unpack_from(f"{order}IQ", view, offs)
        offs += 12
        if item_type == GGUFValueType.STRING:
            length = struct.Struct(f"{order}Q")
            for _ in range(count):
                offs += 8 + length.unpack_from(view, offs)[0]
        elif item_type == GGUFValueType.ARRAY:
            for _ in range(count):
                offs = _past_array(view, offs, order)
        else:
            offs += count * _SIZES[GGUFValueType(item_type)]
    except (struct.error, KeyError, ValueError) as exc:
        raise ValueError(f"a metadata array at byte {offs:,} cannot be read ({exc})") from None
    if offs > len(view):
        raise ValueError(f"a metadata array runs past the end of the file (to byte {offs:,} of {len(view):,})")
    return offs


def open_tensors(path: str | Path) -> gguf.GGUFReader:
    """A reader of `path`'s tensors and scalar metadata (TensorsReader); gguf's whole reader where
    this gguf version's reader is built otherwise than TensorsReader expects."""
    try:
        return TensorsReader(path, "r")
    except (AttributeError, TypeError) as exc:  # another gguf's internals: its own reader, slower
        log.warning("reading %s with gguf's whole reader (%s: %s)", Path(path).name, type(exc).__name__, exc)
        return gguf.GGUFReader(path, "r")


def token_count(reader: gguf.GGUFReader) -> int:
    """How many tokens the file's vocabulary (tokenizer.ggml.tokens) holds; 0 where it has none
    (gguf's GGUFWriter leaves an empty list out altogether)."""
    lengths = getattr(reader, "array_lengths", None)
    if lengths is not None:  # TensorsReader
        return int(lengths.get("tokenizer.ggml.tokens", 0))
    field = reader.fields.get("tokenizer.ggml.tokens")  # gguf's whole reader: one data index per item
    return len(field.data) if field is not None else 0
