"""The per-size watchdog: fires once past its deadline, never while re-armed in time, and
sleeps instead of polling (a woken Python thread takes the GIL from a timed loop)."""

import threading
import time

from ncclbench.engine.watchdog import SizeWatchdog


def make(timeout_s):
    fired = []
    done = threading.Event()

    def on_expire(what):
        fired.append(what)
        done.set()

    return SizeWatchdog(timeout_s, on_expire), fired, done


def test_fires_once_with_what_was_armed():
    dog, fired, done = make(0.1)
    dog.arm("7|allreduce at 8 B")
    assert done.wait(5)
    time.sleep(0.3)
    assert fired == ["7|allreduce at 8 B"]
    dog._thread.join(1)
    assert not dog._thread.is_alive()


def test_disarm_stops_it():
    dog, fired, done = make(0.2)
    dog.arm("1|x")
    dog.disarm()
    assert not done.wait(0.6)
    assert fired == []
    dog.stop()


def test_rearming_in_time_moves_the_deadline():
    dog, fired, done = make(0.3)
    for k in range(8):
        dog.arm(f"{k}|x")
        time.sleep(0.1)
    assert fired == []
    dog.arm("9|last")
    assert done.wait(5)
    assert fired == ["9|last"]


def test_armed_again_after_the_old_deadline_passed_disarmed():
    # the thread wakes at the old deadline, finds nothing armed and waits idle: arm() must wake it
    dog, fired, done = make(0.2)
    dog.arm("1|first")
    dog.disarm()
    time.sleep(0.5)
    assert fired == []
    dog.arm("2|second")
    assert done.wait(5)
    assert fired == ["2|second"]


def test_does_not_wake_while_armed():
    dog, fired, _ = make(30.0)
    dog.arm("1|x")
    time.sleep(0.1)
    woke = dog.wakeups  # the idle -> armed hand-over: one wake-up
    assert woke <= 1
    end = time.monotonic() + 1.0
    k = 1
    while time.monotonic() < end:  # the runner's pattern: arm, measure, disarm, per size
        k += 1
        dog.arm(f"{k}|x")
        time.sleep(0.01)
        dog.disarm()
    assert dog.wakeups == woke  # a 0.2 s poll would have woken ~5 times here
    assert fired == []
    dog.stop()


def test_stop_ends_the_thread():
    dog, fired, _ = make(30.0)
    dog.arm("1|x")
    dog.stop()
    dog._thread.join(2)
    assert not dog._thread.is_alive()
    assert fired == []


def test_timeout_zero_never_fires_and_the_process_group_waits_a_day():
    """-T 0 is nccl-tests' 'no timeout': the watchdog never arms, and the process group's
    own timeout (otherwise 30 s after -T) becomes one day instead of 30 s."""
    from datetime import timedelta

    from ncclbench.backends.common import process_group_timeout

    dog, fired, done = make(0)
    dog.arm("1|x")
    assert not done.wait(0.5)
    assert fired == [] and dog.wakeups == 0
    dog.stop()
    assert process_group_timeout(0) == timedelta(days=1)
    assert process_group_timeout(10) == timedelta(seconds=40)
