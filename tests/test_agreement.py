"""`pairs`, `preflight` and `fleet` on one fabric with one planted fault give one answer, in
the same JSON keys: 4 simulated hosts that are real network hosts (tests/netsim.py), one
gloo rank each, a host's NIC or one host pair's link capped with tc. The slow NIC drains
that host alone; the slow link names that host pair under `links` and drains nothing."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT, cli_command

sys.path.insert(0, str(ROOT / "tests"))
import netsim  # noqa: E402

REASON = netsim.why_not()
COMMANDS = {
    "pairs": ["pairs", "--backend", "gloo", "-b", "1M", "-n", "5", "-T", "60"],
    "preflight": ["preflight", "--backend", "gloo", "--budget", "4", "-T", "60"],
    "fleet": ["fleet", "--backend", "gloo", "-T", "20"],
}
RATE = "200mbit"   # a NIC or link at a few percent of what gloo moves over the bridge


def run(fleet: netsim.SimFleet, command: str, tmp_path) -> tuple[int, dict, str]:
    out = tmp_path / f"{command}.json"
    procs = [fleet.start(i, cli_command() + COMMANDS[command] + ["--json", str(out)], 1, port=29561)
             for i in range(fleet.n)]
    stdout, stderr = procs[0].communicate(timeout=300)
    for p in procs[1:]:
        p.communicate(timeout=120)
    assert out.exists(), stdout + stderr[-3000:]
    return procs[0].returncode, json.loads(out.read_text()), stdout


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.slow
@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("fault", ["nic", "link"])
def test_one_fault_one_answer_in_the_same_keys(fault, command, tmp_path):
    with netsim.SimFleet(4) as fleet:
        if fault == "nic":
            fleet.slow_nic(2, RATE)
        else:
            fleet.slow_link(1, 3, RATE)
        code, doc, stdout = run(fleet, command, tmp_path)
    for key in ("command", "passed", "exit_code", "hosts", "links", "drain", "notes", "pairs"):
        assert key in doc, (key, sorted(doc))
    assert doc["command"] == command and code == doc["exit_code"] == 1 and doc["passed"] is False, stdout
    assert sorted(h["host"] for h in doc["hosts"]) == [f"simnode{i}" for i in range(4)]
    assert all(set(h) >= {"host", "ranks", "verdict", "evidence", "causes"} for h in doc["hosts"])
    if fault == "nic":
        assert doc["drain"] == ["simnode2"] and doc["links"] == [], stdout
    else:
        assert doc["drain"] == [] and [link["hosts"] for link in doc["links"]] == [["simnode1", "simnode3"]], stdout
        assert doc["links"][0]["ranks"] == [1, 3]
