"""Bounded runs: a per-rank deadline for each size, and a progress board in the
rendezvous store so that the rank that times out can say who never arrived.

The collective libraries have their own timeouts (gloo raises, NCCL's watchdog aborts
the communicator), but they know neither the size nor the lagging rank, and a rank
stalled outside any collective (a stuck host, a dead GPU driver call) is invisible to
them. This thread fires at `timeout_s` after a size starts; the process-group timeout is
set later than that, so ours speaks first."""

from __future__ import annotations

import os
import threading
import time

PROGRESS_KEY = "ncclbench/progress/{rank}"


class ProgressBoard:
    """Each rank writes the step it has reached; anyone can read who is behind."""

    def __init__(self, store, rank: int, nranks: int):
        self.store, self.rank, self.nranks = store, rank, nranks

    def reach(self, step: int) -> None:
        if self.store is not None:
            try:
                self.store.set(PROGRESS_KEY.format(rank=self.rank), str(step))
            except Exception:  # noqa: BLE001 - progress is a diagnostic, never a failure
                self.store = None

    def behind(self, step: int) -> list[int]:
        """Ranks whose last reported step is before `step` (never reported counts as behind)."""
        if self.store is None:
            return []
        late = []
        for r in range(self.nranks):
            key = PROGRESS_KEY.format(rank=r)
            try:
                reached = int(self.store.get(key)) if self.store.check([key]) else -1
            except Exception:  # noqa: BLE001
                return []
            if reached < step:
                late.append(r)
        return late


class SizeWatchdog:
    """Calls `on_expire(what)` once if a step runs past its deadline."""

    def __init__(self, timeout_s: float, on_expire):
        self.timeout_s = timeout_s
        self.on_expire = on_expire
        self._deadline = None
        self._what = ""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="ncclbench-watchdog", daemon=True)
        self._thread.start()

    def arm(self, what: str) -> None:
        with self._lock:
            self._deadline, self._what = time.monotonic() + self.timeout_s, what

    def disarm(self) -> None:
        with self._lock:
            self._deadline = None

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            with self._lock:
                expired = self._deadline is not None and time.monotonic() > self._deadline
                what = self._what
            if expired:
                self.on_expire(what)
                return


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
