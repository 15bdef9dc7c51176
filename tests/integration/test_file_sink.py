"""The file sink's own files: the fence under a real SIGKILL, modes, symlinks, durable folders."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import reconcile.core.durable
import sinks.files.layout
import sinks.files.sink
from reconcile.core.contract import Fatal, FencedError, Ok, SinkTxnId
from sinks.files.layout import read_fences
from sinks.files.sink import FENCE_WRITE, FileSink

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def txn(epoch: int, generation: int, pipeline: str = "shop") -> SinkTxnId:
    return SinkTxnId(pipeline, "orders", epoch, generation)


def prepare(sink: FileSink, t: SinkTxnId) -> object:
    assert sink.stage(t, [{"k": f"e{t.epoch}", "v": t.generation}]) == Ok()
    return sink.prepare(t)


# ------------------------------------------------------------------ the fence

WRITER = """
    import sys
    from reconcile.core.contract import SinkTxnId
    from sinks.files.sink import FileSink

    sink = FileSink("orders", sys.argv[1])
    txn = SinkTxnId("shop", "orders", int(sys.argv[2]), int(sys.argv[3]))
    sink.stage(txn, [{"k": "x", "v": 1}])
    print(sink.prepare(txn), flush=True)
"""


def run_writer(root: Path, epoch: int, generation: int, kill_at: str | None = None) -> int:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RECONCILE_KILL_AT", None)
    if kill_at is not None:
        env["RECONCILE_KILL_AT"] = kill_at
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(WRITER), str(root), str(epoch), str(generation)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, -9), done.stderr
    return done.returncode


def test_a_sigkill_inside_the_fence_update_never_leaves_a_lower_fence(tmp_path: Path) -> None:
    assert run_writer(tmp_path, 0, 2) == 0  # the fence is at generation 2
    # A newer writer raising the fence to 5 dies by SIGKILL inside the update.
    assert run_writer(tmp_path, 1, 5, kill_at=FENCE_WRITE) == -9
    fence = read_fences(tmp_path / "orders" / "fence").generation("shop")
    assert fence.generation in (2, 5)  # the old fence or the new one, readable
    # A kill inside the atomic write, before its rename, leaves a torn temp file
    # beside the intact fence: it changes nothing, and the next update overwrites it.
    (tmp_path / "orders" / "fence.tmp").write_bytes(b"")
    assert read_fences(tmp_path / "orders" / "fence").generation("shop") == fence
    stale = prepare(FileSink("orders", tmp_path), txn(2, 1))
    assert isinstance(stale, Fatal) and isinstance(stale.error, FencedError)
    assert prepare(FileSink("orders", tmp_path), txn(2, 5)) == Ok()  # not stuck either
    assert read_fences(tmp_path / "orders" / "fence").generation("shop").generation == 5


def test_an_empty_fence_file_is_refused_not_read_as_generation_zero(tmp_path: Path) -> None:
    # What a crash between a truncate and a write would have left.
    sink = FileSink("orders", tmp_path)
    assert prepare(sink, txn(0, 3)) == Ok()
    (tmp_path / "orders" / "fence").write_bytes(b"")
    outcome = prepare(FileSink("orders", tmp_path), txn(1, 1))
    assert isinstance(outcome, Fatal) and "not read as generation 0" in outcome.reason
    assert str(tmp_path / "orders" / "fence") in outcome.reason
    assert not (tmp_path / "orders" / "prepared" / f"{txn(1, 1)}.batch").exists()


def test_each_pipeline_has_its_own_fence_and_the_older_format_is_a_floor(tmp_path: Path) -> None:
    sink = FileSink("orders", tmp_path)
    assert prepare(sink, txn(0, 5, pipeline="big")) == Ok()
    # Another pipeline writing the same sink folder is not fenced by "big"'s generation.
    assert prepare(sink, txn(0, 1, pipeline="small")) == Ok()
    fences = json.loads((tmp_path / "orders" / "fence").read_text())["pipelines"]
    assert {n: f["generation"] for n, f in fences.items()} == {"big": 5, "small": 1}
    (tmp_path / "orders" / "fence").write_text("4")  # a fence file of the older format
    assert isinstance(prepare(sink, txn(1, 3, pipeline="small")), Fatal)
    assert prepare(sink, txn(1, 4, pipeline="small")) == Ok()


# ------------------------------------------------------------------ modes and symlinks


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.usefixtures("umask_022")
def test_batch_and_fence_files_are_created_0600(tmp_path: Path) -> None:
    sink = FileSink("orders", tmp_path)
    t = txn(0, 1)
    assert prepare(sink, t) == Ok()
    prepared = tmp_path / "orders" / "prepared" / f"{t}.batch"
    assert stat.S_IMODE(prepared.stat().st_mode) == 0o600
    assert sink.commit(t) == Ok()
    committed = tmp_path / "orders" / "committed" / f"{t}.batch"
    assert stat.S_IMODE(committed.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "orders" / "fence").stat().st_mode) == 0o600


def test_a_symlink_planted_at_the_temp_name_is_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("not the sink's")
    sink = FileSink("orders", tmp_path / "sinks")
    t = txn(0, 1)
    folder = tmp_path / "sinks" / "orders" / "prepared"
    for name in (f"{t}.batch.tmp", f"{t}.tmp"):  # this version's temp name, and the older one
        (folder / name).symlink_to(victim)
    assert sink.stage(t, [{"k": "a", "v": 1}]) == Ok()
    assert sink.prepare(t) == Ok()
    assert sink.commit(t) == Ok()
    assert victim.read_text() == "not the sink's"
    committed = tmp_path / "sinks" / "orders" / "committed" / f"{t}.batch"
    assert not committed.is_symlink() and committed.read_text().endswith('{"k": "a", "v": 1}\n')


# ------------------------------------------------------------------ durable folders


def test_new_folders_and_files_are_made_durable_in_their_parents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []

    def record(path: str | os.PathLike[str]) -> None:
        synced.append(Path(path))

    for module in (reconcile.core.durable, sinks.files.layout, sinks.files.sink):
        monkeypatch.setattr(module, "fsync_path", record)
    root = tmp_path / "deep" / "root"
    sink = FileSink("orders", root)
    # Every folder created is durable in its parent: root's parents, the sink's, its two.
    for created in (tmp_path / "deep", root, root / "orders"):
        assert created.parent in synced, (created, synced)
    assert root / "orders" in synced  # prepared/ and committed/ are entries of orders/
    synced.clear()
    assert prepare(sink, txn(0, 1)) == Ok()
    assert root / "orders" in synced  # the new fence file's entry
    assert root / "orders" / "prepared" in synced  # the prepared batch's rename
    synced.clear()
    assert sink.commit(txn(0, 1)) == Ok()
    assert {root / "orders" / "committed", root / "orders" / "prepared"} <= set(synced)
