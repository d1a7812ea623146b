"""One plan on one rank: set up (guarded, so that every rank leaves together), open the
report, sweep the sizes, and decide and write the outcome."""

from __future__ import annotations

import itertools

from ncclbench.engine import pathread, peers
from ncclbench.engine.buffers import Buffers
from ncclbench.engine.guard import attempt, read_cause, verdict
from ncclbench.engine.hang import Census
from ncclbench.engine.hooks import RankHooks
from ncclbench.engine.outcome import judge
from ncclbench.engine.position import HERE
from ncclbench.engine.rankrunner import RankRunner
from ncclbench.engine.runfacts import build_run_info, environ_note, nccl_environ
from ncclbench.engine.signals import _interrupt_for
from ncclbench.engine.watchdog import SizeWatchdog
from ncclbench.errors import CollectiveError, first_line, interruption_message
from ncclbench.failpoints import failpoint
from ncclbench.launch import stop as rank_stop
from ncclbench.results.records import ResultRow, RunSummary


_RUN_NUMBERS = itertools.count()  # run_plan calls in this process, for per-run store keys


def _sweep(plan, backend, runner, buffers, board, watchdog, report, rows: list, doing: list, marker=None) -> None:
    """Every (dtype, op, root) and size of the plan, `run_cycles` times (0: until stopped);
    rank 0 adds each row to `rows` and to its report as it comes. `doing[0]`: what runs now.
    `marker`: a GPU event recorded before each step's first op (None on the CPU), which a
    hang's census queries to tell whether this rank's GPU reached the step (engine.hang)."""
    step = 0
    sizes = plan.sizes()
    cycle = 0
    while plan.run_cycles == 0 or cycle < plan.run_cycles:
        cycle += 1
        for dtype, op, root in runner.combinations():
            step += 1
            doing[0] = f"{plan.coll.name} warm-up ({dtype.name}, {op}, root {root})"
            board.reach(step, doing[0])
            rank_stop.doing(doing[0])
            watchdog.arm(f"{step}|{doing[0]}")
            _reached(backend, marker, "warm-up")
            runner.warm_up(buffers, dtype, op, root, sizes)
            for size in sizes:
                step += 1
                doing[0] = f"{plan.coll.name} at {size} B ({dtype.name}, {op}, root {root})"
                rank_stop.doing(doing[0])
                watchdog.arm(f"{step}|{doing[0]}")
                HERE.at("before its collectives", placement="")
                failpoint("engine.before_size", rank=backend.rank, size=size)
                board.reach(step, doing[0])  # "arrived": about to enter this size's collectives
                _reached(backend, marker, None)
                layout, mine = runner.measure_size(buffers, dtype, op, root, size)
                HERE.at("exchanging the size's timings", placement="")
                everyone = backend.all_gather_object(mine)
                watchdog.disarm()
                if report is not None:
                    row = runner.to_row(everyone, layout, dtype, op, root)
                    rows.append(row)
                    report.add_row(row)


def _reached(backend, marker, phase: str | None) -> None:
    """Mark the point this step's ops start from: the position, and on a GPU an event on
    the collectives' stream (outside any timed region)."""
    if phase is not None:
        HERE.at(phase, placement="")
    if marker is not None:
        backend.mark(marker)


