"""Set-up steps that can fail on some ranks only: a GPU missing on one node, a CUDA or NCCL
error on one rank, buffers that do not fit where another process holds memory, the
free-memory check. Each rank runs the step guarded, the outcomes are exchanged, and every
rank leaves together with the most severe code while one rank says each distinct failure
in one line. Without this the failing rank left alone (its reason unsaid: only rank 0
speaks) and its peers failed later with an unrelated error ("Connection reset by peer")."""

from __future__ import annotations

import json
import socket
import time
from dataclasses import asdict, dataclass
from typing import Callable

from ncclbench.errors import BenchError, ExitCode, RankFailures, error_line, first_line, ranks_list

# the most severe last: a lost or failing peer outranks a timeout, which outranks a
# missing GPU, which outranks a plan that cannot run here
_SEVERITY = (ExitCode.USAGE, ExitCode.BAD_GPU_COUNT, ExitCode.TIMEOUT, ExitCode.NCCL_ERROR)
MAX_LINES = 8  # distinct failures said in full; the rest are summed up in one line


@dataclass(frozen=True)
class Failure:
    rank: int
    host: str
    code: int
    message: str


# What gloo and NCCL say when a peer went away, rather than what went wrong: on the ranks
# that merely lost a failed peer, these are the errors. Only phrases that name the peer:
# generic words (a broken pipe, end of file) also end a rank's own errors, which must
# never be taken for a lost peer and kept quiet.
LOST_PEER_SIGNS = ("reset by peer", "closed by peer", "remote process exited", "communicator was aborted",
                   "ncclremoteerror")
CAUSE_KEY = "ncclbench/sweep_cause"  # + /<run>: the first failure mid-sweep that was not a lost peer
CAUSE_GRACE_S = 2.0  # how long rank 0, having lost a peer, waits for the peer's own reason


def lost_peer(message: str) -> bool:
    low = message.lower()
    return any(sign in low for sign in LOST_PEER_SIGNS)


def post_cause(store, message: str, key: str = CAUSE_KEY) -> None:
    """Offer `message` as the run's cause; the first one posted stays."""
    if store is None:
        return
    try:
        store.compare_set(key, "", message)
    except Exception:  # noqa: BLE001 - the store may be gone with the rank that hosted it
        pass


def posted(store, name: str, seconds: float, longest_pause: float = 0.1) -> bool:
    """Whether `name` is in the store, asking with `check` at growing intervals (5 ms up to
    `longest_pause`) for at most `seconds`. Not `store.wait`: torch logs two c10d warning
    lines on stderr for every wait that times out, and ranks that arrive seconds apart (a
    slow device, a failed one) would bury the run's one error line under them. One small
    request per rank every `longest_pause` at most, only while ranks are apart."""
    deadline, pause = time.monotonic() + seconds, 0.005
    while True:
        if store.check([name]):
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(pause, left))
        pause = min(pause * 2, longest_pause)


def read_cause(store, wait_s: float = 0.0, key: str = CAUSE_KEY) -> str | None:
    """The cause a failed rank posted, waiting up to `wait_s` for one."""
    if store is None:
        return None
    try:
        return store.get(key).decode() if posted(store, key, wait_s) else None
    except Exception:  # noqa: BLE001 - the store may be gone with the rank that hosted it
        return None


def attempt(step: Callable[[], object], rank: int, what: str):
    """(step's value, None), or (None, the Failure it raised). `what` prefixes errors that
    are not ncclbench's own (a CUDA or NCCL error), which do not say where they came from."""
    try:
        return step(), None
    except BenchError as exc:
        return None, Failure(rank, socket.gethostname(), int(exc.exit_code), str(exc))
    except Exception as exc:  # noqa: BLE001 - any error of the step is this rank's failure
        return None, Failure(rank, socket.gethostname(), int(ExitCode.NCCL_ERROR),
                             f"{what}: {type(exc).__name__}: {first_line(exc, 300)}")


def ranks_text(ranks: list[int]) -> str:
    """`rank 3`, `ranks 1,4`, `ranks 0-7,9`, `ranks 0,2,4,... and 40 more`."""
    return f"rank{'s' if len(set(ranks)) > 1 else ''} {ranks_list(ranks)}"


def _hosts_text(hosts: list[str]) -> str:
    seen = list(dict.fromkeys(hosts))
    return ", ".join(seen[:3]) + (f" and {len(seen) - 3} more" if len(seen) > 3 else "")


