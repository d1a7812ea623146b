"""A rank that dies is named alone, and its peers stop themselves even when they wait in C
code, where no Python signal handler runs (as NCCL's peers of a dead rank do on a GPU host,
inside a CUDA synchronize). On the CPU the `kill_held` fault makes gloo do the same: the
killed rank's sockets stay open (a forked child holds them), so its peers block inside the
collective instead of failing at once. Before: the -g launcher's SIGTERM did nothing, its
SIGKILL 30 s later ended them, and it named every rank as killed by SIGKILL."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import ROW_RE, cli_command, table_rows, wait_gone
from ncclbench.launch import spawn
from ncclbench.launch.stop import PeerDeath

ARGS = ["allreduce", "--backend", "gloo", "-b", "1K", "-e", "64K", "-f", "2", "-n", "2", "--no-save"]
DEATH = r"rank {rank} \(pid \d+\) on \S+ was killed by SIGKILL during all_reduce at 16384 B \(float, sum, root -1\)"
BOUND_S = 10.0  # from the kill to every process gone; the GPU host's target is 15 s


def timed_run(cmd, env, timeout=180):
    """Run `cmd`: (exit code, stdout, stderr, seconds from the last table row to the exit).
    The fault kills its rank right after the row before its size, so that is the kill's time."""
    full_env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    full_env.update(NCCL_NVLS_ENABLE="0", **env)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
    err = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()), daemon=True)
    reader.start()
    out, last_row = [], time.monotonic()
    for line in proc.stdout:
        out.append(line)
        if ROW_RE.match(line):
            last_row = time.monotonic()
    proc.wait(timeout=timeout)
    ended = time.monotonic()
    reader.join(timeout=10)
    return proc.returncode, "".join(out), "".join(err), ended - last_row


def error_lines(stderr: str) -> list[str]:
    """ncclbench's error lines (not its warnings: more gloo ranks than CPUs get one)."""
    return [ln for ln in stderr.splitlines() if ln.startswith("ncclbench:") and not ln.startswith("ncclbench: warning")]


def test_a_rank_killed_while_its_peers_wait_in_c_code_is_named_alone(tmp_path):
    """-g 4, rank 3 killed at 16 KiB with its peers stuck inside the collective: one line
    naming rank 3 alone (pid, host, what it ran) and ranks 0-2 as stopped after it, exit 3,
    everything gone well within 15 s of the kill, rows and files kept, and nothing left
    running (not even the child that held the sockets)."""
    code, out, err, after = timed_run(cli_command() + [ARGS[0], "-g", "4", *ARGS[1:], "-J", str(tmp_path / "r.json"),
                                                       "--csv", str(tmp_path / "r.csv")],
                                      {"NCCLBENCH_FAULT": "kill_held:rank=3,size=16384,seconds=60"})
    assert code == 3, err[-3000:]
    lines = error_lines(err)
    assert len(lines) == 1 and re.fullmatch(rf"ncclbench: error: {DEATH.format(rank=3)}; ranks 0-2 stopped after "
                                            r"rank 3 died; rows finished before it are kept, the run is incomplete",
                                            lines[0]), err[-3000:]
    assert err.count("killed") == 1 and "Traceback" not in err
    assert after < BOUND_S, f"{after:.1f} s from the kill to the end"
    assert [row[0] for row in table_rows(out)] == ["1024", "2048", "4096", "8192"]
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["ncclbench"]["status"] == "error" and [r["size"] for r in doc["results"]] == [1024, 2048, 4096, 8192]
    assert re.fullmatch(rf"{DEATH.format(rank=3)}; rank 0 on \S+ stopped after rank 3 died", doc["errors"][0])
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 1 + 2 * 4
    assert not wait_gone(str(tmp_path), seconds=5)


def test_a_rank_killed_under_torchrun_while_its_peers_wait_in_c_code(tmp_path):
    """Under the user's own torchrun the agent sees the death and sends SIGTERM, which the
    stuck peers' main threads cannot take: their stop thread finds the dead rank by its
    process, and rank 0 says one line naming it, itself only as stopped; the survivors exit
    3 on their own (torchrun's summary: 3, not -9 or -15) well within 15 s of the kill."""
    torchrun = str(__import__("pathlib").Path(sys.executable).with_name("torchrun"))
    code, out, err, after = timed_run([torchrun, "--nproc-per-node", "3", "--standalone", "-m", "ncclbench", *ARGS,
                                       "-J", str(tmp_path / "r.json")],
                                      {"NCCLBENCH_FAULT": "kill_held:rank=2,size=16384,seconds=60"})
    assert code == 1, err[-3000:]
    lines = error_lines(err)
    said = r"rank 2 \(pid \d+\) on \S+ died; rank 0 on \S+ stopped after rank 2 died during all_reduce at 16384 B " \
           r"\(float, sum, root -1\)"
    assert len(lines) == 1 and re.fullmatch(rf"ncclbench: error: {said}", lines[0]), err[-3000:]
    assert sorted(re.findall(r"^\s+exitcode\s*:\s*(-?\d+)", err, re.M)) == ["-9", "3", "3"], err[-3000:]
    assert after < BOUND_S, f"{after:.1f} s from the kill to the end"
    assert len(table_rows(out)) == 4
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["ncclbench"]["status"] == "error" and re.fullmatch(said, doc["errors"][0])
    assert not wait_gone(str(tmp_path), seconds=5)


