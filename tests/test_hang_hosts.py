"""Hangs across hosts (tests/netsim.py, one rank per simulated host).

Every host cleaned up (launch.watch): a rank alone on host 1 stopped by SIGSTOP mid-sweep,
under each launcher a user has (ncclbench's own -g 1 --nnodes 2, the user's torchrun on each
host, each rank a process with srun's or mpirun's variables): host 0 names it within -T + 5 s,
host 1 says that its rank was ended and why, and no process is left on either host within
-T + 15 s (with slack for a loaded 2-core machine). Before, host 0 named it and host 1 kept
the stopped rank (and its launcher) until an outer timeout; planted again with the watcher
turned off (NCCLBENCH_WATCH=0), the stopped rank stays.

A GPU that stalls is named (marked gpu; 2 hosts on one GPU under MPS, NCCL over sockets
between them): held before the 6th timed op (eager, -G, CuPy) or before the op that connects
the ranks, and the issue's other rows (a rank stopped under either launcher, a link down);
each prints a HANG-TABLE line (scripts/gpu_hang_check.sh gathers them)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROOT, cli_command
from ncclbench.launch import watch

sys.path.insert(0, str(ROOT / "tests"))
import netsim  # noqa: E402

REASON = netsim.why_not()
rig = pytest.mark.skipif(REASON is not None, reason=REASON or "")

T = 5
SLACK = 10  # a loaded 2-core machine: the watchdog threads and the launchers wait for a core
ARGS = ["allreduce", "--backend", "gloo", "-b", "1K", "-e", "256K", "-f", "2", "-n", "5", "-N", "0", "-T", str(T),
        "--no-save"]
PID_RE = re.compile(r"Rank\s+(\d+) Group\s+\d+ Pid\s+(\d+)")
ROW_RE = re.compile(r"^\s+\d+\s+\d+\s")


class Host:
    """One simulated host's first process: its stdout and stderr lines, each with its wall-clock time."""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.out, self.err = proc, [], []
        threading.Thread(target=self._read, args=(proc.stdout, self.out), daemon=True).start()
        threading.Thread(target=self._read, args=(proc.stderr, self.err), daemon=True).start()

    @staticmethod
    def _read(stream, into):
        for line in stream:
            into.append((time.time(), line.rstrip("\n")))

    def errors(self):
        return [(t, x) for t, x in self.err if x.startswith("ncclbench: error")]

    def tail(self, n=30):
        return "\n".join(x for _, x in (self.out[-10:] + self.err[-n:]))


class Outcome:
    """A fault on host 1 and what followed: the naming line on host 0, host 1's lines, and
    the seconds from the fault to the naming line and to no process left on either host."""

    def __init__(self, hosts, pid, named, to_name, gone, at=None):
        self.hosts, self.pid, self.named, self.to_name, self.gone = hosts, pid, named, to_name, gone
        self.at = at  # when the fault came (wall clock)

    def line(self) -> str:
        assert len(self.named) == 1, self.hosts[0].tail()
        return self.named[0][1]

    def ended_on_host_1(self) -> list[str]:
        """The watcher's lines about host 1's rank (on host 1's stderr; under Open MPI's
        mpirun, its daemon on host 1 forwards them to mpirun's on host 0)."""
        return [x for h in self.hosts for _, x in h.errors() if "was ended by ncclbench" in x and " on simnode1," in x]

    def table(self, fault: str, how: str, what: str) -> str:
        clause = self.line().split("(-T): ", 1)[-1].split("; ")[0]
        return (f"HANG-TABLE | {fault} | {how} | {what} | named after {self.to_name:.1f} s | "
                f"gone after {self.gone:.1f} s | {clause}" if self.gone is not None else
                f"HANG-TABLE | {fault} | {how} | {what} | named after {self.to_name:.1f} s | NOT gone | {clause}")


