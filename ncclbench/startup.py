"""Where the start-up time went: stamps on one clock that every process shares.

A run's wait before its first row is mostly start-up (the torch import, the communicator),
not the sweep. Each phase is stamped with time.time(), which all processes of a host read
alike, and reported in seconds after an origin: the ncclbench launcher's start (it hands
its start time to the ranks it spawns, in LAUNCH_TIME_ENV), else the start of torchrun's
agent when torchrun started this rank, else this process's own start.

Phases (rank 0's view; the first collective waits for every rank, so rank 0's
`backend_ready` also bounds the other ranks' imports):
  rank_started   this rank's process was created
  imported       torch imported, before the backend starts
  backend_ready  process group and communicator ready
  first_row      the first row printed
"""

from __future__ import annotations

import os
import time

LAUNCH_TIME_ENV = "NCCLBENCH_LAUNCH_TIME"
PHASES = ("rank_started", "imported", "backend_ready", "first_row")
_LOADED = time.time()  # the fallback for "this process started", where /proc cannot say
_marks: dict[str, float] = {}


def process_start_time(pid: int | str = "self") -> float | None:
    """When process `pid` was created, on the time.time() clock (Linux: /proc, ~10 ms
    resolution); None where that cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - uptime + started_after_boot


def mark(phase: str) -> None:
    """Stamp `phase` now, once per process (a suite's later plans keep the first stamps)."""
    _marks.setdefault(phase, time.time())


def marked(phase: str) -> bool:
    return phase in _marks


def origin(environ=None) -> tuple[float, str]:
    """(origin time, what it is) for this process's phases."""
    env = os.environ if environ is None else environ
    stamp = env.get(LAUNCH_TIME_ENV)
    if stamp:
        try:
            return float(stamp), "the ncclbench launcher started"
        except ValueError:
            pass
    if env.get("TORCHELASTIC_RUN_ID"):
        agent = process_start_time(os.getppid())
        if agent is not None:
            return agent, "torchrun started"
    return own_start(), "this process started"


def own_start() -> float:
    started = process_start_time()
    return started if started is not None else _LOADED


def phases(environ=None) -> dict:
    """The stamps so far, in seconds after the origin, with the origin itself."""
    start, what = origin(environ)
    out = {"origin": what, "origin_time": round(start, 3)}
    stamps = dict(_marks, rank_started=own_start())
    for phase in PHASES:
        out[f"{phase}_s"] = round(max(stamps[phase] - start, 0.0), 3) if phase in stamps else None
    return out


def summary_line(recorded: dict | None) -> str | None:
    """`# Start-up (rank 0, s after the ncclbench launcher started): ...` or None."""
    if not recorded:
        return None
    parts = [f"{phase.replace('_', ' ')} {recorded[f'{phase}_s']:.2f}" for phase in PHASES
             if recorded.get(f"{phase}_s") is not None]
    if not parts:
        return None
    return f"# Start-up (rank 0, seconds after {recorded.get('origin', 'the start')}): " + ", ".join(parts)