def test_a_stop_signal_reaches_a_rank_stuck_in_c_code(tmp_path):
    """Rank 1 stalls (in Python) and rank 0 waits for it inside the gloo collective; a
    SIGTERM to rank 0 alone cannot run its handler there. Its stop thread finds no dead peer,
    so it stops rank 0 as terminated: trailer and rows kept, exit 130, within seconds (before:
    only -T, 600 s by default, ended it). Rank 1, told by the launcher that rank 0 ended,
    stops too, and the launcher, which saw no death, adds no line."""
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", NCCLBENCH_FAULT="stall:rank=1,size=16384")
    proc = subprocess.Popen(cli_command() + [ARGS[0], "-g", "2", *ARGS[1:], "-J", str(tmp_path / "r.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out, pid0 = [], None
    try:
        for line in proc.stdout:
            out.append(line)
            pid0 = pid0 or next(iter(re.findall(r"Rank\s+0 Group\s+0 Pid\s+(\d+)", line)), None)
            if line.split()[:1] == ["8192"]:
                break
        time.sleep(1.0)  # rank 0 is now inside the 16 KiB collective, rank 1 asleep before it
        sent = time.monotonic()
        os.kill(int(pid0), signal.SIGTERM)
        rest, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        _end_tree(proc)
    assert proc.returncode == 130, err[-3000:]
    assert took < BOUND_S, f"{took:.1f} s from the signal to the end"
    assert error_lines(err) == ["ncclbench: error: terminated by SIGTERM"], err[-3000:]
    assert len(table_rows("".join(out) + rest)) == 4 and "# Incomplete run (interrupted)" in rest
    assert json.loads((tmp_path / "r.json").read_text())["ncclbench"]["status"] == "interrupted"
    assert not wait_gone(str(tmp_path), seconds=5)


def _end_tree(proc) -> None:
    """The launcher and its ranks, killed if a failed test left them running."""
    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True) + [psutil.Process(proc.pid)]
    except psutil.Error:
        return
    for p in tree:
        try:
            p.kill()
        except psutil.Error:
            pass
    proc.wait(timeout=30)


RANK_SCRIPT = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
os.pwrite(int(os.environ["NCCLBENCH_DOING_FD"]), f"step {rank}".encode() + bytes(8), 0)
if rank == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)
if rank == 2:
    heard = os.read(int(os.environ["NCCLBENCH_STOP_FD"]), 4096)
    open(sys.argv[1], "wb").write(heard)
    sys.exit(3)
time.sleep(60)
"""


def test_the_launcher_names_the_first_death_and_kills_only_a_rank_that_does_not_stop(tmp_path, monkeypatch, capsys):
    """The launcher alone, with stand-in ranks: rank 1 dies first; rank 2 hears of it on its
    pipe (rank, pid, host and the step its page held) and stops with 3; rank 0 never stops
    and is killed after the grace, which the line says instead of calling it a death."""
    monkeypatch.setattr(spawn, "STOP_GRACE_S", 1.0)
    heard = tmp_path / "heard"
    start = time.monotonic()
    code = spawn.start_ranks(3, [sys.executable, "-c", RANK_SCRIPT, str(heard), str(tmp_path)])
    assert code == 3 and time.monotonic() - start < 10
    death = PeerDeath.from_line(heard.read_text().strip())
    host = socket.gethostname()
    assert death.rank == 1 and not death.said_own
    assert re.fullmatch(rf"rank 1 \(pid \d+\) on {host} was killed by SIGKILL during step 1", death.text)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("ncclbench:")]
    assert len(lines) == 1 and re.fullmatch(
        rf"ncclbench: error: {re.escape(death.text)}; rank 2 stopped after rank 1 died; rank 0 \(pid \d+\) did not "
        r"stop within 1 s after rank 1 died and was killed by ncclbench \(SIGKILL\); rows finished before it are "
        r"kept, the run is incomplete", lines[0]), lines
    assert not wait_gone(str(tmp_path), seconds=5)


def _exit(rank, code, after=False, killed_here=False, doing=None):
    return spawn.RankExit(rank, 100 + rank, code, doing, after_cause=after, killed_here=killed_here)


def test_the_launchers_line_tells_the_cause_from_its_consequences():
    host = socket.gethostname()
    # a rank that failed with a code said why itself; the ranks that stopped after it add nothing
    assert spawn.describe_exits([_exit(1, 3), _exit(0, 3, after=True), _exit(2, 3, after=True)]) == []
    # two deaths seen in the same first look are both causes; one later by a signal not sent here is told as such
    lines = spawn.describe_exits([_exit(2, -9, doing="x"), _exit(3, -9), _exit(0, 3, after=True),
                                  _exit(1, -11, after=True)])
    assert lines == [f"rank 2 (pid 102) on {host} was killed by SIGKILL during x; rank 3 (pid 103) on {host} was "
                     "killed by SIGKILL; rank 0 stopped after rank 2 died; rank 1 (pid 101) ended by SIGSEGV while it "
                     "stopped; rows finished before it are kept, the run is incomplete"]
    # a rank killed here after a failure with a code: the line says the kill was the launcher's
    lines = spawn.describe_exits([_exit(1, 3), _exit(0, -9, after=True, killed_here=True)])
    assert lines == [f"rank 0 (pid 100) did not stop within {spawn.STOP_GRACE_S:g} s after rank 1 failed and was "
                     "killed by ncclbench (SIGKILL); rows finished before it are kept, the run is incomplete"]


def test_a_peer_death_travels_as_one_line():
    death = PeerDeath(3, "rank 3 (pid 9) on n7 was killed by SIGKILL during all_gather at 8 B (float, none, root -1)")
    assert PeerDeath.from_line(death.line()) == death
    assert PeerDeath.from_line("not json") is None and PeerDeath.from_line('{"text": "no rank"}') is None
    host = socket.gethostname()
    assert death.stopped(0, "all_gather at 8 B") == f"{death.text}; rank 0 on {host} stopped after rank 3 died"
    plain = PeerDeath(3, "rank 3 (pid 9) on n7 died")
    assert plain.stopped(1, "x") == f"rank 3 (pid 9) on n7 died; rank 1 on {host} stopped after rank 3 died during x"
    failed = PeerDeath(2, "rank 2 (pid 8) on n7 exited with code 3", said_own=True)
    assert failed.stopped(0).endswith("stopped after rank 2 failed")


def test_a_dead_peer_is_found_by_its_process_even_before_it_is_reaped():
    from ncclbench import procs
    from ncclbench.engine import peers

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 20
        while procs.alive(dead.pid) and time.monotonic() < deadline:  # a zombie until reaped below
            time.sleep(0.05)
        assert not procs.alive(dead.pid) and procs.alive(alive.pid)
        host = socket.gethostname()
        peers._peers[:] = [(0, host, os.getpid()), (1, host, alive.pid), (2, host, dead.pid), (3, "elsewhere", 1)]
        found = peers.dead_here()
        assert found == PeerDeath(2, f"rank 2 (pid {dead.pid}) on {host} died")
    finally:
        peers._peers.clear()
        alive.kill()
        alive.wait()
        dead.wait()
        assert not procs.alive(dead.pid)


@pytest.mark.parametrize("posted", [True, False])
def test_a_death_found_on_one_host_is_read_on_another_through_the_store(monkeypatch, posted):
    """Ranks on another host cannot see the dead process: the first death a rank found is
    posted in the rendezvous store, and read from there (a gone store reads as none)."""
    import datetime

    import torch.distributed as dist

    from ncclbench.engine import peers

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=5))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    first = PeerDeath(5, "rank 5 (pid 77) on nodeB died")
    if posted:  # by the main thread of a rank there, through the default group's prefixed store
        peers.post_death(first, dist.PrefixStore("default_pg", dist.PrefixStore("x", server)))
        peers.post_death(PeerDeath(6, "rank 6 (pid 78) on nodeB died"))  # later: the first stays
    assert peers.posted_death() == (first if posted else None)  # by a stop thread here, on its own connection
    del server
    monkeypatch.setenv("MASTER_PORT", "1")  # nothing listens there
    start = time.monotonic()
    assert peers.posted_death() is None and time.monotonic() - start < 3 * peers.STORE_WAIT_S + 2
