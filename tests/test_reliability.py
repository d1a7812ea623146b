"""Fault injection with real processes (gloo): a killed rank, a stalled rank, a rank with
another plan, Ctrl-C during `-N 0`. Each: bounded exit, a message naming the rank,
valid partial files with the sizes done, and no process left behind."""

import json
import os
import re
import signal
import subprocess
import sys
import time
import types

import pandas as pd
import pytest

from conftest import cli_command, endless_run_with_rows, run_cli, table_rows, wait_gone
from ncclbench.errors import STOP_SIGNALS

BASE = ["allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "64K", "-f", "4", "-n", "2", "--no-save"]


@pytest.fixture
def signal_state():
    """In-process tests of the rank's signal handling: pytest's own handlers and the
    rank's list of noted signals are put back afterwards."""
    from ncclbench.engine import signals

    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield signals
    signals._held_signals.clear()
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _partial_files(tmp_path, expected_sizes):
    frame = pd.read_csv(tmp_path / "r.csv")
    assert sorted(set(frame.size_bytes)) == expected_sizes
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["ncclbench"]["complete"] is False
    assert [r["size"] for r in doc["results"]] == expected_sizes


def test_killed_rank(tmp_path):
    start = time.time()
    r = run_cli(BASE + ["--csv", str(tmp_path / "r.csv"), "-J", str(tmp_path / "r.json")],
                env={"NCCLBENCH_FAULT": "kill:rank=1,size=4096"}, timeout=180)
    elapsed = time.time() - start
    assert r.returncode == 3, r.stderr
    assert "rank 1" in r.stderr and "SIGKILL" in r.stderr
    assert elapsed < 90
    assert [row[0] for row in table_rows(r.stdout)] == ["1024"]
    _partial_files(tmp_path, [1024])
    assert not wait_gone(str(tmp_path))


def test_killed_rank_while_rank0_writes_its_outcome(tmp_path):
    """torchrun's agent terminates rank 0 (SIGTERM) when rank 1 dies. If that lands while
    rank 0 is still writing the outcome (held there 5 s by the linger fault), rank 0
    keeps its verdict (the lost peer, exit 3) instead of becoming an interrupt (130)."""
    r = run_cli(BASE + ["--csv", str(tmp_path / "r.csv"), "-J", str(tmp_path / "r.json")],
                env={"NCCLBENCH_FAULT": "kill:rank=1,size=4096;linger:rank=0,seconds=5"}, timeout=180)
    assert r.returncode == 3, r.stderr
    assert "rank 1" in r.stderr and "SIGKILL" in r.stderr and "interrupted" not in r.stderr
    assert [row[0] for row in table_rows(r.stdout)] == ["1024"]
    _partial_files(tmp_path, [1024])
    assert not wait_gone(str(tmp_path))


def test_stalled_rank_past_timeout(tmp_path):
    start = time.time()
    r = run_cli(BASE + ["-T", "5", "--csv", str(tmp_path / "r.csv"), "-J", str(tmp_path / "r.json")],
                env={"NCCLBENCH_FAULT": "stall:rank=1,size=4096,seconds=300"}, timeout=180)
    elapsed = time.time() - start
    assert r.returncode == 4, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("ncclbench: error:")]
    assert len(errors) == 1 and "4096 B" in errors[0] and re.search(r"\(-T\): rank 1 \(pid \d+\) on \S+ never reached it: its last step was all_reduce at 1024 B", errors[0]) and "ranks 0" not in errors[0], r.stderr
    assert elapsed < 5 + 60  # the bound plus start-up and teardown on a slow 2-core machine
    assert "# Incomplete run (timeout): 1 rows finished and kept" in r.stdout
    _partial_files(tmp_path, [1024])
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["ncclbench"]["status"] == "timeout" and "4096" in doc["errors"][0]
    assert not wait_gone(str(tmp_path))


def test_rank_with_a_different_plan(tmp_path):
    r = run_cli(BASE + ["--csv", str(tmp_path / "r.csv")], env={"NCCLBENCH_FAULT": "plan:rank=1"})
    assert r.returncode == 2, r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("ncclbench: error:")]
    assert len(errors) == 1 and "rank(s) 1 run a different plan" in errors[0] and "max_bytes" in errors[0]
    assert table_rows(r.stdout) == []
    assert not wait_gone(str(tmp_path))


def test_ctrl_c_during_endless_cycles(tmp_path):
    proc = endless_run_with_rows(tmp_path, BASE)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "# Error: interrupted by the user (Ctrl-C)" in out
    assert "# Collective test concluded: all_reduce_perf" in out
    assert "Traceback" not in err
    frame = pd.read_csv(tmp_path / "r.csv")
    assert len(frame) >= 8 and (frame.nwrong == 0).all()
    assert not wait_gone(str(tmp_path))


