"""A launched rank's life around its plans: the backend brought up (its set-up steps
guarded, so every rank leaves together), the plans run in turn under the signal policy of
each phase, the outcome kept through the teardown, and the process ended with it."""

from __future__ import annotations

import os
import sys

from ncclbench.engine.guard import SetupBoard
from ncclbench.engine.outcome import exit_code_for, severity
from ncclbench.engine.runner import run_plan
from ncclbench.engine.signals import (_held_interrupt, _held_signals, exit_on_termination_signals,
                                      hold_termination_signals, stop_on_termination_signals)
from ncclbench.engine.watchdog import hard_exit
from ncclbench.errors import (BenchError, CollectiveError, ExitCode, Interrupted, error_line, first_line,
                              interruption_message)
from ncclbench.failpoints import failpoint
from ncclbench.launch import stop as rank_stop


def run_rank(plans, launch, make_report, epilogue=None) -> int:
    """Run every plan on this rank with one backend; rank 0 reports each through
    `make_report(plan, run_info)`. `epilogue()` runs once the plans have ended (all done,
    or one stopped), before the teardown, on every rank: a suite prints its summary there.
    Returns the most serious exit code."""
    try:
        try:
            return _run_plans(plans, launch, make_report, epilogue)
        except KeyboardInterrupt as exc:  # before the backend was up: nothing measured yet
            raise Interrupted(interruption_message(exc)) from None
    except BenchError as exc:
        exc.launched_rank = launch.launched  # the CLI then ends the process at once (leave_launched_rank)
        raise


def leave_launched_rank(launch, code: int) -> int:
    """A launched rank's process ends here, with its outcome's code, once the outcome is
    written. Python puts back the default signal handlers while its interpreter shuts down,
    and that shutdown (torch's process groups, the modules) can take a while: a launcher's
    SIGTERM landing then (torchrun's agent sends one to every rank left when another
    failed) killed the rank, and its code (3, 7) read as -15. A run in the caller's own
    process (not launched) returns."""
    if launch.launched:
        hard_exit(int(code))
    return code


def _run_plans(plans, launch, make_report, epilogue) -> int:
    from ncclbench.backends import create_backend

    stop_on_termination_signals()
    timeout_s = 0 if any(p.timeout_s <= 0 for p in plans) else max(p.timeout_s for p in plans)

    def guard(store):
        board = SetupBoard(store, launch.rank, launch.world_size, timeout_s,
                           held=_held_interrupt, hold=hold_termination_signals)

        def run(step, what, fn):
            value = board.run(step, what, fn)
            stop_on_termination_signals()  # the step succeeded everywhere: interruptible again
            return value
        return run

    try:
        backend = create_backend(plans[0].backend, launch, timeout_s, plans[0].stream_null, guard=guard)
    except (BenchError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - rendezvous timeouts, busy ports, unknown hosts: one line
        where = f" at {os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', '?')}" if "MASTER_ADDR" in os.environ else ""
        raise CollectiveError(f"rank {launch.rank} could not join the other {launch.world_size - 1} rank(s){where}: "
                              f"{type(exc).__name__}: {first_line(exc)}") from exc
    rank_stop.on_abort(getattr(backend, "abort", None))
    try:
        backend.use_groups(plans[0].groups(backend.nranks))
    except Exception:
        backend.close()
        raise
    codes = []
    outcome = ExitCode.NCCL_ERROR  # what a signal during the teardown exits with if a plan raised
    try:
        for plan in plans:
            stop_on_termination_signals()  # a plan's set-up can wait on its peers: interruptible
            try:
                summary = run_plan(plan, backend, make_report)
            except KeyboardInterrupt as exc:  # before this plan's report began: none of it measured
                if backend.rank == 0:
                    print(error_line(interruption_message(exc)), file=sys.stderr, flush=True)
                codes.append(ExitCode.INTERRUPTED)
                break
            codes.append(exit_code_for(summary))
            if summary.status in ("interrupted", "error", "timeout"):
                break
            if _held_signals:  # terminated while this plan's outcome was being written: stop here
                codes.append(ExitCode.INTERRUPTED)
                break
        hold_termination_signals()
        outcome = max(codes, key=severity) if codes else ExitCode.OK
        if epilogue is not None:
            epilogue()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            outcome = ExitCode.INTERRUPTED
        elif isinstance(exc, BenchError):
            outcome = exc.exit_code
        raise
    finally:
        # The outcome is written: a signal held meanwhile, or one during the teardown, ends
        # the rank at once with it (never with an earlier plan's code).
        exit_on_termination_signals(outcome)
        backend.close()
        failpoint("engine.after_outcome", rank=launch.rank)
    return outcome
