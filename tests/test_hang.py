"""A hung rank is named, never a healthy one (engine.hang). The pure rule first (board
states and witnesses -> the culprit), then real processes on gloo: a rank frozen by SIGSTOP
(state T) with -g 4, under torchrun, and on another simulated host than rank 0; a rank that
stalls before a collective (failpoint). Before: the first healthy rank to reach -T was blamed
("ranks 0,2 stopped after rank 3 failed") and the frozen one only said to be killed."""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import ROOT, ROW_RE, cli_command, wait_gone
from ncclbench.engine import hang, ras, timing
from ncclbench.engine.watchdog import BoardEntry

sys.path.insert(0, str(ROOT / "tests"))
import netsim  # noqa: E402

T = 5          # -T of the real runs
NAME_BOUND = T + 5 + 10   # stop -> the line naming it: -T + 5 s, plus slack for a loaded 2-core box
GONE_BOUND = T + 15 + 15  # stop -> every process gone: -T + 15 s, plus the same slack
ARGS = ["allreduce", "--backend", "gloo", "-b", "1K", "-e", "1M", "-f", "2", "-n", "5", "-N", "0", "-T", str(T),
        "--no-save"]
PID_RE = re.compile(r"Rank\s+(\d+) Group\s+\d+ Pid\s+(\d+)")


# ---- the rule -----------------------------------------------------------------------------------
def board(steps: dict, host="h0") -> dict:
    return {r: BoardEntry(s, 100 + r, host, f"all_reduce at {1 << s} B") for r, s in steps.items()}


def witness(r, step=7, gpu=None, states=None, where="out-of-place, timed iteration 3 of 20"):
    return hang.Witness(r, step, "all_reduce at 128 B", where, gpu, states or {})


def test_a_frozen_rank_is_named_and_the_ranks_that_timed_out_first_only_waited():
    v = hang.decide(4, 7, "all_reduce at 128 B", board({0: 7, 1: 7, 2: 7, 3: 7}),
                    {r: witness(r, states={1: "T"}) for r in (3, 0, 2)}, {1: "T"})
    assert v.ranks() == [1] and v.culprits[0][1] == hang.FROZEN
    text = v.text()
    assert text == ("rank 1 (pid 101) on h0 is stopped (state T: SIGSTOP or SIGTSTP) inside it; ranks 0,2,3 "
                    "waited for rank 1 at out-of-place, timed iteration 3 of 20")
    assert hang.culprits_in("timeout: x did not finish within 5 s (-T): " + text) == [1]


def test_a_rank_behind_on_the_board_never_reached_it():
    v = hang.decide(3, 7, "w", board({0: 7, 1: 7, 2: 6}),
                    {0: witness(0), 1: witness(1), 2: witness(2, where="before its collectives")}, {2: "S"})
    assert v.ranks() == [2] and v.culprits[0][1] == hang.NEVER
    assert "rank 2 (pid 102) on h0 never reached it: its last step was all_reduce at 64 B, where it is before " \
           "its collectives; its process is running, waiting (state S)" in v.text()
    assert sorted(v.waiting) == [0, 1]


def test_a_rank_behind_that_answered_from_another_thread_says_its_main_thread_is_in_the_kernel():
    """Its watchdog thread answers while its main thread waits in the kernel (state D): named
    as never reaching the step, with that state; a main thread merely waiting (S) adds nothing."""
    wits = {0: witness(0), 1: witness(1), 2: witness(2, where="before its collectives")}
    wits[2].own = "D"
    v = hang.decide(3, 7, "w", board({0: 7, 1: 7, 2: 6}), wits, {})
    assert v.ranks() == [2] and v.culprits[0][1] == hang.NEVER
    assert v.text().startswith("rank 2 (pid 102) on h0 never reached it: its last step was all_reduce at 64 B, "
                               "where it is before its collectives; its main thread is stuck in the kernel (state D)")
    assert hang.Witness.parse(wits[2].line()) == wits[2]
    wits[2].own = "S"
    assert "main thread" not in hang.decide(3, 7, "w", board({0: 7, 1: 7, 2: 6}), wits, {}).text()


