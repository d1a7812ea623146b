"""How one rank's run meets the process around it (RankHooks): its signals, what it says,
how it ends after a lost peer, a timeout or a stop. The command line's are here; the Python
API overrides them (ncclbench.api.measure)."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time

from ncclbench.engine import hang, peers
from ncclbench.engine.guard import CAUSE_GRACE_S, CAUSE_KEY, lost_peer, post_cause, read_cause
from ncclbench.engine.signals import _held_signals, hold_termination_signals, stop_on_termination_signals
from ncclbench.engine.watchdog import ProgressBoard, default_store, hard_exit
from ncclbench.errors import ExitCode, RankFailures, error_line, first_line
from ncclbench.launch import stop as rank_stop
from ncclbench.launch import watch as rank_watch


_TIMING_OUT = threading.Event()  # set once this rank's -T verdict is being written


class RankHooks:
    """How one rank's run meets the process around it. These are the command line's: the
    rank owns its process, so termination signals stop the sweep in order, a timeout ends
    the process (a rank stuck inside a collective cannot be unstuck from Python), and errors
    are said on stderr. The Python API runs inside a user's job and overrides them
    (ncclbench.api.measure)."""

    read_path = True  # one untimed op before the report, so that NCCL's log names the path (engine/pathread.py)

    def board(self, backend) -> ProgressBoard:
        return ProgressBoard(default_store(), backend.rank, backend.nranks)

    def stop_on_signals(self) -> None:
        stop_on_termination_signals()

    def hold_signals(self) -> None:
        hold_termination_signals()

    def held_signals(self) -> list[int]:
        return _held_signals

    def say(self, message: str) -> None:
        print(error_line(message), file=sys.stderr, flush=True)

    cause_on_every_rank = False  # True: every rank ends with the cause (the API raises it everywhere)

    def cause_key(self, run_number: int) -> str:
        """Where a failed rank posts its cause: one key per run_plan of this process (every
        rank of the command line runs the same plans in the same order)."""
        return f"{CAUSE_KEY}/{run_number}"

    def sweep_failed(self, board, rank: int, nranks: int, doing: str | None, exc: Exception,
                     key: str = CAUSE_KEY) -> tuple[str, bool]:
        """A collective failed mid-sweep on this rank: (the line the run ends with, whether
        this rank says it). A failure of its own is said here, with rank and host, and
        posted for the others; a rank that only lost a failed peer, or stopped because a
        peer died (ncclbench.launch.stop), says nothing but takes that peer's line as its
        run's error (rank 0, after waiting briefly for it), so the run ends with one line
        naming the rank where it went wrong. A peer killed without a word is named by the -g
        launcher (which told this rank); under other launchers rank 0 names it when it finds
        it dead (engine.peers), else says that it lost a peer, and the launcher's own report
        names which."""
        if _TIMING_OUT.is_set():  # the -T verdict is being written on the watchdog's thread,
            time.sleep(30)         # which ends the process: a peer lost after it is no cause
        host = socket.gethostname()
        store = getattr(board, "store", None)
        if rank_stop.death() is None and not lost_peer(f"{type(exc).__name__}: {exc}"):  # the whole text
            message = f"rank {rank} on {host}{f' during {doing}' if doing else ''}: {type(exc).__name__}: " \
                      f"{first_line(exc, 240)}"
            post_cause(store, message, key)
            return message, True
        if rank != 0 and not self.cause_on_every_rank:
            return _lost_peer_line(rank, host, doing, exc), False
        cause, death = _peer_cause(store, CAUSE_GRACE_S if nranks > 1 else 0.0, key)
        if cause is not None:
            return cause, False
        message = death.stopped(rank, doing) if death is not None else _lost_peer_line(rank, host, doing, exc)
        return message, rank == 0 and not one_node_spawn()

    def sweep_error(self, message: str) -> BaseException:
        """What a rank other than rank 0 leaves with after a failure mid-sweep: its code,
        nothing printed again (sweep_failed decided who speaks)."""
        return RankFailures([message], ExitCode.NCCL_ERROR)

    def census_prefix(self, run_number: int) -> str:
        """Where a hang's census (engine.hang) keeps its keys: one prefix per run_plan."""
        return f"ncclbench/hang/{run_number}/"

    def timed_out(self, what: str, census, timeout_s: float, rank: int, finish, cause=lambda: None) -> None:
        """The -T watchdog fired on `rank` during `what` (runs on the watchdog's thread).
        `census` (engine.hang.Census) names the rank that hung and the ranks that waited for
        it: rank 0 gathers every rank's witness and decides, the others post theirs and wait
        for its verdict, so a rank that timed out only because a peer hung is never named.
        `cause()`: the failure another rank posted, if one did (a rank whose collective failed
        leaves, and its peers wait inside NCCL until -T). `finish(message)` (rank 0 once its
        report began, else None) writes the report's trailer. A rank stopping because a peer
        died leaves the outcome to its stop thread: that is no timeout."""
        fired = time.monotonic()
        if rank_stop.stopping() or not rank_stop.take_outcome():
            return
        _TIMING_OUT.set()
        # this thread writes the outcome from here: a peer that ends after the verdict (a
        # launcher's SIGTERM, the hung rank killed) is no second cause for the stop thread
        rank_stop.outcome_code(ExitCode.TIMEOUT)
        if rank != 0:
            rank0_stopped = census.reporter_stopped()  # rank 0 decides: stopped, it never will
            if rank0_stopped and one_node_spawn():
                hard_exit(ExitCode.TIMEOUT)  # the -g launcher names rank 0 by the rank it kills
            if not (rank0_stopped and census.claim()):  # the first rank to claim it speaks instead
                verdict = census.post_and_wait()
                if verdict is not None:
                    # no exit before the ranks the verdict found late answered: under torchrun
                    # any exit makes the agent terminate the ranks left (see below)
                    hang.within(hang.LATE_WAIT_S + 2 * hang.STORE_WAIT_S, census.wait_late)
                    named = hang.culprits_in(verdict)
                    ended = _end_stopped(census, named)
                    _say_ended(census, ended, _short(verdict))
                    if not one_node_spawn():  # the named ranks' watchers, should the deciding rank's news not come
                        census.tell_watchers(_short(verdict), named, only=named)
                elif not one_node_spawn():  # no verdict came: the job gave up all the same
                    census.tell_watchers(f"timeout: {what} did not finish within {timeout_s:g} s (-T), and no "
                                         "verdict came from rank 0")
                hard_exit(ExitCode.TIMEOUT)
        verdict = census.gather_within()
        first = cause() if finish is not None else None
        message = f"timeout: {verdict.what} did not finish within {timeout_s:g} s (-T): {verdict.text()}"
        ending = _stopped_here(census, verdict.ranks())
        if ending:
            message += (f"; {hang.ranks_text([r for r, _ in ending])} ended by ncclbench (SIGKILL: a stopped process "
                        "takes no SIGTERM)")
        message += f"; it failed first on {first}" if first else ""
        # Ranks at the step that had not answered (their own -T fires later) are waited for,
        # at most until LATE_WAIT_S after this rank's -T fired, before any rank ends or is
        # ended: torchrun's agent terminates the ranks left once one exits, and one whose -T
        # had not fired ended as interrupted (130) or as a lost peer (3), not 4.
        late_s = max(0.0, hang.LATE_WAIT_S - (time.monotonic() - fired)) if verdict.late else 0.0
        hang.within(hang.STORE_WAIT_S, lambda: census.post_late(verdict.late, late_s))
        try:
            if finish is not None:
                finish(message)
        finally:
            self.say(message)
            hang.within(3.0, lambda: census.post_verdict(message, len([r for r in verdict.answered if r != rank])))
            hang.within(late_s + 1, lambda: census.wait_answers(verdict.late, late_s))
            _end(ending)
            if not one_node_spawn():  # a one-node -g launcher ends its ranks itself
                census.tell_watchers(_short(message), verdict.ranks())
        hard_exit(ExitCode.TIMEOUT)

    def open_outcome(self, finish) -> None:
        """The report is open (rank 0: `finish(message, status)` ends it early; elsewhere
        None). From here the rank's stop thread (ncclbench.launch.stop) writes the outcome
        if the main thread is stuck when a peer has died."""
        def stopped(message: str, code: int) -> None:
            status = "interrupted" if code == ExitCode.INTERRUPTED else "error"
            finish(message, status)
            if status == "interrupted" or not one_node_spawn():  # under -g its launcher names the dead rank
                self.say(message)

        rank_stop.arm(stopped if finish is not None else None)

    def take_outcome(self) -> None:
        """The sweep has ended: this thread writes the outcome, unless the stop thread
        already does; then this one waits to be ended by it."""
        if not rank_stop.take_outcome():
            import time

            while True:
                time.sleep(1)


