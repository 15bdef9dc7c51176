"""Plugin: the parts of the long suites that belong to the slow tier, in one list.

The default tier (``scripts/test``) must stay within minutes on two cores, and
the failure-matrix and kill suites multiply every fault point by every sink
backend and every Spark writer path. The default tier keeps every fault point
on the backends that cover each mechanism once (memory, file, HTTP and
PostgreSQL in transactional mode; one Spark driver kill; one clean run per
Spark path family); the other combinations below are marked ``slow`` here,
so they run in CI's slow step (``.ci/run``) and with ``pytest -m slow``, and
the test files keep their plain parametrization.

A pattern that no longer matches any collected test fails the run, so a
renamed test cannot drop out of the slow tier unnoticed.

The ``spark`` marker is per test, so that a module's tests that need no JVM
stay in the non-Spark tier (``scripts/test --no-spark``): every test that uses
the shared Spark session (the ``spark`` fixture) is marked here, a test that
starts Spark in a subprocess says so with ``@pytest.mark.spark``, and a
``spark`` marker on a whole module (``pytestmark``) fails the run, naming the
module: it would take the module's other tests out of that tier.

With ``RECONCILE_SLOW_SAMPLE=SEED[:SHARE]`` (CI sets it, the seed from the
commit) a run takes a seeded sample of the slow tier's parametrized families:
of a test function with three or more slow parameter sets, a share (a third
by default) of them, at least one, plus every one a mutant's kill set selects
of the mutants this run's mutation check draws (``tests/mutants``,
``RECONCILE_MUTATION_SAMPLE``: the mutation check takes its baseline from this
run, and would otherwise run those tests again after it). The tests of
minutes each form groups (``HEAVY``) of which a few are drawn: one of the
benchmarks' smoke runs, three of the long end-to-end runs. The other slow
tests run whole. The run's summary names the seed, so a failure is repeated with the
same value; over successive commits every parameter set is drawn.
"""

from __future__ import annotations

import math
import os
import random
import re

import pytest

from tests import mutation_baseline
from tests.heavy_groups import HEAVY, HEAVY_GROUP_OF, HEAVY_ROWS

