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
  - the first rank seen failing is the cause. Killed by a signal (it could say nothing),
    it is named here, with what it was running (each rank keeps that in a shared page), and
    the others are told at once to stop (ncclbench.launch.stop: a line on a pipe of their
    own; they abort their communicators, which a signal cannot do for a rank stuck inside
    NCCL, and end with "stopped after rank N died"). A rank that exited with a code said
    its reason itself; the others get FAILURE_GRACE_S to end on their own, then the same
    stop. A rank still running STOP_GRACE_S after the stop is killed, and said to have been;
    the run's code is failures.exit_code_of_failure of every rank that failed. Nothing a rank
    started outlives the run: every rank's process group gets SIGKILL at the end.

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

from ncclbench import procs as proctable
from ncclbench.errors import STOP_SIGNALS, BenchError, ExitCode, ranks_list
from ncclbench.launch.failures import exit_code_of_failure, say
from ncclbench.launch.stop import DOING_BYTES, DOING_FD_ENV, STOP_FD_ENV, PeerDeath

SHUTDOWN_S = 30.0       # torchrun's agent waits this long for terminated ranks before SIGKILL
FAILURE_GRACE_S = 0.5   # a rank that failed with a code of its own: its peers get this long to end by themselves
STOP_GRACE_S = 10.0     # after the stop: how long a rank gets to end before it is killed
TIMEOUT_GRACE_S = 3.0   # after a rank's -T exit: the others name the hung rank and end within this (engine.hang)
POLL_S = 0.05
NAMED_DEATHS = 3        # ranks killed by signals named one by one in the launcher's line; the rest as a range
MASTER_ADDR = "127.0.0.1"


@dataclass
class RankExit:
    """How one rank ended (the fields failures.describe_failures reads from torchrun's ProcessFailure)."""

    rank: int
    pid: int
    exitcode: int  # negative: ended by that signal
    doing: str | None = None   # what it ran last, from its page
    after_cause: bool = False  # ended after the first failure was seen: a consequence of it
    killed_here: bool = False  # SIGKILLed by this launcher, having not stopped within STOP_GRACE_S
    state: str | None = None   # its /proc state letter when this launcher killed it

    def signal_name(self) -> str:
        try:
            return signal.Signals(-self.exitcode).name
        except ValueError:
            return f"signal {-self.exitcode}"

    def death(self) -> PeerDeath:
        """This failure as told to the ranks still running."""
        how = f"was killed by {self.signal_name()}" if self.exitcode < 0 else f"exited with code {self.exitcode}"
        during = f" during {self.doing}" if self.doing else ""
        return PeerDeath(self.rank, f"rank {self.rank} (pid {self.pid}) on {socket.gethostname()} {how}{during}",
                         said_own=self.exitcode > 0)


class RankChannel:
    """The launcher's two lines to one rank (ncclbench.launch.stop): a pipe that carries the
    stop, and a shared page where the rank keeps what it runs now, read when it has died."""

    def __init__(self):
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.write_end, False)  # a rank that never reads must not block the launcher
        self.page = None
        try:
            self.page = os.memfd_create("ncclbench-doing")
            os.ftruncate(self.page, DOING_BYTES)
        except (AttributeError, OSError):  # no memfd here: the lines go without what the rank ran
            self.page = None

    def environ(self) -> dict:
        env = {STOP_FD_ENV: str(self.read_end)}
        if self.page is not None:
            env[DOING_FD_ENV] = str(self.page)
        return env

    def fds(self) -> tuple[int, ...]:
        return (self.read_end,) if self.page is None else (self.read_end, self.page)

    def started(self) -> None:
        os.close(self.read_end)
        self.read_end = -1

    def doing(self) -> str | None:
        if self.page is None:
            return None
        try:
            return os.pread(self.page, DOING_BYTES, 0).split(b"\0", 1)[0].decode(errors="replace") or None
        except OSError:
            return None

    def tell(self, death: PeerDeath) -> None:
        try:
            os.write(self.write_end, (death.line() + "\n").encode())
        except OSError:  # the rank is gone, or its pipe is full
            pass

    def close(self) -> None:
        for fd in (self.read_end, self.write_end, self.page):
            if fd is not None and fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


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
    procs: dict[int, subprocess.Popen] = {}
    channels: dict[int, RankChannel] = {}
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
                channels[rank] = channel = RankChannel()
                env = rank_environ(dict(os.environ), rank, nprocs, port, run_id)
                env.update(channel.environ())
                procs[rank] = subprocess.Popen(command, env=env, start_new_session=True, pass_fds=channel.fds())
                channel.started()
            failures = _Watch(procs, channels).run()
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
        clear_groups(procs)
        for channel in channels.values():
            channel.close()
    if not failures:
        return ExitCode.OK
    for line in describe_exits(failures):
        say(f"error: {line}")
    return exit_code_of_failure({f.rank: f for f in failures})