def run_plan(plan, backend, make_report, *, hooks: RankHooks | None = None) -> RunSummary:
    """One plan on this rank's backend; rank 0 reports through `make_report(plan, run_info)`.
    `hooks`: how the run meets the process around it (default: the command line's)."""
    hooks = hooks or RankHooks()
    run_number = next(_RUN_NUMBERS)  # the same on every rank: each runs the same plans in order
    report = None
    rows: list[ResultRow] = []
    status, errors, said = "ok", [], False
    doing = [None]  # what the sweep runs now, for the line a failure ends with
    runner = RankRunner(plan, backend)
    runner.agree_on_plan()
    board = hooks.board(backend)

    def finish_early(message: str, status: str = "timeout") -> None:
        report.finish(RunSummary(list(rows), complete=False, status=status, errors=[message]))

    marker = [backend.markers(1)[0]]  # the GPU event each step's first op follows (engine.hang)

    def on_timeout(what: str) -> None:
        step, label = what.split("|", 1)
        census = Census(board, int(step), label, hooks.census_prefix(run_number), marker[0], HERE.text(), peers.known(),
                        ras=plan.backend in ("nccl", "cupy"))
        hooks.timed_out(label, census, plan.timeout_s, backend.rank, finish_early if report is not None else None,
                        cause=lambda: read_cause(getattr(board, "store", None), key=hooks.cause_key(run_number)))

    HERE.clear()
    watchdog = SizeWatchdog(plan.timeout_s, on_timeout)
    try:
        devices, notes, buffers = set_up(plan, backend, runner, board, watchdog, hooks)
        path = _read_path(plan, backend, runner, buffers, watchdog, marker[0]) if hooks.read_path else None
    except BaseException:
        watchdog.stop()
        raise
    peers.watch(devices, backend.rank)
    memory = backend.memory_usage() if plan.memory_report else None
    # From the report's first line to the sweep's start a signal is noted, not raised: the
    # sweep then stops before it begins and the report still gets its trailer.
    hooks.hold_signals()
    if backend.rank == 0:
        report = _open_report(plan, backend, devices, notes, path, make_report)
    hooks.open_outcome(finish_early if report is not None else None)
    failpoint("engine.after_report", rank=backend.rank)

    try:
        try:
            hooks.stop_on_signals()
            if hooks.held_signals():  # noted while the report began
                raise _interrupt_for(hooks.held_signals()[0])
            _sweep(plan, backend, runner, buffers, board, watchdog, report, rows, doing, marker[0])
        finally:
            # The outcome is decided: from here a signal is noted, not raised, until it is
            # written. Installed before any exception is looked at, so that a signal landing
            # while a lost peer's error is handled cannot escape that handler.
            hooks.hold_signals()
            hooks.take_outcome()
    except KeyboardInterrupt as exc:
        status = "interrupted"
        errors = [interruption_message(exc)]
    except Exception as exc:  # noqa: BLE001 - any collective failure ends in one line, rows kept
        status = "error"
        watchdog.disarm()  # what ran is over; the wait for a peer's cause below is not a size's time
        message, speak = hooks.sweep_failed(board, backend.rank, backend.nranks, doing[0], exc,
                                            hooks.cause_key(run_number))
        errors, said = [message], not speak
        if report is None:
            if speak:
                hooks.say(message)
            raise hooks.sweep_error(message) from exc
    finally:
        failpoint("engine.after_sweep", rank=backend.rank)
        watchdog.stop()
        backend.release_graphs()
        backend.deregister_buffers()
        del buffers
    summary = RunSummary(rows, complete=(status == "ok"), status=status, errors=errors)
    if plan.memory_report:
        summary.memory = dict(memory or {}, **(backend.memory_usage(peak=True) or {}))
    if report is not None:
        judge(summary, plan, report, hooks, said)
    return summary


def _open_report(plan, backend, devices, notes, path, make_report):
    """Rank 0's report, its header written: the run info with the notes and NCCL's path."""
    info = build_run_info(plan, backend, devices)
    info.notes += notes
    info.nccl_path = path.to_dict() if path is not None else None
    info.path_lines = pathread.header_lines(path, plan.backend)
    return make_report(plan, info)


def _read_path(plan, backend, runner, buffers, watchdog, marker=None):
    """The path NCCL took (rank 0; None elsewhere and on gloo), read after one op that
    connects the ranks, under the -T deadline like any collective; `marker` is recorded
    before it, so that a hang there names a GPU that never reached it (engine.hang)."""
    if plan.backend == "gloo":
        return None
    watchdog.arm("0|connecting the ranks (one op, so that NCCL's log names its path)")
    failpoint("engine.before_connect", rank=backend.rank)
    _reached(backend, marker, "connecting the ranks (one untimed op)")
    try:
        return pathread.read_for_run(plan, backend, runner, buffers)
    finally:
        watchdog.disarm()


def set_up(plan, backend, runner, board, watchdog, hooks: RankHooks | None = None):
    """(every rank's DeviceRecord, header notes, this rank's Buffers). The steps that can
    fail on some ranks only (the memory check, the allocation) run guarded on every rank
    and their outcomes are exchanged, so that all ranks leave together (RankFailures, the
    reasons said once by rank 0) instead of the failing rank alone."""
    hooks = hooks or RankHooks()
    board.reach(-1, "joining the run")
    watchdog.arm("0|setting up the run (memory check, buffers)")

    def local():
        runner.validate()
        record = runner.device_record()
        note = backend.prepare_registration(plan.local_register)
        return record, note, Buffers(backend, *plan.buffer_bytes(runner.nranks), plan.unalign)

    mine, failure = attempt(local, backend.rank, "setting up the run")
    record, note, buffers = mine or (None, None, None)
    board.reach(0, "setting up the run (memory check, buffers)")
    hooks.hold_signals()  # from here the outcome is decided: a launcher's SIGTERM must not replace it
    try:
        everyone = backend.all_gather_object((record, failure, nccl_environ()))
    except Exception as exc:  # noqa: BLE001 - a peer lost while the ranks compare their set-up
        raise CollectiveError(f"a rank was lost while the ranks set up the run: {type(exc).__name__}: "
                              f"{first_line(exc)}") from None
    watchdog.disarm()
    failed = verdict([f for _, f, _ in everyone if f is not None], backend.nranks)
    if failed is not None:
        if backend.rank == 0:
            for line in failed.lines:
                hooks.say(line)
        raise failed
    hooks.stop_on_signals()
    if hooks.held_signals():
        raise _interrupt_for(hooks.held_signals()[0])
    notes = [n for n in [runner.group_note, note, environ_note([env for _, _, env in everyone])] if n]
    notes += [n for n in [backend.register_buffers()] if n]
    return [r for r, _, _ in everyone], notes, buffers