@pytest.mark.parametrize("whom,sig", [("launcher", signal.SIGTERM), ("group", signal.SIGTERM),
                                      ("launcher", signal.SIGHUP)])
def test_termination_signals_stop_like_ctrl_c(tmp_path, whom, sig):
    """SIGTERM (scancel, `timeout`, CI cancelling a job) or SIGHUP, to the launcher alone
    (torchrun's agent forwards it to the ranks) or to the whole group: the rows so far are
    kept, summarized and written to JSON, with one error line and exit 130."""
    proc = endless_run_with_rows(tmp_path, BASE, "-J", str(tmp_path / "r.json"))
    if whom == "group":
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=90)
    name = signal.Signals(sig).name
    assert proc.returncode == 130, err
    assert f"# Error: terminated by {name}" in out and "# Collective test concluded: all_reduce_perf" in out
    assert [ln for ln in err.splitlines() if ln.strip()] == [f"ncclbench: error: terminated by {name}"]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["ncclbench"]["status"] == "interrupted" and doc["errors"] == [f"terminated by {name}"]
    assert len(doc["results"]) >= 4  # the CSV had more than 8 lines: two per row
    assert not list(tmp_path.glob("r.json.tmp-*"))
    assert not wait_gone(str(tmp_path))


def test_ranks_do_not_outlive_a_killed_launcher(tmp_path):
    """SIGKILL of the -g launcher (the OOM killer, kill -9) cannot be forwarded; the
    ranks it started get SIGTERM from the kernel (parent-death signal) and stop like a
    terminated run, JSON and CSV kept, instead of living on as orphans."""
    proc = endless_run_with_rows(tmp_path, BASE, "-J", str(tmp_path / "r.json"))
    proc.kill()
    out, err = proc.communicate(timeout=90)  # the ranks hold the pipes until they exit
    assert proc.returncode == -signal.SIGKILL
    assert "# Error: terminated by SIGTERM" in out and "# Collective test concluded: all_reduce_perf" in out
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["ncclbench"]["status"] == "interrupted" and len(doc["results"]) >= 4
    assert not wait_gone(str(tmp_path))


def test_json_folder_removed_mid_run(tmp_path):
    """The -J file's folder disappears after the first row: the run measures every size,
    the table and the CSV keep every row, and it ends with exit 6 naming the JSON file."""
    import shutil

    (tmp_path / "j").mkdir()
    cmd = [*cli_command(), "allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "4M", "-f", "2",
           "-n", "5", "--no-save", "-J", str(tmp_path / "j" / "r.json"), "--csv", str(tmp_path / "r.csv")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, NCCL_NVLS_ENABLE="0"))
    out = []
    for line in proc.stdout:  # the first data row: the JSON has been written once
        out.append(line)
        if table_rows(line):
            # renamed away in one step: a removal could race the writer's next temporary file
            os.rename(tmp_path / "j", tmp_path / "gone")
            break
    rest, err = proc.communicate(timeout=240)
    out = "".join(out) + rest
    assert proc.returncode == 6, err
    assert len(table_rows(out)) == 13  # 1K .. 4M
    assert f"# Error: cannot write JSON file {tmp_path / 'j' / 'r.json'}" in out
    assert "Traceback" not in err
    assert err.count("ncclbench: warning: cannot write JSON file") == 1
    assert err.strip().splitlines()[-1].startswith("ncclbench: error: cannot write JSON file")
    assert len(pd.read_csv(tmp_path / "r.csv")) == 2 * 13


def test_exit_code_of_failures_prefers_the_run_verdict():
    """Rank 0's own code wins; a rank-0 SIGTERM by the launcher does not hide another
    rank's code; only signals alone mean a lost peer."""
    from types import SimpleNamespace as F

    from ncclbench.launch.failures import exit_code_of_failure

    assert exit_code_of_failure({0: F(exitcode=7), 1: F(exitcode=-15)}) == 7
    assert exit_code_of_failure({0: F(exitcode=-15), 2: F(exitcode=4)}) == 4
    assert exit_code_of_failure({1: F(exitcode=-9), 0: F(exitcode=-15)}) == 3
    assert exit_code_of_failure({}) == 3
    # rank 1 killed (SIGKILL), rank 0 then terminated by the agent: the loss is the verdict
    assert exit_code_of_failure({0: F(exitcode=130), 1: F(exitcode=-9)}) == 3
    # an interrupt with no rank killed, or with ranks the agent itself terminated, stays 130
    assert exit_code_of_failure({0: F(exitcode=130), 1: F(exitcode=130)}) == 130
    assert exit_code_of_failure({0: F(exitcode=130), 1: F(exitcode=-15)}) == 130


