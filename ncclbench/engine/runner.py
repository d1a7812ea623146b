"""One rank's benchmark: agree on the plan, sweep sizes, check, hand rows to rank 0's report."""

from __future__ import annotations

import datetime as _dt
import itertools
import os
import socket
import sys

from ncclbench import __version__
from ncclbench.dtypes import DTYPES, DType, to_dtype
from ncclbench.engine import onerank
from ncclbench.engine.checkdata import InputPattern, bit_view, count_mismatches, poison
from ncclbench.engine.collectives import CheckContext, Collective
from ncclbench.errors import (BenchError, CollectiveError, ExitCode, Interrupted, PlanError, error_line, first_line,
                              interruption_message)
from ncclbench.engine.guard import SetupBoard, attempt, ranks_text, read_cause, verdict
from ncclbench.results.records import DeviceRecord, PlacementResult, ResultRow, RunInfo, RunSummary
from ncclbench.engine.watchdog import SizeWatchdog, hard_exit
from ncclbench.engine.timing import TimingMode, combine, measure, per_iter_summary
from ncclbench.engine.signals import (_held_interrupt, _held_signals, _interrupt_for,  # noqa: F401 - tests and tune use them here
                                      exit_on_termination_signals, hold_termination_signals, stop_on_termination_signals)
from ncclbench.engine.hooks import RankHooks  # noqa: F401 - the API subclasses it from here
from ncclbench.engine import peers
from ncclbench.failpoints import failpoint
from ncclbench.launch import stop as rank_stop

# Elements per expected-value chunk: computing a chunk's expected values took 65-92 bytes of
# int64 temporaries per element on the CPU (about 400 MiB here), well inside the 2 GiB that validate()
# leaves free beside the buffers.
CHECK_CHUNK = 1 << 22


def now() -> str:
    return _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")


def memory_text(nbytes: int) -> str:
    if nbytes >= 2**30:
        return f"{nbytes / 2**30:.1f} GiB"
    return f"{nbytes / 2**20:.1f} MiB" if nbytes >= 2**20 else f"{nbytes} B"


class Buffers:
    """Send and receive memory allocated once for the largest size, typed per dtype."""

    def __init__(self, backend, send_bytes: int, recv_bytes: int, unalign: int = 0):
        try:
            failpoint("engine.alloc", rank=backend.rank, nbytes=send_bytes + recv_bytes)
            self.send_raw = backend.alloc_bytes(send_bytes)
            self.recv_raw = backend.alloc_bytes(recv_bytes)
        except (RuntimeError, MemoryError) as exc:  # torch's CPU and CUDA out-of-memory errors
            lower = "lower -e or -u" if unalign else "lower -e"
            raise PlanError(f"cannot allocate the buffers ({memory_text(send_bytes + recv_bytes)}): "
                            f"{first_line(exc, 200)}; {lower}") from None
        self.unalign = unalign

    def typed(self, dtype: DType):
        def view(raw):
            n = raw.numel() // dtype.itemsize
            return raw[: n * dtype.itemsize].view(dtype.torch_dtype())[self.unalign:]

        return view(self.send_raw), view(self.recv_raw)