def run_fault(fleet, how: str, args: list, fault: str, port: int, env=None, rows: int = 3, limit_s: float = 60,
              stamps=None, start_s: float = 180) -> Outcome:
    """Start the job (one rank per host) and plant `fault` on host 1: `stop` (SIGSTOP to rank
    1 once `rows` rows are out), `link` (host 1's link down then), or `planted` (a failpoint
    in `env`, timed from its stamp in the folder `stamps`). Follows both hosts until no process
    is left on either (at most `limit_s` after the fault)."""
    procs = fleet.launch(how, args, 1, port=port, ncclbench=cli_command(), env=dict(os.environ, **(env or {})))
    hosts = [Host(p) for p in procs]
    deadline, pids, at = time.time() + start_s, {}, None
    while at is None and time.time() < deadline:
        lines = [x for _, x in hosts[0].out]
        pids = {int(r): int(p) for m in map(PID_RE.search, lines) if m for r, p in [m.groups()]}
        if fault == "planted":
            found = [f for f in os.listdir(stamps)] if stamps else []
            at = float(open(os.path.join(stamps, found[0])).read()) if found else None
        elif 1 in pids and sum(1 for x in lines if ROW_RE.match(x)) >= rows:
            if fault == "stop":
                os.kill(pids[1], signal.SIGSTOP)
            else:
                fleet.link_down(1)
            at = time.time()
        if at is None:
            assert all(p.poll() is None for p in procs), hosts[0].tail()
            time.sleep(0.1)
    assert at is not None, "the fault never came: " + hosts[0].tail()
    gone = None
    while time.time() - at < limit_s:
        if not netsim.pids_in(fleet.spaces[0]) and not netsim.pids_in(fleet.spaces[1]):
            gone = time.time() - at
            break
        time.sleep(0.2)
    time.sleep(0.3)
    named = [(t, x) for t, x in hosts[0].errors() if "timeout:" in x and "was ended by ncclbench" not in x]
    return Outcome(hosts, pids.get(1), named, named[0][0] - at if named else None, gone, at)


LAUNCHERS = {"spawn": 29711, "torchrun": 29712, "slurm": 29713, "mpi": 29714, "mpirun": 29715}


@rig
@pytest.mark.slow
@pytest.mark.parametrize("how", list(LAUNCHERS))
def test_a_stopped_rank_on_host_1_is_named_and_no_process_stays_on_any_host(how):
    """`slurm` and `mpi`: each rank a process with those launchers' variables; `mpirun`: Open
    MPI's own mpirun on host 0 and its daemon on host 1 (where it is installed)."""
    if how == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("Open MPI's mpirun is not installed (scripts/ci/install_cluster_tools.sh)")
    with netsim.SimFleet(2) as fleet:
        run = run_fault(fleet, how, ARGS, "stop", LAUNCHERS[how], limit_s=3 * T + 30)
    pid, line = run.pid, run.line()
    assert re.search(rf"\(-T\): rank 1 \(pid {pid}\) on simnode1 did not answer", line), line
    assert "; rank 0 waited for rank 1 at " in line, line
    ended = run.ended_on_host_1()
    assert len(ended) == 1 and re.fullmatch(
        rf"ncclbench: error: rank 1 \(pid {pid}\) on simnode1, stopped \(state T: SIGSTOP or SIGTSTP\), was ended "
        r"by ncclbench \(SIGKILL\): the run named it as the cause \(timeout: .* did not finish within 5 s \(-T\): "
        rf"rank 1 \(pid {pid}\) on simnode1 did not answer .*\)", ended[0]), run.hosts[-1].tail()
    assert run.gone is not None, run.hosts[0].tail()
    print(run.table("rank 1 stopped (SIGSTOP)", how, "gloo, CPU"))
    assert run.to_name < T + 5 + SLACK and run.gone < T + 15 + SLACK, (run.to_name, run.gone)
    assert run.hosts[0].proc.returncode in (1, 4, 137)  # torchrun's agent: 1 for a failed rank; mpirun: 137


@rig
@pytest.mark.slow
def test_without_the_watcher_the_stopped_rank_stays():
    """The plant for the test above: the same fault with no watcher started leaves host 1's
    stopped rank (and its launcher) there long after host 0 named it."""
    with netsim.SimFleet(2) as fleet:
        run = run_fault(fleet, "spawn", ARGS, "stop", 29730, env={watch.ENV: "0"}, limit_s=3 * T + 30)
        left = netsim.pids_in(fleet.spaces[1])
    assert len(run.named) == 1 and run.gone is None and run.pid in left, (run.named, run.gone, left)