def test_a_gpu_that_never_reached_the_op_is_named_only_when_nothing_else_is():
    wits = {r: witness(r, gpu=(r != 2)) for r in range(4)}
    v = hang.decide(4, 7, "w", board({r: 7 for r in range(4)}), wits, {})
    assert v.ranks() == [2] and "its GPU never reached it" in v.text() and "ranks 0,1,3 waited for rank 2" in v.text()
    # a frozen rank outranks a GPU witness (the frozen rank's peers' GPUs are fine)
    del wits[1]
    v = hang.decide(4, 7, "w", board({r: 7 for r in range(4)}), wits, {1: "D"})
    assert v.ranks() == [1] and "stuck in the kernel (state D)" in v.text()


def test_a_silent_rank_on_another_host_and_no_culprit_at_all():
    b = board({0: 7, 1: 7})
    b[2] = BoardEntry(7, 555, "h1", "x")
    v = hang.decide(3, 7, "w", b, {0: witness(0), 1: witness(1)}, {})
    assert v.ranks() == [2] and "rank 2 (pid 555) on h1 did not answer" in v.text()
    v = hang.decide(3, 7, "w", b, {r: witness(r) for r in range(3)}, {})
    assert v.ranks() == [] and v.text().startswith("no rank was found behind")
    assert "ranks 0,1,2 waited inside it" in v.text() and hang.culprits_in(v.text()) == []


def test_a_rank_seen_stopped_that_answered_is_not_stopped():
    """A state read before the rank's own witness came in does not outlive the witness."""
    census = hang.Census.__new__(hang.Census)
    census.store, census.rank, census.nranks, census.prefix = None, 0, 2, "p/"
    wits, states = census._read(witness(0, states={1: "T"}))
    assert states == {1: "T"}
    assert hang.Witness.parse(witness(1, gpu=False, states={0: "S"}).line()) == witness(1, gpu=False, states={0: "S"})


def _loop(passed, issued=21, placement="out-of-place", steps=20, block=1):
    return {"placement": placement, "steps": steps, "block": block, "issued": issued, "passed": passed}


def test_a_gpu_that_stopped_inside_the_timed_loop_is_named_from_the_devices_marks():
    """Every host issued all 20 iterations (each waits for its device), so the host's position
    tells nothing; rank 1's device has not passed the mark after iteration 5 while ranks 0,2
    passed it and wait inside iteration 6: rank 1's GPU is named, the others waited."""
    where = "out-of-place, waiting for its device after issuing the 20 timed iterations"
    wits = {r: witness(r, gpu=True, where=where) for r in range(3)}
    for r, passed in ((0, 6), (1, 5), (2, 6)):
        wits[r].loop = _loop(passed)
    v = hang.decide(3, 7, "all_reduce at 128 B", board({r: 7 for r in range(3)}), wits, {})
    assert v.ranks() == [1] and v.culprits[0][1] == hang.GPU
    assert v.text() == ("rank 1 (pid 101) on h0: its GPU stopped in the timed loop (out-of-place): its stream has "
                        "not passed the end of timed iteration 5, which the GPUs of ranks 0,2 passed; its host issued "
                        "20 of 20 (earlier work on its stream still runs); ranks 0,2 waited for rank 1 at " + where)
    assert hang.culprits_in("timeout: x did not finish within 5 s (-T): " + v.text()) == [1]
    assert hang.Witness.parse(wits[1].line()) == wits[1]  # the reading travels through the store
    # before the start mark; in blocks of 10 iterations (more than NOISE_SAMPLES)
    wits[1].loop = _loop(0)
    assert "its stream has not reached the loop's start" in hang.decide(3, 7, "w", board({r: 7 for r in range(3)}),
                                                                        wits, {}).text()
    for r, passed in ((0, 3), (1, 2), (2, 3)):
        wits[r].loop = _loop(passed, issued=11, steps=100, block=10)
    assert "not passed the end of timed iteration 20, which the GPUs of ranks 0,2 passed; its host issued 100 of " \
        "100" in hang.decide(3, 7, "w", board({r: 7 for r in range(3)}), wits, {}).text()


