"""PostgreSQL's ``hash_bytes_extended`` (Bob Jenkins' lookup3, 64-bit with a seed) in numpy.

What ``hashtextextended(text COLLATE "C", seed)`` computes on a little-endian
server (``src/common/hashfn.c``), vectorized over Arrow string arrays: the hash
of the bucket checksums (``reconcile.core.checksum``). ``pg_hash_bytes`` is the
scalar reference.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pyarrow as pa  # type: ignore[import-untyped, unused-ignore]

__all__ = ["pg_hash_bytes", "pg_hash_text_arrow"]

U32 = npt.NDArray[np.uint32]
U64 = npt.NDArray[np.uint64]

# Rows per slice of the lookup3 matrices: bounds the temporaries.
_SLICE_ROWS = 1 << 17


def _rot(x: U32, k: int) -> U32:
    return (x << np.uint32(k)) | (x >> np.uint32(32 - k))


def _mix(a: U32, b: U32, c: U32) -> tuple[U32, U32, U32]:
    a = a - c
    a ^= _rot(c, 4)
    c = c + b
    b = b - a
    b ^= _rot(a, 6)
    a = a + c
    c = c - b
    c ^= _rot(b, 8)
    b = b + a
    a = a - c
    a ^= _rot(c, 16)
    c = c + b
    b = b - a
    b ^= _rot(a, 19)
    a = a + c
    c = c - b
    c ^= _rot(b, 4)
    b = b + a
    return a, b, c


def _final(a: U32, b: U32, c: U32) -> tuple[U32, U32, U32]:
    c ^= b
    c = c - _rot(b, 14)
    a ^= c
    a = a - _rot(c, 11)
    b ^= a
    b = b - _rot(a, 25)
    c ^= b
    c = c - _rot(b, 16)
    a ^= c
    a = a - _rot(c, 4)
    b ^= a
    b = b - _rot(a, 14)
    c ^= b
    c = c - _rot(b, 24)
    return a, b, c


def _lookup3(words: U32, lengths: npt.NDArray[np.int64], blocks: int, seed: int) -> U64:
    """hash_bytes_extended of rows given as zero-padded LE uint32 words, ``(rows, 3 * (blocks+1))``.

    Every row has ``blocks`` full 12-byte blocks and a tail of ``len % 12`` bytes
    (zero bytes beyond it), exactly as the C code consumes them.
    """
    with np.errstate(over="ignore"):
        init = (np.uint32(0x9E3779B9) + lengths.astype(np.uint32) + np.uint32(3923095)).astype(
            np.uint32
        )
        a, b, c = init.copy(), init.copy(), init.copy()
        if seed:
            a = a + np.uint32((seed >> 32) & 0xFFFFFFFF)
            b = b + np.uint32(seed & 0xFFFFFFFF)
            a, b, c = _mix(a, b, c)
        for block in range(blocks):
            a = a + words[:, 3 * block]
            b = b + words[:, 3 * block + 1]
            c = c + words[:, 3 * block + 2]
            a, b, c = _mix(a, b, c)
        tail = 3 * blocks
        # The tail's bytes 8..10 go into c shifted by 8: its lowest byte is
        # reserved for the length in lookup3 (PostgreSQL adds the length at set-up).
        a = a + words[:, tail]
        b = b + words[:, tail + 1]
        c = c + (words[:, tail + 2] << np.uint32(8))
        a, b, c = _final(a, b, c)
    return (b.astype(np.uint64) << np.uint64(32)) | c.astype(np.uint64)


def pg_hash_bytes(data: bytes, seed: int) -> int:
    """PostgreSQL's ``hash_bytes_extended(data, seed)`` of one byte string, as uint64.

    The scalar reference of :func:`pg_hash_text_arrow` (and what
    ``hashtextextended(text COLLATE "C", seed)`` returns, as a signed int8).
    """
    blocks = len(data) // 12
    padded = data + b"\x00" * ((blocks + 1) * 12 - len(data))
    words = np.frombuffer(padded, dtype="<u4").reshape(1, -1).astype(np.uint32)
    lengths = np.array([len(data)], dtype=np.int64)
    return int(_lookup3(words, lengths, blocks, seed & 0xFFFFFFFFFFFFFFFF)[0])


def pg_hash_text_arrow(texts: pa.Array, seed: int) -> U64:
    """``hash_bytes_extended`` of every value of a string or binary array, vectorized.

    Rows are grouped by their count of full 12-byte blocks; each group is gathered
    into a zero-padded word matrix through a strided window view.
    """
    arr = texts.cast(pa.large_binary())
    n = len(arr)
    out = np.zeros(n, dtype=np.uint64)
    if n == 0:
        return out
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64)[arr.offset : arr.offset + n + 1]
    buf = arr.buffers()[2]
    data = np.frombuffer(buf, dtype=np.uint8) if buf is not None else np.zeros(0, np.uint8)
    starts = offsets[:-1].astype(np.int64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    low = int(starts.min())
    width_max = (int(lengths.max()) // 12 + 1) * 12
    padded = np.concatenate([data[low : int(offsets[-1])], np.zeros(width_max, dtype=np.uint8)])
    starts = starts - low
    block_counts = lengths // 12
    seed &= 0xFFFFFFFFFFFFFFFF
    for blocks in np.unique(block_counts).tolist():
        width = (blocks + 1) * 12
        window = np.lib.stride_tricks.sliding_window_view(padded, width)
        rows = np.flatnonzero(block_counts == blocks)
        step = max(1, _SLICE_ROWS * 12 // width)
        positions = np.arange(width, dtype=np.int64)
        for lo in range(0, len(rows), step):
            part = rows[lo : lo + step]
            mat = np.array(window[starts[part]], dtype=np.uint8)
            # Zero the bytes past each row's end (they belong to the next row).
            mat[positions[None, :] >= lengths[part][:, None]] = 0
            words = mat.view("<u4").astype(np.uint32, copy=False)
            out[part] = _lookup3(words, lengths[part], blocks, seed)
    return out
