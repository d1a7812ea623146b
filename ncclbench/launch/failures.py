"""How a launcher tells what its ranks' failures mean: the run's exit code and the lines it
says about ranks that could say nothing themselves. Shared by both launchers, torchrun's
agent (launcher.py) and the -g launcher (spawn.py), and read through the fields of
torchrun's ProcessFailure (exitcode, pid, signal_name(), hostname), which spawn's RankExit
mirrors."""

from __future__ import annotations

import signal
import socket
import sys

from ncclbench.errors import ExitCode


def exit_code_of_failure(failures: dict) -> int:
    """Rank 0's code when it exited with one (it knows the run's outcome), else the lowest
    rank's positive code; only ranks killed by signals count as a lost peer (NCCL error).
    A rank 0 that says "interrupted" while another rank was killed by a signal was
    terminated by the agent because of that loss (this launcher got no signal itself,
    or it would not be here): the run's code is the lost peer's."""
    ordered = sorted(failures.items())
    killed = any(failure.exitcode < 0 and -failure.exitcode not in (signal.SIGTERM, signal.SIGHUP)
                 for _rank, failure in ordered)  # not the agent's own SIGTERM
    for rank, failure in ordered:
        if rank == 0 and failure.exitcode == ExitCode.INTERRUPTED and killed:
            return ExitCode.NCCL_ERROR
        if rank == 0 and failure.exitcode > 0:
            return failure.exitcode
    for _rank, failure in ordered:
        if failure.exitcode > 0:
            return failure.exitcode
    return ExitCode.NCCL_ERROR


def describe_failures(failures: dict) -> list[str]:
    """One line per rank that died from a signal (the ranks explain their own exit codes);
    SIGTERM is the launcher tearing down the survivors, not news. After a -T timeout (a rank
    exited with 4) a SIGKILLed rank is the stopped rank the others named and ended
    (engine.hang), said as such."""
    lines = []
    timed_out = any(f.exitcode == ExitCode.TIMEOUT for f in failures.values())
    for rank, f in sorted(failures.items()):
        if f.exitcode < 0:
            name = f.signal_name()
            if name != "SIGTERM":
                host = getattr(f, "hostname", None) or socket.gethostname()  # the agent's records name it
                if timed_out and name == "SIGKILL":
                    lines.append(f"rank {rank} (pid {f.pid}) on {host}, hung and stopped, was ended by SIGKILL "
                                 "after the timeout")
                    continue
                lines.append(f"rank {rank} (pid {f.pid}) on {host} was killed by {name}; "
                             "rows finished before it are kept, the run is incomplete")
    return lines


def say(message: str) -> None:
    print(f"ncclbench: {message}", file=sys.stderr, flush=True)
