"""Every file a command reads is bounded (ncclbench.inputs): devices, binary files and files
past the cap are refused in one line, exit 2, no traceback, run in a child whose address
space is capped so that a reader that slurps the file fails here instead of eating the host.
Also the rows of `baseline`, `compare` and `-J` that used to succeed silently."""

from __future__ import annotations

import io
import json
import os
import resource
import stat
import subprocess
import sys

import pytest

from conftest import ROOT, cli_command, run_cli, slower_copy
from ncclbench.inputs import LIMITS, InputFileError, read_text
from ncclbench.results import noise

ADDRESS_SPACE = 1 << 30  # a reader that loads /dev/zero or a 2 GiB file hits this and fails the test


def _capped():
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def run_capped(args, cwd=None, timeout=60):
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    return subprocess.run(cli_command() + list(args), capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=cwd, preexec_fn=_capped)


def assert_one_line(r, *words, code=2):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Traceback" not in r.stderr and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("ncclbench") and ": error: " in lines[0], lines
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    """The inputs of issue 63's table: /dev/zero, /dev/urandom, a 2 GiB sparse file, random bytes."""
    d = tmp_path_factory.mktemp("bad")
    sparse = d / "huge.json"
    with open(sparse, "wb") as f:
        f.truncate(2 << 30)
    binary = d / "binary.log"
    binary.write_bytes(os.urandom(1 << 20))
    latin = d / "latin1.txt"  # no NUL byte, still not UTF-8
    latin.write_bytes(b"# nccl-tests version 2.19.6 caf\xe9\n")
    os.mkfifo(d / "pipe")  # no writer: an open() for reading would wait for ever
    return {"/dev/zero": ("/dev/zero", "not a regular file (a character device)"),
            "/dev/urandom": ("/dev/urandom", "not a regular file (a character device)"),
            "sparse 2 GiB": (str(sparse), "2.0 GiB, larger than 64.0 MiB, the most a results file may be"),
            "random bytes": (str(binary), "a binary file"),
            "latin-1": (str(latin), "a binary file (not UTF-8 text at byte 31)"),
            "folder": (str(d), "not a regular file (a folder)"),
            "pipe": (str(d / "pipe"), "not a regular file (a pipe)")}


@pytest.mark.parametrize("which", ["/dev/zero", "/dev/urandom", "sparse 2 GiB", "random bytes", "latin-1", "folder",
                                   "pipe"])
@pytest.mark.parametrize("command", ["show", "compare", "baseline", "plot"])
def test_results_readers_refuse_in_one_line(command, which, bad_files, tmp_path):
    path, words = bad_files[which]
    argv = {"show": ["show", path], "compare": ["compare", path, path],
            "baseline": ["baseline", path, path, "-O", str(tmp_path / "b.json")],
            "plot": ["plot", path, "-O", str(tmp_path / "p.png")]}[command]
    assert_one_line(run_capped(argv), path, words)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("which", ["/dev/zero", "sparse 2 GiB", "random bytes"])
def test_suite_matrix_and_nccl_logs_refuse_in_one_line(which, bad_files, tmp_path):
    path, _ = bad_files[which]
    words = {"/dev/zero": "not a regular file", "sparse 2 GiB": "2.0 GiB, larger than", "random bytes": "a binary file"}
    assert_one_line(run_capped(["suite", path, "--backend", "gloo", "--no-save"]), path, words[which])
    assert_one_line(run_capped(["alltoallv", "--backend", "gloo", "-b", "1K", "-e", "1K",
                                "--alltoallv-matrix", path]), path, words[which])
    r = run_capped(["explain", path])
    assert_one_line(r, path, words[which] if which != "sparse 2 GiB" else "2.0 GiB, larger than 256.0 MiB")