def test_devices_that_agree_or_a_device_that_caught_up_with_its_host_name_no_gpu():
    """Equal marks (a size just slower than -T), marks of another placement or step, a device
    that passed all its host issued (its host is the slow one: another rule's), and gloo's
    host-clock marks (passed == issued) name nobody by this rule."""
    b = board({r: 7 for r in range(3)})
    wits = {r: witness(r, gpu=True) for r in range(3)}
    for r in range(3):
        wits[r].loop = _loop(6)
    assert hang.decide(3, 7, "w", b, wits, {}).ranks() == []
    wits[1].loop = _loop(5, placement="in-place")
    assert hang.decide(3, 7, "w", b, wits, {}).ranks() == []
    wits[1].loop, wits[1].step = _loop(5), 6
    assert hang.gpus_behind(wits, 7) == {}
    wits[1].step = 7
    wits[1].loop = _loop(5, issued=5)
    assert hang.decide(3, 7, "w", b, wits, {}).ranks() == []
    for r, issued in ((0, 6), (1, 4), (2, 6)):
        wits[r].loop = _loop(issued, issued=issued)
    assert hang.decide(3, 7, "w", b, wits, {}).ranks() == []
    # a frozen rank outranks the device rule (its peers' devices stop behind it too)
    wits[1].loop = _loop(5)
    del wits[2]
    assert hang.decide(3, 7, "w", b, wits, {2: "T"}).ranks() == [2]
    # a size just slower than -T: the ranks read their devices at different moments, so the
    # counts differ, but every device moves while it is watched
    wits = {r: witness(r, gpu=True) for r in range(3)}
    for r, passed in ((0, 103), (1, 100), (2, 104)):
        wits[r].loop = dict(_loop(passed, issued=200, steps=200), moved=True)
    assert hang.decide(3, 7, "w", b, wits, {}).ranks() == []
    wits[1].loop["moved"] = False
    assert hang.decide(3, 7, "w", b, wits, {}).ranks() == [1]


class _MarkingBackend:
    """A device that runs `ahead` ops behind its host: a mark is passed once that many ops
    were issued after it; hold() adds a long kernel that none passes."""

    rank = 1

    def __init__(self, lag=1):
        self.ops, self.lag, self.held_at, self.calls = 0, lag, None, []

    def markers(self, n):
        return [None] * n

    def mark(self, _marker):
        self.calls.append("mark")
        return self.ops

    def reached(self, mark):
        if self.held_at is not None and mark >= self.held_at:
            return False
        return mark + self.lag <= self.ops or self.ops >= 25

    def hold(self, _seconds):
        self.calls.append("hold")
        self.held_at = self.ops

    def elapsed(self, a, b):
        return (b - a) * 1e-6

    def synchronize(self):
        if self.probe is not None:
            self.readings.append(timing.PROGRESS.reading())
            self.samples.append(timing.PROGRESS.sample(0.01))

    def barrier(self):
        pass


def test_the_loops_marks_are_read_as_progress_and_a_planted_stall_lands_before_a_mark(monkeypatch):
    """NCCLBENCH_FAULT gpu_stall at=6: the hold goes after the 5th iteration's op and before
    the mark that ends it; the reading, taken while the host waits for its device, shows the
    device stopped there. Without the plant the loop issues exactly what it did before."""
    from ncclbench import failpoints

    from ncclbench.engine.position import HERE

    monkeypatch.setattr(HERE, "placement", None)  # no placement left by an earlier test in this process
    monkeypatch.setenv("NCCLBENCH_FAULT", "gpu_stall:rank=1,size=1024,at=6,seconds=60")
    failpoints.reset()
    try:
        backend = _MarkingBackend()
        backend.probe, backend.readings, backend.samples = True, [], []
        failpoints.failpoint("engine.before_size", rank=1, size=1024)

        def op(_k):
            backend.ops += 1
            backend.calls.append("op")
        timing.measure(backend, op, timing.TimingSettings(iters=20))
    finally:
        monkeypatch.delenv("NCCLBENCH_FAULT")
        failpoints.reset()
    loop = backend.calls[backend.calls.index("mark"):]
    assert loop[:12] == ["mark"] + ["op", "mark"] * 4 + ["op", "hold", "mark"], loop[:12]
    reading = backend.readings[-1]  # in the wait after the loop
    assert reading == {"placement": None, "steps": 20, "block": 1, "issued": 21, "passed": 5}, reading
    assert backend.samples[-1] == dict(reading, moved=False)  # stopped: no mark passed while watched
    assert timing.PROGRESS.reading() is None  # cleared once the device caught up
    plain = _MarkingBackend()
    plain.probe = None
    timing.measure(plain, lambda _k: plain.calls.append("op"), timing.TimingSettings(iters=3))
    assert "hold" not in plain.calls