def test_buffers_that_cannot_be_allocated_end_in_one_line():
    """1 PB of host buffers (beyond any address space). With -g the launcher refuses it
    before any rank starts (host memory, exit 5); a rank started by an outside launcher
    fails to allocate: one error line and exit 2. No traceback either way."""
    args = ["allreduce", "--backend", "gloo", "-b", str(10**15), "-e", str(10**15), "--no-save"]
    r = run_cli([*args, "-g", "2"])
    assert r.returncode == 5, r.stderr[-2000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and "of host memory" in errors[0] and "Traceback" not in r.stderr, r.stderr
    r = run_cli(args, env={"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29731"})
    assert r.returncode == 2, r.stderr[-2000:]
    errors = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1 and errors[0].startswith("ncclbench: error: cannot allocate the buffers"), r.stderr
    assert "Traceback" not in r.stderr


def test_a_launched_rank_that_cannot_rendezvous_is_one_line_and_exit_3(tmp_path):
    """Under an outside launcher (RANK/WORLD_SIZE set), a rendezvous port taken by another
    program ends in one line naming the rank and the address, exit 3, no torch traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = run_cli(["allreduce", "--backend", "gloo", "-b", "8", "-e", "8", "-T", "5", "--no-save"],
                    env={"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}, timeout=120, cwd=tmp_path)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 3, r.stderr[-2000:]
    assert len(lines) == 1 and "Traceback" not in r.stderr
    assert lines[0].startswith(f"ncclbench: error: rank 0 could not join the other 1 rank(s) at 127.0.0.1:{port}: ")


def test_ctrl_c_while_the_cli_imports_is_one_line():
    """A Ctrl-C that lands while the console command imports its modules (click here)
    ends like any other interrupt: one line, exit 130, no traceback."""
    import sys

    code = ("import sys\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, *args):\n"
            "        if name == 'click':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            "from ncclbench.entry import main\n"
            "main()\n")
    r = subprocess.run([sys.executable, "-c", code, "allreduce"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 130, r.stderr
    assert r.stderr.strip() == "ncclbench: interrupted" and "Traceback" not in r.stderr


@pytest.mark.parametrize("first,stops_with", [(signal.SIGTERM, "Terminated"), (signal.SIGINT, "KeyboardInterrupt")])
def test_an_interrupt_is_raised_once_and_its_repeats_noted(first, stops_with, signal_state):
    """The first SIGTERM/SIGINT stops the sweep; the repeats that follow it (a SIGKILLed -g
    launcher's parent-death signal comes once per exiting thread; on Ctrl-C torchrun's agent
    forwards SIGINT to ranks that got it from the terminal already) are only noted: a
    second exception raised while the first unwinds would skip the summary."""
    signals = signal_state
    signals.stop_on_termination_signals()
    with pytest.raises(KeyboardInterrupt) as stopped:
        os.kill(os.getpid(), first)
        time.sleep(5)  # the handler runs here at the latest
    assert type(stopped.value).__name__ == stops_with
    for sig in STOP_SIGNALS:
        os.kill(os.getpid(), sig)
    time.sleep(0.1)
    assert signals._held_signals == list(STOP_SIGNALS)


def test_a_stop_signal_while_another_thread_writes_a_timeout_verdict_is_noted_not_raised(signal_state, monkeypatch):
    """Rank 0 printed its -T verdict and waits on the watchdog's thread for the late ranks;
    one of them leaves with 4 and torchrun's agent sends rank 0 SIGTERM. Raised in the main
    thread it turned rank 0's exit into 130 (seen on 2 loaded cores); noted, the watchdog's
    thread ends the rank with 4."""
    from ncclbench.errors import ExitCode
    from ncclbench.launch import stop as rank_stop

    monkeypatch.setattr(rank_stop, "decided", lambda: int(ExitCode.TIMEOUT))
    signals = signal_state
    signals.stop_on_termination_signals()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.2)  # no KeyboardInterrupt here
    assert signals._held_signals == [signal.SIGTERM]


@pytest.mark.parametrize("fault,message", [("terms", "terminated by SIGTERM"), ("ints", "interrupted by the user (Ctrl-C)")])
def test_a_burst_of_interrupts_still_ends_in_one_summary(fault, message, tmp_path):
    """50 SIGTERMs or SIGINTs in quick succession (what a rank sees when its -g launcher is
    SIGKILLed, or on Ctrl-C): the trailer, JSON and CSV keep the rows so far, and stderr
    has one error line."""
    csv, js = tmp_path / "r.csv", tmp_path / "r.json"
    r = run_cli(["allreduce", "-g", "1", "--backend", "gloo", "-b", "1K", "-e", "1M", "-f", "2", "-n", "2", "--no-save",
                 "--csv", str(csv), "-J", str(js)], env={"NCCLBENCH_FAULT": f"{fault}:rank=0,size=65536"}, timeout=180)
    assert r.returncode == 130, r.stderr[-2000:]
    assert f"# Error: {message}" in r.stdout and "# Collective test concluded: all_reduce_perf" in r.stdout
    assert [ln for ln in r.stderr.splitlines() if ln.strip()] == [f"ncclbench: error: {message}"]
    doc = json.loads(js.read_text())
    assert doc["ncclbench"]["status"] == "interrupted" and [row["size"] for row in doc["results"]] == [
        1024, 2048, 4096, 8192, 16384, 32768]
    assert len(pd.read_csv(csv)) == 12


@pytest.mark.parametrize("rank,local_rank,expected", [
    ("0", "0", "ncclbench: error: terminated by SIGTERM\n"),
    ("1", "1", ""),
    ("4", "0", "ncclbench: error: [rank 4] terminated by SIGTERM\n"),  # the first rank of another node
])
def test_terminated_before_the_sweep_is_one_line_per_node(rank, local_rank, expected, capsys, monkeypatch,
                                                          signal_state):
    """A SIGTERM while the backend starts (nothing measured yet): exit 130 and one line,
    said by each node's first rank, instead of Click's blank line and 'interrupted'."""
    from ncclbench import backends
    from ncclbench.cli.main import main
    from ncclbench.errors import Terminated

    def terminated(*_args, **_kwargs):
        raise Terminated("SIGTERM")

    for key, value in {"RANK": rank, "WORLD_SIZE": "8", "LOCAL_RANK": local_rank, "LOCAL_WORLD_SIZE": "4",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(backends, "create_backend", terminated)

    def hard_exit(code):  # a launched rank's exit, which here would end pytest itself
        raise SystemExit(code)

    monkeypatch.setattr("ncclbench.engine.watchdog.hard_exit", hard_exit)
    with pytest.raises(SystemExit) as exc:
        main(["allreduce", "--backend", "gloo", "--no-save", "-b", "8", "-e", "8"])
    assert exc.value.code == 130
    assert capsys.readouterr().err == expected


def test_a_signal_while_the_header_is_written_still_gets_a_trailer(tmp_path):
    """A SIGTERM after rank 0 printed the header and wrote a 'running' JSON, before the sweep:
    noted, then the sweep stops before it begins; trailer, JSON 'interrupted' with no rows."""
    js = tmp_path / "r.json"
    r = run_cli(["allreduce", "-g", "1", "--backend", "gloo", "-b", "1K", "-e", "64K", "-f", "4", "-n", "2",
                 "--no-save", "-J", str(js)], env={"NCCLBENCH_FAULT": "term_at_start:rank=0"}, timeout=180)
    assert r.returncode == 130, r.stderr[-2000:]
    assert "# Error: terminated by SIGTERM" in r.stdout and "# Collective test concluded: all_reduce_perf" in r.stdout
    assert not table_rows(r.stdout)
    assert [ln for ln in r.stderr.splitlines() if ln.strip()] == ["ncclbench: error: terminated by SIGTERM"]
    doc = json.loads(js.read_text())
    assert doc["ncclbench"]["status"] == "interrupted" and doc["results"] == []


def test_a_suite_interrupted_by_a_burst_still_prints_its_summary(tmp_path):
    """The suite summary comes before the rank's teardown, which a held signal cuts short."""
    suite = tmp_path / "s.yaml"
    suite.write_text("defaults:\n  minbytes: 1K\n  maxbytes: 1M\n  stepfactor: 2\n  iters: 2\n"
                     "runs:\n  - allreduce\n  - allgather\n")
    r = run_cli(["suite", str(suite), "-g", "1", "--backend", "gloo", "--no-save"],
                env={"NCCLBENCH_FAULT": "terms:rank=0,size=65536"}, timeout=180)
    assert r.returncode == 130, r.stderr[-2000:]
    summary = r.stdout[r.stdout.index("# Suite summary"):].splitlines()
    assert "interrupted" in summary[2] and summary[3].endswith("not run"), summary
    assert [ln for ln in r.stderr.splitlines() if ln.strip()] == ["ncclbench: error: terminated by SIGTERM"]


def test_an_interrupt_before_a_later_plan_began_ends_the_run_with_130(signal_state, capsys, monkeypatch):
    """A suite's second plan interrupted while it sets up (its report not begun): the run
    ends with 130 and one line, the suite's epilogue still runs, and a signal during the
    teardown exits with 130, never with the first plan's 0."""
    from ncclbench import backends
    from ncclbench.engine import lifecycle
    from ncclbench.errors import Terminated
    from ncclbench.results.records import RunSummary

    closed, ran = [], []

    class Backend:
        rank, nranks = 0, 1

        def use_groups(self, _groups):
            pass

        def close(self):
            closed.append(signal.getsignal(signal.SIGTERM))

    def run_plan(plan, *_args):
        if ran:
            raise Terminated("SIGTERM")
        ran.append(plan)
        return RunSummary([], complete=True, status="ok", errors=[])

    class Plan:
        backend, timeout_s, stream_null = "gloo", 60, False

        def groups(self, _n):
            return [[0]]

    monkeypatch.setattr(backends, "create_backend", lambda *_a, **_k: Backend())
    monkeypatch.setattr(lifecycle, "run_plan", run_plan)
    epilogue = []
    launch = types.SimpleNamespace(rank=0, world_size=1)
    code = lifecycle.run_rank([Plan(), Plan()], launch, None, epilogue=lambda: epilogue.append(1))
    assert code == 130 and epilogue == [1] and len(ran) == 1
    assert capsys.readouterr().err == "ncclbench: error: terminated by SIGTERM\n"
    leave = closed[0]  # the teardown's handler: exits with the run's code
    exits = []
    monkeypatch.setattr(os, "_exit", exits.append)
    leave(signal.SIGTERM, None)
    assert exits == [130]


def test_the_launcher_outlives_its_ranks_after_repeated_signals(tmp_path):
    """Three SIGTERMs to the -g launcher while rank 0 writes its outcome slowly (linger):
    torchrun's agent raises on each and cut its own wait for the ranks short, so the
    launcher returned before the trailer. It now waits for its ranks."""
    env = {"NCCLBENCH_FAULT": "linger:rank=0,seconds=4"}
    proc = endless_run_with_rows(tmp_path, BASE, "-J", str(tmp_path / "r.json"), env=env)
    for _ in range(3):
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.7)
    start = time.monotonic()
    proc.wait(timeout=90)
    exited_after = time.monotonic() - start
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "# Collective test concluded: all_reduce_perf" in out and "Traceback" not in err
    assert json.loads((tmp_path / "r.json").read_text())["ncclbench"]["status"] == "interrupted"
    assert exited_after > 1.0  # it waited for rank 0's remaining linger, not only the signals
    assert not wait_gone(str(tmp_path))


