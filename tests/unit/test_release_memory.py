"""The housekeeping's memory release reaches glibc's heap where the C library is glibc."""

from __future__ import annotations

import platform

import pyarrow as pa

from expected_state.memory import _malloc_trim, release_freed_memory


def test_on_glibc_the_heap_is_trimmed_and_arrows_pool_released() -> None:
    if platform.libc_ver()[0] == "glibc":
        assert _malloc_trim() is not None  # else only Arrow's pool would be released
    held = pa.array(range(1_000_000))
    del held
    release_freed_memory()
    assert pa.array([1, 2]).sum().as_py() == 3