@rig
@pytest.mark.slow
def test_a_rank_stopped_while_it_sets_up_is_ended_on_its_host_too():
    """Rank 1 (alone on host 1) stopped inside its first set-up step (device_freeze): rank 0
    says it did not finish within -T, and rank 1's watcher, told by the set-up's verdict,
    ends it; nothing stays on either host."""
    with netsim.SimFleet(2) as fleet:
        procs = fleet.launch("spawn", ARGS, 1, port=29735, ncclbench=cli_command(),
                             env=dict(os.environ, NCCLBENCH_FAULT="device_freeze:rank=1"))
        hosts = [Host(p) for p in procs]
        started, gone = time.time(), None
        while time.time() - started < 120:
            if not netsim.pids_in(fleet.spaces[0]) and not netsim.pids_in(fleet.spaces[1]):
                gone = time.time() - started
                break
            time.sleep(0.2)
        time.sleep(0.3)
    said = [x for _, x in hosts[0].errors()]
    assert any(re.search(r"rank 1 did not finish setting up the device within 5 s \(-T\)", x) for x in said), said
    ended = [x for _, x in hosts[1].errors() if "was ended by ncclbench" in x]
    assert len(ended) == 1 and "stopped (state T" in ended[0] and "the run named it as the cause" in ended[0], \
        hosts[1].tail()
    assert gone is not None, hosts[0].tail()
    print(f"rank 1 stopped in set-up: all gone {gone:.1f} s after the launch (-T {T})")


# ---- on one GPU (or more): 2 hosts, NCCL over sockets between them ---------------------------------
def _gpus() -> list[str] | None:
    """Each host's GPU: its own where the machine has 2, else both on GPU 0 (under MPS)."""
    try:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001
        n = 0
    return None if n < 1 else (["0", "1"] if n >= 2 else ["0", "0"])


GPU_T = 10
GPU_SWEEP = ["allreduce", "-b", "1M", "-e", "64M", "-f", "4", "-n", "20", "-N", "0", "-T", str(GPU_T), "--no-save"]
GPU_ONE_SIZE = ["allreduce", "-b", "64M", "-e", "64M", "-n", "20", "-w", "1", "-T", str(GPU_T), "--no-save"]
STALL_S = GPU_T + 5  # the planted kernel outlasts the verdict, and ends soon after (a killed MPS client's kernel runs on)
gpu_hosts = pytest.mark.skipif(_gpus() is None, reason="needs a GPU")


def _gpu_fleet():
    gpus = _gpus()
    return netsim.SimFleet(2, gpus=gpus, mps=bool(netsim.shared_gpus(gpus)))


def _kernel_over(run: Outcome) -> None:
    """Wait until the planted kernel has ended: a GPU shared under MPS stays busy to new
    clients (the next test's hosts) while a killed client's kernel runs on."""
    if run.at is not None:
        time.sleep(max(0.0, run.at + STALL_S + 1 - time.time()))


def _gpu_bounds(run: Outcome) -> None:
    assert run.gone is not None, run.hosts[0].tail() + "\n--- host 1\n" + run.hosts[-1].tail()
    assert run.to_name < GPU_T + 5 and run.gone < GPU_T + 15, (run.to_name, run.gone)


STALL = f"gpu_stall:rank=1,size={64 << 20},at=6,seconds={STALL_S}"
STALL_CASES = {"nccl, eager": [], "nccl, -G 20 (graph replays)": ["-G", "20", "-n", "1"],
               "cupy, eager": ["--backend", "cupy"]}  # what -> extra arguments


@pytest.mark.gpu
@rig
@gpu_hosts
def test_gpu_a_gpu_stalled_inside_the_timed_loop_is_named_across_hosts(tmp_path):
    """Host 1's GPU held before the 6th timed op of 64 MiB (its host issues all 20 and waits
    like host 0's): host 0 names rank 1's GPU from the loop's marks within -T + 5 s of the
    stall, and no process is left on either host within -T + 15 s. Before: "no rank was
    found behind", both ranks having issued every iteration."""
    _stall_in_loop("nccl, eager", tmp_path)