# ---- a failure on some ranks only, heard by all ------------------------------------------------
RANK1_FAULTS = [
    # (fault on rank 1, exit code, words of rank 1's reason)
    ("alloc_fail", 2, "cannot allocate the buffers (8.0 MiB): out of memory"),
    ("plan_fail", 2, "buffers need 8.0 MiB but the GPU has 0 B free"),
    ("no_gpu", 5, "local rank 1 has no GPU"),
    ("device_fail", 3, "setting up the device: RuntimeError: CUDA error"),
    ("comm_fail", 3, "starting the gloo communicator: RuntimeError: NCCL error"),
]


def _error_lines(stderr: str) -> list[str]:
    """ncclbench's error lines (not its warnings: more gloo ranks than CPUs get one)."""
    return [ln for ln in stderr.splitlines() if ln.startswith("ncclbench:") and not ln.startswith("ncclbench: warning")]


def _c10d_noise(stderr: str) -> list[str]:
    """torch's c10d warnings (a store wait that timed out logs two per wait)."""
    return [ln for ln in stderr.splitlines() if "[c10d]" in ln or "socket.cpp" in ln]


@pytest.mark.parametrize("fault,code,reason", RANK1_FAULTS, ids=[f[0] for f in RANK1_FAULTS])
def test_a_set_up_failure_on_one_rank_is_said_once_and_every_rank_leaves_with_its_code(tmp_path, fault, code,
                                                                                        reason):
    """Rank 1 alone fails while the run sets up (its GPU, its communicator, the memory
    check, the allocation): one line naming rank 1, its host and its reason, the code of
    that kind of failure, no traceback, and no result file for a run that never started
    (before: rank 0 failed on with 'Connection reset by peer', exit 3, rank 1's reason
    unsaid and 'results saved'; or a traceback and exit 1)."""
    store = tmp_path / "store"
    start = time.time()
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "4M", "-e", "4M", "-n", "2", "-T", "60",
                 "--results-dir", str(store), "-J", str(tmp_path / "r.json")],
                env={"NCCLBENCH_FAULT": f"{fault}:rank=1"}, timeout=180)
    assert r.returncode == code, r.stderr[-3000:]
    lines = _error_lines(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("ncclbench: error: rank 1 on ") and reason in lines[0], r.stderr
    assert _c10d_noise(r.stderr) == []  # before: 2 c10d warnings per half second rank 0 waited
    assert "Traceback" not in r.stderr and table_rows(r.stdout) == [] and "saved" not in r.stdout + r.stderr
    assert not (tmp_path / "r.json").exists() and not list(store.glob("*.json"))
    assert time.time() - start < 60  # well within -T: nobody waits for the failed rank
    assert not wait_gone(str(tmp_path))


@pytest.mark.parametrize("fault,code,reason", [RANK1_FAULTS[0], RANK1_FAULTS[2], RANK1_FAULTS[4]],
                         ids=["alloc_fail", "no_gpu", "comm_fail"])
def test_a_set_up_failure_on_one_rank_under_torchrun_itself(tmp_path, fault, code, reason):
    """The same under an outside torchrun: rank 1's reason once, both ranks exit with the
    failure's code (torchrun itself exits 1 and prints its own summary), no traceback from
    the ranks."""
    torchrun = str(__import__("pathlib").Path(sys.executable).with_name("torchrun"))
    cmd = [torchrun, "--nproc-per-node", "2", "--standalone", "-m", "ncclbench", "allreduce", "--backend", "gloo",
           "-b", "4M", "-e", "4M", "-n", "2", "-T", "60", "--results-dir", str(tmp_path / "store")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, NCCL_NVLS_ENABLE="0", NCCLBENCH_FAULT=f"{fault}:rank=1"))
    assert r.returncode == 1, r.stderr[-3000:]
    lines = _error_lines(r.stderr)
    assert len(lines) == 1 and lines[0].startswith("ncclbench: error: rank 1 on ") and reason in lines[0], r.stderr
    assert re.findall(r"^\s+exitcode\s*:\s*(-?\d+)", r.stderr, re.M) == [str(code)] * 2, r.stderr[-3000:]
    assert not [ln for ln in r.stderr.splitlines() if ln.startswith("  File ") and "/ncclbench/" in ln]
    assert not list((tmp_path / "store").glob("*.json"))