# ---- real processes -----------------------------------------------------------------------------
class Run:
    """A run in its own session: its header's pids, rows as they come, stderr with times."""

    def __init__(self, cmd, env=None):
        full = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                  "TORCHELASTIC_RUN_ID")}
        full.update(NCCL_NVLS_ENABLE="0", OMP_NUM_THREADS="1", **(env or {}))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full,
                                     start_new_session=True)
        self.pids, self.rows, self.err = {}, 0, []
        self.rows_seen = threading.Event()
        threading.Thread(target=self._err, daemon=True).start()

    def _err(self):
        for line in self.proc.stderr:
            self.err.append((time.monotonic(), line))

    def wait_rows(self, rows: int, limit_s: float = 240) -> None:
        deadline = time.monotonic() + limit_s
        for line in self.proc.stdout:
            m = PID_RE.search(line)
            if m:
                self.pids[int(m.group(1))] = int(m.group(2))
            if ROW_RE.match(line):
                self.rows += 1
                if self.rows >= rows:
                    return
            assert time.monotonic() < deadline, "no rows in time"
        raise AssertionError("the run ended before its rows: " + "".join(line for _, line in self.err)[-3000:])

    def finish(self, limit_s: float = 120):
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        self.proc.wait(timeout=limit_s)
        gone = time.monotonic()
        time.sleep(0.2)
        return gone

    def lines(self):
        return [(t, line.rstrip("\n")) for t, line in self.err
                if line.startswith("ncclbench:") and not line.startswith("ncclbench: warning")]

    def kill(self, pids=()):
        for pid in [*pids, self.proc.pid]:
            for sig in (signal.SIGKILL,):
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass


def _freeze_and_judge(run: Run, victim: int, pid: int, nranks: int, host_re=r"\S+", own_launcher=True):
    """SIGSTOP `pid` (rank `victim`) and check the run's verdict; (seconds to name, seconds to gone)."""
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        gone = run.finish()
    finally:
        run.kill([pid])
    lines = run.lines()
    named = [(t, line) for t, line in lines if "timeout:" in line]
    assert len(named) == 1, "\n".join(line for _, line in lines)
    line = named[0][1]
    others = ",".join(str(r) for r in range(nranks) if r != victim)
    assert re.search(rf"\(-T\): rank {victim} \(pid {pid}\) on {host_re} (is stopped \(state T: SIGSTOP or SIGTSTP\) "
                     rf"inside it|never reached it: .*its process is stopped \(state T)", line), line
    # the others waited for it, at one place or several ("ranks 0,2 waited for rank 3 at X; rank 1 at Y")
    assert re.search(rf"; ranks? [\d,]+ waited for rank {victim} at ", line), line
    waiting = re.findall(r"; ranks? ([\d,]+)(?: waited for rank \d+)? at ", line)
    assert sorted(int(r) for group in waiting for r in group.split(",")) == [int(r) for r in others.split(",")], line
    for t, other in lines:  # any other line (a launcher's kill) names the frozen rank alone
        assert not re.search(rf"rank (?!{victim}\b)\d+ \(pid", other.replace(line, "")), other
    assert "failed" not in " ".join(x for _, x in lines)
    assert not own_launcher or "Traceback" not in "".join(x for _, x in run.err)  # torchrun prints its own
    return named[0][0] - stopped, gone - stopped


def _freeze_rank_1_of_four(run: Run, rows: int, settle_s: float) -> tuple[float, float]:
    """Once `rows` rows are out, SIGSTOP rank 1 of 4 and judge the verdict (_freeze_and_judge);
    every rank killed afterwards, whatever happened."""
    try:
        run.wait_rows(rows)
        time.sleep(settle_s)
        return _freeze_and_judge(run, 1, run.pids[1], 4)
    finally:
        run.kill(run.pids.values())


def test_a_frozen_rank_of_four_is_named_alone(tmp_path):
    """-g 4 -T 5, rank 1 frozen by SIGSTOP mid-sweep: one timeout line naming rank 1 (pid, host,
    state T) and ranks 0,2,3 as waiting for it, exit 4, named within -T + 5 s and everything
    gone within -T + 15 s (with slack for a loaded machine), nothing left running."""
    run = Run(cli_command() + [ARGS[0], "-g", "4", *ARGS[1:], "--csv", str(tmp_path / "r.csv")])
    to_name, to_gone = _freeze_rank_1_of_four(run, rows=4, settle_s=0.3)
    assert run.proc.returncode == 4
    assert to_name < NAME_BOUND and to_gone < GONE_BOUND, (to_name, to_gone)
    print(f"frozen rank named after {to_name:.1f} s, all gone after {to_gone:.1f} s")
    assert not wait_gone(str(tmp_path), seconds=5)


