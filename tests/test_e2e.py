"""End-to-end: real ranks on the CPU (gloo) through the same launchers users use."""

import json
import os
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest

from conftest import ROOT, cli_command, run_cli, table_rows

ALL = ["all_reduce", "all_gather", "reduce_scatter", "alltoall", "broadcast", "reduce", "gather", "scatter",
       "sendrecv"]
HEADER = "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong "


def _tests(stdout: str) -> dict:
    """Split a log into its tests: name -> lines."""
    out, name = {}, None
    for line in stdout.splitlines():
        m = re.match(r"# Collective test starting: (\w+)_perf", line)
        if m:
            name = m.group(1)
            out[name] = []
        if name:
            out[name].append(line)
    return out


def _check_nccl_tests_layout(lines: list[str], nranks: int, nsizes: int):
    text = "\n".join(lines)
    assert HEADER in lines
    assert sum(1 for ln in lines if ln.startswith("#  Rank ")) == nranks
    rows = table_rows(text)
    assert len(rows) == nsizes
    for row in rows:
        assert len(row) == 13, row
        int(row[0]), int(row[1]), float(row[5]), float(row[6]), float(row[7])  # noqa: B018 - parse check
        assert row[8] == "0" and row[12] in ("0", "N/A"), row
    assert any(ln.startswith("# Out of bounds values : 0 OK") for ln in lines)
    assert any(re.match(r"# Avg bus bandwidth    : [0-9.e+-]+ $", ln) for ln in lines)
    for line in lines:
        if re.match(r"^\s+\d", line):
            assert len(line) in (117, 118), line  # the reference files' widths


@pytest.mark.parametrize("nranks", [2, 4])
def test_every_collective_on_gloo_ranks(nranks, tmp_path):
    """`-g N` self-spawn through torchrun's machinery: every collective, nccl-tests layout."""
    csv = tmp_path / "all.csv"
    r = run_cli(["suite", str(ROOT / "configs" / "quick.yaml"), "-g", str(nranks), "--backend", "gloo",
                 "--no-save", "--csv", str(csv)])
    assert r.returncode == 0, r.stderr[-3000:]
    tests = _tests(r.stdout)
    assert sorted(tests) == sorted(ALL)
    for name, lines in tests.items():
        _check_nccl_tests_layout(lines, nranks, nsizes=5)
    frame = pd.read_csv(csv)
    assert len(frame) == 9 * 5 * 2
    assert set(frame.ranks) == {nranks}
    assert "# Suite summary" in r.stdout


def test_launched_by_torchrun_directly(tmp_path):
    torchrun = shutil.which("torchrun", path=str(ROOT.parent)) or shutil.which("torchrun") \
        or str(__import__("pathlib").Path(sys.executable).with_name("torchrun"))
    out = tmp_path / "r.json"
    cmd = [torchrun, "--nproc-per-node", "3", "--standalone", "-m", "ncclbench", "reducescatter",
           "--backend", "gloo", "-b", "1K", "-e", "16K", "-f", "4", "-n", "2", "--no-save", "-J", str(out)]
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="0", NCCL_ALGO="Ring", NCCLBENCH_TEST_MARKER="x",
               UNRELATED_ENV_FOR_THE_TEST="y")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    _check_nccl_tests_layout(_tests(r.stdout)["reduce_scatter"], 3, nsizes=3)
    doc = json.loads(out.read_text())
    # the knobs that shape the numbers are recorded, other variables are not
    assert {"TORCH_FR_BUFFER_SIZE=0", "NCCL_ALGO=Ring", "NCCLBENCH_TEST_MARKER=x"} <= set(doc["env"])
    assert not any(e.startswith("UNRELATED_ENV_FOR_THE_TEST") for e in doc["env"])
    assert doc["version"] == 3 and doc["ncclbench"]["ranks"] == 3 and doc["ncclbench"]["complete"] is True
    assert [res["size"] for res in doc["results"]] == [1008, 4080, 16368]  # 16-byte-aligned chunks x 3


