"""The snapshots of systems that cannot checksum rows refuse buckets mode, each naming why."""

from __future__ import annotations

import types

import pytest

from reconcile.core.contract import InvalidInputError
from reconcile.core.target import NoRowChecksums
from sinks.iceberg.recovery import _Snapshot as IcebergSnapshot
from sinks.kafka.recovery import _Snapshot as KafkaSnapshot
from sinks.s3.recovery import _Snapshot as S3Snapshot


@pytest.mark.parametrize(
    ("snapshot", "system", "modes"),
    [(KafkaSnapshot, "Kafka", "full or scoped"), (S3Snapshot, "S3", "full"),
     (IcebergSnapshot, "Iceberg", "full or scoped")],
)  # fmt: skip
def test_every_way_into_buckets_mode_is_refused_naming_the_table_and_the_system(
    snapshot: type[NoRowChecksums], system: str, modes: str
) -> None:
    one = object.__new__(snapshot)  # no system needed: the refusal reads no row
    one.target = types.SimpleNamespace(display="shop.orders")
    want = rf"^shop\.orders: buckets mode .* which {system} does not do; use mode {modes}$"
    for call in (one.check_buckets, lambda: one.bucket_sums([1], []),
                 lambda: one.pull_ranges([])):  # fmt: skip
        with pytest.raises(InvalidInputError, match=want) as refused:
            call()
        assert refused.value.details["table"] == "shop.orders"
