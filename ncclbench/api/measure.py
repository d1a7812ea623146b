"""The Python API: the command line's engine on a job's own process groups.

`measure()` runs one collective's sweep on an existing torch.distributed process group (the
default one, or any sub-group such as a DeviceMesh dimension's) with the registry, checks,
timing engine and result rows of `ncclbench <collective>`, and leaves the group as it found
it: no process group is created or destroyed, every collective it starts is matched on every
rank, the current CUDA device and stream are untouched (the engine runs on a stream of its
own inside a stream context), the job's signal handlers stay the job's. Every rank of the
group calls it with the same arguments; group rank 0 gets the rows, every rank the verdict.

Bad input raises the typed errors of ncclbench.errors, with one line, on every rank of the
group, before any measuring collective: each rank checks its own arguments and the ranks
then agree (one all_gather_object on the group), so that one rank's mistake cannot leave the
others waiting in a collective.

Timeouts (`timeout`, the command line's -T, seconds per size): a watchdog thread names the
ranks that never reached the size (from a progress board in the job's rendezvous store),
writes that message to the store and aborts the NCCL group's communicator, so that ranks
waiting inside a NCCL collective raise. A gloo collective cannot be aborted from outside:
for the call, the gloo group's own timeout is lowered to `timeout` + GLOO_GRACE_S (and put
back afterwards), and the waiting ranks raise when it expires. A rank that was late (stalled
outside any collective) raises as soon as it comes back to the engine and finds the message.
Every rank raises TimeoutExpired with the same message. After a timeout the group is not
usable (a communicator was aborted, or a peer is gone), as after any NCCL timeout. A rank
stuck for good (a hung driver call) cannot be unstuck from Python: that rank stays stuck."""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time

from ncclbench.errors import (BenchError, CollectiveError, ExitCode, LaunchError, PlanError, PreflightError,
                              TimeoutExpired, error_line, first_line, ranks_list)
from ncclbench.engine.guard import CAUSE_KEY
from ncclbench.engine.hooks import RankHooks
from ncclbench.engine.outcome import failed_verdict
from ncclbench.engine.runner import run_plan
from ncclbench.api.rows import Rows
from ncclbench.engine.watchdog import PROGRESS_KEY, ProgressBoard, SizeWatchdog, default_store, hard_exit

DEFAULT_SIZES = "8M:1G:x4"
GLOO_GRACE_S = 5.0  # gloo's own timeout expires this long after the watchdog has named the late ranks
DEFAULT_TIMEOUT_S = 600.0  # the command line's -T default, for the agreement before the plan is known

# Command-line options that describe a launch, output files or parallel groups: measure()
# runs on the caller's group and returns its rows instead.
_NOT_API = {
    "nthreads": "one thread per process", "ngpus": "the group's ranks are the caller's",
    "parallel_init": "one process per GPU", "backend": "the group's own backend is used",
    "output_file": "use Rows.to_json(path)", "csv_path": "use Rows.to_pandas()",
    "metrics_path": "use Rows.to_metrics(path)",
    "results_dir": "use Rows.to_json(path)", "no_save": "nothing is saved", "quiet": "nothing is printed",
    "nnodes": "the group is already formed", "node_rank": "the group is already formed",
    "master_addr": "the group is already formed", "master_port": "the group is already formed",
    "rdzv_endpoint": "the group is already formed", "split": "pass the sub-group itself as group=",
    "minbytes": "use sizes='MIN:MAX:xFACTOR'", "maxbytes": "use sizes='MIN:MAX:xFACTOR'",
    "stepbytes": "use sizes='MIN:MAX:+STEP'", "stepfactor": "use sizes='MIN:MAX:xFACTOR'",
}
_ERROR_TYPES = {cls.__name__: cls for cls in (BenchError, PlanError, LaunchError, CollectiveError, TimeoutExpired,
                                              PreflightError)}