@pytest.mark.parametrize("launcher", ["-g", "torchrun"])
def test_a_sigterm_while_a_rank_shuts_down_keeps_its_code(tmp_path, launcher):
    """Rank 0 has written its verdict (wrong results: 7) and gets SIGTERM while its
    interpreter shuts down, as torchrun's agent sends to the ranks left when another rank
    failed: it still exits 7 (before: Python's default handler, put back at shutdown, killed
    it, -15 under torchrun, read as 3 by the -g launcher)."""
    args = ["allreduce", "--backend", "gloo", "-b", "1K", "-e", "1K", "-n", "2", "-w", "1", "--no-save"]
    env = {"NCCLBENCH_FAULT": "term_at_exit:rank=0;corrupt:rank=1"}
    if launcher == "-g":
        r = run_cli(["allreduce", "-g", "2"] + args[1:], env=env, timeout=180)
        assert r.returncode == 7, r.stderr[-3000:]
        return
    torchrun = str(__import__("pathlib").Path(sys.executable).with_name("torchrun"))
    r = subprocess.run([torchrun, "--nproc-per-node", "2", "--standalone", "-m", "ncclbench"] + args,
                       capture_output=True, text=True, timeout=180, env=dict(os.environ, NCCL_NVLS_ENABLE="0", **env))
    assert r.returncode == 1, r.stderr[-3000:]
    assert "7" in re.findall(r"^\s+exitcode\s*:\s*(-?\d+)", r.stderr, re.M), r.stderr[-3000:]
    assert "-15" not in re.findall(r"^\s+exitcode\s*:\s*(-?\d+)", r.stderr, re.M), r.stderr[-3000:]


