"""An engine error raised on a Spark executor reaches the driver with its own type.

Spark hands the driver an executor's Python exception as text: the task's
traceback inside its own error. The verify job finds the engine's error in it
by the errors module's name, so the error keeps its type (and so its exit
code) however that module is named.
"""

from __future__ import annotations

from reconcile.core import errors
from reconcile.spark.verify import _from_executor


def _spark_error(last_line: str) -> RuntimeError:
    return RuntimeError(
        "Job aborted due to stage failure: Task 0 in stage 3.0 failed 1 times\n"
        "Traceback (most recent call last):\n"
        '  File "reconcile/spark/verify.py", line 1, in pull\n'
        f"{last_line}\n\tat org.apache.spark.api.python.BasePythonRunner"
    )


def test_an_engine_error_is_raised_again_as_itself() -> None:
    raised = _from_executor(
        _spark_error(f"{errors.__name__}.MassChangeError: repair of public.t refused")
    )
    assert type(raised) is errors.MassChangeError
    assert str(raised) == "on an executor: repair of public.t refused"


def test_another_error_stays_sparks() -> None:
    spark = _spark_error("ValueError: not ours")
    assert _from_executor(spark) is spark
    # A name in the errors module that is not an engine error is not rebuilt either.
    other = _spark_error(f"{errors.__name__}.Any: no")
    assert _from_executor(other) is other