# ---- plans -----------------------------------------------------------------------------------
def parse_sizes(spec) -> dict:
    """`sizes` as the command line's -b/-e/-i/-f: 1024 or '32M' (one size), '8M:1G' (x2
    steps), '8M:1G:x4' (factor 4), '1M:8M:+1M' (steps of 1 MiB)."""
    from ncclbench.sizes import parse_size

    text = str(spec).strip()
    parts = [p.strip() for p in text.split(":")]
    try:
        if len(parts) == 1:
            size = parse_size(spec if isinstance(spec, int) else parts[0])
            return {"minbytes": size, "maxbytes": size}
        if len(parts) in (2, 3):
            out = {"minbytes": parse_size(parts[0]), "maxbytes": parse_size(parts[1]), "stepfactor": 2.0}
            step = parts[2] if len(parts) == 3 else "x2"
            if step[:1] in ("x", "*"):
                out["stepfactor"] = float(step[1:])
            else:
                out.pop("stepfactor")
                out["stepbytes"] = parse_size(step.lstrip("+"))
            return out
    except ValueError as exc:
        raise PlanError(f"sizes {spec!r}: {exc}") from None
    raise PlanError(f"sizes {spec!r}: expected SIZE, MIN:MAX, MIN:MAX:xFACTOR or MIN:MAX:+STEP (e.g. 8M:1G:x4)")


def plan_for(collective: str, sizes, options: dict, backend: str, nranks: int):
    """The Plan the command line would build for these options (its option table and its
    conversion, ncclbench.api.options), on a group of `nranks` ranks of `backend`."""
    from ncclbench.engine.collectives import REGISTRY, lookup
    from ncclbench.api.options import build_plan, options_for

    try:
        coll = lookup(str(collective))
    except KeyError:
        raise PlanError(f"unknown collective {collective!r}; choose from {', '.join(REGISTRY)}") from None
    for key in options:
        if key in _NOT_API:
            raise PlanError(f"option {key!r} does not apply to measure(): {_NOT_API[key]}")
    o = options_for(dict(options, **parse_sizes(sizes)))
    if o["run_cycles"] == 0:
        raise PlanError("run_cycles=0 (until interrupted) does not apply to measure(): give a number of cycles")
    args = ["measure", coll.name, f"sizes={sizes}"] + [f"{k}={v}" for k, v in options.items()]
    plan = build_plan(coll.name, o, backend, args, nranks)
    if plan.split:
        raise PlanError(f"NCCL_TESTS_SPLIT/--split ({plan.split}) does not apply to measure(): "
                        "pass the sub-group itself as group=")
    plan.check_runnable(nranks)
    return plan


# ---- one call on one group -------------------------------------------------------------------
_calls: dict[str, int] = {}
_calls_lock = threading.Lock()