def test_the_reader_rule(tmp_path, monkeypatch):
    ok = tmp_path / "ok.txt"
    ok.write_text("caf\u00e9\n")
    assert read_text(ok, "results") == "caf\u00e9\n"
    with pytest.raises(InputFileError, match=r"a NUL byte at offset 2\), not a suite file$"):
        (tmp_path / "nul.yaml").write_bytes(b"ab\0cd")
        read_text(tmp_path / "nul.yaml", "suite")
    # an NCCL log may carry another program's stray bytes: replaced, not refused (NUL still is)
    (tmp_path / "n.log").write_bytes(b"NCCL INFO \xff\n")
    assert read_text(tmp_path / "n.log", "nccl log", lenient=True) == "NCCL INFO \ufffd\n"
    # past the cap by one byte (the cap lowered for the test): refused; at the cap: read
    monkeypatch.setitem(LIMITS, "suite", ("a suite file", 8))
    (tmp_path / "s.yaml").write_text("x" * 9)
    with pytest.raises(InputFileError, match=r"9 B, larger than 8 B, the most a suite file may be$"):
        read_text(tmp_path / "s.yaml", "suite")
    (tmp_path / "s.yaml").write_text("x" * 8)
    assert read_text(tmp_path / "s.yaml", "suite") == "x" * 8
    # a /proc file says size 0: the bytes read are bounded too
    monkeypatch.setitem(LIMITS, "suite", ("a suite file", 16))
    with pytest.raises(InputFileError, match="more than 16 B"):
        read_text("/proc/self/status", "suite")
    # '-' is stdin only where the caller allows it, bounded the same way
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"y" * 17)))
    with pytest.raises(InputFileError, match=r"^<stdin>: more than 16 B"):
        read_text("-", "suite", stdin_ok=True)
    with pytest.raises(InputFileError, match=r"^-: cannot read a suite file: No such file"):
        read_text("-", "suite")
    os.mkfifo(tmp_path / "pipe")  # refused without opening: an open() would wait for a writer
    with pytest.raises(InputFileError, match=r"not a regular file \(a pipe\)"):
        read_text(tmp_path / "pipe", "results")


def test_preflight_baseline_is_read_bounded():
    from ncclbench.faults.preflight.verdict import read_baseline
    from ncclbench.errors import PlanError

    with pytest.raises(PlanError, match=r"^baseline /dev/zero: not a regular file"):
        read_baseline("/dev/zero", "float")


def test_a_json_nested_past_the_stack_is_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200000)
    assert_one_line(run_capped(["compare", str(deep), str(deep)]), "nested deeper")
    r = run_capped(["show", str(deep)])
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]