def test_op_root_and_dtype_loops(tmp_path):
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "4K", "-e", "4K", "-o", "all", "-d", "bfloat16",
                 "-n", "2", "--no-save"])
    assert r.returncode == 0, r.stderr[-2000:]
    rows = table_rows(r.stdout)
    assert [row[3] for row in rows] == ["sum", "prod", "max", "min", "avg"]
    assert all(row[8] == "0" and row[12] == "0" for row in rows)
    r = run_cli(["broadcast", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "2K", "-f", "2", "-r", "all",
                 "-n", "2", "--no-save"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert [(row[0], row[4]) for row in table_rows(r.stdout)] == [("1024", "0"), ("2048", "0"),
                                                                   ("1024", "1"), ("2048", "1")]


def test_agg_iters_on_gloo_say_the_ops_are_not_grouped():
    """-m > 1 groups each iteration's ops where NCCL is underneath; gloo cannot, and the
    header says so (with -z there is nothing to group: each op is waited for)."""
    note = "# Note: -m 3: ops issued one by one, not in one NCCL group per iteration (gloo has no NCCL groups)"
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "1K", "-m", "3", "-n", "2",
                 "--no-save"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert note in r.stdout and table_rows(r.stdout)[0][8] == "0"
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "1K", "-m", "3", "-z", "1", "-n", "2",
                 "--no-save"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "NCCL group" not in r.stdout


def test_suite_set_overrides_every_entry(tmp_path):
    """`suite --set` replaces an option in every entry (over the file's own value) and
    reaches the spawned ranks."""
    suite = tmp_path / "s.yaml"
    suite.write_text("defaults:\n  minbytes: 64\n  maxbytes: 1K\n  iters: 5\nruns:\n  - allreduce\n"
                     "  - collective: broadcast\n    iters: 7\n")
    r = run_cli(["suite", str(suite), "-g", "2", "--backend", "gloo", "--no-save", "--set", "iters=2",
                 "--set", "maxbytes=64", "--set", "agg_iters=2"])
    assert r.returncode == 0, r.stderr[-2000:]
    headers = [ln for ln in r.stdout.splitlines() if ln.startswith("# nThread")]
    assert len(headers) == 2 and all("maxBytes 64 " in h and "iters: 2 agg iters: 2" in h for h in headers)
    assert len(table_rows(r.stdout)) == 2


def test_all_types_and_ops_skip_what_gloo_lacks():
    """-d all -o all on gloo: one row per pair gloo can run, in nccl-tests' order; the
    pairs it cannot run are named in the header instead of failing the run."""
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "1K", "-d", "all", "-o", "all",
                 "-n", "1", "--no-save"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("# Note: skipped what the gloo backend cannot run: int8 (avg, mulsum), uint8 (avg, mulsum), "
            "int32 (avg, mulsum), uint32, int64 (avg, mulsum), uint64, half (mulsum), float (mulsum), "
            "double (mulsum), bfloat16 (mulsum), f8e4m3, f8e5m2") in r.stdout
    pairs = [(row[2], row[3]) for row in table_rows(r.stdout)]
    ints = [(d, op) for d in ("int8", "uint8", "int32", "int64") for op in ("sum", "prod", "max", "min")]
    floats = [(d, op) for d in ("half", "float", "double", "bfloat16") for op in ("sum", "prod", "max", "min", "avg")]
    assert pairs == ints + floats
    assert all(row[8] == "0" for row in table_rows(r.stdout))


def test_planted_wrong_element_fails_loudly(tmp_path):
    out = tmp_path / "r.csv"
    r = run_cli(["allgather", "-g", "2", "--backend", "gloo", "-b", "256", "-e", "4K", "-f", "4", "-n", "2",
                 "--no-save", "--csv", str(out)], env={"NCCLBENCH_FAULT": "corrupt:rank=1,size=1024"})
    assert r.returncode == 7, r.stderr
    assert "# Out of bounds values : 4 FAILED" in r.stdout
    assert "# Wrong results at sizes: 1024, 4096" in r.stdout  # size=1024: the 256 B row stays right
    rows = table_rows(r.stdout)
    assert [row[8] for row in rows] == ["0", "1", "1"] and [row[12] for row in rows] == ["0", "1", "1"]
    assert list(pd.read_csv(out).nwrong) == [0, 0, 1, 1, 1, 1]
    assert r.stderr.strip().splitlines()[-1] == \
        "ncclbench: error: wrong results in 4 cell(s) (4 wrong element(s)) at sizes 1024, 4096 B"


def test_check_count_repeats_the_check(tmp_path):
    """-c 3 checks three times with fresh inputs (nccl-tests loops its check -c times):
    a planted wrong element is counted once per check."""
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "1K", "-n", "1", "-c", "3",
                 "--no-save"], env={"NCCLBENCH_FAULT": "corrupt:rank=1"})
    assert r.returncode == 7, r.stderr
    assert "validation: 3" in r.stdout
    assert [(row[8], row[12]) for row in table_rows(r.stdout)] == [("3", "3")]


