"""The slow tests of minutes each that a sampled slow tier draws a few of per commit.

``tests/fix_tiers.py`` draws them (``sample``); they are listed here, apart from the
patterns of what is slow, so that each list reads on its own.
"""

from __future__ import annotations

import re

__all__ = ["HEAVY", "HEAVY_GROUP_OF", "HEAVY_ROWS"]

# Tests of minutes each, drawn like a family's members though they are not one
# function's parameter sets: a sample runs ``keep`` of each group, besides those
# a drawn mutant claims. Over successive commits each runs.
HEAVY: dict[str, tuple[int, frozenset[str]]] = {
    # Several Spark drivers, kill loops, a process per mode each.
    "the benchmarks' smoke runs": (1, frozenset({
        "tests/integration/test_benchmark_scale.py::test_scale_benchmark_quick",
        "tests/integration/test_benchmark_kafka.py::test_kafka_benchmark_quick",
        "tests/integration/test_benchmark_realtime.py::test_quick_run_measures_the_four_modes_and_the_exactly_once_ones_write_each_record_once",
        "tests/integration/test_benchmark_latency.py::test_latency_benchmark_tiny",
        "tests/integration/test_benchmark_sinks.py::test_one_command_measures_every_sink_beside_postgres",
        "tests/integration/test_benchmark_rebuild.py::test_quick_run_reports_both_ratios_and_the_rebuild_writes_only_the_changed_rows",
    })),
    # Whole pipelines end to end, killed or changed on the way, 1.5 to 5 minutes
    # each on two cores (their cheaper neighbours of each kind are in the default tier).
    "the long end-to-end runs": (2, frozenset({
        "tests/chaos/test_demo_kafka.py::test_a_kafka_fed_demo_under_chaos_writes_every_line_once",
        "tests/chaos/test_demo_realtime.py::test_a_realtime_demo_killed_mid_batch_writes_every_line_once",
        "tests/chaos/test_demo.py::test_demo_under_chaos_verifies_and_its_faults_fired",
        "tests/chaos/test_demo.py::test_demo_killed_whole_resumes_with_the_same_workdir",
        "tests/chaos/test_ha.py::test_kill_pause_kill_the_leader_nothing_lost_or_doubled",
        "tests/chaos/test_random_faults.py::test_random_faults_postgres_transactional_long_run",
        "tests/integration/test_cli_run_changes.py::test_a_new_column_through_reconcile_run_on_every_staging_path_under_hostile_defaults",
        "tests/integration/test_cli_run_changes.py::test_after_a_rebuild_the_rebuilt_app_runs_as_the_rebuild_s_logic",
        "tests/integration/test_bucket_drift_spread.py::test_spread_drift_on_a_million_rows_is_counted_exactly_near_full_modes_time",
        "tests/integration/test_cli_rebuild.py::test_rebuild_plans_applies_only_the_changes_and_switches_the_logic",
        "tests/integration/test_cli_rebuild.py::test_a_rebuild_while_a_main_and_a_standby_run_makes_both_step_aside",
        "tests/integration/test_spark_verify.py::test_spark_verify_and_repair_on_separate_executors",
        "tests/integration/test_delta_spark_interop.py::test_spark_reads_every_version_and_every_epoch_as_the_engine_does",
        "tests/integration/test_delta_spark_interop.py::test_spark_reads_a_store_on_s3_as_the_engine_does",
        "tests/integration/test_realtime_stream.py::test_realtime_mode_into_postgres_exactly_once_with_the_driver_killed_mid_batch",
        "tests/integration/test_realtime_checkpoint.py::test_a_restart_after_an_interrupted_commit_log_write_lands_every_record_once",
        "tests/integration/test_realtime_faults.py::test_a_task_that_fails_after_committing_is_retried_and_lands_each_record_once",
        "tests/integration/test_realtime_faults.py::test_a_postgres_restart_mid_stream_is_ridden_out_exactly_once",
        "tests/integration/test_cli_run_realtime.py::test_a_realtime_run_killed_is_taken_over_by_its_standby_and_each_record_lands_once",
        "tests/integration/test_realtime_executor_kill.py::test_an_executor_killed_mid_batch_is_replaced_and_each_record_lands_once",
        "tests/integration/test_spark_stream.py::test_format_reconcile_commit_process_killed_after_the_decision",
        "tests/unit/test_mutation_baseline.py::test_the_joint_selection_is_pytests_own",
    })),
}  # fmt: skip
HEAVY_GROUP_OF = {nodeid: group for group, (_, names) in HEAVY.items() for nodeid in names}

# Parameter sets (node ids matched by re.match) drawn as a group of their own, a few per
# commit, out of the families they belong to: the delta-spark sink's fault rows start a
# Spark command per commit and a Spark JVM per killed process (a minute or more each on
# two cores), where the other kinds' rows of the same functions take seconds.
HEAVY_ROWS: dict[str, tuple[int, re.Pattern[str]]] = {
    "the delta-spark sink's fault rows": (2, re.compile(
        r"tests/chaos/test_(failure_matrix|kill9)\.py::test_\w+\[([^\]]*-)?delta_spark(-[^\]]*)?\]"
    )),
}  # fmt: skip
