"""Starting one node's ranks the way torchrun does, without importing torch.

torchrun's agent lives in the process that starts it, so a launcher that used it paid
the torch import (3-4 s on a GPU host) before its ranks could begin paying their own.
This module gives each rank exactly the environment torchrun's local agent gives it
(torch/distributed/elastic/agent/server/local_elastic_agent.py, `_start_workers`) and
keeps its process layout and failure handling:

  - each rank is `python -u -m ncclbench ...` in a session of its own (start_new_session,
    as torchrun's SubprocessHandler), so a terminal's Ctrl-C reaches the launcher alone,
    which forwards it; signals go to the rank's whole process group;
  - SIGINT, SIGTERM and SIGHUP to the launcher are forwarded once, then it waits for
    the ranks (up to SHUTDOWN_S, then SIGKILL) and ignores repeats; exit 130;
  - when a rank exits non-zero, the others get FAILURE_GRACE_S to end on their own
    (they usually reached the same verdict) and are then terminated like torchrun's
    agent does (SIGTERM, SHUTDOWN_S, SIGKILL); the run's code is launch.exit_code_of_failure
    of every rank that failed.

The difference: torchrun's agent hosts the rendezvous store; here rank 0 hosts it (as
under torch's env:// rendezvous, TORCHELASTIC_USE_AGENT_STORE=False) on a port this
launcher chose and keeps reserved (bound, not listening, SO_REUSEADDR) until the ranks end:
no other program's bind or outgoing connection can take it meanwhile."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass

from ncclbench.errors import STOP_SIGNALS, BenchError, ExitCode

SHUTDOWN_S = 30.0       # torchrun's agent waits this long for terminated ranks before SIGKILL
FAILURE_GRACE_S = 0.5   # a failed rank's peers get this long to end by themselves
POLL_S = 0.05
MASTER_ADDR = "127.0.0.1"


@dataclass
class RankExit:
    """How one rank ended (the fields launch.describe_failures reads from torchrun's ProcessFailure)."""

    rank: int
    pid: int
    exitcode: int  # negative: killed by that signal

    def signal_name(self) -> str:
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"


class _Stopped(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def rank_environ(base: dict, local_rank: int, nprocs: int, master_port: int, run_id: str) -> dict:
    """`base` plus what torchrun's local agent sets for local rank `local_rank` of a
    one-node world of `nprocs` (no restarts, role "default")."""
    env = dict(base)
    env.update({
        "RANK": str(local_rank),
        "LOCAL_RANK": str(local_rank),
        "GROUP_RANK": "0",
        "ROLE_RANK": str(local_rank),
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": str(nprocs),
        "WORLD_SIZE": str(nprocs),
        "GROUP_WORLD_SIZE": "1",
        "ROLE_WORLD_SIZE": str(nprocs),
        "MASTER_ADDR": MASTER_ADDR,
        "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_USE_AGENT_STORE": "False",  # rank 0 hosts the store (env:// rendezvous)
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "TORCHELASTIC_ERROR_FILE": "",  # torchrun's value without a log folder: no error files
    })
    return env


def reserve_port() -> socket.socket:
    """A socket bound to a free port with SO_REUSEADDR and not listening: rank 0's store
    (SO_REUSEADDR too) can bind and listen there, nothing else can while it is held."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("", 0))
    return sock


def start_ranks(nprocs: int, command: list[str]) -> int:
    """Run `command` as ranks 0..nprocs-1 of a one-node world; the run's exit code."""
    from ncclbench.launch.launcher import describe_failures, exit_code_of_failure, say

    procs: dict[int, subprocess.Popen] = {}
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}

    def stop(signum, _frame):
        raise _Stopped(signum)

    try:
        reservation = reserve_port()
    except OSError as exc:
        raise BenchError(f"could not reserve a port for the ranks' rendezvous: {exc.strerror or exc}",
                         ExitCode.NCCL_ERROR) from None
    try:
        for sig in STOP_SIGNALS:
            signal.signal(sig, stop)
        port, run_id = reservation.getsockname()[1], uuid.uuid4().hex
        try:
            for rank in range(nprocs):
                procs[rank] = subprocess.Popen(command, env=rank_environ(dict(os.environ), rank, nprocs, port, run_id),
                                               start_new_session=True)
            failures = watch(procs)
        except _Stopped as stopped:
            signal_ranks(procs, stopped.signum)
            outlive(procs)
            return ExitCode.INTERRUPTED  # the ranks got the same signal and said so
        except OSError as exc:  # fork or exec failed (no memory, no such interpreter)
            signal_ranks(procs, signal.SIGTERM)
            outlive(procs)
            raise BenchError(f"could not start the ranks: {exc.strerror or exc}", ExitCode.NCCL_ERROR) from None
    finally:
        reservation.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not failures:
        return ExitCode.OK
    for line in describe_failures(failures):
        say(f"error: {line}")
    return exit_code_of_failure(failures)


def watch(procs: dict[int, subprocess.Popen]) -> dict[int, RankExit]:
    """Wait until every rank succeeded, or one failed and the rest were ended; the failures."""
    running, failures = dict(procs), {}
    while running:
        before = len(running)
        wait_for_an_exit()
        _collect(running, failures)
        if len(running) == before:  # some other child of this process ended: no busy loop on it
            time.sleep(POLL_S)
        if failures:
            deadline = time.monotonic() + FAILURE_GRACE_S
            while running and time.monotonic() < deadline:
                time.sleep(POLL_S)
                _collect(running, failures)
            signal_ranks(running, signal.SIGTERM)
            end_within(running, SHUTDOWN_S)
            _collect(running, failures)
    return failures


def _collect(running: dict[int, subprocess.Popen], failures: dict[int, RankExit]) -> None:
    for rank, proc in list(running.items()):
        code = proc.poll()
        if code is not None:
            del running[rank]
            if code != 0:
                failures[rank] = RankExit(rank, proc.pid, code)


def wait_for_an_exit() -> None:
    """Block until some child has ended (without reaping it: Popen.poll does that), or a
    short while where waitid is missing. A signal's handler raising ends the wait."""
    if not hasattr(os, "waitid"):
        time.sleep(POLL_S)
        return
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        pass


def signal_ranks(procs: dict[int, subprocess.Popen], signum: int) -> None:
    """`signum` to each live rank's process group (the rank and whatever it started)."""
    for proc in procs.values():
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass


def end_within(procs: dict[int, subprocess.Popen], seconds: float) -> None:
    """Wait up to `seconds` for the ranks to end, then SIGKILL the ones left."""
    deadline = time.monotonic() + seconds
    while any(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    signal_ranks(procs, signal.SIGKILL)
    for proc in procs.values():
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            pass  # stuck in the kernel (a wedged GPU driver call): nothing more to do from here


def outlive(procs: dict[int, subprocess.Popen]) -> None:
    """After an interrupt: outlive the ranks, so that a scheduler that ends a job step with
    its launched process does not cut rank 0's summary short; repeated signals are ignored."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda _signum, _frame: None)
    end_within(procs, SHUTDOWN_S)