def test_an_error_in_the_sweep_on_one_rank_under_torchrun(tmp_path):
    """Rank 1 alone raises a CUDA error mid-sweep: it says so, rank 0 keeps the rows done,
    and both ranks exit 3 (before: the rank still shutting down when torchrun's agent
    terminated it showed -15 instead)."""
    torchrun = str(__import__("pathlib").Path(sys.executable).with_name("torchrun"))
    cmd = [torchrun, "--nproc-per-node", "2", "--standalone", "-m", "ncclbench", "allreduce", "--backend", "gloo",
           "-b", "1K", "-e", "64K", "-f", "2", "-n", "2", "-w", "1", "-T", "60", "-J", str(tmp_path / "r.json"),
           "--no-save"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, NCCL_NVLS_ENABLE="0", NCCLBENCH_FAULT="error:rank=1,size=16384"))
    assert r.returncode == 1, r.stderr[-3000:]
    lines = _error_lines(r.stderr)
    assert len(lines) == 1 and re.fullmatch(SWEEP_ERROR_LINE.format(rank=1, size=16384), lines[0]), r.stderr[-3000:]
    assert sorted(re.findall(r"^\s+exitcode\s*:\s*(-?\d+)", r.stderr, re.M)) == ["3", "3"], r.stderr[-3000:]
    assert len(table_rows(r.stdout)) == 4  # 1K to 8K
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["ncclbench"]["status"] == "error" and doc["errors"] == [lines[0].removeprefix("ncclbench: error: ")]


SWEEP_ERROR_LINE = (r"ncclbench: error: rank {rank} on \S+ during all_reduce at {size} B \(float, sum, root -1\): "
                    r"RuntimeError: CUDA error: an illegal memory access was encountered \(NCCLBENCH_FAULT error\)")