def test_a_frozen_rank_0_is_named_by_the_launcher(tmp_path):
    """-g 4, rank 0 (which decides, and hosts the store) frozen: the others see it stopped on
    their host and exit 4 at once; the launcher kills rank 0 and names it with its state,
    the run's only line."""
    run = Run(cli_command() + [ARGS[0], "-g", "4", *ARGS[1:], "--csv", str(tmp_path / "r.csv")])
    try:
        run.wait_rows(4)
        time.sleep(0.3)
        os.kill(run.pids[0], signal.SIGSTOP)
        stopped = time.monotonic()
        gone = run.finish() - stopped
    finally:
        run.kill(run.pids.values())
    lines = run.lines()
    assert run.proc.returncode == 4 and len(lines) == 1, lines
    assert re.fullmatch(rf"ncclbench: error: rank 0 \(pid {run.pids[0]}\) on \S+, stopped \(state T: SIGSTOP or "
                        r"SIGTSTP\), did not end after the timeout and was killed by ncclbench \(SIGKILL\)", lines[0][1])
    to_name = lines[0][0] - stopped
    print(f"rank 0 frozen: named after {to_name:.1f} s, all gone after {gone:.1f} s")
    assert to_name < NAME_BOUND and gone < GONE_BOUND, (to_name, gone)


def test_a_rank_that_stalls_before_a_collective_is_named_as_never_reaching_it(tmp_path):
    run = Run(cli_command() + [ARGS[0], "-g", "4", *ARGS[1:], "--csv", str(tmp_path / "r.csv")],
              env={"NCCLBENCH_FAULT": "stall:rank=2,size=4096,seconds=300"})
    try:
        run.wait_rows(1)
        run.finish(limit_s=120)
    finally:
        run.kill(run.pids.values())
    lines = [line for _, line in run.lines()]
    assert run.proc.returncode == 4 and len(lines) == 1, lines
    assert re.search(r"timeout: all_reduce at 4096 B \(float, sum, root -1\) did not finish within 5 s \(-T\): "
                     r"rank 2 \(pid \d+\) on \S+ never reached it: its last step was all_reduce at 2048 B "
                     r"\(float, sum, root -1\), where it is before its collectives; ranks 0,1,3 waited for rank 2 "
                     r"at out-of-place, its first \(untimed\) op$", lines[0]), lines[0]
    assert not wait_gone(str(tmp_path), seconds=10)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="state D is planted with Linux's vfork")
def test_a_rank_stuck_in_the_kernel_is_named_with_state_d(tmp_path):
    """-g 4 -T 5, rank 2's main thread held inside the kernel (state D) before 4 KiB for 25 s,
    its other threads running on: rank 2 alone is named as never reaching the size, with its
    state (said by its own watchdog thread, or read by a rank on its host when that thread has
    not answered in time), the others as waiting for it; exit 4 within -T + 5 s, and SIGKILL
    ends it long before its 25 s wait would have. Before the plant, state D was held by the rule's
    unit test only."""
    run = Run(cli_command() + [ARGS[0], "-g", "4", *ARGS[1:], "--csv", str(tmp_path / "r.csv")],
              env={"NCCLBENCH_FAULT": "in_kernel:rank=2,size=4096,seconds=25"})
    try:
        run.wait_rows(1)
        started = time.monotonic()
        gone = run.finish(limit_s=120) - started
    finally:
        run.kill(run.pids.values())
    lines = run.lines()
    named = [(t, line) for t, line in lines if "timeout:" in line]
    assert run.proc.returncode == 4 and len(named) == 1, lines
    assert re.search(r"timeout: all_reduce at 4096 B \(float, sum, root -1\) did not finish within 5 s \(-T\): "
                     r"rank 2 \(pid \d+\) on \S+ never reached it: its last step was all_reduce at 2048 B .*(its main "
                     r"thread|its process) is stuck in the kernel \(state D\); ranks 0,1,3 waited for rank 2 at ",
                     named[0][1]), \
        named[0][1]
    to_name = named[0][0] - started
    print(f"rank in state D named after {to_name:.1f} s, all gone after {gone:.1f} s")
    assert to_name < NAME_BOUND and gone < GONE_BOUND, (to_name, gone)
    # the ranks are gone, and with rank 2 the plant's child (which shares its command line)
    assert not wait_gone(str(tmp_path), seconds=10)