def verdict(failures: list[Failure], nranks: int, missing: list[int] = (), what: str = "",
            timeout_s: float = 0.0) -> RankFailures | None:
    """One exception for everything that went wrong in one set-up step: its lines (one per
    distinct failure; a failure found on every rank is said once, without ranks) and the
    most severe exit code. `missing`: ranks that never said how the step went."""
    if not failures and not missing:
        return None
    by_message: dict[str, list[Failure]] = {}
    for f in sorted(failures, key=lambda f: f.rank):
        by_message.setdefault(f.message, []).append(f)
    lines = []
    if len(by_message) == 1 and len(failures) == nranks:
        lines.append(failures[0].message)
    else:
        for message, fs in by_message.items():
            lines.append(f"{ranks_text([f.rank for f in fs])} on {_hosts_text([f.host for f in fs])}: {message}")
    if len(lines) > MAX_LINES:
        rest = [f.rank for fs in list(by_message.values())[MAX_LINES:] for f in fs]
        lines = lines[:MAX_LINES] + [f"{ranks_text(rest)} failed too (other reasons)"]
    codes = [f.code for f in failures]
    if missing:
        lines.append(f"{ranks_text(missing)} did not finish {what} within {timeout_s:g} s (-T)")
        codes.append(ExitCode.TIMEOUT)
    code = max(codes, key=lambda c: _SEVERITY.index(c) if c in _SEVERITY else len(_SEVERITY))
    return RankFailures(lines, code)


def say(failure: RankFailures, prefix: str = "") -> None:
    import sys

    for line in failure.lines:
        print(error_line(prefix + line), file=sys.stderr, flush=True)


class SetupBoard:
    """Set-up outcomes in the rendezvous store, for the steps before any process group
    exists (the device, the communicator). Rank 0 says the verdict, or, when rank 0 never
    reported, the lowest rank that did; every other rank leaves quietly with the same code.

    A rank still inside its step when the others have settled on a failure (stuck in a
    communicator that will never form because a peer failed) is ended by a watcher thread
    after GRACE_S, or at the -T deadline."""

    POLL_S = 0.05
    WAIT_S = 0.5     # longest wait between looks at the rest, so that a stop signal is seen in time
    POLL_MAX_S = 0.1  # longest pause between two looks at the store
    GRACE_S = 5.0    # after a failure is known: for ranks still busy to report theirs
    HEARD_S = 10.0   # how long the rank that spoke waits for the others to read it (it may host the store)

    def __init__(self, store, rank: int, nranks: int, timeout_s: float,
                 held: Callable[[], BaseException | None] = lambda: None,
                 hold: Callable[[], None] = lambda: None):
        self.store, self.rank, self.nranks = store, rank, nranks
        self.timeout_s = timeout_s if timeout_s > 0 else float("inf")
        self.held, self.hold = held, hold  # a held stop signal's exception; hold stop signals

    def run(self, step: str, what: str, fn: Callable[[], object]):
        """fn() on this rank, its outcome settled with every rank's: returns fn's value when
        every rank succeeded, else raises RankFailures (already said)."""
        start = time.monotonic()
        watcher = _Watcher(self, step, what, start)
        try:
            value, failure = attempt(fn, self.rank, what)
        finally:
            watcher.stop()
        self.hold()  # the outcome is being decided: a launcher's SIGTERM must not replace it
        key = self._key(step)
        self.store.set(key(str(self.rank)), json.dumps(asdict(failure)) if failure else "")
        if failure:
            self.store.add(key("failed"), 1)
        if self.store.add(key("done"), 1) == self.nranks:
            self.store.set(key("complete"), "")
        self._settle(step, what, start, failure is not None)
        return value

    def on_own_connection(self) -> "SetupBoard":
        """The same board through a second connection to the store's server."""
        import datetime

        import torch.distributed as dist

        store = dist.TCPStore(self.store.host, self.store.port, is_master=False, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=30))
        return SetupBoard(store, self.rank, self.nranks, self.timeout_s)

    def _key(self, step: str):
        return lambda name: f"ncclbench/setup/{step}/{name}"

    def _settle(self, step: str, what: str, start: float, failed_here: bool) -> None:
        key = self._key(step)
        failure_seen = time.monotonic() if failed_here else None
        decided_at = speaker = None
        while True:
            complete = posted(self.store, key("complete"), self.WAIT_S, self.POLL_MAX_S)
            if self.store.check([key("said")]):
                # read before saying it was heard: the speaker may host the store and leave
                # as soon as every rank has, and a read after that finds the store gone
                code = int(self.store.get(key("said")))
                self.store.add(key("heard"), 1)
                raise RankFailures([], code)
            failed = self.store.add(key("failed"), 0)
            if complete and not failed:
                return
            now = time.monotonic()
            if failed and failure_seen is None:
                failure_seen = now
            interrupt = self.held()
            if interrupt is not None and not failed:
                raise interrupt
            if decided_at is None and (complete or now - start >= self.timeout_s
                                       or (failure_seen is not None and now - failure_seen >= self.GRACE_S)):
                decided_at = now
            if decided_at is None:
                continue
            # rank 0 speaks; another rank only when rank 0 has not reported and stayed silent
            if self.rank != 0 and speaker is None and now - decided_at >= self.GRACE_S:
                speaker = self._lowest_reported(step)
            if self.rank == 0 or speaker == self.rank:
                raise self.speak(step, what)
            time.sleep(self.POLL_S)

    def _lowest_reported(self, step: str) -> int | None:
        key = self._key(step)
        return next((r for r in range(self.nranks) if self.store.check([key(str(r))])), None)

    def speak(self, step: str, what: str, silent: bool = False) -> RankFailures:
        """The verdict of `step` from what the store holds (ranks that never reported count
        as missing); unless `silent`, say it, mark it said, and wait a little for the
        others to read it."""
        key = self._key(step)
        failures, missing = [], []
        for r in range(self.nranks):
            if not self.store.check([key(str(r))]):
                missing.append(r)
                continue
            text = self.store.get(key(str(r))).decode()
            if text:
                failures.append(Failure(**json.loads(text)))
        if failures:
            missing = []  # the peers of a failed rank wait on it: not the news
        result = verdict(failures, self.nranks, missing, what, self.timeout_s)
        if result is None:  # everyone reported success after all
            result = RankFailures([], int(ExitCode.OK))
        if silent:
            return result
        say(result)
        self.store.set(key("said"), str(result.exit_code))
        waiting_for = self.nranks - 1 - len([r for r in missing if r != self.rank])
        deadline = time.monotonic() + self.HEARD_S
        while self.store.add(key("heard"), 0) < waiting_for and time.monotonic() < deadline:
            time.sleep(self.POLL_S)
        return result


