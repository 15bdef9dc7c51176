"""``reconcile.core.interrupts``: real signals sent to this process, and what the one line says."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator

import pytest

from reconcile.core import interrupts
from reconcile.core.interrupts import Guard, Interrupted, Written
from tests.cli_run import REPO


def send(signum: int) -> None:
    """Signal this process and give the handler the moment it needs (it raises in here)."""
    os.kill(os.getpid(), signum)
    time.sleep(5)
    raise AssertionError(f"{signal.Signals(signum).name} raised nothing")


@pytest.fixture
def guard() -> Iterator[Guard]:
    with Guard() as installed:
        yield installed


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_raises_with_its_exit_code_and_where_it_was(
    guard: Guard, signum: int, code: int
) -> None:
    with (
        pytest.raises(Interrupted) as caught,
        interrupts.step("the repair", table="orders"),
    ):
        interrupts.name_table("public.orders")
        with interrupts.step("the pull"):
            send(signum)
    stopped = caught.value
    assert isinstance(stopped, KeyboardInterrupt)  # what psycopg cancels a statement on
    assert (stopped.signum, stopped.exit_code) == (signum, code)
    name = signal.Signals(signum).name
    assert stopped.line("reconcile repair") == (
        f"reconcile repair: interrupted by {name} during the pull of public.orders; "
        "nothing was written"
    )


def test_the_steps_outside_the_table_name_the_round() -> None:
    # One guard per signal: a guard's second signal ends the process.
    with (
        Guard(),
        pytest.raises(Interrupted) as caught,
        interrupts.step("round 2"),
        interrupts.step("the verify", table="public.orders"),
        interrupts.step("the diff"),
    ):
        send(signal.SIGINT)
    assert caught.value.where() == " during the diff of public.orders, in round 2"
    with (
        Guard(),
        pytest.raises(Interrupted) as between,
        interrupts.step("the wait after round 2"),
    ):
        send(signal.SIGTERM)
    assert between.value.where() == " during the wait after round 2"
    with Guard(), pytest.raises(Interrupted) as outside:
        send(signal.SIGTERM)
    assert outside.value.line("reconcile watch") == (
        "reconcile watch: interrupted by SIGTERM; nothing was written"
    )


def test_a_commit_point_is_in_doubt_until_its_reply_is_read() -> None:
    with Guard():
        interrupts.commit_point("the repair of public.orders")
        with pytest.raises(Interrupted) as doubt, interrupts.step("the COMMIT of the repair"):
            send(signal.SIGINT)
    assert doubt.value.written is Written.IN_DOUBT
    assert doubt.value.outcome() == (
        "the COMMIT of the repair of public.orders had been sent, so whether it was written "
        "is unknown: run `reconcile verify` to see"
    )
    with Guard():
        interrupts.commit_point("the repair of public.a").committed()
        aborted = interrupts.commit_point("the repair of public.b")
        aborted.aborted()  # known not to have happened: what came before stands
        with pytest.raises(Interrupted) as after:
            send(signal.SIGTERM)
    assert after.value.outcome() == (
        "the repair of public.a had been committed; nothing else was written"
    )


def test_a_command_that_commits_as_it_goes_says_what_stands() -> None:
    with Guard(), pytest.raises(Interrupted) as caught:
        interrupts.writing("the epochs it committed stay, each once")
        send(signal.SIGINT)
    assert caught.value.line("reconcile demo") == (
        "reconcile demo: interrupted by SIGINT; the epochs it committed stay, each once"
    )


def test_the_previous_handlers_come_back_and_an_ignored_signal_stays_ignored() -> None:
    before_term = signal.getsignal(signal.SIGTERM)
    before_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with Guard():
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not before_term
            os.kill(os.getpid(), signal.SIGINT)  # ignored, as whoever started us asked
            time.sleep(0.05)
            interrupts.check()
        assert signal.getsignal(signal.SIGTERM) == before_term
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before_int)
    assert interrupts.active() is None


def test_a_swallowed_interruption_is_raised_again_by_check() -> None:
    with Guard():
        interrupts.check()  # nothing received: nothing raised
        with contextlib.suppress(KeyboardInterrupt):  # as a library might
            send(signal.SIGTERM)
        with pytest.raises(Interrupted) as again, interrupts.step("the COMMIT"):
            interrupts.check()
    assert again.value.signum == signal.SIGTERM


def test_a_plain_keyboard_interrupt_counts_as_sigint() -> None:
    with Guard():
        interrupts.commit_point("the repair of t")
        made = interrupts.interrupted(KeyboardInterrupt())
    assert (made.signum, made.exit_code, made.written) == (signal.SIGINT, 130, Written.IN_DOUBT)


def test_stopping_sets_the_event_instead_of_raising() -> None:
    stop = threading.Event()
    with Guard(), interrupts.stopping(stop) as guard:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
        interrupts.check()  # a graceful stop is not raised later either
    assert guard.signal_name == "SIGTERM"
    # Outside any command's guard it brings its own, and takes it away after.
    alone = threading.Event()
    with interrupts.stopping(alone):
        os.kill(os.getpid(), signal.SIGINT)
        assert alone.wait(5)
    assert interrupts.active() is None


SECOND = textwrap.dedent(
    """
    import os, signal, time
    from reconcile.core import interrupts

    with interrupts.Guard():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except interrupts.Interrupted:
            print("cleaning up", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)  # the operator does not wait
            time.sleep(5)
    print("survived", flush=True)
    """
)


def test_a_second_signal_ends_the_process_by_that_signal() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SECOND], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout == "cleaning up\n"