class GroupCall:
    """One API call on one process group: its ranks, its progress boards and timeout mark in
    the job's rendezvous store (keys of its own, so that calls and groups never mix), and
    the agreement and sharing of small objects among its ranks under a watchdog."""

    def __init__(self, group=None, label: str | None = None, parent: "GroupCall | None" = None,
                 exit_on_timeout: bool = False):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise PlanError("no process group is initialised: call torch.distributed.init_process_group() first")
        if group is dist.GroupMember.NON_GROUP_MEMBER:  # what new_group() gives the ranks outside it
            raise PlanError(f"rank {dist.get_rank()} is not a member of the group it passed")
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise PlanError(f"group must be a torch.distributed ProcessGroup or None (got {type(group).__name__}; "
                            "for a DeviceMesh pass mesh.get_group(dim))")
        self.dist, self.group = dist, group
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise PlanError(f"rank {dist.get_rank()} is not a member of the group it passed "
                            f"(ranks {','.join(map(str, dist.get_process_group_ranks(group)))})")
        self.size = dist.get_world_size(group)
        self.global_ranks = list(dist.get_process_group_ranks(self.pg))
        self.label = label or ("the default group" if group is None else
                               f"group {self.pg.group_name} (ranks {ranks_text(self.global_ranks)})")
        self.parent, self.exit_on_timeout = parent, exit_on_timeout
        self.before_exit = None  # callable(message) run on rank 0 before a timeout ends the process
        with _calls_lock:
            index = _calls[self.pg.group_name] = _calls.get(self.pg.group_name, 0) + 1
        self.store = _store(f"ncclbench/api/{self.pg.group_name}/{index}/")
        self._boards: dict[str, object] = {}
        self.backend_name = None

    @property
    def pg(self):
        # looked up, not kept: a reference to the default group that outlives its destruction
        # (in a watchdog's closure) lets its destructor run at interpreter exit, where gloo aborts
        return self.group if self.group is not None else self.dist.GroupMember.WORLD

    def engine_backend(self) -> str:
        from ncclbench.backends.torch_dist import group_backend_name

        if self.backend_name is None:
            self.backend_name = group_backend_name(self.dist, self.group)
        return self.backend_name

    # ---- progress and timeouts ----
    def board(self, name: str):
        """The progress board `name` of this call (the engine's sweep has its own)."""
        if name not in self._boards:
            store = _store(f"{name}/", self.store) if self.store is not None else None
            self._boards[name] = _Board(self, store, self.rank, self.size)
        return self._boards[name]

    def census(self, board, step: int, what: str, marker=None, where=None):
        """A hang's census (engine.hang) on one of this call's progress boards."""
        from ncclbench.engine.hang import Census

        return Census(board, step, what, "hang/", marker, where, ras=self.engine_backend() == "nccl")

    def timed_out(self, what: str, census, timeout_s: float, rank: int) -> None:
        """The watchdog fired on group rank `rank` (watchdog thread): group rank 0 names the
        rank that hung and the ranks that waited for it (engine.hang), and leaves that message
        for every rank; the others post what they see and take its message; then the waiting
        ranks are unblocked."""
        from ncclbench.engine.hang import STORE_WAIT_S, VERDICT_WAIT_S, within

        message = None
        if rank != 0:
            message = within(VERDICT_WAIT_S + 2 * STORE_WAIT_S, lambda: census.post_then(self.timeout_message))
        if message is None:  # group rank 0, or it never spoke (itself hung): this rank decides
            verdict = census.gather_within()
            text = verdict.text(name=lambda r: self.global_ranks[r] if r < len(self.global_ranks) else r)
            message = f"timeout: {verdict.what} on {self.label} did not finish within {timeout_s:g} s: {text}"
            message = within(2 * STORE_WAIT_S, lambda: self.mark(message), message)
            if self.exit_on_timeout:
                within(3.0, lambda: census.wait_heard(len([r for r in verdict.answered if r != rank])))
        if self.exit_on_timeout:  # a batch job's own process: end it, as the command line's -T does
            if self.dist.get_rank() == 0:
                call = self
                while call is not None:  # e.g. preflight's report file, before the process ends
                    if call.before_exit is not None:
                        with contextlib.suppress(Exception):
                            call.before_exit(message)
                    call = call.parent
                print(error_line(message), file=sys.stderr, flush=True)
            else:
                time.sleep(0.5)  # rank 0 may still be reading the store it hosts
            hard_exit(ExitCode.TIMEOUT)
        self.abort()

    def mark(self, message: str) -> str:
        """Leave the timeout message for every rank (the first one written stays); returns it."""
        kept = message
        if self.store is not None:
            with contextlib.suppress(Exception):
                kept = self.store.compare_set("timeout", "", message).decode() or message
        if self.parent is not None:
            self.parent.mark(kept)
        return kept

    def timeout_message(self) -> str | None:
        call = self
        while call is not None:
            if call.store is not None:
                with contextlib.suppress(Exception):
                    if call.store.check(["timeout"]):
                        return call.store.get("timeout").decode()
            call = call.parent
        return None

    def raise_if_timed_out(self) -> None:
        message = self.timeout_message()
        if message:
            raise TimeoutExpired(message)

    def abort(self) -> None:
        """Abort the group's NCCL communicator: ranks waiting in it raise instead of hanging
        until the group's own timeout (whose expiry tears the process down by default)."""
        with contextlib.suppress(Exception):
            if self.engine_backend() == "nccl":
                self.pg.abort()

    @contextlib.contextmanager
    def op_timeout(self, timeout_s: float):
        """A gloo group's own timeout lowered to `timeout_s` + GLOO_GRACE_S for the call: a
        gloo collective cannot be aborted, only timed out. NCCL groups are left alone."""
        try:
            gloo = timeout_s > 0 and self.engine_backend() == "gloo"
        except PlanError:  # a backend ncclbench does not run: the call refuses it elsewhere
            gloo = False
        if not gloo:
            yield
            return
        from datetime import timedelta

        import torch

        try:
            old = self.pg._get_backend(torch.device("cpu")).options._timeout
            self.pg.set_timeout(min(old, timedelta(seconds=timeout_s + GLOO_GRACE_S)))
        except Exception:  # noqa: BLE001 - a torch without these: the group keeps its own timeout
            yield
            return
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                self.pg.set_timeout(old)

    # ---- small objects among the ranks ----
    def exchange(self, obj, what: str, timeout_s: float) -> list:
        """Every rank's `obj` (all_gather_object on the group), within `timeout_s`."""
        board = self.board("s")
        board.step += 1
        step = board.step
        board.reach(step, what)
        dog = SizeWatchdog(timeout_s, lambda _what: self.timed_out(what, self.census(board, step, what), timeout_s,
                                                                   self.rank))
        dog.arm(what)
        try:
            out = [None] * self.size
            with self.op_timeout(timeout_s):
                self.dist.all_gather_object(out, obj, group=self.group)
            return out
        except Exception as exc:  # noqa: BLE001 - a broken group: one line, the timeout's if there was one
            self.raise_if_timed_out()
            raise CollectiveError(f"{what} on {self.label} failed: {type(exc).__name__}: {first_line(exc)}") from exc
        finally:
            dog.stop()

    def agree(self, build, what: str, timeout_s: float):
        """`build()` on every rank, then the ranks agree: when it raised a BenchError on any
        rank, every rank raises that error (naming the ranks where it differs). Returns this
        rank's value."""
        try:
            value, failure = build(), None
        except BenchError as exc:
            value, failure = None, (type(exc).__name__, str(exc), int(exc.exit_code))
        except Exception as exc:  # noqa: BLE001 - e.g. a value of the wrong type: still one line everywhere
            value, failure = None, ("PlanError", f"{type(exc).__name__}: {first_line(exc)}", int(ExitCode.USAGE))
        everyone = self.exchange(failure, what, timeout_s)
        failed = [(r, f) for r, f in enumerate(everyone) if f is not None]
        if not failed:
            return value
        name, message, code = failure or failed[0][1]
        ranks = [self.global_ranks[r] for r, f in failed if f[1] == message]
        if len(ranks) < self.size:
            message = f"{message} (on rank(s) {ranks_text(ranks)})"
        raise _ERROR_TYPES.get(name, PlanError)(message, code)

    def forget(self) -> None:
        """Remove this rank's progress keys (a finished call leaves no trace in the store)."""
        for board in self._boards.values():
            board.forget()


