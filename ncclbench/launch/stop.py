"""A launched rank's way out when a peer dies while it waits inside a collective.

Under NCCL the peers of a dead rank wait for it inside the collective's kernels, and their
main thread sits in a CUDA synchronize, where no Python signal handler runs: a launcher's
SIGTERM does nothing until its SIGKILL, which then reads like a death of its own. Threads do
run meanwhile. One thread per rank (`start`, from the main thread) therefore waits for news
of a death and stops the rank itself: it aborts the communicators (the engine's `on_abort`;
NCCL's kernels then return, and the main thread raises and writes the outcome as after any
lost peer), and if the rank has still not ended LEAVE_S later it writes the outcome itself
(the engine's `arm`) and leaves with it.

The news comes
  - from the -g launcher (ncclbench.launch.spawn), which sees a rank's exit first: one line
    on a pipe (STOP_FD_ENV) naming the rank that died first, how, and what it was running
    (each rank keeps its current step in a small shared page, DOING_FD_ENV, for that line);
  - from a stop signal (SIGTERM, SIGHUP, SIGINT: torchrun's agent, srun, mpirun) that the
    main thread has not taken within TAKE_S: it is then stuck in C code, and the engine's
    `on_peer_check` looks for a dead peer (local processes, the rendezvous store). With one
    found the rank stops as above; with none it still aborts, so that the signal's own
    orderly stop (rows kept, exit 130) can happen.
Signals reach this thread through Python's wakeup fd (the C-level handler writes each
signal's number there from whatever thread the kernel picked), so the Python handlers the
main thread runs stay exactly as they are. Nothing here imports torch."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Callable

from ncclbench.errors import STOP_SIGNALS, ExitCode, Terminated, interruption_message

STOP_FD_ENV = "NCCLBENCH_STOP_FD"    # read end of the -g launcher's pipe to this rank
DOING_FD_ENV = "NCCLBENCH_DOING_FD"  # this rank's page of what it runs now, read by the launcher
DOING_BYTES = 512
TAKE_S = 1.0   # a stop signal the main thread has not taken by then: it is stuck in C code
LEAVE_S = 3.0  # after the abort: how long the main thread gets to write the outcome itself


@dataclass(frozen=True)
class PeerDeath:
    """The peer that died first, as this rank heard of it. `said_own`: it exited with a code
    of its own after saying why (posted in the store); otherwise it died without a word."""

    rank: int
    text: str  # "rank 3 (pid 812) on node7 was killed by SIGKILL during all_gather at ..."
    said_own: bool = False

    def line(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_line(cls, line: str) -> "PeerDeath | None":
        try:
            fields = json.loads(line)
            return cls(int(fields["rank"]), str(fields["text"]), bool(fields.get("said_own")))
        except (ValueError, KeyError, TypeError):
            return None

    def stopped(self, rank: int, doing: str | None = None) -> str:
        """The line of a rank that stopped because of this death: the death first, then
        the rank itself, which failed in nothing."""
        during = f" during {doing}" if doing and " during " not in self.text else ""
        gone = "failed" if self.said_own else "died"
        return f"{self.text}; rank {rank} on {socket.gethostname()} stopped after rank {self.rank} {gone}{during}"


def _fd_from(name: str) -> int | None:
    """The descriptor the -g launcher passed in `name`, taken out of the environment: a
    process this rank starts must not take the same number for its own."""
    try:
        fd = int(os.environ.pop(name, ""))
        os.fstat(fd)
    except (ValueError, OSError):
        return None
    os.set_inheritable(fd, False)  # not for the processes this rank starts
    return fd


class RankStop:
    def __init__(self, rank: int, stop_fd: int | None, doing_fd: int | None):
        self.rank, self._stop_fd, self._doing_fd = rank, stop_fd, doing_fd
        self._lock = threading.Lock()
        self._taken = 0  # stop signals whose Python handler ran (in the main thread)
        self._stopping = False
        self._death: PeerDeath | None = None
        self._doing: str | None = None
        self._abort: Callable[[], None] | None = None
        self._find: Callable[[], PeerDeath | None] | None = None
        self._post: Callable[[PeerDeath], None] | None = None
        self._finish: Callable[[str, int], None] | None = None
        self._outcome_taken = False  # the main thread writes the outcome: never this thread
        self._leaving = False  # this thread writes it (or has found it written) and ends the process
        self._armed = False  # a run's report has begun in this process
        self._code: int | None = None
        self._wake_r = self._wake_w = -1

    # ---- set-up (main thread) --------------------------------------------------------------
    def start(self) -> None:
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        threading.Thread(target=self._watch, name="ncclbench-stop", daemon=True).start()

    # ---- the thread -----------------------------------------------------------------------------
    def _watch(self) -> None:
        pending = b""
        while True:
            fds = [self._wake_r] + ([self._stop_fd] if self._stop_fd is not None else [])
            try:
                ready, _, _ = select.select(fds, [], [])
            except InterruptedError:
                continue
            if self._wake_r in ready:
                signums = _drain(self._wake_r)
                stops = [s for s in signums if s in STOP_SIGNALS]
                if stops:
                    self._on_signal(stops[0])
            if self._stop_fd is not None and self._stop_fd in ready:
                data = _read(self._stop_fd)
                if not data:  # the launcher is gone: its parent-death signal says the rest
                    self._stop_fd = None
                    continue
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    death = PeerDeath.from_line(line.decode(errors="replace"))
                    if death is not None:
                        self._stop(death)

    def _on_signal(self, signum: int) -> None:
        """A stop signal: the main thread's handler normally takes it at once. If it has
        not within TAKE_S, the main thread is stuck in C code (inside a collective)."""
        with self._lock:
            if self._stopping:
                return
            taken = self._taken
        deadline = time.monotonic() + TAKE_S
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if self._taken != taken:
                return
        death = None
        if self._find is not None:
            try:
                death = self._find()
            except Exception:  # noqa: BLE001 - no verdict on the peers: stop as signalled
                death = None
        self._stop(death, signum, found=True)

    def _stop(self, death: PeerDeath | None, signum: int | None = None, found: bool = False) -> None:
        """Abort, give the main thread LEAVE_S to end the process, else end it here. A death
        this rank `found` itself is posted for ranks on other hosts."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            self._death = death
        if self._abort is not None:
            # in a thread of its own: an abort that hangs must not hold back the leaving below
            threading.Thread(target=_quietly, args=(self._abort,), name="ncclbench-abort", daemon=True).start()
        if found and death is not None and self._post is not None:
            _quietly(lambda: self._post(death))
        time.sleep(LEAVE_S)  # the main thread normally ends the process meanwhile
        self._leave(death, signum)

    def _leave(self, death: PeerDeath | None, signum: int | None) -> None:
        """Write the outcome where the main thread has not, and end the process."""
        if death is not None:
            code, message = int(ExitCode.NCCL_ERROR), death.stopped(self.rank, self._doing)
        else:
            name = signal.Signals(signum).name if signum else "SIGTERM"
            exc = KeyboardInterrupt() if signum == signal.SIGINT else Terminated(name)
            code, message = int(ExitCode.INTERRUPTED), interruption_message(exc)
        with self._lock:
            self._leaving = True
            finish, self._finish = self._finish, None
            writing = self._outcome_taken
        if writing:  # the main thread is writing the outcome: a while more for it to end
            deadline = time.monotonic() + 2 * LEAVE_S
            while self._code is None and time.monotonic() < deadline:
                time.sleep(0.05)
            code = self._code if self._code is not None else code
        elif finish is not None:
            _quietly(lambda: finish(message, code))
        elif death is None and not self._armed and os.environ.get("LOCAL_RANK", "0") == "0":
            # interrupted before any report began: one line per node, as the main thread says it
            print(f"ncclbench: error: {message}", file=sys.stderr, flush=True)
        _hard_exit(code)

    # ---- what the main thread tells -------------------------------------------------------------
    def took_signal(self) -> None:
        self._taken += 1

    def doing(self, text: str) -> None:
        self._doing = text
        if self._doing_fd is not None:
            data = text.encode()[:DOING_BYTES - 1]
            try:
                os.pwrite(self._doing_fd, data + b"\0" * (DOING_BYTES - len(data)), 0)
            except OSError:
                self._doing_fd = None

    def arm(self, finish: Callable[[str, int], None] | None) -> None:
        with self._lock:
            self._finish, self._outcome_taken, self._armed = finish, False, True

    def take_outcome(self) -> bool:
        """The main thread is about to write the run's outcome: True unless this thread is
        already writing it (the main thread then waits to be ended)."""
        with self._lock:
            if self._leaving:
                return False
            self._finish, self._outcome_taken = None, True
            return True