class _Watch:
    """Waits for the ranks. The first failure seen is the cause; the ranks still running
    are then told to stop (at once after a death by a signal, FAILURE_GRACE_S after an
    exit with a code), and killed if they have not ended STOP_GRACE_S later."""

    def __init__(self, procs: dict[int, subprocess.Popen], channels: dict[int, RankChannel]):
        self.running, self.channels = dict(procs), channels
        self.exits: list[RankExit] = []  # every rank that ended non-zero, in the order seen
        self.cause: RankExit | None = None
        self.stop_at: float | None = None  # when the stop goes out
        self.stopped_at: float | None = None  # when it went out

    def run(self) -> list[RankExit]:
        while self.running:
            if self.cause is None:
                before = len(self.running)
                wait_for_an_exit()
                self._collect()
                if len(self.running) == before:  # some other child of this process ended: no busy loop on it
                    time.sleep(POLL_S)
            else:
                time.sleep(POLL_S)
                self._collect()
            self._act()
        return self.exits

    def _collect(self, killed_here: bool = False, states: dict | None = None) -> None:
        seen = []
        for rank, proc in list(self.running.items()):
            code = proc.poll()
            if code is None:
                continue
            del self.running[rank]
            if code != 0:
                seen.append(RankExit(rank, proc.pid, code, self.channels[rank].doing(),
                                     after_cause=self.cause is not None, killed_here=killed_here,
                                     state=(states or {}).get(rank)))
        seen.sort(key=lambda e: e.exitcode >= 0)  # in one look, a death by a signal first: no exit code caused it
        self.exits += seen
        if seen and self.cause is None:
            self.cause = seen[0]
            self.stop_at = time.monotonic() + (0.0 if self.cause.exitcode < 0 else FAILURE_GRACE_S)
            if self.cause.exitcode == ExitCode.TIMEOUT:  # the ranks name the hung one themselves
                self.stop_at = time.monotonic() + TIMEOUT_GRACE_S

    def _act(self) -> None:
        now = time.monotonic()
        if self.stop_at is not None and now >= self.stop_at:
            self.stop_at, self.stopped_at = None, now
            if self.cause.exitcode == ExitCode.TIMEOUT:
                self.stopped_at -= STOP_GRACE_S  # no stop to tell: a rank still here did not end after the timeout
            else:
                death = self.cause.death()
                for rank in self.running:
                    self.channels[rank].tell(death)
        if self.stopped_at is not None and self.running and now - self.stopped_at >= STOP_GRACE_S:
            states = {rank: proctable.state(proc.pid) for rank, proc in self.running.items()}
            signal_ranks(self.running, signal.SIGKILL)
            for proc in self.running.values():
                try:
                    proc.wait(timeout=SHUTDOWN_S)
                except subprocess.TimeoutExpired:
                    pass  # stuck in the kernel (a wedged GPU driver call): nothing more to do from here
            self._collect(killed_here=True, states=states)
            self.running.clear()


def describe_exits(exits: list[RankExit]) -> list[str]:
    """The launcher's line about a failed run, or none where the ranks said it all: the
    ranks that died by a signal before anything else failed (they could say nothing), with
    what they ran; the ranks that then stopped; and any that ended otherwise after it
    (killed here for not stopping in time, or by a signal while they stopped)."""
    causes = [e for e in exits if not e.after_cause]
    later = [e for e in exits if e.after_cause]
    if causes and causes[0].exitcode == ExitCode.TIMEOUT:
        return _after_timeout(later)
    killed = [e for e in causes if e.exitcode < 0]
    odd = [e for e in later if e.exitcode < 0]
    if not causes or not killed and not odd:
        return []  # every failed rank said its own reason
    first = causes[0]
    gone = "died" if first.exitcode < 0 else "failed"
    parts = [e.death().text for e in killed[:NAMED_DEATHS]]
    if len(killed) > NAMED_DEATHS:  # an out-of-memory kill of 99 ranks is one short line
        parts.append(f"{_ranks_text([e.rank for e in killed[NAMED_DEATHS:]])} were killed by signals too")
    stopped = [e.rank for e in later if e.exitcode > 0]
    if stopped:
        parts.append(f"{_ranks_text(stopped)} stopped after rank {first.rank} {gone}")
    if len(odd) > NAMED_DEATHS:
        parts.append(f"{_ranks_text([e.rank for e in odd])} ended by signals while they stopped")
        odd = []
    for e in odd:
        if e.killed_here:
            parts.append(f"rank {e.rank} (pid {e.pid}) did not stop within {STOP_GRACE_S:g} s after rank "
                         f"{first.rank} {gone} and was killed by ncclbench (SIGKILL)")
        else:
            parts.append(f"rank {e.rank} (pid {e.pid}) ended by {e.signal_name()} while it stopped")
    parts.append("rows finished before it are kept, the run is incomplete")
    return ["; ".join(parts)]


def _after_timeout(later: list[RankExit]) -> list[str]:
    """After a -T timeout the ranks named the hung rank (engine.hang); this launcher adds
    only the ranks it had to kill, with the state they were in."""
    host = socket.gethostname()
    return [f"rank {e.rank} (pid {e.pid}) on {host}, {proctable.state_text(e.state)}, did not end after the timeout "
            "and was killed by ncclbench (SIGKILL)" for e in later if e.killed_here]


def _ranks_text(ranks: list[int]) -> str:
    """`rank 0`, `ranks 0,2`, `ranks 0-2`, `ranks 0-2,5,7 and 40 more`."""
    return f"rank{'s' if len(set(ranks)) > 1 else ''} {ranks_list(ranks)}"


def clear_groups(procs: dict[int, subprocess.Popen]) -> None:
    """SIGKILL to every rank's process group once the ranks have ended: whatever a rank
    started (a helper it forked, a tool it ran) does not outlive the run."""
    for proc in procs.values():
        if proc.poll() is None:
            continue  # still running (stuck in the kernel): its group is its own
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


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