@pytest.mark.parametrize("victim", [2, 0])
def test_a_frozen_rank_under_torchrun_is_named_and_ended(tmp_path, victim):
    """The user's own torchrun: rank 0 names the frozen rank (same host: state T), ends it
    with SIGKILL (torchrun's SIGTERM stays pending on a stopped process for 30 s), and
    torchrun's summary shows 4 for the ranks that waited. Rank 0 frozen: another rank
    claims the word and says the same."""
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    run = Run([torchrun, "--nproc-per-node", "3", "--standalone", "-m", "ncclbench", *ARGS,
               "--csv", str(tmp_path / "r.csv")])
    try:
        run.wait_rows(4)
        time.sleep(0.3)
        to_name, to_gone = _freeze_and_judge(run, victim, run.pids[victim], 3, own_launcher=False)
    finally:
        run.kill(run.pids.values())
    assert run.proc.returncode == 1
    err = "".join(line for _, line in run.err)
    assert f"rank {victim} ended by ncclbench (SIGKILL" in err
    codes = sorted(re.findall(r"^\s+exitcode\s*:\s*(-?\d+)", err, re.M))
    assert codes == ["-9", "4", "4"], err[-3000:]
    assert to_name < NAME_BOUND and to_gone < GONE_BOUND, (to_name, to_gone)
    print(f"torchrun: frozen rank {victim} named after {to_name:.1f} s, all gone after {to_gone:.1f} s"
          f" (exit codes {codes})")
    assert not wait_gone(str(tmp_path), seconds=5)


@pytest.mark.parametrize("nranks", [3, 4])
def test_a_rank_whose_timeout_fires_late_ends_4_under_torchrun(tmp_path, nranks):
    """Rank 1 stopped at 16 KiB, the last rank's -T firing 5 s late (a host so loaded its
    watchdog thread waits for a core): rank 0 names rank 1 after its 3 s gather, with the
    late rank as waiting at a point not told, and no rank ends or ends rank 1 before the
    late rank answered. Before, torchrun's SIGTERM (sent once rank 1 was killed, or once a
    rank exited 4: with 4 ranks rank 2 read the verdict, ended rank 1 and left) reached the
    late rank first: it was left out of the line and ended 3 or 130, not 4."""
    late = nranks - 1
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    run = Run([torchrun, "--nproc-per-node", str(nranks), "--standalone", "-m", "ncclbench", *ARGS,
               "--csv", str(tmp_path / "r.csv")],
              env={"NCCLBENCH_FAULT": f"freeze:rank=1,size=16384;late_timeout:rank={late},seconds=5"})
    try:
        run.wait_rows(1)
        run.finish(limit_s=120)
    finally:
        run.kill(run.pids.values())
    named = [line for _, line in run.lines() if "timeout:" in line]
    assert len(named) == 1, run.lines()
    assert re.search(r"\(-T\): rank 1 \(pid \d+\) on \S+ never reached it: .*its process is stopped \(state T", named[0])
    waited = "rank 0" if nranks == 3 else "ranks 0,2"
    assert f"; {waited} waited for rank 1 at " in named[0] and f"; rank {late} at {hang.LATE_WHERE}" in named[0], \
        named[0]
    err = "".join(line for _, line in run.err)
    codes = sorted(re.findall(r"^\s+exitcode\s*:\s*(-?\d+)", err, re.M))
    assert codes == ["-9"] + ["4"] * (nranks - 1), err[-3000:]
    assert not wait_gone(str(tmp_path), seconds=5)


REASON = netsim.why_not()


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_a_frozen_rank_on_another_host_is_named_by_its_host_mate(tmp_path):
    """Two simulated hosts x 2 ranks: rank 3 (on simnode1) frozen; rank 0 (on simnode0) names it
    with its state, which rank 2, its host mate, read and posted in the store; the ranks on
    simnode1 end it. (With one rank per host the frozen rank is named as silent instead.)"""
    with netsim.SimFleet(2) as fleet:
        nodes, run = _two_hosts(fleet, tmp_path, 29571)
        try:
            run.wait_rows(4)
            time.sleep(0.3)
            to_name, to_gone = _freeze_and_judge(run, 3, run.pids[3], 4, host_re="simnode1")
            nodes[1].wait(timeout=60)
        finally:
            run.kill(run.pids.values())
    assert nodes[0].returncode == 4
    assert to_name < NAME_BOUND and to_gone < GONE_BOUND, (to_name, to_gone)
    time.sleep(0.5)
    # host 1 says that its rank was ended and why (its host mate or its watcher ended it)
    assert any(re.match(r"ncclbench: error: rank 3 \(pid \d+\) on simnode1, stopped \(state T: SIGSTOP or SIGTSTP\), "
                        r"was ended by ncclbench \(SIGKILL\): the run named it as the cause \(timeout: ", line)
               for line in run.host1_err), run.host1_err
    print(f"across hosts: frozen rank named after {to_name:.1f} s, all gone after {to_gone:.1f} s")



