"""A launched rank's stop signals, phase by phase: raised as an orderly stop while the
sweep runs (rows kept, summary written), noted while an outcome is being decided or
written, and, once it is written, an exit with that outcome's code. Each handler also tells
the rank's stop thread (ncclbench.launch.stop) that the main thread took the signal: one
it has not taken is a main thread stuck in C code, which that thread then unsticks."""

from __future__ import annotations

import os
import sys

from ncclbench.errors import STOP_SIGNALS, PeerLost, Terminated
from ncclbench.launch import stop as rank_stop

_held_signals: list[int] = []


def hold_termination_signals() -> None:
    """While a report begins, and from the end of the sweep until the run's outcome is
    written: SIGTERM/SIGHUP/SIGINT are noted, not raised. torchrun's agent terminates the
    surviving ranks when one dies; a rank finishing its trailer then keeps its own verdict
    (3 for the lost peer, say) instead of turning into an interrupt (130) that came after
    the fact."""
    _on_termination_signals(lambda signum, _frame: _held_signals.append(signum))


def exit_on_termination_signals(code: int) -> None:
    """After the outcome is written: a signal held meanwhile, or one that comes during the
    teardown, ends the rank at once with the run's own exit code."""
    def leave(_signum=None, _frame=None):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe: nothing more to say
                pass
        os._exit(int(code))

    rank_stop.outcome_code(code)
    _on_termination_signals(leave)
    if _held_signals:
        leave()


def stop_on_termination_signals() -> None:
    """SIGTERM, SIGHUP and SIGINT (Ctrl-C) end the sweep, and rank 0 writes the summary and
    its files, instead of killing the rank mid-table. torchrun's agent forwards SIGTERM to
    the ranks when it is itself terminated; srun/scancel and `timeout` send it directly."""

    def stop(signum, _frame):
        # Raised once; repeats are noted: a second interrupt raised while the first unwinds
        # would escape the summary. Repeats are the rule, not a fluke
        # (docs/design/stop-signal-repeats.md).
        # A -T verdict being written on the watchdog's thread (its code decided) ends the
        # process itself: a launcher's SIGTERM then (torchrun's agent, once another rank
        # left with that verdict) is noted, not raised, so the rank still ends 4, not 130.
        hold_termination_signals()
        if rank_stop.decided() is not None:
            _held_signals.append(signum)
            return
        raise _interrupt_for(signum)

    _on_termination_signals(stop)


def _held_interrupt() -> KeyboardInterrupt | None:
    """The interrupt a stop signal noted meanwhile stands for, if one was."""
    return _interrupt_for(_held_signals[0]) if _held_signals else None


def _interrupt_for(signum: int) -> BaseException:
    """What a stop signal raises: the interrupt it stands for, or, when this rank is stopping
    because a peer died (the signal is then the launcher's teardown), that loss."""
    import signal

    death = rank_stop.death()
    if death is not None:
        return PeerLost(death.stopped(rank_stop.rank(), rank_stop.doing_now()))
    return KeyboardInterrupt() if signum == signal.SIGINT else Terminated(signal.Signals(signum).name)


def _on_termination_signals(handler) -> None:
    """`handler` for SIGTERM and SIGHUP (what scancel, `timeout`, CI cancels and torchrun's
    agent send) and SIGINT (Ctrl-C); the three phases of a rank above each install their own."""
    import signal

    def taken(signum, frame):
        rank_stop.took_signal()
        return handler(signum, frame)

    for sig in STOP_SIGNALS:
        signal.signal(sig, taken)