class Slots:
    """Per-op (send, recv) views for one size and placement. Successive ops use successive
    slices of the big buffers, as nccl-tests shifts each op, so repeated small ops do not
    hit the same cache lines."""

    def __init__(self, layout, send_t, recv_t, in_place: bool, use_recv_as_send: bool, rank: int, nslots: int):
        self.views = []
        span = max(layout.send_count, layout.recv_count, 1)
        if in_place:
            fit = recv_t.numel() // span
        else:
            fit = min(send_t.numel() // max(layout.send_count, 1), recv_t.numel() // max(layout.recv_count, 1))
        for slot in range(max(1, min(fit, nslots))):
            if in_place:
                base = slot * span
                r0 = base + layout.recv_inplace_offset * rank
                s0 = base + layout.send_inplace_offset * rank
                recv = recv_t[r0: r0 + layout.recv_count]
                send = recv_t[s0: s0 + layout.send_count]
            else:
                recv = recv_t[slot * layout.recv_count: (slot + 1) * layout.recv_count]
                send = send_t[slot * layout.send_count: (slot + 1) * layout.send_count]
                if use_recv_as_send:
                    send = recv
            self.views.append((send, recv))

    def __getitem__(self, op_index: int):
        return self.views[op_index % len(self.views)]

    def bind(self, backend, coll, op, root, layout):
        """One ready-to-call op per slot (backend.bind), for the eager timed loop."""
        return [backend.bind(coll, send, recv, op, root, layout) for send, recv in self.views]


def fill_input(view, pattern: InputPattern, rank: int, dtype: DType, device):
    import torch

    bits = bit_view(view, dtype)
    for a in range(0, view.numel(), CHECK_CHUNK):
        b = min(a + CHECK_CHUNK, view.numel())
        idx = torch.arange(a, b, device=device, dtype=torch.int64)
        bits[a:b].copy_(bit_view(to_dtype(pattern.values(rank, idx), dtype), dtype))


def count_wrong(view, coll: Collective, ctx: CheckContext, dtype: DType, op: str | None, device) -> int:
    import torch

    wrong = 0
    for a in range(0, view.numel(), CHECK_CHUNK):
        b = min(a + CHECK_CHUNK, view.numel())
        idx = torch.arange(a, b, device=device, dtype=torch.int64)
        wrong += count_mismatches(view[a:b], coll.expected(ctx, idx), dtype, op)
    return wrong


class RankRunner:
    def __init__(self, plan, backend):
        self.plan = plan
        self.backend = backend
        self.coll = plan.coll
        self.rank = backend.group_rank
        self.nranks = backend.group_size
        self.seed_counter = 0
        self.op_group, self.group_note = self._group_ops()

    def _group_ops(self):
        """(factory of one NCCL group around each iteration's ops, or None; a header note or
        None). With -m > 1 ops are grouped where the backend can, as nccl-tests does; the
        note says when they are not."""
        if self.plan.agg_iters < 2:
            return None, None
        if self.plan.blocking in (1, 2):
            return None, (f"-z {self.plan.blocking} -m {self.plan.agg_iters}: each op is waited for on its own, "
                          "not grouped (nccl-tests groups them, and its wait inside the open group finds nothing "
                          "launched yet)")
        group, reason = self.backend.op_group(self.coll.name)
        if group is None:
            return None, f"-m {self.plan.agg_iters}: ops issued one by one, not in one NCCL group per iteration ({reason})"
        return group, None

    # ---- before the sweep ---------------------------------------------------------------
    def agree_on_plan(self):
        """Stop with the names of the ranks that differ, instead of hanging in a mismatched collective."""
        import torch

        mine = dict(self.plan.fingerprint(), torch=torch.__version__,
                    library=self.backend.library_version()[0])
        mine = failpoint("engine.plan_fingerprint", mine, rank=self.backend.rank)
        everyone = self.backend.all_gather_object(mine)
        reference = everyone[0]
        differ = [r for r, fp in enumerate(everyone) if fp != reference]
        if differ:
            keys = sorted({k for r in differ for k in everyone[r] if everyone[r].get(k) != reference.get(k)})
            raise PlanError(f"rank(s) {','.join(map(str, differ))} run a different plan than rank 0 "
                            f"(differs in: {', '.join(keys)}); every rank must get the same options")

    def validate(self):
        p = self.plan
        p.check_runnable(self.nranks)  # with the group size the backend actually formed
        send, recv = p.buffer_bytes(self.nranks)
        free = failpoint("engine.free_memory", self.backend.free_memory(), rank=self.backend.rank)
        if free is not None and send + recv + (2 << 30) > free:
            fit = p.largest_fitting_size(self.nranks, free - (2 << 30))
            hint = f"largest size that fits: -e {fit}" if fit else "not even the smallest size fits"
            raise PlanError(f"buffers need {memory_text(send + recv)} but the GPU has "
                            f"{memory_text(free)} free ({hint})")

    def device_record(self) -> DeviceRecord:
        info = self.backend.device_info()
        return DeviceRecord(rank=self.backend.rank, group=self.backend.group_index, pid=os.getpid(),
                            hostname=socket.gethostname(),
                            device=info["device"], device_hex=info["device_hex"], device_info=info["device_info"])

    # ---- the sweep ----------------------------------------------------------------------------
    def combinations(self):
        for dname, op in self.plan.dtype_ops():
            for root in self.plan.root_list(self.nranks):
                yield DTYPES[dname], op, root

    def warm_up(self, buffers, dtype, op, root, sizes):
        send_t, recv_t = buffers.typed(dtype)
        for size in sizes:
            layout = self.plan.layout(size, dtype.itemsize, self.nranks)
            slots = self._slots(layout, send_t, recv_t, False, 1)
            for _ in range(self.plan.warmup_iters):
                send, recv = slots[0]
                self.coll.call(self.backend, send, recv, op, root, layout)
        self.backend.synchronize()

    def _slots(self, layout, send_t, recv_t, in_place, nslots):
        out_of_place_missing = self.plan.backend in self.coll.in_place_only
        return Slots(layout, send_t, recv_t, in_place, out_of_place_missing and not in_place, self.rank, nslots)

    def measure_size(self, buffers, dtype, op, root, size):
        """This rank's (timing, wrong) for both placements of one size."""
        send_t, recv_t = buffers.typed(dtype)
        layout = self.plan.layout(size, dtype.itemsize, self.nranks)
        settings = self.plan.timing_settings()
        out = []
        for in_place in (False, True):
            slots = self._slots(layout, send_t, recv_t, in_place, settings.iters * settings.agg)

            if settings.mode is TimingMode.GRAPH:
                # capture must see the current (capture) stream: no pre-bound calls
                def run_op(k, slots=slots):
                    send, recv = slots[k]
                    self.coll.call(self.backend, send, recv, op, root, layout)
            else:
                calls = slots.bind(self.backend, self.coll, op, root, layout)
                ncalls = len(calls)

                def run_op(k, calls=calls, ncalls=ncalls):
                    calls[k % ncalls]()

            timing = measure(self.backend, run_op, settings, self.op_group)
            wrong = None
            checkable = self.plan.check and (self.coll.in_place_checked or not in_place)
            if checkable:  # -c N: N checks, each with fresh inputs; their wrong counts add up
                issue = self._check_issue(run_op, slots, layout, settings, size)
                wrong = sum(self.check(slots, layout, dtype, op, root, size, issue) for _ in range(self.plan.check))
            out.append((timing.device_s, timing.host_s, timing.per_iter_s, wrong))
        return layout, out

    def _check_issue(self, run_op, slots, layout, settings, size):
        """The check's one op, issued the way the timed loop issued its ops: the timed
        loop's own bound callable for slot 0 (eager, -z), or, under -G, a CUDA graph
        captured from the same call and replayed, as nccl-tests does (common.cu: the
        check's op is captured and the graph launched). The graph is captured before the
        inputs are filled: capturing also runs the op once outside the graph."""
        if settings.mode is not TimingMode.GRAPH:
            return lambda: run_op(0)

        def one_op():
            run_op(0)
            # a failpoint here can plant a wrong element written by the graph itself
            failpoint("engine.check_in_graph", rank=self.backend.rank, size=size,
                      view=slots[0][1][:layout.recv_span(self.rank)])

        return self.backend.capture(one_op)

    def check(self, slots, layout, dtype, op, root, size, issue) -> int:
        """Fresh inputs, one op through `issue()`, count wrong elements in this rank's
        output (untimed)."""
        self.seed_counter += 1
        pattern = InputPattern(dtype, op if self.coll.has_op else None, self.nranks, seed=self.seed_counter)
        send, recv = slots[0]
        device = self.backend.device
        poison(recv, dtype)  # an element nothing wrote cannot pass
        if self.coll.input_on(self.rank, root):
            fill_input(send, pattern, self.rank, dtype, device)
        else:  # not an input (broadcast, scatter off the root): in place, the output starts as poison
            poison(send, dtype)
        self.backend.synchronize()
        issue()
        self.backend.synchronize()
        if not self.coll.checked_on(self.rank, root):
            return 0
        recv = recv[:layout.recv_span(self.rank)]
        failpoint("engine.check_output", rank=self.backend.rank, size=size, view=recv)
        ctx = CheckContext(pattern, self.rank, self.nranks, root, layout.param_count, layout.counts)
        return count_wrong(recv, self.coll, ctx, dtype, pattern.op, device)

    def to_row(self, per_rank, layout, dtype, op, root) -> ResultRow:
        """Rank 0: combine every rank's numbers for one size into a printed row."""
        plan = self.plan
        cells = []
        for placement in range(2):
            device_s = [r[placement][0] for r in per_rank]
            host_s = [r[placement][1] for r in per_rank]
            wrongs = [r[placement][3] for r in per_rank]
            # Bandwidth always from the timed duration of the ops; -C swaps only the time
            # column, as nccl-tests does (getBw gets deltaSec, the column cputimeSec).
            seconds = combine(device_s, plan.averaging)
            shown = combine(host_s, plan.averaging) if plan.report_cputime else seconds
            algbw, busbw = self.coll.bandwidths(layout, dtype.itemsize, self.nranks, seconds)
            nwrong = None if any(w is None for w in wrongs) else sum(wrongs)
            per_iter = None
            if plan.per_iter:
                per_iter = per_iter_summary([r[placement][2] for r in per_rank], plan.per_iter_skip)
            cells.append(PlacementResult(shown * 1e6, algbw, busbw, nwrong,
                                         host_us=sum(host_s) / len(host_s) * 1e6, per_iter=per_iter,
                                         device_us=seconds * 1e6,
                                         rank_us=tuple(t * 1e6 for t in device_s)))  # kept for preflight
        cells = onerank.honest_cells(cells, self.coll, self.plan.backend, self.nranks)
        notes = ()
        if plan.traffic_summary and layout.counts is not None:
            notes = traffic_summary_lines(plan, layout, dtype.itemsize, self.nranks, cells[0].device_us)
        return ResultRow(self.coll.name, layout.printed_bytes(dtype.itemsize), layout.param_count,
                         dtype.name, self.coll.printed_op if self.coll.printed_op is not None else op,
                         root, cells[0], cells[1],
                         timestamp=now(), notes=notes)


def traffic_summary_lines(plan, layout, itemsize: int, nranks: int, time_us: float) -> tuple[str, ...]:
    """alltoallv per-rank bytes and bandwidth at the out-of-place time (nccl-tests'
    NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY lines)."""
    t = plan.traffic
    if t.generated:
        head = (f"# NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY: mode=generated nranks={nranks} "
                f"total_bytes={layout.param_count * nranks * itemsize} spread={t.spread:.3f} time_usec={time_us:.2f}")
    else:
        head = (f"# NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY: mode=matrix nranks={nranks} matrix_dim={len(t.matrix)} "
                f"scale={t.scale:.3f} time_usec={time_us:.2f}")
    lines = [head]
    factor = plan.coll.bus_factor(nranks)
    for rank in range(nranks):
        sent, got = sum(layout.sends(rank)) * itemsize, sum(layout.receives(rank)) * itemsize
        alg = max(sent, got) / 1e3 / time_us if time_us > 0 else 0.0
        lines.append(f"#   rank={rank} send_bytes={sent} recv_bytes={got} alg_bw={alg:.2f} bus_bw={alg * factor:.2f}")
    return tuple(lines)


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
                    print(error_line(None, interruption_message(exc)), file=sys.stderr, flush=True)
                codes.append(ExitCode.INTERRUPTED)
                break
            codes.append(exit_code_for(summary))
            if summary.status in ("interrupted", "error", "timeout"):
                break
            if _held_signals:  # terminated while this plan's outcome was being written: stop here
                codes.append(ExitCode.INTERRUPTED)
                break
        hold_termination_signals()
        outcome = max(codes, key=_severity) if codes else ExitCode.OK
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


_RUN_NUMBERS = itertools.count()  # run_plan calls in this process, for per-run store keys


def _severity(code: int) -> int:
    # a lost peer or timeout outranks wrong numbers, which outrank success
    order = [ExitCode.OK, ExitCode.OUTPUT_ERROR, ExitCode.WRONG_RESULTS, ExitCode.INTERRUPTED, ExitCode.TIMEOUT,
             ExitCode.NCCL_ERROR]
    return order.index(code) if code in order else len(order)


def _sweep(plan, backend, runner, buffers, board, watchdog, report, rows: list, doing: list) -> None:
    """Every (dtype, op, root) and size of the plan, `run_cycles` times (0: until stopped);
    rank 0 adds each row to `rows` and to its report as it comes. `doing[0]`: what runs now."""
    step = 0
    sizes = plan.sizes()
    cycle = 0
    while plan.run_cycles == 0 or cycle < plan.run_cycles:
        cycle += 1
        for dtype, op, root in runner.combinations():
            step += 1
            board.reach(step)
            doing[0] = f"{plan.coll.name} warm-up ({dtype.name}, {op}, root {root})"
            rank_stop.doing(doing[0])
            watchdog.arm(f"{step}|{doing[0]}")
            runner.warm_up(buffers, dtype, op, root, sizes)
            for size in sizes:
                step += 1
                doing[0] = f"{plan.coll.name} at {size} B ({dtype.name}, {op}, root {root})"
                rank_stop.doing(doing[0])
                watchdog.arm(f"{step}|{doing[0]}")
                failpoint("engine.before_size", rank=backend.rank, size=size)
                board.reach(step)  # "arrived": about to enter this size's collectives
                layout, mine = runner.measure_size(buffers, dtype, op, root, size)
                everyone = backend.all_gather_object(mine)
                watchdog.disarm()
                if report is not None:
                    row = runner.to_row(everyone, layout, dtype, op, root)
                    rows.append(row)
                    report.add_row(row)


def _judge(summary: RunSummary, plan, report, hooks: RankHooks, said: bool = False) -> None:
    """Rank 0's verdict on a finished sweep, its trailer, and the reason on stderr.

    Only rank 0 holds the rows, so only rank 0 judges them; the other ranks exit 0 and
    rank 0's code is the run's (an early non-zero exit elsewhere would make the launcher
    kill rank 0 while it is still writing)."""
    if summary.complete and summary.wrong:
        summary.status = "wrong_results"
    elif summary.complete and summary.bandwidth_ok(plan.min_bw, plan.min_peak_bw) is False:
        summary.status = "bandwidth_low"
    report.finish(summary)
    for err in [] if said else summary.errors:  # said: by the rank that failed first
        hooks.say(err)
    verdict = failed_verdict(summary, plan)
    if verdict:  # exit 7 says why on stderr too, for logs that keep only stderr (CI)
        hooks.say(verdict)


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

    def on_timeout(what: str) -> None:
        step, label = what.split("|", 1)
        hooks.timed_out(label, lambda: board.behind(int(step)), plan.timeout_s, backend.rank,
                        finish_early if report is not None else None,
                        cause=lambda: read_cause(getattr(board, "store", None), key=hooks.cause_key(run_number)))

    watchdog = SizeWatchdog(plan.timeout_s, on_timeout)
    try:
        devices, notes, buffers = set_up(plan, backend, runner, board, watchdog, hooks)
    except BaseException:
        watchdog.stop()
        raise
    peers.watch(devices, backend.rank)
    memory = backend.memory_usage() if plan.memory_report else None
    # From the report's first line to the sweep's start a signal is noted, not raised: the
    # sweep then stops before it begins and the report still gets its trailer.
    hooks.hold_signals()
    if backend.rank == 0:
        info = build_run_info(plan, backend, devices)
        info.notes += notes
        report = make_report(plan, info)
    hooks.open_outcome(finish_early if report is not None else None)
    failpoint("engine.after_report", rank=backend.rank)

    try:
        try:
            hooks.stop_on_signals()
            if hooks.held_signals():  # noted while the report began
                raise _interrupt_for(hooks.held_signals()[0])
            _sweep(plan, backend, runner, buffers, board, watchdog, report, rows, doing)
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
        _judge(summary, plan, report, hooks, said)
    return summary


def set_up(plan, backend, runner, board, watchdog, hooks: RankHooks | None = None):
    """(every rank's DeviceRecord, header notes, this rank's Buffers). The steps that can
    fail on some ranks only (the memory check, the allocation) run guarded on every rank
    and their outcomes are exchanged, so that all ranks leave together (RankFailures, the
    reasons said once by rank 0) instead of the failing rank alone."""
    hooks = hooks or RankHooks()
    board.reach(-1)
    watchdog.arm("0|setting up the run (memory check, buffers)")

    def local():
        runner.validate()
        record = runner.device_record()
        note = backend.prepare_registration(plan.local_register)
        return record, note, Buffers(backend, *plan.buffer_bytes(runner.nranks), plan.unalign)

    mine, failure = attempt(local, backend.rank, "setting up the run")
    record, note, buffers = mine or (None, None, None)
    board.reach(0)
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


def nccl_environ() -> tuple[str, ...]:
    """This rank's NCCL settings (nccl-tests' NCCL_TESTS_* are not NCCL's)."""
    return tuple(sorted(f"{k}={v}" for k, v in os.environ.items()
                        if k.startswith("NCCL_") and not k.startswith("NCCL_TESTS_")))


def environ_note(envs: list[tuple[str, ...]]) -> str | None:
    """A header note naming the ranks whose NCCL settings differ from rank 0's (the header's
    `# NCCL environment` line and the JSON's env are rank 0's)."""
    others: dict[tuple[str, ...], list[int]] = {}
    for rank, env in enumerate(envs):
        if env != envs[0]:
            others.setdefault(env, []).append(rank)
    if not others:
        return None
    return "NCCL environment differs by rank: " + "; ".join(
        f"{ranks_text(ranks)}: {' '.join(env) or 'no NCCL_* set'}" for env, ranks in others.items())


def failed_verdict(summary: RunSummary, plan) -> str | None:
    """One line for a run that measured everything but failed its checks (exit 7)."""
    if summary.status == "wrong_results":
        sizes = ", ".join(map(str, summary.failing_sizes()))
        return f"wrong results in {summary.wrong_cells} cell(s) ({summary.wrong} wrong element(s)) at sizes {sizes} B"
    if summary.status == "bandwidth_low":
        parts = []
        if summary.average_ok(plan.min_bw) is False:
            parts.append(f"average busbw {summary.average_busbw:g} GB/s < 0.9 x {plan.min_bw:g}")
        if summary.peak_ok(plan.min_peak_bw) is False:
            parts.append(f"peak busbw {summary.peak_busbw:g} GB/s < {plan.min_peak_bw:g}")
        return "bandwidth below the floor: " + "; ".join(parts)
    return None


def exit_code_for(summary: RunSummary) -> int:
    return {
        "ok": ExitCode.OK,
        "wrong_results": ExitCode.WRONG_RESULTS,
        "bandwidth_low": ExitCode.WRONG_RESULTS,
        "output_error": ExitCode.OUTPUT_ERROR,
        "interrupted": ExitCode.INTERRUPTED,
        "timeout": ExitCode.TIMEOUT,
        "error": ExitCode.NCCL_ERROR,
    }[summary.status]


def skipped_text(plan) -> str:
    """`uint32, f8e4m3, int8 (avg)`: whole types, or the ops skipped for a type."""
    ops = plan.op_list()
    parts = []
    for d in plan.dtypes:
        gone = [op for op in ops if (d, op) in plan.skipped]
        if gone:
            parts.append(d if len(gone) == len(ops) or not plan.coll.has_op else f"{d} ({', '.join(gone)})")
    return ", ".join(parts)


def _integral(value: float) -> float | int:
    """8.0 -> 8 (nccl-tests writes the step factor as an integer); 1.5 stays 1.5."""
    return int(value) if float(value).is_integer() else value


def build_run_info(plan, backend, devices) -> RunInfo:
    import torch

    code, text = backend.library_version()
    notes = []
    if plan.split:
        groups = plan.groups(backend.nranks)
        notes.append(f"split {plan.split}: {len(groups)} groups of {len(groups[0])} ranks run the test in parallel "
                     "(each rank's group is in `# Using devices`); times are averaged over all ranks")
    if plan.traffic is not None:
        notes.append(plan.traffic.describe())
    if plan.skipped:
        where = f"the {plan.backend} backend"
        if plan.skipped != plan.without_unsupported().skipped:  # some pairs only for the rank count
            where += f" with {backend.group_size} rank(s) per communicator"
        notes.append(f"skipped what {where} cannot run: {skipped_text(plan)}")
    notes += onerank.header_notes(plan, backend.group_size)
    config = {
        "nthreads": 1, "ngpus": 1, "minimum_bytes": plan.min_bytes, "maximum_bytes": plan.max_bytes,
        "step_bytes" if plan.step_factor == 1 else "step_factor":
            plan.step_bytes if plan.step_factor == 1 else _integral(plan.step_factor),
        "warmup_iters": plan.warmup_iters, "iterations": plan.iters,
        "aggregated_iterations": plan.agg_iters, "validation": plan.check, "graph": plan.graph_replays,
        "blocking_collectives": "true" if plan.blocking else "false", "blocking_mode": plan.blocking,
        "per_iter_timing": "true" if plan.per_iter else "false", "per_iter_skip": plan.per_iter_skip,
        "parallel_init": "false", "unalign": plan.unalign, "min_bw": plan.min_bw, "min_peak_bw": plan.min_peak_bw,
    }
    # what shapes the numbers: NCCL's and PyTorch's knobs (TORCH_FR_*: its flight recorder)
    env = sorted(f"{k}={v}" for k, v in os.environ.items()
                 if k.startswith(("NCCL_", "TORCH_NCCL_", "TORCH_FR_", "CUDA_", "NCCLBENCH_")))
    return RunInfo(
        collective=plan.coll.name, args=list(plan.args), backend=plan.backend, mode=plan.mode.value,
        timing=backend.timing_name(), nranks=backend.group_size, devices=devices,
        ncclbench_version=__version__, torch_version=torch.__version__, nccl_code=code, nccl_text=text,
        config=config, env=env, start_time=now(), notes=notes, report_cputime=plan.report_cputime,
    )