@pytest.mark.parametrize("rank", [0, 1])
def test_an_error_in_the_sweep_on_one_rank_is_one_line_naming_it(tmp_path, rank):
    """A collective fails mid-sweep on one rank only; its peer then fails too, as a lost
    peer. The run ends with one line, the failed rank's, naming it, its host and what ran;
    rank 0's JSON and its trailer hold the same line, rows done kept (before: two lines,
    the peer's 'Connection reset by peer' first and no host)."""
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "64K", "-f", "2", "-n", "2", "-T", "60",
                 "-J", str(tmp_path / "r.json"), "--no-save"],
                env={"NCCLBENCH_FAULT": f"error:rank={rank},size=16384"}, timeout=180)
    assert r.returncode == 3, r.stderr[-3000:]
    lines = _error_lines(r.stderr)
    assert len(lines) == 1 and re.fullmatch(SWEEP_ERROR_LINE.format(rank=rank, size=16384), lines[0]), r.stderr
    assert _c10d_noise(r.stderr) == [] and "Traceback" not in r.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["ncclbench"]["status"] == "error" and doc["errors"] == [lines[0].removeprefix("ncclbench: error: ")]
    assert len(table_rows(r.stdout)) == 4
    assert not wait_gone(str(tmp_path))


@pytest.mark.parametrize("deadline", ["60", "1"])
def test_a_killed_rank_is_one_line_naming_it_and_its_host(tmp_path, deadline):
    """Killed mid-sweep (no word of its own): the -g launcher's line names it, its host and
    what it ran, and says that rank 0 stopped after it; rank 0 adds nothing on stderr but
    keeps the same story in its JSON. With -T 1 too: rank 0's wait for a posted cause is not
    a size's time (before, it ran into the deadline: exit 4 and a second line)."""
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "64K", "-f", "2", "-n", "2", "-T", deadline,
                 "-J", str(tmp_path / "r.json"), "--no-save"],
                env={"NCCLBENCH_FAULT": "kill:rank=1,size=16384"}, timeout=180)
    assert r.returncode == 3, r.stderr[-3000:]
    lines = _error_lines(r.stderr)
    death = r"rank 1 \(pid \d+\) on \S+ was killed by SIGKILL during all_reduce at 16384 B \(float, sum, root -1\)"
    assert len(lines) == 1 and re.fullmatch(rf"ncclbench: error: {death}; rank 0 stopped after rank 1 died; "
                                            r"rows finished before it are kept, the run is incomplete", lines[0]), r.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["ncclbench"]["status"] == "error"
    assert re.fullmatch(rf"{death}; rank 0 on \S+ stopped after rank 1 died", doc["errors"][0]), doc["errors"]


def test_a_killed_rank_under_torchrun_is_one_line_from_rank_0():
    """Under an outside launcher, rank 0 says once which peer died (found by its process on
    this host) and what it was running itself when it stopped; torchrun's own summary names
    the rank that died too."""
    torchrun = str(__import__("pathlib").Path(sys.executable).with_name("torchrun"))
    cmd = [torchrun, "--nproc-per-node", "2", "--standalone", "-m", "ncclbench", "allreduce", "--backend", "gloo",
           "-b", "1K", "-e", "64K", "-f", "2", "-n", "2", "-T", "60", "--no-save"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                       env=dict(os.environ, NCCL_NVLS_ENABLE="0", NCCLBENCH_FAULT="kill:rank=1,size=16384"))
    assert r.returncode == 1, r.stderr[-3000:]
    lines = _error_lines(r.stderr)
    assert len(lines) == 1 and re.fullmatch(r"ncclbench: error: rank 1 \(pid \d+\) on \S+ died; rank 0 on \S+ stopped "
                                            r"after rank 1 died during all_reduce at 16384 B \(float, sum, root -1\)",
                                            lines[0]), r.stderr[-3000:]


def test_a_rank_that_arrives_late_leaves_stderr_clean(tmp_path):
    """Ranks that reach the set-up seconds apart wait for each other without torch's c10d
    warnings (before: two lines for every half second of waiting)."""
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "1K", "-n", "2", "--no-save"],
                env={"NCCLBENCH_FAULT": "device_stall:rank=1,seconds=3"}, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _c10d_noise(r.stderr) == [] and _error_lines(r.stderr) == [], r.stderr


def test_the_first_cause_of_a_sweep_failure_is_kept_and_read():
    """Unit: the first failure posted stays (compare_set); a lost peer is told by its words."""
    import torch.distributed as dist

    from ncclbench.engine.guard import lost_peer, post_cause, read_cause

    store = dist.PrefixStore("t", dist.HashStore())
    assert read_cause(store, 0.05) is None
    post_cause(store, "rank 3 on h: RuntimeError: CUDA error")
    post_cause(store, "rank 1 on h: RuntimeError: later")
    assert read_cause(store) == "rank 3 on h: RuntimeError: CUDA error"
    assert read_cause(None) is None
    post_cause(None, "ignored")  # no store: nothing to do, no error
    assert lost_peer("RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:4")
    assert lost_peer("DistBackendError: NCCL error: remote process exited or there was a network error")
    assert not lost_peer("RuntimeError: CUDA error: an illegal memory access was encountered")
    # a rank's own error that ends in generic words is its own, never kept quiet as a lost peer
    assert not lost_peer("RuntimeError: CUDA error: unspecified launch failure; cudaMemcpy: Broken pipe")
    assert not lost_peer("OSError: [Errno 111] Connection refused") and not lost_peer("EOFError: end of file")


