"""Bounded runs: a per-rank deadline for each size, and a progress board in the
rendezvous store so that the rank that times out can say who never arrived.

The collective libraries have their own timeouts (gloo raises, NCCL's watchdog aborts
the communicator), but they know neither the size nor the lagging rank, and a rank
stalled outside any collective (a stuck host, a dead GPU driver call) is invisible to
them. This thread fires at `timeout_s` after a size starts; the process-group timeout is
set later than that, so ours speaks first."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass

from ncclbench.failpoints import failpoint
from ncclbench.launch import stop as rank_stop
from ncclbench.launch import watch as rank_watch

PROGRESS_KEY = "ncclbench/progress/{rank}"


class ProgressBoard:
    """Each rank writes the step it has reached (with its pid, host and what the step runs);
    anyone can read who is behind, and where each rank is (engine.hang)."""

    def __init__(self, store, rank: int, nranks: int):
        self.store, self.rank, self.nranks = store, rank, nranks
        self._me = f"{os.getpid()}|{socket.gethostname()}"
        self._registered = False

    def reach(self, step: int, what: str | None = None) -> None:
        if self.store is not None:
            if not self._registered:  # this rank's watcher (launch.watch), once per board
                self._registered = True
                rank_watch.register(self.store, self.rank)
            try:
                self.store.set(PROGRESS_KEY.format(rank=self.rank), f"{step}|{self._me}|{what or ''}")
            except Exception:  # noqa: BLE001 - progress is a diagnostic, never a failure
                self.store = None

    def behind(self, step: int) -> list[int]:
        """Ranks whose last reported step is before `step` (never reported counts as behind)."""
        entries = self.entries()
        if entries is None:
            return []
        return [r for r in range(self.nranks) if r not in entries or entries[r].step < step]

    def entries(self, store=None) -> "dict[int, BoardEntry] | None":
        """Every rank's last entry (ranks that wrote none left out), through `store` (a
        connection of the watchdog's own) or the board's; None where the store cannot be read."""
        store = store if store is not None else self.store
        if store is None:
            return None
        out = {}
        for r in range(self.nranks):
            key = PROGRESS_KEY.format(rank=r)
            try:
                if store.check([key]):
                    out[r] = BoardEntry.parse(store.get(key).decode(errors="replace"))
            except Exception:  # noqa: BLE001
                return None
        return out


@dataclass(frozen=True)
class BoardEntry:
    step: int
    pid: int | None = None
    host: str | None = None
    what: str | None = None

    @classmethod
    def parse(cls, text: str) -> "BoardEntry":
        step, pid, host, what = (text.split("|", 3) + ["", "", ""])[:4]
        return cls(int(step), int(pid) if pid.isdigit() else None, host or None, what or None)


class SizeWatchdog:
    """Calls `on_expire(what)` once if a step runs past its deadline.

    The thread sleeps until the deadline instead of polling: a Python thread that wakes
    needs the GIL, which it may take from the main thread in the middle of a timed loop
    (docs/design/watchdog-sleeps.md). Re-arming only moves the deadline later, so it
    never has to wake the thread; the thread wakes at a deadline that has since moved (at
    most once per `timeout_s`), when armed after a disarm, and on stop."""

    def __init__(self, timeout_s: float, on_expire):
        self.timeout_s = timeout_s
        self.on_expire = on_expire
        self.wakeups = 0          # times the thread woke (tests; the fewer the better)
        self._deadline = None
        self._what = ""
        self._idle = False        # the thread waits with no deadline: arm() must wake it
        self._stopped = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ncclbench-watchdog", daemon=True)
        self._thread.start()

    def arm(self, what: str) -> None:
        if self.timeout_s <= 0:  # -T 0: no timeout, as in nccl-tests
            return
        with self._lock:
            self._deadline, self._what = time.monotonic() + self.timeout_s, what
            if self._idle:
                self._idle = False
                self._wake.set()

    def disarm(self) -> None:
        with self._lock:
            self._deadline = None  # the sleeping thread finds out at the old deadline

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._wake.set()

    def _watch(self) -> None:
        while True:
            with self._lock:
                if self._stopped:
                    return
                self._wake.clear()
                deadline, what = self._deadline, self._what
                wait = None if deadline is None else deadline - time.monotonic()
                self._idle = deadline is None
            if wait is not None and wait <= 0:
                # a fault can make it fire late (a host so loaded this thread waits for a core)
                failpoint("engine.watchdog_fires", rank=rank_stop.rank())
                self.on_expire(what)
                return
            self._wake.wait(wait)
            self.wakeups += 1


def default_store():
    """The store torch's rendezvous created (private accessor; None when unavailable)."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001
        return None


def hard_exit(code: int) -> None:
    """Leave now, even with the main thread stuck inside a collective."""
    try:
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)