def _two_hosts(fleet, tmp_path, port: int):
    """2 ranks on each of two simulated hosts; host 0's launcher read as a Run (its ranks'
    pids, rows and error lines), host 1's output drained."""
    cmd = cli_command() + ARGS + ["--csv", str(tmp_path / "r.csv")]
    nodes = [fleet.start(i, cmd, nproc=2, port=port) for i in range(2)]
    run = Run.__new__(Run)
    run.proc, run.pids, run.rows, run.err = nodes[0], {}, 0, []
    threading.Thread(target=run._err, daemon=True).start()
    run.host1_err = []  # host 1's stderr lines
    threading.Thread(target=nodes[1].stdout.read, daemon=True).start()
    threading.Thread(target=lambda: run.host1_err.extend(nodes[1].stderr), daemon=True).start()
    return nodes, run


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_a_host_whose_network_is_gone_is_named_as_not_answering(tmp_path):
    """Two simulated hosts x 2 ranks, simnode1's interface taken down mid-sweep: ranks 2,3
    (simnode1) did not answer, ranks 0,1 waited for them; every process of both hosts ends."""
    with netsim.SimFleet(2) as fleet:
        nodes, run = _two_hosts(fleet, tmp_path, 29572)
        try:
            run.wait_rows(4)
            time.sleep(0.3)
            fleet.link_down(1)
            down = time.monotonic()
            gone = run.finish()
            nodes[1].wait(timeout=60)
            gone = max(gone, time.monotonic()) - down
        finally:
            run.kill(run.pids.values())
    lines = [line for _, line in run.lines()]
    named = [line for line in lines if "timeout:" in line]
    assert nodes[0].returncode == 4 and len(named) == 1, lines
    to_name = next(t for t, line in run.lines() if "timeout:" in line) - down
    assert re.search(r"\(-T\): rank 2 \(pid \d+\) on simnode1 did not answer .*; rank 3 \(pid \d+\) on simnode1 did "
                     r"not answer .*; ranks? [\d,]+ waited for ranks 2,3 at ", named[0]), named[0]
    # ranks 0 and 1 waited, at one place ("ranks 0,1 waited for ranks 2,3 at X") or two ("rank 0
    # waited for ranks 2,3 at X; rank 1 at Y": the network went while they were at different steps)
    waiting = re.findall(r"; ranks? ([\d,]+)(?: waited for ranks 2,3)? at ", named[0])
    assert sorted(int(r) for group in waiting for r in group.split(",")) == [0, 1], named[0]
    assert to_name < NAME_BOUND and gone < GONE_BOUND, (to_name, gone)
    print(f"network gone: named after {to_name:.1f} s, all gone after {gone:.1f} s")

# ---- on GPUs (NCCL) -----------------------------------------------------------------------------
def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        return 0


GPUS = min(4, _gpu_count())
GPU_ARGS = ["allreduce", "-g", str(GPUS), "-b", "1M", "-e", "256M", "-f", "2", "-n", "20", "-N", "0", "-T", "10",
            "--no-save"]
RAS_CLAUSE = re.compile(r"; NCCL RAS \(([^,]+), a second witness\): (.*)$")


def _ras_names_only(line: str, victim: int) -> str:
    """NCCL's RAS clause of a GPU verdict (engine.ras): present, and naming no rank but `victim`."""
    found = RAS_CLAUSE.search(line)
    assert found, line
    named = {int(r) for r in re.findall(r"rank (\d+) = pid", found.group(2).split("; " + ras.LAGGING)[0])}
    assert named <= {victim}, line
    return found.group(2)