# Node-id patterns (re.match) of the tests that run only in the slow tier, and why.
SLOW: dict[str, str] = {
    # The failure matrix with an expected state: memory covers the cycle's
    # order at every point; the PostgreSQL sinks repeat it with a database.
    r"tests/chaos/test_expected_state_cycle\.py::test_failure_matrix_with_expected_state"
    r"\[postgres": "every fault point again on a database, in both modes",
    # On memory, the rows that fail the epoch before it stages anything into the
    # store (begin, the cycle's stage step, a sink's stage): the plain failure
    # matrix takes them on every default backend, and the store's abort path is
    # taken by the prepare rows after it staged.
    r"tests/chaos/test_expected_state_cycle\.py::test_failure_matrix_with_expected_state"
    r"\[memory-(begin-|stage-|engine_crash-cycle\.stage)":
        "the faults before the epoch reaches the store, with a store on memory",
    # kill -9 around the decision: transactional PostgreSQL takes every point in the
    # default tier; prepared transactions repeat them with a second commit path.
    r"tests/chaos/test_expected_state_cycle\.py::test_kill9_around_the_decision_then_restart"
    r"\[postgres_prepared-": "kill -9 around the decision, into prepared PostgreSQL",
    # The plain failure matrix: prepared transactions, Delta and Iceberg repeat
    # the points that transactional PostgreSQL, files and HTTP already take.
    r"tests/chaos/test_failure_matrix\.py::test_failure_matrix\[(postgres_prepared|delta|iceberg)-":
        "prepared PostgreSQL, Delta and Iceberg at every fault point",
    r"tests/chaos/test_kill9\.py::test_kill9_then_restart_converges"
    r"\[.*-(postgres_prepared|delta|iceberg)\]":
        "kill -9 at every point into prepared PostgreSQL, Delta and Iceberg",
    # The delta-spark sink: every kill starts two processes, each with a Spark JVM of
    # its own (minutes on two busy cores); the default tier takes its in-process tests.
    r"tests/chaos/test_kill9\.py::test_kill9_then_restart_converges"
    r"\[.*-delta_spark\]":
        "kill -9 at every point into the delta-spark sink (a Spark JVM per process)",
    r"tests/chaos/test_kill9\.py::test_kill9_inside_the_delta_spark_commit":
        "kill -9 inside the delta-spark commit, before its Spark command",
    r"tests/chaos/test_failure_matrix\.py::test_failure_matrix\[delta_spark-":
        "the delta-spark sink at every fault point (a Spark command per commit)",
    r"tests/chaos/test_failure_matrix\.py::test_(commit_reply_lost_is_not_recommitted"
    r"|stranded_txn_of_truncated_epoch_is_reported_not_guessed|zombie_writer_is_fenced)"
    r"\[delta_spark\]": "the delta-spark sink's lost reply, stranded txn and zombie "
    "(test_delta_spark_sink.py's zombie test stays)",
    # The delta-spark sink's contract checks: every commit is a Spark command; the
    # default tier keeps the commit's idempotency, the fence and the durable prepare.
    r"tests/integration/test_sink_contract\.py::test_contract\[delta_spark-(?!("
    r"commit_is_idempotent_by_epoch|stale_generation_cannot_write|prepared_is_durable_and"
    r"_invisible)\])":
        "the rest of the contract suite on the delta-spark sink",
    r"tests/integration/test_delta_spark_sink\.py::test_a_replayed_commit_is_skipped_by_delta"
    r"_itself\[append\]": "a replayed append (the replayed MERGE stays)",
    r"tests/integration/test_delta_spark_stream\.py::":
        "the streaming writer into a delta+spark:// sink (a Spark query)",
    # Inside the Iceberg commit: the kill right before the catalog commit stays in
    # the default tier; the one after the sink's checks repeats it a step earlier.
    r"tests/chaos/test_kill9\.py::test_kill9_inside_the_iceberg_commit\[iceberg-commit-checked":
        "kill -9 inside the Iceberg commit, after its checks",
    # MariaDB through the SQL sink: the commit rows (the marker decides) and the zombie
    # stay in the default tier; the rows before the commit point are the cycle's own,
    # taken on every default backend.
    r"tests/chaos/test_failure_matrix\.py::test_failure_matrix\[mariadb-(?!commit-|after_commit)":
        "MariaDB at the fault points before the commit",
    # Kafka: as MariaDB, the commit rows (the marker topic decides, after a new
    # producer made the broker finish the old transaction) and the zombie stay in
    # the default tier; the rows before the commit point are the cycle's own.
    r"tests/chaos/test_failure_matrix\.py::test_failure_matrix\[kafka-(?!commit-|after_commit)":
        "Kafka at the fault points before the commit",
    r"tests/chaos/test_kill9\.py::test_kill9_then_restart_converges\[(?!prepare-midway|"
    r"commit-first-sink).*-kafka\]": "kill -9 into Kafka between the sinks' own steps",
    # Kafka into Spark into PostgreSQL and Kafka: the kill after the decision stays in
    # the default tier; the others take a Spark pipeline twice each.
    r"tests/integration/test_kafka_stream\.py::test_kafka_to_postgres_and_kafka_exactly_once"
    r"_with_the_driver_killed\[(?!cycle\.decided)":
        "the Kafka-fed stream killed at the other points",
    r"tests/integration/test_replay_kafka\.py::test_a_topic_whose_retention":
        "a replay refused for retention, after a stream of its own",
    # kill -9 into MariaDB: the kills inside its prepare and commit stay in the default
    # tier; those between the sinks' own steps are the cycle's, taken on Postgres.
    r"tests/chaos/test_kill9\.py::test_kill9_then_restart_converges\[(stage|record_expected_state|"
    r"prepare-midway|commit-progress-written|finalize|engine_crash-before-commit-progress)"
    r"-mariadb\]": "kill -9 into MariaDB between the sinks' own steps",
    # Into files, the kills between the sinks' own steps (the log written, the
    # decision, finalize) repeat what transactional PostgreSQL takes at each; the
    # kills inside the file sink's stage, prepare and commit stay in the default tier.
    r"tests/chaos/test_kill9\.py::test_kill9_then_restart_converges\[(record_expected_state|"
    r"commit-progress-written|finalize|engine_crash-before-commit-progress)-file\]":
        "kill -9 into files between the sinks' own steps",
    # The file sink on S3: the default tier keeps the rows where the S3 commit
    # log itself decides (an ambiguous sink commit, a crash after prepare, an
    # abort cut short); the others repeat the cycle's order on a slower
    # backend (a second or more a row, over HTTP).
    r"tests/chaos/test_failure_matrix\.py::test_failure_matrix\[s3-(?!commit-ambiguous-sink-|"
    r"engine_crash-after-prepare|prepare-then-crash-in-abort)":
        "the file sink on S3 at the fault points the local file sink takes",
    # The store on S3 through the cycle: the default tier keeps a failed store
    # commit and an ambiguous sink commit; the crashes repeat them on the same path.
    r"tests/integration/test_s3_store\.py::test_the_commit_cycle_with_the_store_on_s3"
    r"\[(record_expected_state-crash|engine_crash-after-record-progress)\]":
        "crashes around the store's step, with the store on S3",
    # Spark pipelines in subprocesses, a minute or more each.
    # The kill test on the executor path runs the whole stream to its end and checks
    # every row once, so a clean run of it adds no check the default tier lacks.
    r"tests/integration/test_spark_stream\.py::test_a_clean_run_writes_every_batch_once_and_a"
    r"_rerun_writes_nothing\[": "the clean run, on each writer path",
    # The kill and the recovery are the cycle's, the same whichever way the rows go,
    # and each of these runs starts Spark twice.
    # The driver killed after the decision stays in the default tier on the
    # Kafka-fed stream (tests/integration/test_kafka_stream.py), which takes the
    # same writer, cycle and recovery with a replaying source; from files every
    # point and path runs here.
    r"tests/integration/test_spark_stream\.py::test_driver_killed_mid_batch_resumes_exactly_once":
        "the driver of a file-fed stream killed, at every point and path",
    r"tests/integration/test_spark_stream\.py::test_an_executor_killed_after_staging_its_file"
    r"_is_retried_and_counted_once": "an executor killed, on each writer path",
    # A COMMIT cut before the server got it is a definite failure, the epoch retried;
    # the one cut after it (the ambiguous case) stays in the default tier on both paths.
    r"tests/integration/test_spark_stream\.py::test_an_ambiguous_commit_in_a_micro_batch_is"
    r"_settled_by_the_database\[drop_before_commit-":
        "a micro-batch's COMMIT cut before it arrived",
    r"tests/integration/test_spark_stream\.py::test_format_reconcile_commit_process_killed":
        "the format's commit process killed",
    # The format's clean run: the driver and executor kills of the default tier go
    # through the same cycle and writers, and take a minute each already.
    r"tests/integration/test_spark_stream\.py::test_format_reconcile_writes_every_batch_once":
        "the format's clean run",
    r"tests/integration/test_spark_stream\.py::test_a_dead_drivers_staged_rows_are_swept":
        "a dead driver's staged rows",
    r"tests/integration/test_spark_verify\.py::test_spark_verify_and_repair_on_separate_executors":
        "the verify job on a local cluster of executor processes",
    r"tests/integration/test_cli_run\.py::test_the_standby_takes_over_a_killed_main":
        "two `reconcile run` processes, the main one killed",
    r"tests/chaos/test_demo\.py::test_demo_under_chaos": "the whole demo under injected faults",
    # The random plans on PostgreSQL: the failure matrix takes every point on a
    # database in the default tier; the plans on memory and files stay there too.
    r"tests/chaos/test_random_faults\.py::test_random_faults_(delta_sinks|postgres_sinks)":
        "the random fault plans on Delta and PostgreSQL (a table or database each)",
    r"tests/integration/test_spark_cds\.py::": "the class archive's coverage (a Spark start)",
    r"tests/integration/test_cli_config\.py::test_config_with_spark_runs_each_table_on_spark":
        "the config file's tables verified by Spark jobs",
    # Six `reconcile` processes in a row; the config file's other tests (a table
    # failing, watch, refused flags) stay in the default tier.
    r"tests/integration/test_cli_config\.py::test_verify_all_then_repair_all_from_the_config_file":
        "verify --all, then repair one table and all, from the config file",
    r"tests/integration/test_airflow_example\.py::": "the example DAG's Spark job",
    # The test machinery checked against pytest runs of the whole suite, half a
    # minute each: CI runs them (its slow step), and they change only with it.
    r"tests/unit/test_mutation_baseline\.py::test_the_joint_selection_is_pytests_own":
        "the mutation check's selection against a collection of the suite",
    r"tests/unit/test_schedule\.py::test_a_(whole_run|run_that_stops)":
        "the test order, from pytest runs of the suite",
    r"tests/unit/test_tiers\.py::test_a_(run_marks|sampled_run)":
        "the slow tier and its sample, from pytest runs of the suite",
    r"tests/unit/test_imports\.py::test_every_module_imports_first_in_a_fresh_interpreter":
        "every module imported alone, a fresh interpreter each (the import contracts and the "
        "modules a Spark worker imports first run in the default tier)",
    # A minute or more each, beside a cheaper neighbour of the same kind that
    # stays in the default tier (named after each).
    r"tests/integration/test_rebuild_property\.py::":
        "random sequences of epochs and rebuilds (test_rebuild.py's cases stay)",
    r"tests/integration/test_s3_store\.py::test_verify_repair_and_watch_from_a_config":
        "the CLI with the store on S3 (the MariaDB and Kafka CLI tests stay)",
    r"tests/integration/test_iceberg_cli\.py::test_verify_repair_and_watch":
        "the CLI on Iceberg (the MariaDB and Kafka CLI tests stay)",
    r"tests/integration/test_recover_sql\.py::test_the_sql_sink_passes_the_contract_suite":
        "the contract suite on SQLite (MariaDB's stays, test_sink_contract.py)",
    r"tests/integration/test_store_long_run\.py::test_a_long_lived_writer":
        "a long-lived writer's window (the store's layout tests stay)",
    r"tests/integration/test_spark_cli\.py::test_verify_and_repair_with_spark_exit_codes":
        "verify --spark's exit codes (the brake and store check on Spark stay)",
    r"tests/integration/test_iceberg_contention\.py::test_the_engines_commits_land_while":
        "a co-writer appending every 50 ms (the lost races and the rebase that plans again stay)",
}  # fmt: skip