def test_per_iteration_columns_and_json(tmp_path):
    out = tmp_path / "r.json"
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "64", "-e", "64", "-n", "6", "-I", "1",
                 "-K", "2", "--no-save", "-J", str(out)])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "i_p99" in r.stdout and "summary skips first 2 iterations" in r.stdout
    row = table_rows(r.stdout)[0]
    assert len(row) == 21
    per = json.loads(out.read_text())["results"][0]["out_of_place_per_iter"]
    assert per["skipped_iterations"] == 2 and len(per["times_us"]) == 6
    assert len(per["per_process_max_times_us"]) == 2
    assert per["min_us"] <= per["p50_us"] <= per["p99_us"] <= per["max_us"]


def test_cputime_timestamps_blocking_and_unchecked_cells_read_like_nccl_tests(tmp_path):
    """-C titles the time columns `cputime` (JSON key cpu_time), -S adds a `timestamp`
    column title, -z says `# Blocking Enabled`, -I without -K skips nothing and says
    nothing of skipping, a met NCCL_TESTS_MIN_BW ends the Avg line with OK, the step
    factor is an integer in JSON, and an unchecked cell's nwrong is null; `show` replays it.
    Also -b given as a fraction (0.0625K = 64 B), as nccl-tests reads sizes."""
    out = tmp_path / "r.json"
    env = dict(os.environ, NCCL_TESTS_MIN_BW="0.0000001")
    r = run_cli(["sendrecv", "-g", "2", "--backend", "gloo", "-b", "0.0625K", "-e", "512", "-f", "8", "-n", "3",
                 "-C", "1", "-S", "1", "-z", "1", "-I", "1", "--memory", "1", "--results-dir", str(tmp_path / "store"),
                 "-J", str(out)],
                env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    head = next(ln for ln in lines if ln.startswith("#       size"))
    assert head.split()[6] == "cputime" and head.split().count("cputime") == 2 and "time" not in head.split()
    assert head.endswith("  timestamp") and lines[lines.index(head) + 1].endswith("  %Y-%m-%d %H:%M:%S")
    assert "# Blocking Enabled: wait and barrier after each inner iteration (-m) " in lines
    per_iter = next(ln for ln in lines if ln.startswith("# Per-Iteration Report"))
    assert per_iter.endswith("i_* uses max over process rows ") and "skips" not in per_iter
    assert re.search(r"^# Avg bus bandwidth    : [0-9.e+-]+ OK$", r.stdout, re.M)
    assert "# Memory usage (rank 0, MiB):" in r.stdout  # --memory: nccl-tests' long name of -M
    doc = json.loads(out.read_text())
    assert doc["config"]["step_factor"] == 8 and isinstance(doc["config"]["step_factor"], int)
    assert doc["config"]["minimum_bytes"] == 64 and [r["size"] for r in doc["results"]] == [64, 512]
    cell = doc["results"][0]
    assert set(cell["out_of_place"]) == {"cpu_time", "alg_bw", "bus_bw", "nwrong"}
    assert cell["out_of_place"]["nwrong"] == 0.0 and cell["in_place"]["nwrong"] is None  # sendrecv in place: N/A
    stored = next((tmp_path / "store").glob("*.json"))
    shown = run_cli(["show", str(stored)])
    assert shown.returncode == 0 and "cputime" in shown.stdout, shown.stderr


def test_hypercube_unalign_memory_and_bandwidth_gate(tmp_path):
    """hypercube on 4 ranks with misaligned buffers is correct; an unreachable --min-bw
    fails the run with nccl-tests' code 7 and says so, JSON included."""
    out = tmp_path / "r.json"
    r = run_cli(["hypercube", "-g", "4", "--backend", "gloo", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2",
                 "-u", "3", "-M", "1", "--min-bw", "1000", "--no-save", "-J", str(out)])
    assert r.returncode == 7, r.stderr[-2000:]
    rows = table_rows(r.stdout)
    assert [(row[0], row[1], row[2]) for row in rows] == [("1024", "64", "float"), ("4096", "256", "float")]
    assert all(len(row) == 12 and row[7] == "0" and row[11] == "0" for row in rows)  # empty redop column
    assert "unalign: 3" in r.stdout
    assert "# Bandwidth check: average busbw" in r.stdout and "FAILED" in r.stdout
    assert re.search(r"^# Avg bus bandwidth    : [0-9.e+-]+ FAILED$", r.stdout, re.M)  # nccl-tests' own verdict
    assert re.search(r"^ncclbench: error: bandwidth below the floor: average busbw [0-9.e+-]+ GB/s < 0\.9 x 1000$",
                     r.stderr, re.M)
    assert "# Memory usage (rank 0, MiB):" in r.stdout
    doc = json.loads(out.read_text())
    assert doc["average_bus_bandwidth"]["okay"] == "false" and doc["ncclbench"]["status"] == "bandwidth_low"


def test_progress_bar_on_a_terminal_only(tmp_path):
    """stderr on a pseudo-terminal shows the rich progress bar; stdout (a pipe) stays the
    plain nccl-tests table; --quiet turns the bar off."""
    import os
    import pty

    def run(extra):
        master, slave = pty.openpty()
        env = {k: v for k, v in os.environ.items() if k != "CI"}
        proc = subprocess.Popen(cli_command() + ["allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "4K",
                                                 "-f", "4", "-n", "2", "--no-save", *extra],
                                stdout=subprocess.PIPE, stderr=slave, env=env, text=True)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        out, _ = proc.communicate(timeout=240)
        os.close(master)
        return proc.returncode, out, b"".join(chunks).decode(errors="replace")

    code, out, err = run([])
    assert code == 0
    assert "━" in err and "all_reduce" in err
    assert "━" not in out and len(table_rows(out)) == 2
    code, out, err = run(["--quiet"])
    assert code == 0 and "━" not in err


def test_split_runs_parallel_groups_and_checks_each(tmp_path):
    """--split "MOD 2": two groups of 2 ranks; rows are per-group tests (2-rank sizes and
    counts); a wrong element planted on rank 3 (group 1) is still counted."""
    r = run_cli(["reducescatter", "-g", "4", "--backend", "gloo", "-b", "1K", "-e", "4K", "-f", "4", "-n", "2",
                 "--split", "MOD 2", "--no-save"], env={"NCCLBENCH_FAULT": "corrupt:rank=3"})
    assert r.returncode == 7, r.stderr[-2000:]
    groups = re.findall(r"#  Rank +(\d) Group +(\d)", r.stdout)
    assert groups == [("0", "0"), ("1", "1"), ("2", "0"), ("3", "1")]
    rows = table_rows(r.stdout)
    assert [(row[0], row[1]) for row in rows] == [("1024", "128"), ("4096", "512")]  # 2-rank chunks
    assert all(row[8] == "1" and row[12] == "1" for row in rows)
    assert "split MOD 2: 2 groups of 2 ranks" in r.stdout


def test_suite_entries_carry_the_bandwidth_gate_and_buffer_options(tmp_path):
    """min_bw, unalign and memory_report are suite keys too (a CI gate file can hold its floor)."""
    suite = tmp_path / "gate.yaml"
    suite.write_text("defaults:\n  minbytes: 1K\n  maxbytes: 1K\n  iters: 2\n  unalign: 1\n  memory_report: 1\n"
                     "runs:\n  - collective: allreduce\n    min_bw: 1000000\n")
    r = run_cli(["suite", str(suite), "-g", "2", "--backend", "gloo", "--no-save"])
    assert r.returncode == 7, r.stderr[-2000:]
    assert "unalign: 1" in r.stdout and "# Memory usage (rank 0, MiB):" in r.stdout
    assert re.search(r"^# Avg bus bandwidth    : [0-9.e+-]+ FAILED$", r.stdout, re.M)


def test_long_option_prefixes_like_getopt_long():
    """nccl-tests takes unambiguous prefixes of long options (getopt_long); so does
    ncclbench, and the word after an option that takes a value is never expanded."""
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "--minb", "1K", "--maxb=2K", "--stepf", "2",
                 "--warmup", "0", "--iter", "3", "--no-s"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert "minBytes 1024 maxBytes 2048" in r.stdout and "warmup iters: 0 iters: 3 " in r.stdout
    assert [row[0] for row in table_rows(r.stdout)] == ["1024", "2048"]


@pytest.mark.parametrize("cputime", [0, 1])
def test_cputime_prints_host_time_but_bandwidth_from_the_timed_duration(tmp_path, cputime):
    """A 'device' 50 x slower than the host issues its ops (fault injection): without -C
    the printed time is the timed duration and algbw x time = bytes; with -C 1 the time is
    the host's issue time (cpu_time in JSON) while algbw still comes from the timed
    duration, so algbw x time is some 50 x short of the bytes (nccl-tests: getBw gets
    deltaSec whatever -C says)."""
    out = tmp_path / "r.json"
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "1M", "-e", "1M", "-n", "4", "-C", str(cputime),
                 "--no-save", "-J", str(out)], env={"NCCLBENCH_FAULT": "slow_device:factor=50"})
    assert r.returncode == 0, r.stderr[-2000:]
    cell = json.loads(out.read_text())["results"][0]["out_of_place"]
    time_us = cell["cpu_time" if cputime else "time"]
    moved = cell["alg_bw"] * 1e3 * time_us / (1 << 20)  # 1 when the time is what the bandwidth came from
    if cputime:
        assert moved < 0.1, cell
    else:
        assert moved == pytest.approx(1, rel=1e-6), cell
    assert cell["bus_bw"] == pytest.approx(cell["alg_bw"])  # 2 ranks: factor 2(n-1)/n = 1


