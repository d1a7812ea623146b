"""Where this rank's main thread is inside a size: its phase (warm-up, the timed loop, the
check, ...), the placement, and the timed iteration. The timing engine and the sweep set it
with plain attribute stores (tens of nanoseconds a timed iteration, no system call, against a
collective call's ~20 us of host cost); the -T watchdog's thread reads it when a size overruns,
so that a hang report can say where the ranks waited. On a GPU the host issues a timed loop
ahead of the device: there it says how far the host got, and that it then waits for the device."""

from __future__ import annotations

TIMED = "timed"


class Position:
    __slots__ = ("phase", "iteration", "iterations", "placement")

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.phase: str | None = None
        self.iteration = 0
        self.iterations = 0
        self.placement: str | None = None

    def at(self, phase: str | None, placement: str | None = None) -> None:
        self.phase, self.iteration = phase, 0
        if placement is not None:
            self.placement = placement

    def text(self) -> str | None:
        if self.phase is None:
            return None
        place = f"{self.placement}, " if self.placement else ""
        if self.phase == TIMED:
            return f"{place}timed iteration {self.iteration + 1} of {self.iterations}"
        return place + self.phase


HERE = Position()