_COMPILED = [re.compile(pattern) for pattern in SLOW]


def slow_tier(nodeid: str) -> bool:
    """Whether ``nodeid`` is one of the listed tests (it is then marked ``slow``)."""
    return any(pattern.match(nodeid) for pattern in _COMPILED)


def unmatched(nodeids: list[str], args: list[str]) -> list[str]:
    """The patterns that match none of ``nodeids``, though a run of ``args`` collected their file.

    Only a run asked for a pattern's whole file (or a folder of it, or no
    arguments: the test paths) can tell that the pattern has gone stale.
    """
    files = {nodeid.split("::", 1)[0] for nodeid in nodeids}
    stale = []
    heavy = [re.compile(re.escape(nodeid)) for nodeid in HEAVY_GROUP_OF]  # a renamed one too
    for pattern in (*_COMPILED, *heavy):
        file = pattern.pattern.split("::", 1)[0].replace("\\.", ".")
        if file not in files or not _whole_file(args, file):
            continue
        if not any(pattern.match(nodeid) for nodeid in nodeids):
            stale.append(pattern.pattern)
    return stale


def marks_module_spark(module: object) -> bool:
    """Whether a test module marks all its tests ``spark`` (its ``pytestmark``)."""
    marks = getattr(module, "pytestmark", [])
    marks = marks if isinstance(marks, list) else [marks]
    return any(getattr(mark, "name", None) == "spark" for mark in marks)


