"""Exit codes and the error types that map onto them.

Runtime codes follow nccl-tests (testResult_t): a user switching tools keeps the
meaning of `$?`. Usage errors use Click's convention (2)."""

from __future__ import annotations

import enum
import signal


class ExitCode(enum.IntEnum):
    OK = 0
    REGRESSION = 1      # `compare` found a regression / `pairs --fail-below` tripped
    USAGE = 2           # bad input, nothing was launched (Click's convention)
    NCCL_ERROR = 3      # a collective call failed (NCCL / gloo error, lost peer)
    TIMEOUT = 4         # a size did not finish within -T seconds
    BAD_GPU_COUNT = 5   # asked for more GPUs than visible
    OUTPUT_ERROR = 6    # a result file (JSON, CSV, store) could not be written; stdout has every row
    INTERRUPTED = 130   # Ctrl-C: rows finished so far are kept
    WRONG_RESULTS = 7   # #wrong > 0, or bandwidth below NCCL_TESTS_MIN_BW


class BenchError(Exception):
    """An error that ends the run with one line of text and a known exit code."""

    exit_code: int = ExitCode.USAGE

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class BadInput(BenchError):
    """Bad input found inside a command (exit code 2); the command classes print it as one line."""

    exit_code = ExitCode.USAGE


class PlanError(BenchError):
    """The requested benchmark cannot run as asked (detected before launching)."""

    exit_code = ExitCode.USAGE


class LaunchError(PlanError):
    """The launcher's environment is contradictory: every rank says so (rank unknown)."""


class CollectiveError(BenchError):
    exit_code = ExitCode.NCCL_ERROR


class GraphCaptureError(CollectiveError):
    """Capturing the timed ops (or the check's op) into a CUDA graph failed (-G): its name
    in a run's error line tells a caller such as `tune` that eager timing may still work."""


class TimeoutExpired(BenchError):
    """A step did not finish within its timeout (the Python API's `timeout`, -T): every rank
    that can still run raises it with the same message, naming the ranks that never arrived."""

    exit_code = ExitCode.TIMEOUT


class RankFailures(BenchError):
    """Set-up failed on some ranks; every rank knows it and leaves with the same code. The
    lines (one per distinct failure) were already printed by the one rank that speaks for
    all, so nothing is printed again."""

    def __init__(self, lines: list[str], exit_code: int):
        super().__init__("; ".join(lines), exit_code)
        self.lines = lines


class PeerLost(RankFailures):
    """This rank stopped because a peer died (ncclbench.launch.stop); the dead rank is named
    by whoever saw the death (the -g launcher, or rank 0's line): exit 3, nothing printed again."""

    def __init__(self, message: str):
        super().__init__([message], ExitCode.NCCL_ERROR)


class PreflightError(BenchError):
    """A preflight check failed (ncclbench.preflight): one line naming the group, collective
    and rank or host. Exit code 1 like a regression; 7 when data arrived wrong; 4 on a timeout."""

    exit_code = ExitCode.REGRESSION


class FleetError(BenchError):
    """A fleet run found nodes to drain or slow links (ncclbench.fleet): one line naming them."""

    exit_code = ExitCode.REGRESSION


class Interrupted(BenchError):
    """Ctrl-C or SIGTERM before a report began (nothing of it measured): one line, exit 130."""

    exit_code = ExitCode.INTERRUPTED


# What stops a run in order (rows kept, summary written): a scheduler's or `timeout`'s
# SIGTERM, a closed terminal's SIGHUP, Ctrl-C.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a batch scheduler, `timeout`, a closed terminal) turned into the
    same orderly stop as Ctrl-C: rows so far kept and summarized."""

    def __init__(self, signal_name: str):
        super().__init__(signal_name)
        self.signal_name = signal_name


def error_line(message: str) -> str:
    """The one line a failing run ends with, whatever the subcommand: `ncclbench: error: <message>`."""
    return f"ncclbench: error: {message}"


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """The first line of an exception's message, cut to `limit` characters, or the
    exception's type name when it has no message (for one-line error reports)."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line[:limit] if limit else line


def interruption_message(exc: KeyboardInterrupt) -> str:
    if isinstance(exc, Terminated):
        return f"terminated by {exc.signal_name}"
    return "interrupted by the user (Ctrl-C)"


def ranks_list(ranks, limit: int = 8) -> str:
    """Ranks in few characters however many: `0-7,9`, `1,4`, and past `limit` runs of them
    `0,2,4,6,8,10,12,14 and 42 more` (an error line that names 99 ranks stays one short line)."""
    ranks = sorted(set(ranks))
    parts, counts, start = [], [], 0
    for i in range(1, len(ranks) + 1):
        if i == len(ranks) or ranks[i] != ranks[i - 1] + 1:
            a, b = ranks[start], ranks[i - 1]
            if b == a + 1:  # two in a row read better as a pair
                parts += [str(a), str(b)]
                counts += [1, 1]
            else:
                parts.append(str(a) if a == b else f"{a}-{b}")
                counts.append(b - a + 1)
            start = i
    if len(parts) <= limit:
        return ",".join(parts)
    return ",".join(parts[:limit]) + f" and {sum(counts[limit:])} more"