@pytest.mark.parametrize("mode,line", [
    (1, "# Blocking Enabled: wait and barrier after each inner iteration (-m) "),
    (2, "# Blocking Enabled: wait after each inner iteration (-m), no barrier "),
    (3, "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier "),
])
def test_each_blocking_mode_runs_and_says_so_as_nccl_tests(tmp_path, mode, line):
    out = tmp_path / "r.json"
    r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "4K", "-f", "4", "-n", "3", "-m", "2",
                 "-I", "1", "-z", str(mode), "--no-save", "-J", str(out)])
    assert r.returncode == 0, r.stderr[-2000:]
    assert line in r.stdout.splitlines()
    grouped_note = f"# Note: -z {mode} -m 2: each op is waited for on its own, not grouped"
    assert (grouped_note in r.stdout) == (mode in (1, 2))
    doc = json.loads(out.read_text())
    assert doc["config"]["blocking_collectives"] == "true" and doc["config"]["blocking_mode"] == mode
    assert [res["out_of_place"]["nwrong"] for res in doc["results"]] == [0, 0]
    assert all(len(res["out_of_place_per_iter"]["times_us"]) == 3 for res in doc["results"])
    shown = run_cli(["show", str(out)])
    assert shown.returncode == 0 and line in shown.stdout.splitlines(), shown.stderr