def mark_spark_tests(items: list[pytest.Item]) -> None:
    """Mark ``spark`` every test that uses the Spark session; refuse a module-wide marker."""
    whole = sorted({item.nodeid.split("::", 1)[0] for item in items
                    if marks_module_spark(getattr(item, "module", None))})  # fmt: skip
    if whole:
        raise pytest.UsageError(
            f"tests/fix_tiers.py: {whole} mark `spark` on the whole module, which takes its "
            "tests that need no Spark out of the non-Spark tier: mark each test that starts "
            "Spark in a subprocess with @pytest.mark.spark (those using the `spark` fixture "
            "are marked by tests/fix_tiers.py)"
        )
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


SAMPLE_ENV = "RECONCILE_SLOW_SAMPLE"  # SEED[:SHARE]: run a seeded sample of the slow families
SHARE = 1 / 3  # of each family, when the variable names no share
FAMILY = 3  # a test function with fewer slow parameter sets runs whole


def parse_sample(value: str) -> tuple[str, float]:
    """``SEED[:SHARE]`` as (seed, share).

    Raises:
        pytest.UsageError: an empty seed, or a share that is not a number in (0, 1].
    """
    seed, _, share_text = value.partition(":")
    try:
        share = float(share_text) if share_text else SHARE
    except ValueError:
        share = math.nan
    if not seed or not 0 < share <= 1:
        raise pytest.UsageError(
            f"{SAMPLE_ENV}={value!r}: expected SEED or SEED:SHARE, 0 < SHARE <= 1"
        )
    return seed, share


def _group_of(nodeid: str) -> str:
    """The family or group a slow node id is drawn in (see :func:`sample`)."""
    for group, (_, pattern) in HEAVY_ROWS.items():
        if pattern.match(nodeid):
            return group
    name = nodeid.split("[", 1)[0]
    return HEAVY_GROUP_OF.get(name, name)