def _store(prefix: str, base=None):
    """The job's rendezvous store (torch's default store) under `prefix`; None without one."""
    import torch.distributed as dist

    base = base if base is not None else default_store()
    if base is None:
        return None
    try:
        return dist.PrefixStore(prefix, base)
    except Exception:  # noqa: BLE001
        return None


class _Board(ProgressBoard):
    """A progress board that also stops a rank arriving after a timeout (it would wait in a
    collective its peers have given up on), with a step counter for GroupCall.exchange."""

    def __init__(self, call: GroupCall, store, rank: int, nranks: int):
        super().__init__(store, rank, nranks)
        self.call, self.step = call, 0

    def reach(self, step: int, what: str | None = None) -> None:
        self.call.raise_if_timed_out()
        super().reach(step, what)

    def forget(self) -> None:
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.delete_key(PROGRESS_KEY.format(rank=self.rank))


def ranks_text(ranks) -> str:
    """Ranks as a short list (0,1,3; 0-7,9; past eight runs `... and N more`), as errors and
    preflight's notes name them."""
    return ranks_list(ranks)


# ---- the engine on an adopted group ------------------------------------------------------------
class _ApiHooks(RankHooks):
    """The engine inside a caller's process: signals stay the caller's, errors are raised
    rather than printed, and a timeout unblocks the ranks instead of ending the process."""

    def __init__(self, call: GroupCall):
        self.call, self.said = call, []

    def board(self, backend):
        return self.call.board("e")

    def stop_on_signals(self) -> None:
        pass

    def hold_signals(self) -> None:
        pass

    def held_signals(self) -> list[int]:
        return []

    def say(self, message: str) -> None:
        self.said.append(message)

    cause_on_every_rank = True  # every rank raises the same error

    def cause_key(self, run_number: int) -> str:
        return CAUSE_KEY  # the call's own store already (a prefix per group and call)

    def sweep_error(self, message: str) -> BaseException:
        return CollectiveError(message)

    def census_prefix(self, run_number: int) -> str:
        return "hang/"  # the call's own store already (a prefix per group and call)

    def timed_out(self, what, census, timeout_s, rank, finish, cause=lambda: None) -> None:
        self.call.timed_out(what, census, timeout_s, rank)


class _Collector:
    """Group rank 0's report: what the command line prints and writes, kept."""

    def __init__(self, info):
        self.info, self.rows, self.summary = info, [], None

    def add_row(self, row) -> None:
        self.rows.append(row)

    def finish(self, summary) -> None:
        self.summary = summary


