"""Which files of a Spark checkpoint's logs count as a killed driver's pending entries.

Only the temporary names Spark's CheckpointFileManager gives an entry before its
rename may be removed (``reconcile.spark.checkpoint``): an entry in place, its
checksum, or a compacted log file is what the query reads, and must stay.
"""

from __future__ import annotations

import pytest

from reconcile.spark.checkpoint import is_interrupted_write

UUID = "0f4e5c3a-1b2c-4d5e-8f90-a1b2c3d4e5f6"


@pytest.mark.parametrize(
    "name", [f".0.{UUID}.tmp", f"..0.{UUID}.tmp.crc", f".12.{UUID}.tmp", f"..12.{UUID}.tmp.crc"]
)
def test_a_pending_entry_and_its_checksum_are_cleared(name: str) -> None:
    assert is_interrupted_write(name)


@pytest.mark.parametrize(
    "name",
    ["0", ".0.crc", "12", ".12.crc", "9.compact", ".9.compact.crc", "metadata", f"0.{UUID}.tmp",
     f".x.{UUID}.tmp", f".0.{UUID}.tmpx", f".0.{UUID[:-1]}.tmp"],
)  # fmt: skip
def test_an_entry_in_place_and_any_other_name_are_kept(name: str) -> None:
    assert not is_interrupted_write(name)