def _short(message: str) -> str:
    """A verdict's head and first culprit, for the watchers' lines (the rest is on host 0)."""
    return message.split("; ", 1)[0]


def _end_stopped(census, named: list[int]) -> list[tuple[int, int]]:
    """The named ranks on this host that are stopped (state T), ended with SIGKILL. Their
    launcher would wait for them: torchrun's agent sends SIGTERM, which a stopped process
    keeps pending, and kills them only 30 s later. The -g launcher of one node ends them
    itself, and says so."""
    return _end(_stopped_here(census, named))


def _say_ended(census, ended: list[tuple[int, int]], why: str) -> None:
    """On a host other than rank 0's, the line the culprit's watcher would have said about
    each rank this rank ended (rank 0's own line says it on its host)."""
    host = socket.gethostname()
    zero = census.entries.get(0)
    if zero is None or zero.host == host:
        return
    for r, pid in ended:
        print(rank_watch.ended_line(r, pid, host, "T", True, why), file=sys.stderr, flush=True)


def _stopped_here(census, named: list[int]) -> list[tuple[int, int]]:
    """(rank, pid) of the named ranks on this host that are stopped, for _end; none under a
    one-node -g launcher (it ends them itself)."""
    return [] if one_node_spawn() else census.frozen_here(named)