class _Watcher:
    """While this rank is inside a set-up step: if the others settle on a failure (or -T
    passes) and this rank is still stuck in it, end the process with the verdict's code;
    rank 0 says the verdict first, as its main thread would have. The main thread cannot:
    it is inside the stuck call."""

    def __init__(self, board: SetupBoard, step: str, what: str, start: float):
        import threading

        self.board, self.step, self.what, self.start = board, step, what, start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ncclbench-setup-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        key = self.board._key(self.step)
        failure_seen = decided_at = None
        try:
            # a connection of its own: the stuck main thread may hold the board's, waiting
            # inside the store for a peer that will never write (gloo and NCCL meet there)
            board = self.board.on_own_connection()
        except Exception:  # noqa: BLE001 - not a TCP store: nothing to watch with
            return
        while not self._stop.wait(0.2):
            try:
                said = board.store.check([key("said")])
                failed = board.store.add(key("failed"), 0)
            except Exception:  # noqa: BLE001 - the store is gone: whoever hosted it has left
                return
            now = time.monotonic()
            if failed and failure_seen is None:
                failure_seen = now
            if decided_at is None and (now - self.start >= board.timeout_s or
                                       (failure_seen is not None and now - failure_seen >= board.GRACE_S)):
                decided_at = now
            if self._stop.is_set():
                return
            if said or (decided_at is not None and (board.rank == 0 or now - decided_at >= 2 * board.GRACE_S)):
                self._leave(board, said)
                return

    def _leave(self, board: SetupBoard, said: bool) -> None:
        from ncclbench.engine.watchdog import hard_exit

        key = board._key(self.step)
        code = int(ExitCode.TIMEOUT)
        try:
            if said:
                code = int(board.store.get(key("said")))
                board.store.add(key("heard"), 1)
            else:
                code = board.speak(self.step, self.what, silent=board.rank != 0).exit_code
        except Exception:  # noqa: BLE001 - the store is gone: leave with what is known
            pass
        hard_exit(code)