def _stall_in_loop(what: str, tmp_path) -> None:
    extra = STALL_CASES[what]
    if "cupy" in what:
        pytest.importorskip("cupy")
    fault = STALL
    with _gpu_fleet() as fleet:
        run = run_fault(fleet, "spawn", GPU_ONE_SIZE + extra, "planted", 29740,
                        env={"NCCLBENCH_FAULT": fault, "NCCLBENCH_FAULT_STAMP": str(tmp_path)}, stamps=str(tmp_path))
    _kernel_over(run)
    line = run.line()
    assert re.search(r"\(-T\): rank 1 \(pid \d+\) on simnode1: its GPU stopped in the timed loop \(out-of-place\): "
                     r"its stream has not passed the end of timed iteration 5, which the GPUs of rank 0 passed; its host "
                     r"issued \d+ of 20 .*; rank 0 waited for rank 1 at ", line), line
    print(run.table("GPU stalled before its 6th timed op", "ncclbench -g 1 --nnodes 2", what))
    _gpu_bounds(run)


@pytest.mark.gpu
@rig
@gpu_hosts
def test_gpu_a_gpu_stalled_before_the_first_op_is_named_across_hosts(tmp_path):
    """Host 1's GPU held before the op that connects the ranks: rank 1's GPU never reached
    it, named within -T + 5 s, nothing left within -T + 15 s. Before: "no rank was found
    behind" (no mark preceded that op)."""
    with _gpu_fleet() as fleet:
        run = run_fault(fleet, "spawn", GPU_ONE_SIZE, "planted", 29745,
                        env={"NCCLBENCH_FAULT": f"gpu_stall_connect:rank=1,seconds={STALL_S}",
                             "NCCLBENCH_FAULT_STAMP": str(tmp_path)}, stamps=str(tmp_path))
    _kernel_over(run)
    line = run.line()
    assert re.search(r"timeout: connecting the ranks .*\(-T\): rank 1 \(pid \d+\) on simnode1: its GPU never reached "
                     r"it \(earlier work on its stream still runs\); rank 0 waited for rank 1", line), line
    print(run.table("GPU stalled before the first op (connecting)", "ncclbench -g 1 --nnodes 2", "nccl, eager"))
    _gpu_bounds(run)


@pytest.mark.gpu
@rig
@gpu_hosts
@pytest.mark.parametrize("what", ["nccl, -G 20 (graph replays)", "cupy, eager"])
def test_gpu_a_gpu_stalled_inside_the_timed_loop_is_named_with_graphs_and_cupy(what, tmp_path):
    """The same stall with -G (a mark after each graph replay) and on the CuPy backend."""
    _stall_in_loop(what, tmp_path)


# a stopped or cut-off client's NCCL kernel may keep a GPU shared under MPS busy: these come last
@pytest.mark.gpu
@rig
@gpu_hosts
@pytest.mark.parametrize("how", ["spawn", "torchrun"])
def test_gpu_a_stopped_rank_on_host_1_is_named_and_every_host_cleaned_up(how):
    """Rank 1 (alone on host 1) stopped by SIGSTOP mid-sweep, its peer waiting inside NCCL:
    named on host 0, ended on host 1 by its watcher (which says so there), nothing left."""
    with _gpu_fleet() as fleet:
        run = run_fault(fleet, how, GPU_SWEEP, "stop", 29750 + len(how))
    line = run.line()
    assert re.search(rf"\(-T\): rank 1 \(pid {run.pid}\) on simnode1 did not answer", line), line
    assert len(run.ended_on_host_1()) == 1, run.hosts[-1].tail()
    print(run.table("rank 1 stopped (SIGSTOP)", "torchrun --nnodes 2" if how == "torchrun" else
                    "ncclbench -g 1 --nnodes 2", "nccl, eager"))
    _gpu_bounds(run)


