"""What this host's process table says about another process."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped by its launcher, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def state(pid: int) -> str | None:
    """Process `pid`'s state letter in this host's process table (R running, S sleeping,
    D in the kernel, T stopped, Z dead; None: no such process here)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


STATE_TEXT = {
    "T": "stopped (state T: SIGSTOP or SIGTSTP)",
    "t": "stopped by a debugger (state t)",
    "D": "stuck in the kernel (state D)",
    "Z": "dead (state Z)",
    "X": "dead (state X)",
    "R": "running (state R)",
    "S": "running, waiting (state S)",
}
STOPPED = ("T", "t")  # stopped by a signal or a tracer: only SIGKILL ends it
FROZEN = STOPPED + ("D",)  # a process in these states does not run its own code


def state_text(letter: str | None) -> str:
    if letter is None:
        return "gone"
    return STATE_TEXT.get(letter, f"in state {letter}")