def _end(ranks: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """SIGKILL to each (rank, pid) still stopped (a host mate may have ended it meanwhile,
    and its pid been taken again); the (rank, pid) it reached."""
    import signal

    from ncclbench import procs

    ended = []
    for r, pid in ranks:
        if procs.state(pid) not in procs.STOPPED:
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            ended.append((r, pid))
        except OSError:
            pass
    return ended


def one_node_spawn() -> bool:
    """Ranks of a one-node -g run: their launcher names a rank that died."""
    return bool(os.environ.get("NCCLBENCH_SPAWNED")) and os.environ.get("WORLD_SIZE") == os.environ.get("LOCAL_WORLD_SIZE")


def _lost_peer_line(rank: int, host: str, doing: str | None, exc: BaseException) -> str:
    during = f" during {doing}" if doing else ""
    return f"rank {rank} on {host} lost a peer{during}: {type(exc).__name__}: {first_line(exc, 240)}"


def _peer_cause(store, wait_s: float, key: str):
    """(the cause a failed peer posted, or None; the death this rank stops for, or None),
    waiting up to `wait_s` for either. A peer that died without a word posts nothing: the
    -g launcher's news of it, or its process found gone on this host with still nothing
    posted (a failed rank posts before it exits), ends the wait."""
    import time

    deadline = time.monotonic() + wait_s
    while True:
        death = rank_stop.death()
        if death is not None and not death.said_own:
            return None, death
        cause = read_cause(store, 0.0, key)
        if cause is not None:
            return cause, death
        found = peers.dead_here()
        if found is not None:
            told = rank_stop.told(1.0)  # a -g launcher's news of it says more: a moment for it
            if told is not None and not told.said_own:
                return None, told
            peers.post_death(found, store)
            return read_cause(store, 0.0, key), found
        found = peers.posted_death(store) if store is not None else None
        if found is not None:
            return None, found
        if time.monotonic() >= deadline:
            return None, death
        time.sleep(0.05)