# ---- baseline, compare and -J: no silent success ------------------------------------------------
def _doc(collective="all_reduce", dtype="float", ranks=2, times=(40.0, 45.0, 120.0), factor=1.0, seed=0):
    import random

    rng = random.Random(seed)
    results = []
    for i, t in enumerate(times):
        size = 1024 << (4 * i)
        row = {"size": size, "count": size // 4, "type": dtype, "redop": "sum", "root": "    -1"}
        for placement in ("out_of_place", "in_place"):
            samples = [t * factor * (1 + rng.uniform(-0.02, 0.02)) for _ in range(20)]
            mean = sum(samples) / 20
            bw = size / mean / 1e3
            row[placement] = {"time": mean, "alg_bw": bw, "bus_bw": bw, "nwrong": 0.0}
            row[f"{placement}_noise"] = noise.summarise(samples)
        results.append(row)
    return {"version": 3, "args": [collective], "results": results,
            "ncclbench": {"collective": collective, "backend": "gloo", "mode": "eager", "ranks": ranks}}


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("other,words", [
    ({"collective": "all_gather"}, "the runs measured different things"),
    ({"dtype": "half"}, "the runs measured different things"),
    ({"ranks": 4}, "the runs differ in ranks (2, 4)"),
])
def test_baseline_refuses_runs_of_different_setups(other, words, tmp_path):
    a = _write(tmp_path / "a.json", _doc(seed=1))
    b = _write(tmp_path / "b.json", _doc(seed=2, **other))
    r = run_cli(["baseline", a, b, "-O", str(tmp_path / "base.json")], timeout=60)
    assert_one_line(r, words)
    assert not (tmp_path / "base.json").exists()
    same = run_cli(["baseline", a, _write(tmp_path / "c.json", _doc(seed=3)), "-O", str(tmp_path / "base.json")])
    assert same.returncode == 0 and (tmp_path / "base.json").exists(), same.stderr


def test_compare_names_a_rank_count_mismatch(tmp_path):
    """NEW on 64 ranks: its busbw at these sizes is below 0.05 GB/s; BASE's are real. The
    rows say the rank counts differ, not that BASE is 0 or N/A."""
    base = _write(tmp_path / "a.json", _doc(ranks=2, times=(0.5, 0.6, 0.7)))
    new = _write(tmp_path / "b.json", _doc(ranks=64, times=(400.0, 4500.0, 90000.0)))
    r = run_cli(["compare", base, new], timeout=60)
    assert_one_line(r, "busbw below 0.05 GB/s in NEW, and the rank counts differ (BASE 2 vs NEW 64 ranks)")
    assert "BASE value 0" not in r.stderr and "0 or N/A" not in r.stderr
    # one row judged, the others named as not comparable for the same reason
    some = _write(tmp_path / "c.json", _doc(ranks=64, times=(400.0, 4500.0, 0.7)))
    r = run_cli(["compare", base, some], timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 not comparable (busbw below 0.05 GB/s in NEW, and the rank counts differ (BASE 2 vs NEW 64" in r.stdout


def _statuses(base: str, new: str) -> dict:
    """{(size, placement): status} of `compare base new`, through the same reader and rule."""
    from ncclbench.results.compare import compare_frames, read_inputs

    rows = compare_frames(*read_inputs([base, new], [])).rows
    return {(int(r["size_bytes"]), r["placement"]): r["status"] for r in rows.to_dict("records")}


def test_a_gloo_run_four_times_slower_fails(tmp_path):
    """Issue 63: a real gloo run (2 ranks, -n 20) against a copy with every time and sample
    4x slower passed as 'within noise' on every row. Now every row whose NEW blocks all lie
    beyond BASE's (4x its fastest block above its slowest) is a regression, and the run
    fails where there is one; a row whose own blocks spread over 4x (a busy host) may pass.
    A copy slower than the run's widest spread fails on every row, whatever the load."""
    run = tmp_path / "run.json"
    r = run_cli(["allreduce", "--backend", "gloo", "-g", "2", "-b", "8", "-e", "32K", "-f", "4", "-n", "20",
                 "-w", "2", "--no-save", "-J", str(run)], timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(run.read_text())
    blocks = {(row["size"], placement): row[f"{placement}_noise"] for row in doc["results"]
              for placement in ("out_of_place", "in_place")}
    slow = _write(tmp_path / "slow.json", slower_copy(doc, 4))
    statuses = _statuses(str(run), slow)
    assert set(statuses) == set(blocks)
    apart = [key for key, b in blocks.items() if 4 * b["min_us"] > b["max_us"]]
    assert all(statuses[key] == "regression" for key in apart), (apart, statuses)
    c = run_cli(["compare", str(run), slow], timeout=60)
    failed = any(status == "regression" for status in statuses.values())
    assert c.returncode == (1 if failed else 0) and ("FAIL" in c.stdout) == failed, c.stdout
    spread = max(b["max_us"] / b["min_us"] for b in blocks.values())
    slower = _write(tmp_path / "slower.json", slower_copy(doc, max(4.0, 1.5 * spread)))
    assert set(_statuses(str(run), slower).values()) == {"regression"}
    c = run_cli(["compare", str(run), slower], timeout=60)
    assert c.returncode == 1 and "FAIL" in c.stdout, c.stdout


def test_json_to_an_existing_file_says_where_and_dev_null_stays(tmp_path):
    """-J keeps nccl-tests' .N naming and says so on stderr; /dev/null is written as it is
    (it used to become a regular /dev/null.0). The run saves to the store, and the checkout's
    results/ stays as it was (tests store runs in a temporary folder)."""
    before = sorted(p.name for p in (ROOT / "results").iterdir())
    args = ["allreduce", "--backend", "gloo", "-g", "2", "-b", "1K", "-e", "1K", "-n", "2", "-w", "1"]
    taken = tmp_path / "new.json"
    taken.write_text("{}")
    r = run_cli(args + ["-J", str(taken)], timeout=180, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{taken} exists: the JSON goes to {taken}.0" in r.stderr
    assert taken.read_text() == "{}" and json.loads((tmp_path / "new.json.0").read_text())["results"]
    r = run_cli(args + ["-J", "/dev/null"], timeout=180, cwd=ROOT)
    assert r.returncode == 0 and "exists" not in r.stderr, r.stderr[-2000:]
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and not os.path.exists("/dev/null.0")
    assert sorted(p.name for p in (ROOT / "results").iterdir()) == before


@pytest.mark.parametrize("doc,words", [
    ({"ncclbench": {"collective": "all_reduce"}, "config": {"minimum_bytes": 8}, "results": [{"size": 8}]},
     "KeyError: 'count'"),
    ({"ncclbench": 5, "config": {"minimum_bytes": 8}, "results": 7}, "TypeError"),
])
def test_show_of_a_malformed_run_document_is_one_line(doc, words, tmp_path):
    path = _write(tmp_path / "bad.json", doc)
    assert_one_line(run_cli(["show", path], timeout=60), "not a run's JSON document as ncclbench writes it", words)