def sample(slow: list[str], seed: str, share: float, claimed: set[str]) -> list[str]:
    """The node ids of ``slow`` that a sample leaves out.

    A family (the node ids of one test function, parameters aside) of at least
    ``FAMILY`` members keeps ``ceil(share * size)`` of them drawn by ``seed`` (a
    draw per family, so a family's sample does not change when another grows),
    and every member in ``claimed``. Smaller families and lone tests stay whole,
    but for the groups of ``HEAVY`` and ``HEAVY_ROWS``, each of which keeps its own count.
    """
    families: dict[str, list[str]] = {}
    for nodeid in slow:
        families.setdefault(_group_of(nodeid), []).append(nodeid)
    left_out = []
    for name, members in families.items():
        heavy = HEAVY.get(name) or HEAVY_ROWS.get(name)
        if len(members) < FAMILY and heavy is None:
            continue
        keep = min(heavy[0], len(members)) if heavy else math.ceil(share * len(members))
        # Sorted: the draw is the same whatever order the tests were collected in.
        draw = random.Random(f"{seed}:{name}")
        drawn = set(draw.sample(sorted(members), keep))
        left_out += [m for m in members if m not in drawn and m not in claimed]
    return left_out


def claimed_by_mutants(items: list[pytest.Item]) -> set[str]:
    """The node ids of ``items`` that some mutant's kill set selects (pytest's own selection)."""
    from tests.mutation import SAMPLE_ENV as MUTANTS_DRAWN
    from tests.mutation import drawn, load_mutants
    from tests.mutation_runs import plain_groups

    if not mutation_baseline.available():
        return {item.nodeid for item in items}  # cannot tell: leave none of them out
    # The kill sets the joint baseline can take from a run: the others run their own.
    # Only the mutants this run's mutation check draws claim a test.
    mutants = drawn(load_mutants(), os.environ.get(MUTANTS_DRAWN, ""))
    kill_sets = plain_groups({(m.kill, m.marker): m for m in mutants})
    return {n for s in kill_sets.values() for n in mutation_baseline.selection_of(items, s)}


_SAMPLED: list[str] = []  # the summary line of a sampled run


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the listed tests ``slow`` before ``-m`` selects (so ``-m "not slow"`` drops them).

    And ``spark`` every test that uses the Spark session (``-m "not spark"``
    drops them). With ``RECONCILE_SLOW_SAMPLE`` set, the slow tests a sample
    leaves out are deselected here too.
    """
    mark_spark_tests(items)
    for item in items:
        if slow_tier(item.nodeid):
            item.add_marker(pytest.mark.slow)
    # Before the sample: a draw may leave out every test of a pattern, which
    # makes the pattern no staler than a test that is still collected.
    if not config.option.keyword:  # -k may have dropped a pattern's tests already
        stale = unmatched([item.nodeid for item in items], list(config.args))
        if stale:
            raise pytest.UsageError(f"tests/fix_tiers.py: {stale} match no test")
    value = os.environ.get(SAMPLE_ENV, "")
    if value:
        _deselect_the_unsampled(config, items, value)


def _deselect_the_unsampled(config: pytest.Config, items: list[pytest.Item], value: str) -> None:
    seed, share = parse_sample(value)
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    left_out = set(sample([i.nodeid for i in slow], seed, share, claimed_by_mutants(slow)))
    _SAMPLED[:] = [
        f"slow tier sampled ({SAMPLE_ENV}={value}): {len(slow) - len(left_out)} of "
        f"{len(slow)} slow tests run, {len(left_out)} left out; the same value repeats it"
    ]
    if left_out:
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in left_out])
        items[:] = [item for item in items if item.nodeid not in left_out]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    value = os.environ.get(SAMPLE_ENV, "")
    if _SAMPLED:
        terminalreporter.write_line(_SAMPLED[0])
    elif value:  # xdist's controller: the workers collected and drew, alike
        terminalreporter.write_line(
            f"slow tier sampled ({SAMPLE_ENV}={value}): a share of each slow family ran; "
            "the same value repeats the draw"
        )


def _whole_file(args: list[str], file: str) -> bool:
    """Whether a run of ``args`` was asked for ``file`` (or a folder of it) as a whole."""
    for arg in args:
        arg = arg.rstrip("/")
        if "::" in arg:
            continue
        if file == arg or file.startswith(arg + "/") or arg in (".", "tests"):
            return True
    return not args