@pytest.mark.gpu
def test_gpu_a_frozen_rank_is_named_alone(tmp_path):
    """-g 4 (or 2) on NCCL, rank 1 frozen by SIGSTOP mid-sweep: its peers wait inside NCCL's
    kernels; rank 0 names rank 1 (state T) alone within -T + 5 s, everything gone within -T +
    15 s. NCCL's RAS, asked meanwhile, names no other rank."""
    if GPUS < 2:
        pytest.skip("needs 2 GPUs")
    run = Run(cli_command() + GPU_ARGS + ["--csv", str(tmp_path / "r.csv")])
    try:
        run.wait_rows(6)
        time.sleep(0.2)
        to_name, to_gone = _freeze_and_judge(run, 1, run.pids[1], GPUS)
    finally:
        run.kill(run.pids.values())
    line = next(x for _, x in run.lines() if "timeout:" in x)
    print(f"GPU: frozen rank named after {to_name:.1f} s, all gone after {to_gone:.1f} s (-T 10); "
          f"RAS: {_ras_names_only(line, 1)}")
    assert run.proc.returncode == 4
    assert to_name < 10 + 5 and to_gone < 10 + 15, (to_name, to_gone)
    assert not wait_gone(str(tmp_path), seconds=10)


def _gpu_fault_before_16m(tmp_path, fault: str) -> tuple[str, float, float]:
    """GPU_ARGS with `fault` planted at 16 MiB: (the one timeout line, seconds from the size's
    start to it, seconds to every process gone); exit 4 checked."""
    run = Run(cli_command() + GPU_ARGS + ["--csv", str(tmp_path / "r.csv")], env={"NCCLBENCH_FAULT": fault})
    try:
        run.wait_rows(4)  # 1, 2, 4, 8 MiB: the 16 MiB size starts now
        started = time.monotonic()
        gone = run.finish(limit_s=120)
    finally:
        run.kill(run.pids.values())
    lines = run.lines()
    named = [(t, line) for t, line in lines if "timeout:" in line]
    assert run.proc.returncode == 4 and len(named) == 1, lines
    return named[0][1], named[0][0] - started, gone - started


@pytest.mark.gpu
def test_gpu_a_gpu_that_never_reaches_the_op_is_named(tmp_path):
    """-g 4 (or 2) on NCCL, a 600 s kernel queued on the last rank's stream before 16 MiB
    (gpu_sleep): its host goes on and waits like the others; its GPU never reaches the
    all_reduce. That rank is named as such, the others as waiting for it, within -T + 5 s of
    the size's start. NCCL's RAS counts what the host launched: it sees no hang."""
    if GPUS < 2:
        pytest.skip("needs 2 GPUs")
    victim = GPUS - 1
    line, to_name, to_gone = _gpu_fault_before_16m(tmp_path, f"gpu_sleep:rank={victim},size={16 << 20},seconds=600")
    others = ",".join(str(r) for r in range(GPUS) if r != victim)
    waiting = f"ranks {others}" if GPUS > 2 else f"rank {others}"
    assert re.search(rf"timeout: all_reduce at 16777216 B \(float, sum, root -1\) did not finish within 10 s \(-T\): "
                     rf"rank {victim} \(pid \d+\) on \S+: its GPU never reached it \(earlier work on its stream still "
                     rf"runs\); {waiting} waited for rank {victim} at ", line), line
    assert "it sees no hang" in _ras_names_only(line, victim), line
    print(f"GPU: rank with a busy GPU named after {to_name:.1f} s, all gone after {to_gone:.1f} s (-T 10)")
    assert to_name < 10 + 5 and to_gone < 10 + 15, (to_name, to_gone)
    assert not wait_gone(str(tmp_path), seconds=10)


@pytest.mark.gpu
def test_gpu_a_rank_stuck_in_the_kernel_is_named(tmp_path):
    """-g 4 (or 2) on NCCL, the last rank's main thread held inside the kernel (state D) before
    16 MiB for 40 s: named alone as never reaching the size, with its main thread's state,
    within -T + 5 s of the size's start; the others waited inside NCCL. Its RAS clause names
    no other rank."""
    if GPUS < 2:
        pytest.skip("needs 2 GPUs")
    victim = GPUS - 1
    line, to_name, to_gone = _gpu_fault_before_16m(tmp_path, f"in_kernel:rank={victim},size={16 << 20},seconds=40")
    assert re.search(rf"\(-T\): rank {victim} \(pid \d+\) on \S+ never reached it: its last step was all_reduce at "
                     rf"8388608 B .*(its main thread|its process) is stuck in the kernel \(state D\); ", line), line
    ras = _ras_names_only(line, victim)
    print(f"GPU: rank in state D named after {to_name:.1f} s, all gone after {to_gone:.1f} s (-T 10); RAS: {ras}")
    assert to_name < 10 + 5 and to_gone < 10 + 15, (to_name, to_gone)
    assert not wait_gone(str(tmp_path), seconds=10)
