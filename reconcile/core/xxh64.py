"""Vectorized XXH64 on numpy arrays: 4-byte, 8-byte and variable-length inputs, a seed per row."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["hash_bytes_fixed", "hash_bytes_padded", "hash_int32", "hash_int64", "to_signed"]

U64 = npt.NDArray[np.uint64]

# The five XXH64 primes (xxhash.h; Spark's org.apache.spark.unsafe.hash.XXH64 uses the same).
P1 = np.uint64(0x9E3779B185EBCA87)
P2 = np.uint64(0xC2B2AE3D27D4EB4F)
P3 = np.uint64(0x165667B19E3779F9)
P4 = np.uint64(0x85EBCA77C2B2AE63)
P5 = np.uint64(0x27D4EB2F165667C5)


def _rotl(x: U64, r: int) -> U64:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _round(acc: U64, lane: U64) -> U64:
    return _rotl(acc + lane * P2, 31) * P1


def _merge(h: U64, v: U64) -> U64:
    return (h ^ _round(np.zeros_like(v), v)) * P1 + P4


def _avalanche(h: U64) -> U64:
    h = h ^ (h >> np.uint64(33))
    h = h * P2
    h = h ^ (h >> np.uint64(29))
    h = h * P3
    return h ^ (h >> np.uint64(32))


def hash_int32(values: U64, seeds: U64) -> U64:
    """XXH64 of each value's 4 little-endian bytes (Spark ``XXH64.hashInt``).

    Args:
        values: the 32-bit patterns, zero-extended to uint64 (``v & 0xFFFFFFFF``).
        seeds: one seed per row.

    Returns:
        One hash per row, as uint64.
    """
    h = seeds + P5 + np.uint64(4)
    h = h ^ (values * P1)
    h = _rotl(h, 23) * P2 + P3
    return _avalanche(h)


def hash_int64(values: U64, seeds: U64) -> U64:
    """XXH64 of each value's 8 little-endian bytes (Spark ``XXH64.hashLong``).

    Args:
        values: the 64-bit patterns as uint64.
        seeds: one seed per row.

    Returns:
        One hash per row, as uint64.
    """
    h = seeds + P5 + np.uint64(8)
    h = h ^ _round(np.zeros_like(values), values)
    h = _rotl(h, 27) * P1 + P4
    return _avalanche(h)


def _take(mat: npt.NDArray[np.generic], col: npt.NDArray[np.int64]) -> npt.NDArray[np.generic]:
    """``mat[i, col[i]]`` for every row, with out-of-range columns clamped (masked later)."""
    idx = np.minimum(col, mat.shape[1] - 1)[:, None]
    return np.take_along_axis(mat, idx, axis=1)[:, 0]


def hash_bytes_padded(
    mat: npt.NDArray[np.uint8], lengths: npt.NDArray[np.int64], seeds: U64
) -> U64:
    """XXH64 of variable-length byte strings held left-aligned in a padded matrix.

    Row ``i`` hashes ``mat[i, :lengths[i]]`` with seed ``seeds[i]``; bytes past a
    row's length are never read into its hash, so the padding may hold anything.
    Every step runs on all rows at once, with rows that have finished masked out;
    the Python loops run over 32-byte stripes of the widest row, never over rows.

    Args:
        mat: ``(rows, width)`` uint8, C-contiguous, ``width`` a multiple of 8.
        lengths: the byte length of each row, ``0 <= lengths[i] <= width``.
        seeds: one seed per row.

    Returns:
        One hash per row, as uint64 (equal to ``xxhash.xxh64_intdigest``).
    """
    rows = mat.shape[0]
    if rows == 0:
        return np.zeros(0, dtype=np.uint64)
    words = mat.view("<u8")  # (rows, width // 8), little-endian whatever the host
    stripes = lengths // 32
    h = seeds + P5
    max_stripes = int(stripes.max())
    if max_stripes:
        v1 = seeds + P1 + P2
        v2 = seeds + P2
        v3 = seeds.copy()
        v4 = seeds - P1
        for k in range(max_stripes):
            active = k < stripes
            base = 4 * k
            v1 = np.where(active, _round(v1, words[:, base]), v1)
            v2 = np.where(active, _round(v2, words[:, base + 1]), v2)
            v3 = np.where(active, _round(v3, words[:, base + 2]), v3)
            v4 = np.where(active, _round(v4, words[:, base + 3]), v4)
        big = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        for v in (v1, v2, v3, v4):
            big = _merge(big, v)
        h = np.where(stripes > 0, big, h)
    h = h + lengths.astype(np.uint64)
    rest = lengths - stripes * 32
    n_words = rest // 8
    word_pos = stripes * 4
    for j in range(3):
        active = j < n_words
        if not active.any():
            break
        k1 = _round(np.zeros_like(h), _take(words, word_pos + j).astype(np.uint64))
        h = np.where(active, _rotl(h ^ k1, 27) * P1 + P4, h)
    byte_pos = stripes * 32 + n_words * 8
    rest = rest - n_words * 8
    has4 = rest >= 4
    if has4.any():
        w32 = _take(mat.view("<u4"), byte_pos // 4).astype(np.uint64)
        h = np.where(has4, _rotl(h ^ (w32 * P1), 23) * P2 + P3, h)
        byte_pos = byte_pos + np.where(has4, 4, 0)
        rest = rest - np.where(has4, 4, 0)
    for j in range(3):
        active = j < rest
        if not active.any():
            break
        b = _take(mat, byte_pos + j).astype(np.uint64)
        h = np.where(active, _rotl(h ^ (b * P5), 11) * P1, h)
    return _avalanche(h)


def hash_bytes_fixed(mat: npt.NDArray[np.uint8], length: int, seeds: U64) -> U64:
    """XXH64 of byte strings that all have the same ``length``, held left-aligned in ``mat``.

    The fast path of :func:`hash_bytes_padded`: with one length for every row, each
    step reads a fixed column of the matrix and nothing needs masking.

    Args:
        mat: ``(rows, width)`` uint8, C-contiguous, ``width`` a multiple of 8, ``>= length``.
        length: the byte length of every row.
        seeds: one seed per row.

    Returns:
        One hash per row, as uint64.
    """
    words = mat.view("<u8")
    stripes = length // 32
    if stripes:
        v1 = seeds + P1 + P2
        v2 = seeds + P2
        v3 = seeds.copy()
        v4 = seeds - P1
        for k in range(stripes):
            v1 = _round(v1, words[:, 4 * k])
            v2 = _round(v2, words[:, 4 * k + 1])
            v3 = _round(v3, words[:, 4 * k + 2])
            v4 = _round(v4, words[:, 4 * k + 3])
        h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = seeds + P5
    h = h + np.uint64(length)
    pos = stripes * 32
    while length - pos >= 8:
        k1 = _round(np.zeros_like(h), np.ascontiguousarray(words[:, pos // 8]))
        h = _rotl(h ^ k1, 27) * P1 + P4
        pos += 8
    if length - pos >= 4:
        w32 = mat.view("<u4")[:, pos // 4].astype(np.uint64)
        h = _rotl(h ^ (w32 * P1), 23) * P2 + P3
        pos += 4
    while pos < length:
        h = _rotl(h ^ (mat[:, pos].astype(np.uint64) * P5), 11) * P1
        pos += 1
    return _avalanche(h)


def to_signed(h: U64) -> npt.NDArray[np.int64]:
    """Reinterpret uint64 hashes as int64 (Spark's ``LongType``), without copying."""
    return h.view(np.int64)