def test_ncclbench_sets_no_nccl_variable_and_names_those_the_ranks_ran_with(tmp_path):
    """A self-spawned run starts from NCCL's defaults (it used to set NCCL_NVLS_ENABLE=0,
    which turns NCCL's fastest all_reduce off on NVSwitch systems while torchrun, srun and
    mpirun runs kept it on); header and JSON name the NCCL_* variables the user set."""
    unset = {name: None for name in os.environ if name.startswith("NCCL_")}
    unset["NCCL_NVLS_ENABLE"] = None
    for extra, expected in (({}, "# NCCL environment: NCCL defaults (no NCCL_* set)"),
                            ({"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"},
                             "# NCCL environment: NCCL_ALGO=Ring NCCL_PROTO=Simple")):
        out = tmp_path / f"r{len(extra)}.json"
        r = run_cli(["allreduce", "-g", "2", "--backend", "gloo", "-b", "1K", "-e", "1K", "-n", "1", "--no-save",
                     "-J", str(out)], env={**unset, **extra})
        assert r.returncode == 0, r.stderr[-2000:]
        assert expected in r.stdout.splitlines()
        # gloo: the header says plainly that there is no NCCL path, and NCCL's log was not turned on
        assert "# NCCL path: none (gloo backend: TCP through the hosts' network stack, no NCCL)" in r.stdout.splitlines()
        nccl = [e for e in json.loads(out.read_text())["env"] if e.startswith("NCCL_")]
        assert nccl == [f"{k}={v}" for k, v in sorted(extra.items())]
