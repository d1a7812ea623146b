"""Drain lists (results/drain.py) are run by operators with `sh`: a host name or reason from a
rank must never run a command. Each format is run here against recording `scontrol` and
`kubectl` commands on PATH, with host names and reasons built to break out of quoting."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ncclbench.results import drain

REPO = Path(__file__).resolve().parent.parent

# (host, reason): each hostile name tries another way out of a shell word
HOSTILE = [
    ("n2$(touch${IFS}PWNED)", "slow alone $(touch PWNED_R1)"),
    ("n3`touch${IFS}PWNED_BT`", "`touch PWNED_R2` below the band"),
    ("n4'\";touch${IFS}PWNED_Q;'\"", "quotes \"; touch PWNED_R3; \" and '; touch PWNED_R4; '"),
    ("n5;touch${IFS}PWNED_SC", "a; touch PWNED_R5 && echo"),
    ("n6\ntouch PWNED_NL", "newline: left out everywhere"),
    ("n8 touch PWNED_SP", "a space: scontrol would read two words of a node list"),
    ("-n7", "an option-like name"),
    ("node01", "reason over two lines\ntouch PWNED_R6\r\x1b[2Kand escapes"),
]
K8S_VALUE = re.compile(r"([A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)?")


def _recorders(tmp_path: Path) -> tuple[Path, Path]:
    """scontrol and kubectl that append their argv (JSON, one call a line) to a file."""
    bin_dir, record = tmp_path / "bin", tmp_path / "calls.jsonl"
    bin_dir.mkdir()
    for name in ("scontrol", "kubectl"):
        script = bin_dir / name
        script.write_text(f"#!{sys.executable}\nimport json, os, sys\n"
                          f"with open({str(record)!r}, 'a') as f:\n"
                          f"    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + '\\n')\n")
        script.chmod(0o755)
    return bin_dir, record


def _run_sh(tmp_path: Path, command: list[str]) -> list[list[str]]:
    """Run `command` in a fresh folder with the recorders first on PATH; the calls recorded."""
    bin_dir, record = _recorders(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    proc = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    planted = [p.name for p in work.iterdir()] + [p.name for p in tmp_path.iterdir() if "PWN" in p.name]
    assert not [name for name in planted if "PWN" in name], planted
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def _expected_reason(reason: str) -> str:
    return " ".join(f"ncclbench fleet: {reason}".replace("\x1b", " ").split())


def test_the_harness_catches_an_unquoted_drain_line(tmp_path):
    """The check is live: the drain line written before quoting (host bare, reason in double
    quotes) runs the planted command."""
    host, reason = HOSTILE[0]
    script = tmp_path / "old.sh"
    script.write_text(f'scontrol update NodeName={host} State=DRAIN Reason="ncclbench fleet: {reason}"\n')
    with pytest.raises(AssertionError, match="PWNED"):
        _run_sh(tmp_path, ["sh", str(script)])


def test_scontrol_lines_pass_every_name_and_reason_as_one_argument(tmp_path):
    script = tmp_path / "drain.sh"
    left_out = drain.write(str(script), HOSTILE, "scontrol", "fleet")
    calls = _run_sh(tmp_path, ["sh", str(script)])
    passed = [(h, r) for h, r in HOSTILE if not re.search(r"\s", h)]
    assert calls == [["scontrol", "update", f"NodeName={h}", "State=DRAIN", f"Reason={_expected_reason(r)}"]
                     for h, r in passed]
    assert [h for h, _ in left_out] == ["n6\ntouch PWNED_NL", "n8 touch PWNED_SP"]
    assert "# left out: host 'n6\\ntouch PWNED_NL'" in script.read_text()


@pytest.mark.parametrize("host", ["n[1-64]", "n1,n2", "n1 n2"])
def test_scontrol_refuses_a_name_it_would_read_as_several_nodes(tmp_path, host):
    script = tmp_path / "drain.sh"
    left_out = drain.write(str(script), [(host, "slow"), ("node01", "slow")], "scontrol", "fleet")
    assert [h for h, _ in left_out] == [host]
    calls = _run_sh(tmp_path, ["sh", str(script)])
    assert [c[2] for c in calls] == ["NodeName=node01"]


def test_kubectl_lines_cordon_taint_and_annotate_with_the_exact_name(tmp_path):
    script = tmp_path / "drain.sh"
    drain.write(str(script), HOSTILE, "kubectl", "fleet")
    calls = _run_sh(tmp_path, ["sh", str(script)])
    passed = [(h, r) for h, r in HOSTILE if "\n" not in h]
    assert len(calls) == 3 * len(passed)
    for k, (host, reason) in enumerate(passed):
        cordon, taint, annotate = calls[3 * k: 3 * k + 3]
        assert cordon == ["kubectl", "cordon", "--", host]
        assert taint[:5] == ["kubectl", "taint", "nodes", "--overwrite", "--"] and taint[5] == host
        key, _, rest = taint[6].partition("=")
        value, _, effect = rest.rpartition(":")
        assert (key, effect) == ("ncclbench/drain", "NoSchedule")
        assert len(value) <= 63 and K8S_VALUE.fullmatch(value), value
        assert annotate == ["kubectl", "annotate", "nodes", "--overwrite", "--", host,
                            f"ncclbench/drain-reason={_expected_reason(reason)}"]


def test_the_host_list_holds_plain_names_only(tmp_path):
    """A plain list is read by tools that do not unquote (xargs, pdsh -w ^FILE): only names
    of letters, digits, '.', '-' and '_' are written, each alone on its line."""
    listing = tmp_path / "hosts.txt"
    left_out = drain.write(str(listing), HOSTILE + [("gpu-07.rack2_a", "slow")], "hosts", "fleet")
    assert listing.read_text() == "node01\ngpu-07.rack2_a\n"
    assert len(left_out) == len(HOSTILE) - 1
    calls = _run_sh(tmp_path, ["sh", "-c", 'xargs -n1 kubectl cordon -- < "$1"', "sh", str(listing)])
    assert calls == [["kubectl", "cordon", "--", "node01"], ["kubectl", "cordon", "--", "gpu-07.rack2_a"]]


@pytest.mark.parametrize("reason", ["", "!!!", "x" * 300, "GPU 3: PCIe Gen4 x8, the others x16",
                                    "déjà vu: 12% below", "-leading and trailing-", "a" * 62 + "--b"])
def test_taint_values_follow_kubernetes_rules(reason):
    value = drain.taint_value(reason)
    assert len(value) <= 63 and K8S_VALUE.fullmatch(value), value
    if re.search(r"[A-Za-z0-9]", reason):
        assert value  # something of the reason survives


def test_a_report_s_drain_list_takes_its_reason_from_the_host_s_evidence():
    report = {"command": "preflight", "drain": ["node2"], "hosts": [
        {"host": "node1", "ranks": [0, 1], "verdict": "ok", "evidence": [], "causes": []},
        {"host": "node2", "ranks": [2, 3], "verdict": "drain",
         "evidence": ["rank 3 slow alone: 40% below its peers", "pairs with rank 3 slow"], "causes": []}]}
    lines, left_out = drain.render(report, "scontrol")
    assert left_out == []
    assert lines == ["scontrol update NodeName=node2 State=DRAIN Reason='ncclbench preflight: rank 3 slow alone: "
                     "40% below its peers; pairs with rank 3 slow'"]
    older = {"drain": [{"host": "simnode1", "reason": "has 1 GPU of 2 expected"}], "nodes": []}
    assert drain.render(older, "hosts") == (["simnode1"], [])


def test_an_unknown_format_is_refused():
    with pytest.raises(ValueError, match="scontrol, kubectl, hosts"):
        drain.render([("n1", "x")], "yaml")


def test_the_python_api_refuses_an_unknown_format_before_measuring():
    import ncclbench
    from ncclbench.errors import PlanError

    assert drain.checked_format(None) == "scontrol"
    with pytest.raises(PlanError, match="drain format 'yaml'"):
        ncclbench.preflight(drain_path="d.sh", drain_format="yaml")


def _can_set_hostname() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--uts", sys.executable, "-c", "import socket; socket.sethostname('probe')"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


@pytest.mark.skipif(sys.platform != "linux", reason="UTS namespaces are Linux's")
@pytest.mark.parametrize("fmt", ["scontrol", "kubectl", "hosts"])
def test_fleet_on_a_host_with_a_hostile_name_writes_a_safe_drain_file(tmp_path, fmt):
    """End to end: `fleet` on 3 gloo ranks in a UTS namespace whose host name runs a command
    if unquoted; nodes of 2 ranks (the second has 1 and is drained). The file, run with sh
    (or read by xargs), passes the name whole or leaves it out; it never runs it."""
    if not _can_set_hostname():
        pytest.skip("needs `unshare --uts` and the right to set a host name (root)")
    host = "n2$(touch${IFS}PWNED)`touch${IFS}PWNED2`;x'\""
    drain_file, report_file = tmp_path / "drain.out", tmp_path / "fleet.json"
    launcher = ("import os, socket, sys; socket.sethostname(sys.argv[1]); "
                "os.execv(sys.executable, [sys.executable, '-m', 'ncclbench'] + sys.argv[2:])")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run(["unshare", "--uts", sys.executable, "-c", launcher, host, "fleet", "-g", "3",
                           "--sim-node-size", "2", "--gpus-per-node", "2", "--backend", "gloo", "--budget", "2",
                           "--json", str(report_file), "--drain-file", str(drain_file), "--drain-format", fmt],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads(report_file.read_text())
    drained = f"{host}-n1"
    assert report["drain"] == [drained]
    if fmt == "hosts":
        assert drain_file.read_text() == ""
        assert "left out of the drain file" in proc.stderr
        return
    calls = _run_sh(tmp_path, ["sh", str(drain_file)])
    if fmt == "scontrol":
        assert calls == [["scontrol", "update", f"NodeName={drained}", "State=DRAIN",
                          "Reason=ncclbench fleet: has 1 GPU of 2 expected"]]
    else:
        assert [c[:2] for c in calls] == [["kubectl", "cordon"], ["kubectl", "taint"], ["kubectl", "annotate"]]
        assert all(drained in c for c in calls)


def test_preflight_writes_its_drain_list_from_the_report_before_a_timeout_ends_it(tmp_path):
    """preflight on 2 gloo ranks with rank 1 stalled (a planted fault): the run ends on its
    timeout (exit 4) and rank 0 writes the drain file first, the host's evidence as the reason."""
    drain_file, report_file = tmp_path / "drain.sh", tmp_path / "report.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               NCCLBENCH_FAULT="stall:rank=1,size=4096,seconds=60")
    proc = subprocess.run([sys.executable, "-m", "ncclbench", "preflight", "-g", "2", "--backend", "gloo",
                           "--budget", "1", "-T", "3", "--json", str(report_file), "--drain-file", str(drain_file)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stderr
    report = json.loads(report_file.read_text())
    assert report["drain"], report
    calls = _run_sh(tmp_path, ["sh", str(drain_file)])
    evidence = {h["host"]: "; ".join(h["evidence"]) for h in report["hosts"]}
    assert calls == [["scontrol", "update", f"NodeName={host}", "State=DRAIN",
                      f"Reason={' '.join(f'ncclbench preflight: {evidence[host]}'.split())[:200]}"]
                     for host in report["drain"]]