@pytest.mark.gpu
@rig
@gpu_hosts
def test_gpu_a_host_whose_link_goes_down_is_named_and_every_host_cleaned_up():
    with _gpu_fleet() as fleet:
        run = run_fault(fleet, "spawn", GPU_SWEEP, "link", 29760)
    assert re.search(r"\(-T\): rank 1 \(pid \d+\) on simnode1 did not answer", run.line()), run.line()
    print(run.table("host 1's link down", "ncclbench -g 1 --nnodes 2", "nccl, eager"))
    _gpu_bounds(run)


# ---- the watcher alone ----------------------------------------------------------------------------
WATCHED = """
import sys, time
from ncclbench.launch import watch
watch.start(1)
print(watch.registration('127.0.0.1'), flush=True)
if sys.argv[1] == 'stop':
    import os, signal
    os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(float(sys.argv[2]))
"""


def _watched(mode: str, seconds: float):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", WATCHED, mode, str(seconds)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    entry = proc.stdout.readline().strip()
    addr, watcher, host, token = entry.split("|")
    ip, port = addr.rsplit(":", 1)
    return proc, (ip, int(port), token), int(watcher), host


def _wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = None
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


def test_a_watcher_told_the_job_ended_kills_its_stopped_rank_and_says_why():
    """News without the watcher's token (anyone who reaches its port) is ignored; with it,
    the stopped rank is ended and the line says which and why."""
    proc, addr, watcher, host = _watched("stop", 60)
    try:
        assert host == socket.gethostname()
        assert watch.tell({1: (*addr[:2], "not-its-token")}, "forged", [1]) == [1]
        time.sleep(1.0)
        assert proc.poll() is None and _wait_gone(watcher, 0.1) is False
        assert watch.tell({1: addr}, "timeout: all_reduce at 1024 B did not finish within 5 s (-T)", [1]) == [1]
        proc.wait(timeout=10)
        err = proc.stderr.read()
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert re.fullmatch(rf"ncclbench: error: rank 1 \(pid {proc.pid}\) on \S+, stopped \(state T: SIGSTOP or "
                        r"SIGTSTP\), was ended by ncclbench \(SIGKILL\): the run named it as the cause \(timeout: "
                        r"all_reduce at 1024 B did not finish within 5 s \(-T\)\)\n", err), err
    assert _wait_gone(watcher, 5)


def test_a_watcher_gives_a_running_rank_its_grace_and_ends_with_a_rank_that_ends():
    """Told while its rank runs, the watcher waits for it to leave (it does, within the grace
    here) and says nothing; a watcher whose rank ends without news ends too."""
    proc, addr, watcher, _ = _watched("run", 2)
    try:
        assert watch.tell({1: addr}, "the run ended") == [1]
        proc.wait(timeout=10)
        assert proc.returncode == 0 and proc.stderr.read() == ""
        assert _wait_gone(watcher, 5)
    finally:
        proc.kill()
    proc, addr, watcher, _ = _watched("run", 0.5)
    proc.wait(timeout=10)
    assert _wait_gone(watcher, 5) and proc.returncode == 0


def test_a_watcher_ends_a_rank_that_outstays_its_grace(monkeypatch):
    """A rank still running GRACE_S after the news is ended too, and the line says so."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stderr=subprocess.PIPE)
    monkeypatch.setattr(watch, "_running", lambda pid: True)
    try:
        assert watch.end_rank(sleeper.pid, 3, {"why": "x", "culprits": [1]}, grace_s=0.3)
        sleeper.wait(timeout=10)
    finally:
        sleeper.kill()
    assert sleeper.returncode == -signal.SIGKILL


def test_the_registry_round_trip_and_an_unreachable_watcher():
    class Store(dict):
        def set(self, k, v):
            self[k] = v.encode()

        def check(self, keys):
            return all(k in self for k in keys)

        def get(self, k):
            return self[k]

    store = Store()
    store.set(watch.REGISTRY_KEY.format(rank=2), "198.18.0.2:4242|77|simnode1|abc")
    assert watch.registered(store, range(4)) == {2: ("198.18.0.2", 4242, "abc")}
    with socket.socket() as s:  # a port nobody listens on: refused at once, nothing reached
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert watch.tell({0: ("127.0.0.1", closed, "abc")}, "x", seconds=1) == []
    assert json.loads(json.dumps({"why": "x"}))  # the wire format is one JSON line