def _drain(fd: int) -> bytes:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 256)
        except (BlockingIOError, InterruptedError):
            return data
        if not chunk:
            return data
        data += chunk


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:
        return b""


def _quietly(fn: Callable[[], object]) -> None:
    try:
        fn()
    except Exception:  # noqa: BLE001 - on the way out: nothing left to report it to
        pass


def _hard_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass
    os._exit(code)


_current: RankStop | None = None


def start(rank: int) -> None:
    """Start this rank's stop thread (once per process, from the main thread)."""
    global _current
    if _current is not None or threading.current_thread() is not threading.main_thread():
        return
    stop = RankStop(rank, _fd_from(STOP_FD_ENV), _fd_from(DOING_FD_ENV))
    stop.start()
    _current = stop


def death() -> PeerDeath | None:
    """The peer death this rank stops for, once it is stopping for one."""
    return _current._death if _current is not None else None


def told(wait_s: float) -> PeerDeath | None:
    """The death this rank stops for; with a -g launcher to tell it, waiting up to `wait_s`
    for its news (it names the signal and what the rank ran, which a rank cannot see)."""
    deadline = time.monotonic() + wait_s
    while _current is not None and _current._stop_fd is not None and _current._death is None \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    return death()


def took_signal() -> None:
    if _current is not None:
        _current.took_signal()


def doing(text: str) -> None:
    if _current is not None:
        _current.doing(text)


def on_abort(abort: Callable[[], None] | None) -> None:
    if _current is not None:
        _current._abort = abort


def on_peer_check(find: Callable[[], PeerDeath | None], post: Callable[[PeerDeath], None] | None = None) -> None:
    if _current is not None:
        _current._find, _current._post = find, post


def arm(finish: Callable[[str, int], None] | None) -> None:
    """While a run's report is open: `finish(message, code)` writes its outcome (rank 0)."""
    if _current is not None:
        _current.arm(finish)


def take_outcome() -> bool:
    return _current.take_outcome() if _current is not None else True


def outcome_code(code: int) -> None:
    """The code the main thread decided on, for a leave after it."""
    if _current is not None:
        _current._code = int(code)


def decided() -> int | None:
    """The exit code a thread writing the run's outcome decided on (a -T verdict on the
    watchdog's thread), or None."""
    return _current._code if _current is not None else None


def stopping() -> bool:
    """Whether this rank's stop thread has taken over (a peer died, or a stop signal found
    the main thread stuck)."""
    return _current is not None and _current._stopping


def rank() -> int:
    return _current.rank if _current is not None else int(os.environ.get("RANK", "0") or 0)


def doing_now() -> str | None:
    return _current._doing if _current is not None else None
