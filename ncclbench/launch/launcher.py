"""Starting ranks: run as the rank a launcher made us, or start this node's ranks: with
torchrun's environment but without torch in this process on one node (ncclbench.launch.spawn),
through torchrun's elastic agent (torch.distributed.run) across nodes."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys

from ncclbench.errors import STOP_SIGNALS, BenchError, ExitCode, LaunchError
from ncclbench.launch.failures import describe_failures, exit_code_of_failure, say

SPAWNED_ENV = "NCCLBENCH_SPAWNED"
LAUNCHER_PID_ENV = "NCCLBENCH_LAUNCHER_PID"  # the -g launcher, the ranks' parent
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
ran_as_rank = False  # this process ran as one rank of a run (entry.main then skips the interpreter teardown)


def detect(explicit: dict | None = None):
    """This process's LaunchInfo; PlanError on a contradictory environment."""
    from ncclbench.launch.env import detect as detect_env
    from ncclbench.launch.variables import LaunchEnvError

    try:
        return detect_env(os.environ, explicit=explicit or None)
    except LaunchEnvError as exc:
        raise LaunchError(str(exc)) from exc


def prepare_environ(info) -> None:
    from ncclbench.launch.env import apply_to_environ
    from ncclbench.launch.variables import LaunchEnvError

    global ran_as_rank
    ran_as_rank = True
    try:
        apply_to_environ(info, os.environ)
    except LaunchEnvError as exc:
        raise LaunchError(str(exc)) from exc
    end_with_launcher()
    from ncclbench.launch import stop

    stop.start(info.rank)  # a thread that ends this rank when a peer dies while it is stuck in C code
    from ncclbench.launch import watch

    if info.world_size > 1:  # a process that ends this rank if the job ended while it could not (stopped)
        watch.start(info.rank)


def end_with_launcher() -> None:
    """A rank that ncclbench's own launcher (-g) started gets SIGTERM when that launcher
    dies, even by SIGKILL (the OOM killer, `kill -9`), and then stops like any terminated
    run, rows kept, instead of living on as an orphan holding its GPU. Linux only; ranks
    of srun, mpirun or an outside torchrun are left to their launcher."""
    launcher = os.environ.get(LAUNCHER_PID_ENV)
    if not launcher or not os.environ.get(SPAWNED_ENV) or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(launcher):  # it died before the request was in place
        os.kill(os.getpid(), signal.SIGTERM)


@contextlib.contextmanager
def environ_changed(changes: dict):
    """os.environ with `changes` applied (a None value removes the variable), put back as it
    was afterwards: a suite's or tune's env block for the launches it starts, or one
    combination's NCCL settings for the communicator made under it."""
    saved = {name: os.environ.get(name) for name in changes}
    try:
        _apply(changes)
        yield
    finally:
        _apply(saved)


def _apply(values: dict) -> None:
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def spawn_local(nprocs: int, argv: list[str], nnodes: int = 1, node_rank: int = 0,
                rdzv_endpoint: str | None = None, rdzv_timeout_s: int | None = None) -> int:
    """Run `python -m ncclbench <argv>` as `nprocs` ranks on this node and return the exit
    code that best describes what happened. One node: started here (start_ranks); several:
    through torchrun's elastic agent, whose rendezvous joins the nodes (waiting for them up
    to `rdzv_timeout_s`, torchrun's 600 s when None)."""
    from ncclbench import startup

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # what torchrun sets for several ranks, minus its warning
    os.environ[SPAWNED_ENV] = "1"
    os.environ[LAUNCHER_PID_ENV] = str(os.getpid())
    os.environ[startup.LAUNCH_TIME_ENV] = f"{startup.own_start():.3f}"
    if nnodes > 1 or rdzv_endpoint:
        return spawn_with_torchrun(nprocs, argv, nnodes, node_rank, rdzv_endpoint, rdzv_timeout_s)
    from ncclbench.launch.spawn import start_ranks

    return start_ranks(nprocs, [sys.executable, "-u", "-m", "ncclbench", *argv])


def spawn_with_torchrun(nprocs: int, argv: list[str], nnodes: int, node_rank: int,
                        rdzv_endpoint: str | None, rdzv_timeout_s: int | None = None) -> int:
    """The ranks of one node of a multi-node run, under torchrun's elastic agent."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # static rendezvous: node 0 hosts the store at the endpoint, like torchrun's
    # --master-addr/--master-port form, so --node-rank is honoured
    host, _, port = (rdzv_endpoint or "127.0.0.1:29500").rpartition(":")
    targs = ["--nproc-per-node", str(nprocs), "--max-restarts", "0", "--nnodes", str(nnodes),
             "--node-rank", str(node_rank), "--master-addr", host, "--master-port", port,
             *(["--rdzv-conf", f"timeout={int(rdzv_timeout_s)}"] if rdzv_timeout_s else []),
             "--module", "ncclbench", *argv]
    if not os.environ.get("NCCLBENCH_VERBOSE"):
        quiet_torchrun_logs()
    interrupted = False
    try:
        run(parse_args(targs))
    except (SignalException, KeyboardInterrupt):
        interrupted = True  # nothing that can be interrupted again here
    except ChildFailedError as exc:
        for line in describe_failures(exc.failures):
            say(f"error: {line}")
        return exit_code_of_failure(exc.failures)
    except Exception as exc:  # noqa: BLE001 - the agent itself failed (rendezvous, ports)
        raise BenchError(f"torchrun could not start the ranks: {str(exc).splitlines()[0]}",
                         ExitCode.NCCL_ERROR) from exc
    while interrupted:
        try:
            outlive_ranks()
            return ExitCode.INTERRUPTED  # the ranks got the same signal and said so
        except (SignalException, KeyboardInterrupt):
            continue  # one more, before outlive_ranks ignores them
    return ExitCode.OK


def outlive_ranks(limit_s: float = 30.0) -> None:
    """After an interrupt, wait for the ranks to end before the launcher does. torchrun's
    agent forwards the signal and waits for them, but its handler raises again on each
    further signal (a second Ctrl-C, repeated SIGTERMs) and cuts that wait short: the
    launcher then returned while rank 0 was still writing its summary, and a scheduler that
    ends a job step with its launched process can lose it. Further signals are ignored
    here; ranks still alive after `limit_s` (the agent's own shutdown wait) are killed."""
    import time

    import psutil

    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda _signum, _frame: None)
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no ranks left
        if pid == 0:
            time.sleep(0.05)
    for child in psutil.Process().children():
        try:
            child.kill()
        except psutil.Error:
            pass


def quiet_torchrun_logs() -> None:
    """The elastic agent logs each failed child with a traceback-like dump and each signal
    it forwards; the ranks already said what went wrong, on one line."""
    import torch.distributed.run  # noqa: F401 - creates the elastic loggers

    for name in list(logging.root.manager.loggerDict):
        if name.startswith(("torch.distributed.elastic", "torch.distributed.run")):
            logging.getLogger(name).setLevel(logging.CRITICAL)
