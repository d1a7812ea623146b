"""Unit: the failpoints module reads what is planted once, plants each fault kind at its
named failpoint, and its actions act on the context they are given."""

import time

import pytest

from ncclbench import failpoints
from ncclbench.failpoints import failpoint


@pytest.fixture
def planted(monkeypatch):
    """plant(fault=..., item=..., pairs_slow=...): set the environment and read it again."""
    def plant(fault=None, item=None, pairs_slow=None):
        for name, value in ((failpoints.ENV, fault), (failpoints.ITEM_ENV, item),
                            (failpoints.PAIRS_SLOW_ENV, pairs_slow)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        failpoints.reset()

    yield plant
    monkeypatch.delenv(failpoints.ENV, raising=False)
    monkeypatch.delenv(failpoints.ITEM_ENV, raising=False)
    monkeypatch.delenv(failpoints.PAIRS_SLOW_ENV, raising=False)
    failpoints.reset()


def test_nothing_planted_hands_the_value_back(planted):
    planted()
    value = object()
    assert failpoint("engine.free_memory", value, rank=0) is value
    assert failpoint("engine.before_size", rank=0, size=8) is None


def test_the_settings_are_read_once_until_reset(planted, monkeypatch):
    planted("plan_fail:rank=1")
    assert failpoint("engine.free_memory", 5, rank=1) == 0
    monkeypatch.delenv(failpoints.ENV)
    assert failpoint("engine.free_memory", 5, rank=1) == 0  # still planted: read once
    failpoints.reset()
    assert failpoint("engine.free_memory", 5, rank=1) == 5


def test_rank_and_size_select_where_a_fault_acts(planted):
    planted("error:rank=1,size=4096")
    failpoint("engine.before_size", rank=0, size=8192)
    failpoint("engine.before_size", rank=1, size=2048)
    with pytest.raises(RuntimeError, match=r"illegal memory access was encountered \(NCCLBENCH_FAULT error\)"):
        failpoint("engine.before_size", rank=1, size=4096)


def test_each_fault_acts_on_its_own(planted):
    planted("error:rank=0,size=4096;error:rank=1,size=4096;plan:rank=1")
    for rank in (0, 1):
        with pytest.raises(RuntimeError):
            failpoint("engine.before_size", rank=rank, size=4096)
    fingerprint = {"max_bytes": 8, "iters": 2}
    assert failpoint("engine.plan_fingerprint", fingerprint, rank=0) is fingerprint
    assert failpoint("engine.plan_fingerprint", fingerprint, rank=1) == {"max_bytes": 16, "iters": 2}


def test_the_context_fills_a_raised_message(planted):
    planted("alloc_fail:rank=2")
    with pytest.raises(RuntimeError, match=r"^out of memory: tried to allocate 1024 bytes \(NCCLBENCH_FAULT alloc_fail\)$"):
        failpoint("engine.alloc", rank=2, nbytes=1024)


def test_slow_device_multiplies_every_rank(planted):
    planted("slow_device:factor=50")
    assert failpoint("timing.device_time_factor", 1.0) == 50.0


def test_slow_is_the_global_rank_and_wraps_the_binder(planted):
    planted("slow:rank=3,us=20000")
    synced = []

    def bind(*args):
        return lambda: synced.append(("op", args))

    assert failpoint("backend.bind", bind, rank=3, global_rank=1, synchronize=lambda: None) is bind
    slow = failpoint("backend.bind", bind, rank=0, global_rank=3, synchronize=lambda: synced.append("sync"))
    call = slow("a", "b")
    start = time.monotonic()
    call()
    assert time.monotonic() - start >= 0.02 and synced == [("op", ("a", "b")), "sync"]


def test_no_gpu_runs_the_real_check_with_none_visible(planted):
    planted("no_gpu:rank=0;device_stall:rank=1,seconds=0")
    seen = []
    failpoint("backend.device_setup", rank=0, find_gpu=seen.append)
    failpoint("backend.device_setup", rank=1, find_gpu=seen.append)
    assert seen == [0]


def test_corrupt_flips_one_element_of_the_view(planted):
    torch = pytest.importorskip("torch")
    planted("corrupt:rank=1,size=64")
    view = torch.zeros(9, dtype=torch.float32)
    failpoint("engine.check_output", rank=1, size=32, view=view)
    assert int((view != 0).sum()) == 0
    failpoint("engine.check_output", rank=1, size=64, view=view)
    assert int((view != 0).sum()) == 1 and view[4] != 0
    failpoint("engine.check_output", rank=1, size=64, view=view[:0])  # empty: nothing to flip


def test_an_item_fault_acts_in_that_item_and_outside_every_item(planted):
    planted("plan_fail:rank=0", item="all_reduce.ring-ll.r1")
    assert failpoint("engine.free_memory", 5, rank=0) == 0
    with failpoints.within(item="all_reduce.ring-simple.r1"):
        assert failpoint("engine.free_memory", 5, rank=0) == 5
    with failpoints.within(item="all_reduce.ring-ll.r1"):
        assert failpoint("engine.free_memory", 5, rank=0) == 0


def test_pairs_slow_plants_at_the_pair_exchange(planted):
    planted(pairs_slow="1,3:0.01")
    exchange = lambda _op=0: None  # noqa: E731
    assert failpoint("pairs.exchange", exchange, rank=0, global_rank=0, synchronize=lambda: None) is exchange
    slow = failpoint("pairs.exchange", exchange, rank=3, global_rank=3, synchronize=lambda: None)
    assert slow is not exchange
    start = time.monotonic()
    slow(0)
    assert time.monotonic() - start >= 0.01


def test_the_pairs_slow_spelling():
    assert failpoints.parse_pairs_slow(None) == [] and failpoints.parse_pairs_slow(" ") == []
    assert [(n, p.rank, p.seconds) for n, p in failpoints.parse_pairs_slow("1")] == [("pairs.exchange", 1, 0.1)]
    assert [(p.rank, p.seconds) for _, p in failpoints.parse_pairs_slow("3,1:0.5")] == [(1, 0.5), (3, 0.5)]
    with pytest.raises(ValueError, match="NCCLBENCH_PAIRS_SLOW"):
        failpoints.parse_pairs_slow("one")


def test_every_kind_parses_and_an_unknown_one_is_refused():
    for kind in failpoints.KINDS:
        assert failpoints.parse(f"{kind}:rank=1,size=8,seconds=2")
    plant = failpoints.parse("stall:rank=2,us=1500")[0][1]
    assert (plant.rank, plant.seconds, plant.size) == (2, 0.0015, None)
    assert failpoints.parse("corrupt_graph")[0][1].rank == 0  # rank 0 unless named
    with pytest.raises(ValueError, match="unknown fault kind 'kil'"):
        failpoints.parse("kil:rank=1")


def _reached_names(package) -> set[str]:
    """Every failpoint name production code reaches: failpoint("name", ...) calls."""
    import ast

    names = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "failpoint"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                names.add(node.args[0].value)
    return names


def test_every_planted_name_is_reached_and_documented():
    """A fault kind planted at a name no code reaches would silently plant nothing (a typo in
    either place); every name is listed in docs/failpoints.md."""
    import re
    from pathlib import Path

    root = Path(failpoints.__file__).resolve().parent
    planted = {name for entries in failpoints.KINDS.values() for name, _action, _key in entries}
    planted |= {name for name, _plant in failpoints.parse_pairs_slow("1")}
    reached = _reached_names(root)
    assert planted == reached, (planted - reached, reached - planted)
    documented = set(re.findall(r"^\| `([a-z_]+\.[a-z_]+)`", (root.parent / "docs" / "failpoints.md").read_text(), re.M))
    assert reached == documented, (reached - documented, documented - reached)


def test_the_name_check_sees_a_misspelt_failpoint(tmp_path):
    (tmp_path / "m.py").write_text('failpoint("engine.check_in_grpah", rank=0)\nx.failpoint("pairs.exchange", v)\n')
    assert _reached_names(tmp_path) == {"engine.check_in_grpah", "pairs.exchange"}


@pytest.mark.parametrize("text, says", [
    ("kill:rnak=1,size=4096", "unknown field(s) rnak"),
    ("kill:rank=1,sise=4096", "unknown field(s) sise"),
    ("kill:rank=1,4096", "unknown field(s) 4096"),
    ("kill:rank=1,size=4K", "'kill:rank=1,size=4K': invalid literal"),
    ("stall:rank=one", "invalid literal"),
])
def test_a_misspelt_fault_is_refused_naming_the_variable(text, says):
    with pytest.raises(ValueError) as e:
        failpoints.parse(text)
    assert str(e.value).startswith(failpoints.ENV) and says in str(e.value)


IN_KERNEL = """
import os, sys, time
from ncclbench import failpoints
plant = failpoints.Plant("in_kernel", failpoints.in_kernel, seconds=float(sys.argv[1]))
print(os.getpid(), flush=True)
began = time.monotonic()
failpoints.in_kernel(plant, None, {})
print(f"{time.monotonic() - began:.2f}", flush=True)
"""


def _twins(pid, cmdline):
    """Processes other than `pid` with its command line (in_kernel's child shares its memory)."""
    import os

    out = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if f.read() == cmdline and int(name) != pid:
                    out.append(int(name))
        except OSError:
            pass
    return out


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="Linux's vfork")
def test_in_kernel_holds_state_d_through_signals_and_leaves_nothing_when_killed():
    """The process's main thread sits in state D: a SIGTERM to its process group (as a launcher
    sends) changes nothing, SIGKILL to it alone ends it, and its vfork child goes with it
    (before: the child slept on for `seconds`, holding the rank's sockets and files). Left
    alone, the wait ends after `seconds`."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import ROOT
    from ncclbench import procs

    cmd = [sys.executable, "-c", IN_KERNEL]
    proc = subprocess.Popen([*cmd, "60"], stdout=subprocess.PIPE, text=True, cwd=ROOT, start_new_session=True)
    try:
        pid = int(proc.stdout.readline())
        time.sleep(1.0)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
        assert procs.state(pid) == "D" and len(_twins(pid, cmdline)) == 1
        os.killpg(pid, signal.SIGTERM)
        time.sleep(1.0)
        assert procs.state(pid) == "D"
        os.kill(pid, signal.SIGKILL)
        proc.wait(timeout=5)
        deadline = time.monotonic() + 3
        while _twins(pid, cmdline) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _twins(pid, cmdline) == []
    finally:
        proc.kill()
    short = subprocess.run([*cmd, "1"], capture_output=True, text=True, cwd=ROOT, timeout=30)
    assert short.returncode == 0 and 0.9 < float(short.stdout.split()[1]) < 4, short