def test_the_cause_is_waited_for_within_its_grace_and_a_gone_store_gives_none():
    """Unit: a cause posted late, within the wait, is read; none posted costs the whole wait
    and no more; the set-up wait polls until the key comes; a store that is gone with the
    rank that hosted it gives no cause instead of an error."""
    import threading

    import torch.distributed as dist

    from ncclbench.engine.guard import post_cause, posted, read_cause

    store = dist.HashStore()
    threading.Timer(0.3, post_cause, (store, "rank 1 on h: late", "late")).start()
    assert read_cause(store, 5.0, "late") == "rank 1 on h: late"
    start = time.monotonic()
    assert read_cause(store, 0.3, "never") is None
    assert 0.3 <= time.monotonic() - start < 1.5
    threading.Timer(0.3, store.set, ("complete", "1")).start()
    assert posted(store, "complete", 5.0) and not posted(store, "absent", 0.0)

    class Gone:
        def check(self, keys):
            raise RuntimeError("Connection reset by peer")

        def get(self, key):
            raise RuntimeError("Connection reset by peer")

        def compare_set(self, key, expected, value):
            raise RuntimeError("Connection reset by peer")

    assert read_cause(Gone(), 1.0) is None
    post_cause(Gone(), "ignored")  # cannot post: no error either


def test_a_rank_stuck_in_its_set_up_is_named_at_the_deadline(tmp_path):
    """Rank 1 stays in its device set-up: at -T the others say so in one line and every
    rank leaves with the timeout code."""
    start = time.time()
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "1K", "-T", "5", "--no-save"],
                env={"NCCLBENCH_FAULT": "device_stall:rank=1,seconds=300"}, timeout=180)
    assert r.returncode == 4, r.stderr[-3000:]
    lines = _error_lines(r.stderr)
    assert lines[0] == "ncclbench: error: rank 1 did not finish setting up the device within 5 s (-T)", lines
    # the -g launcher ends a rank still running 3 s after the timeout, and says so: rank 1 only
    assert all(re.match(r"ncclbench: error: rank 1 \(pid \d+\) .*killed by ncclbench", ln) for ln in lines[1:]), lines
    assert time.time() - start < 5 + 60
    assert not wait_gone(str(tmp_path))


def test_failures_on_several_ranks_are_each_said_with_the_most_severe_code():
    """No GPU on rank 0, a CUDA error on rank 2: both said, the run ends with the CUDA
    error's 3 rather than the missing GPU's 5."""
    r = run_cli(["allreduce", "-g", "3", "--backend", "gloo", "-b", "4M", "-e", "4M", "--no-save"],
                env={"NCCLBENCH_FAULT": "no_gpu:rank=0;device_fail:rank=2"}, timeout=180)
    assert r.returncode == 3, r.stderr[-3000:]
    lines = _error_lines(r.stderr)
    assert len(lines) == 2 and "rank 0 on " in lines[0] and "rank 2 on " in lines[1], r.stderr


def test_the_verdict_of_a_set_up_step():
    from ncclbench.engine.guard import Failure, ranks_text, verdict

    assert [ranks_text(r) for r in ([3], [1, 4], [0, 1, 2, 3, 9], [5, 6])] == \
        ["rank 3", "ranks 1,4", "ranks 0-3,9", "ranks 5,6"]
    same = [Failure(r, "h", 2, "root 5 does not exist") for r in range(4)]
    assert verdict(same, 4).lines == ["root 5 does not exist"]  # found on every rank: said once, as is
    assert verdict(same[1:], 4).lines == ["ranks 1-3 on h: root 5 does not exist"]
    mixed = [Failure(2, "b", 3, "CUDA error"), Failure(0, "a", 5, "no GPU"), Failure(1, "a", 2, "no memory")]
    v = verdict(mixed, 4)
    assert v.lines == ["rank 0 on a: no GPU", "rank 1 on a: no memory", "rank 2 on b: CUDA error"]
    assert v.exit_code == 3  # a CUDA/NCCL error outranks a missing GPU and a plan that does not fit
    late = verdict([], 4, missing=[2], what="setting up the device", timeout_s=5)
    assert late.lines == ["rank 2 did not finish setting up the device within 5 s (-T)"] and late.exit_code == 4
    many = verdict([Failure(r, "h", 2, f"reason {r}") for r in range(20)], 64)
    assert len(many.lines) == 9 and many.lines[-1] == "ranks 8-19 failed too (other reasons)"
    assert verdict([], 4) is None