@functools.lru_cache(maxsize=None)
def _topology(backend: str):
    from ncclbench.topology.header import header_context

    return header_context(backend)


@contextlib.contextmanager
def _own_stream(backend, stream_null: bool):
    """The engine's ops on a stream of their own (as on the command line; the legacy default
    stream with stream_null), after the caller's queued work; the caller's current stream
    is current again afterwards and waits for ours."""
    if not backend.is_gpu:
        yield
        return
    torch = backend.torch
    caller = torch.cuda.current_stream(backend.device)
    stream = torch.cuda.default_stream(backend.device) if stream_null else torch.cuda.Stream(backend.device)
    stream.wait_stream(caller)
    try:
        with torch.cuda.stream(stream):
            yield
    finally:
        caller.wait_stream(stream)


def run_engine(plan, call: GroupCall, all_ranks: bool = False) -> "Rows":
    """`plan` through the command line's engine (runner.run_plan) on the call's group."""
    from ncclbench.backends.torch_dist import TorchBackend

    backend = TorchBackend.adopt(call.group)
    collected: list[_Collector] = []

    def make_report(plan, info):
        info.topology, info.link_peak_gbps, _ = _topology(plan.backend)
        collected.append(_Collector(info))
        return collected[-1]

    try:
        with call.op_timeout(plan.timeout_s), _own_stream(backend, plan.stream_null):
            summary = run_plan(plan, backend, make_report, hooks=_ApiHooks(call))
    except BenchError:
        call.raise_if_timed_out()
        raise
    except Exception as exc:  # noqa: BLE001 - whatever torch raised: one line
        call.raise_if_timed_out()
        raise CollectiveError(f"{type(exc).__name__}: {first_line(exc)}") from exc
    finally:
        backend.close()
    call.raise_if_timed_out()
    if summary.status == "interrupted":
        raise KeyboardInterrupt
    if summary.status == "error":
        raise CollectiveError(summary.errors[0] if summary.errors else "a collective failed")
    mine = None
    if collected:
        report = collected[0]
        mine = (report.summary.status, failed_verdict(report.summary, plan),
                (report.info, report.summary) if all_ranks else None)
    status, verdict, shared = call.exchange(mine, f"{plan.coll.name}: sharing the verdict", plan.timeout_s)[0]
    call.forget()
    if collected:
        shared = (collected[0].info, collected[0].summary)
    info, summary = shared if shared is not None else (None, None)
    return Rows(plan, status, verdict, info, summary, call.global_ranks, call.dist.get_rank())


def measure(collective: str, sizes=DEFAULT_SIZES, group=None, *, all_ranks: bool = False, **options) -> "Rows":
    """Measure `collective` on an existing process group (None: the default group) with the
    command line's engine. `sizes`: '8M:1G:x4' (from 8 MiB to 1 GiB, x4 steps), '32M',
    '1M:8M:+1M'. `options`: the command line's long option names (iters, warmup_iters,
    agg_iters, datatype, op, root, check, average, timeout, cudagraph, blocking,
    report_cputime, per_iter_timing, per_iter_skip, unalign, local_register, stream_null,
    memory_report, min_bw, min_peak_bw, run_cycles, ...), with the same defaults.
    Every rank of the group calls it with the same arguments. Returns Rows: the rows on group
    rank 0 (on every rank with all_ranks=True), the verdict on every rank. Raises the
    errors of ncclbench.errors (PlanError, CollectiveError, TimeoutExpired) on every rank."""
    return _measure(collective, sizes, group, options, all_ranks=all_ranks)


def _measure(collective, sizes, group, options: dict, all_ranks: bool = False, label: str | None = None,
             parent: GroupCall | None = None, exit_on_timeout: bool = False) -> "Rows":
    call = GroupCall(group, label, parent, exit_on_timeout)
    timeout_s = _timeout_hint(options)

    def build():
        return plan_for(collective, sizes, options, call.engine_backend(), call.size)

    plan = call.agree(build, f"measure({collective!r}): agreeing on the plan", timeout_s)
    return run_engine(plan, call, all_ranks)


def _timeout_hint(options: dict) -> float:
    """The timeout for the agreement, before the options are checked (they may be wrong)."""
    try:
        value = float(options.get("timeout", DEFAULT_TIMEOUT_S))
        return value if 0 <= value < 1e6 else DEFAULT_TIMEOUT_S
    except (TypeError, ValueError):
        return DEFAULT_TIMEOUT_S
