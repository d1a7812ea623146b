"""Every bad input: one line of error, exit code 2, nothing launched, no traceback.

Runs the real entry point (`ncclbench.cli.main.main`) in-process: each case fails before any
rank starts, so no process would be spawned anyway (asserted: no child processes)."""


import psutil
import pytest

from conftest import ROOT
from ncclbench.cli.main import main

BAD_SUITE = "runs:\n  - collective: allreduce\n    datatype: float7\n"
UNKNOWN_KEY_SUITE = "runs:\n  - collective: allreduce\n    sizes: 8\n"
UNKNOWN_COLL_SUITE = "runs:\n  - allreduse\n"
NOT_YAML = "runs: [allreduce\n"
OTHER_CSV = "a,b,c\n1,2,3\n"

CASES = [
    # (id, argv, expected words in the error line)
    ("negative size", ["allreduce", "-b", "-8"], "size"),
    ("unparsable size", ["allreduce", "-b", "8X"], "cannot parse size"),
    ("min above max", ["allreduce", "-b", "1M", "-e", "1K"], "larger than maximum"),
    ("zero step", ["allreduce", "-b", "1K", "-e", "4K", "-i", "0"], "step must be > 0"),
    ("factor one", ["allreduce", "-b", "1K", "-e", "4K", "-f", "1"], "step factor must be > 1"),
    ("factor below one", ["allreduce", "-b", "1K", "-e", "4K", "-f", "0.5"], "step factor must be > 1"),
    ("factor from zero", ["allreduce", "-b", "0", "-e", "4K", "-f", "2"], "minimum size > 0"),
    ("unknown collective", ["allreduse"], "allreduse"),
    ("unknown dtype", ["allreduce", "-d", "float7"], "unknown datatype"),
    ("unknown op", ["allreduce", "-o", "xor"], "unknown op"),
    ("unknown backend", ["allreduce", "--backend", "mpi"], "mpi"),
    ("avg on ints with gloo", ["allreduce", "--backend", "gloo", "-d", "int32", "-o", "avg"], "cannot average"),
    ("fp8 on gloo", ["allgather", "--backend", "gloo", "-d", "f8e4m3"], "no datatype f8e4m3"),
    ("uint32 on gloo", ["allreduce", "--backend", "gloo", "-d", "uint32"], "no datatype uint32"),
    ("root beyond ranks", ["broadcast", "--backend", "gloo", "-g", "2", "-r", "5"], "root 5 does not exist"),
    ("bad root", ["broadcast", "-r", "first"], "root must be"),
    ("zero gpus", ["allreduce", "--backend", "gloo", "-g", "0"], "-g must be at least 1"),
    ("zero iterations", ["allreduce", "-n", "0"], "iters"),
    ("zero agg", ["allreduce", "-m", "0"], "agg_iters"),
    ("bad average", ["allreduce", "-a", "4"], "average"),
    ("negative timeout", ["allreduce", "-T", "-1"], "timeout"),
    ("-K skipping every iteration", ["allreduce", "--backend", "gloo", "-n", "5", "-I", "1", "-K", "5"],
     "would skip every one of the 5 -n iterations"),
    ("-J and --csv on one file", ["allreduce", "--backend", "gloo", "-J", "r.out", "--csv", "./r.out"], "same file"),
    ("json name too long", ["allreduce", "--backend", "gloo", "-J", "j" * 300 + ".json"], "File name too long"),
    ("alltoallv matrix without end", ["alltoallv", "--backend", "gloo", "-b", "1K", "-e", "1K",
                                      "--alltoallv-matrix", "/dev/zero"], "not a regular file (a character device)"),
    ("infinite timeout", ["allreduce", "-T", "inf"], "timeout"),
    ("nan timeout", ["allreduce", "-T", "nan"], "not a finite number"),
    ("timeout past the watchdog's clock", ["allreduce", "-T", "1e12"], "timeout"),
    ("nan bandwidth floor", ["allreduce", "--min-bw", "nan"], "not a finite number"),
    ("infinite factor", ["allreduce", "-f", "inf"], "not a finite number"),
    ("size past 1 PiB", ["allreduce", "-e", "1e400"], "largest size"),
    ("size with a huge exponent", ["allreduce", "-e", "1e999999999"], "largest size"),
    ("sweep of a trillion sizes", ["allreduce", "--backend", "gloo", "-b", "8", "-e", "1T", "-i", "1"],
     "more than 100000 sizes"),
    ("threads", ["allreduce", "-t", "2"], "nthreads"),
    ("graph on gloo", ["allreduce", "--backend", "gloo", "-G", "5"], "gloo"),
    ("graph and blocking", ["allreduce", "--backend", "gloo", "-G", "5", "-z", "1"], "cannot be captured"),
    ("graph and blocking per iteration", ["allreduce", "--backend", "gloo", "-G", "5", "-z", "3"], "-z 3 cannot"),
    ("blocking mode beyond nccl-tests'", ["allreduce", "-z", "4"], "blocking"),
    ("sendrecv alone", ["sendrecv", "--backend", "gloo", "-g", "1"], "at least 2 ranks"),
    ("json dir missing", ["allreduce", "--backend", "gloo", "-J", "/nonexistent/dir/r.json"], "does not exist"),
    ("csv dir missing", ["allreduce", "--backend", "gloo", "--csv", "/nonexistent/dir/r.csv"], "does not exist"),
    ("results dir unusable", ["allreduce", "--backend", "gloo", "--results-dir", "/proc/ncclbench"], "result store"),
    # /proc passes permission checks for root, yet no file can be created there
    ("json where no file can be made", ["allreduce", "--backend", "gloo", "-J", "/proc/ncclbench-r.json"],
     "cannot write JSON file /proc/ncclbench-r.json"),
    ("csv where no file can be made", ["allreduce", "--backend", "gloo", "--csv", "/proc/ncclbench-r.csv"],
     "cannot write CSV file /proc/ncclbench-r.csv"),
    ("nodes without master", ["allreduce", "--backend", "gloo", "-g", "2", "--nnodes", "2"], "--master-addr"),
    ("node rank beyond nodes", ["allreduce", "--backend", "gloo", "--nnodes", "2", "--node-rank", "2",
                                "--master-addr", "h"], "--node-rank 2"),
    ("unknown option", ["allreduce", "--frobnicate"], "frobnicate"),
    ("endpoint port out of range", ["allreduce", "--backend", "gloo", "--nnodes", "2", "--rdzv-endpoint", "h:99999"],
     "port from 1 to 65535"),
    ("endpoint on one node", ["allreduce", "--backend", "gloo", "--rdzv-endpoint", "h:29500"], "--nnodes > 1"),
    ("master address on one node", ["allreduce", "--backend", "gloo", "--master-addr", "h"], "--nnodes > 1"),
    ("hypercube on 3 ranks", ["hypercube", "--backend", "gloo", "-g", "3"], "power-of-two"),
    ("cta policy on gloo", ["allreduce", "--backend", "gloo", "-x", "1"], "gloo backend runs no NCCL"),
    ("cta policy nccl has not", ["allreduce", "-x", "3"], "cta_policy"),
    ("null stream on cpu", ["allreduce", "--backend", "gloo", "-y", "1"], "GPU backend"),
    ("negative unalign", ["allreduce", "-u", "-1"], "unalign"),
    ("bad split", ["allreduce", "--backend", "gloo", "--split", "XOR 3"], "split"),
    ("unequal split", ["allreduce", "--backend", "gloo", "-g", "4", "--split", "MOD 3"], "one size"),
    ("all ops of a type gloo lacks", ["allreduce", "--backend", "gloo", "-d", "uint32", "-o", "all"],
     "no datatype uint32"),
    ("ambiguous long-option prefix", ["allreduce", "--min", "1K"], "--min is ambiguous: it could be --min-bw"),
    ("mulsum on gloo", ["allreduce", "--backend", "gloo", "-o", "mulsum"], "backend gloo has no mulsum"),
    ("alltoallv option elsewhere", ["allreduce", "--alltoallv-spread", "0.5"], "applies to alltoallv only"),
    ("alltoallv spread above one", ["alltoallv", "--backend", "gloo", "--alltoallv-spread", "1.5"], "from 0 to 1"),
    ("alltoallv spread not a number", ["alltoallv", "--backend", "gloo", "--alltoallv-spread", "wide"], "number"),
    ("alltoallv matrix missing", ["alltoallv", "--backend", "gloo", "--alltoallv-matrix", "/nonexistent/m.txt"],
     "cannot read an alltoallv matrix: No such file"),
    ("alltoallv matrix and spread", ["alltoallv", "--backend", "gloo", "--alltoallv-matrix", "m.txt",
                                     "--alltoallv-spread", "0"], "exclude each other"),
    ("alltoallv scale without matrix", ["alltoallv", "--backend", "gloo", "--alltoallv-scale", "2"], "needs a matrix"),
    ("root beyond split group", ["broadcast", "--backend", "gloo", "-g", "4", "--split", "MOD 2", "-r", "2"],
     "root 2 does not exist with 2 ranks"),
]


def _no_children():
    return [p for p in psutil.Process().children(recursive=True)]


@pytest.mark.parametrize("argv,words", [(c[1], c[2]) for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_exit_2(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert exc.value.code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("ncclbench: error:"), err
    assert words.lower() in lines[0].lower(), err
    assert "Traceback" not in err
    assert not _no_children()


@pytest.mark.parametrize("argv", [["allreduce", "--backend", "nccl", "-g", "64"],
                                  ["allreduce", "--backend", "cupy", "-g", "64"],
                                  ["pairs", "--backend", "nccl", "-g", "64"]])
def test_more_gpus_than_visible_is_nccl_tests_exit_5(argv, capsys, tmp_path, monkeypatch):
    """nccl-tests exits 5 ('Invalid number of GPUs'); nothing is launched."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exc.value.code == 5 and len(lines) == 1, lines
    assert "-g 64 asks for more GPUs than the" in lines[0] and lines[0].startswith("ncclbench")
    assert not _no_children()


def test_a_gpu_backend_without_a_gpu_says_so_when_no_g_was_given(capsys, monkeypatch):
    from ncclbench.topology import visible

    monkeypatch.setattr(visible, "visible_gpu_count", lambda: 0)
    with pytest.raises(SystemExit) as exc:
        main(["allreduce", "--backend", "cupy"])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert exc.value.code == 5 and lines == [
        "ncclbench: error: the cupy backend needs a CUDA GPU and none is visible (--backend gloo runs on the CPU)"]


@pytest.mark.parametrize("content,words", [
    (BAD_SUITE, "runs[0]"), (UNKNOWN_KEY_SUITE, "unknown key 'sizes'"),
    (UNKNOWN_COLL_SUITE, "unknown collective"), (NOT_YAML, "not valid YAML"),
    # the same ranges as the command line's options (these used to launch and fail in the ranks)
    ("runs:\n  - collective: allreduce\n    iters: 0\n", "'--iters': 0 is not in the range x>=1"),
    ("runs:\n  - collective: allreduce\n    agg_iters: 0\n", "'--agg_iters': 0 is not in the range"),
    ("runs:\n  - collective: allreduce\n    average: 7\n", "'--average': 7 is not in the range"),
    ("runs:\n  - collective: allreduce\n    timeout: -5\n", "'--timeout': -5.0 is not in the range"),
    ("defaults:\n  stepfactor: .inf\nruns:\n  - allreduce\n", "not a finite number"),
    ("defaults:\n  env: [a, b]\nruns:\n  - allreduce\n", "env must be a mapping"),
    (b"runs:\n  - \xff\xfe\n", "a binary file (not UTF-8 text at byte 10), not a suite file"),
])
def test_malformed_suite_names_file_and_entry(content, words, capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(SystemExit) as exc:
        main(["suite", str(path), "--backend", "gloo", "--no-save"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert str(path) in err[0] and words in err[0]


def test_a_suite_entry_asking_for_another_stream_than_its_launch_is_refused(capsys, tmp_path, monkeypatch):
    """The stream is chosen when the backend starts, once per launch: an entry with another
    stream_null than the launch's first entry is refused before anything starts (it used to
    run on the first entry's stream, silently). One GPU stands in for the count, so that the
    refusal is the stream's on a machine without one too."""
    from ncclbench.api import command

    monkeypatch.setattr(command, "local_rank_count", lambda requested, backend: 1)
    path = tmp_path / "streams.yaml"
    path.write_text("runs:\n  - allreduce\n  - collective: allgather\n    stream_null: 1\n")
    with pytest.raises(SystemExit) as exc:
        main(["suite", str(path), "--backend", "nccl", "--no-save"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert "runs[1] (allgather) sets stream_null 1 but runs[0] (allreduce), launched with it, sets 0" in err[0]
    assert not psutil.Process().children()


@pytest.mark.parametrize("item,words", [("sizes=3", "unknown key 'sizes'"), ("iters", "expected KEY=VALUE"),
                                        ("iters=[1, 2]", "not a single value"), ("iters=", "not a single value"),
                                        ("iters=abc", "'abc' is not a valid integer"), ("iters=0", "x>=1"),
                                        ("timeout=nan", "not a finite number")])
def test_bad_suite_override_is_one_line(item, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["suite", str(ROOT / "configs" / "quick.yaml"), "--backend", "gloo", "--no-save", "--set", item])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert words in err[0], err


def test_csv_with_other_columns_is_refused(capsys, tmp_path):
    path = tmp_path / "old.csv"
    path.write_text(OTHER_CSV)
    with pytest.raises(SystemExit) as exc:
        main(["allreduce", "--backend", "gloo", "--csv", str(path), "--no-save"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "columns differ" in err[0]
    assert path.read_text() == OTHER_CSV  # untouched


@pytest.mark.parametrize("env,words", [
    ({"RANK": "5", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}, "RANK"),
    ({"RANK": "1"}, "WORLD_SIZE"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "x"}, "OMPI_COMM_WORLD_SIZE"),
])
def test_contradictory_launcher_environment(env, words, capsys, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(SystemExit) as exc:
        main(["allreduce", "--backend", "gloo", "--no-save"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err
    assert words in err[0]


def test_bad_min_bw_variable(capsys, monkeypatch):
    monkeypatch.setenv("NCCL_TESTS_MIN_BW", "fast")
    with pytest.raises(SystemExit) as exc:
        main(["allreduce", "--backend", "gloo", "--no-save"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "NCCL_TESTS_MIN_BW" in err[0]


def test_compare_with_malformed_baseline(capsys, tmp_path):
    base = tmp_path / "base.json"
    base.write_text("{not json")
    new = tmp_path / "new.txt"
    new.write_text("nothing here\n")
    with pytest.raises(SystemExit) as exc:
        main(["compare", str(base), str(new)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1, err


def test_bare_command_shows_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "Collectives:" in out and "Tools:" in out


def test_buffers_larger_than_free_gpu_memory_are_refused_with_what_fits():
    """The per-rank check that runs before allocating (a GPU backend reports free memory;
    here a stand-in with 3 GiB free, since this machine has no GPU)."""
    from types import SimpleNamespace

    from ncclbench.errors import PlanError
    from ncclbench.engine.plan import Plan
    from ncclbench.engine.rankrunner import RankRunner

    class FakeGpuBackend(SimpleNamespace):
        def free_memory(self):
            return 3 << 30

    plan = Plan("all_reduce", min_bytes=8, max_bytes=4 << 30, step_factor=4.0, backend="nccl")
    backend = FakeGpuBackend(group_rank=0, group_size=4, rank=0, nranks=4)
    with pytest.raises(PlanError) as exc:
        RankRunner(plan, backend).validate()
    text = str(exc.value)
    assert "buffers need 4.0 GiB" in text and "3.0 GiB free" in text
    assert "largest size that fits: -e 536870912" in text  # 2 x 512 MiB + 2 GiB reserve = 3 GiB
    small = Plan("all_reduce", min_bytes=8, max_bytes=64 << 20, step_factor=4.0, backend="nccl")
    RankRunner(small, backend).validate()  # fits: no error


def test_first_line_of_an_error():
    from ncclbench.errors import first_line

    assert first_line(RuntimeError("CUDA out of memory.\nTried to allocate 2 GiB")) == "CUDA out of memory."
    assert first_line(RuntimeError("x" * 300), 200) == "x" * 200
    assert first_line(MemoryError()) == "MemoryError"


def test_help_of_every_command_reads_cleanly():
    """--help of every subcommand: no Click range text like "x<=None" (an unbounded
    FiniteFloat showed it) and no traceback."""
    from click.testing import CliRunner

    from ncclbench.cli.main import cli

    for name, command in cli.commands.items():
        result = CliRunner().invoke(command, ["--help"])
        assert result.exit_code == 0, (name, result.output)
        assert "None" not in result.output, name


def test_long_option_prefix_edge_cases():
    """getopt_long's rules: a prefix of two names of one option is that option (`--mem`:
    --memory / --memory_report); the word after a value-taking option, also at the end of
    a short cluster (`-qJ`), is never expanded; shell completion is not broken by an
    ambiguous word; pairs, suite and show take prefixes too."""
    from ncclbench.cli.main import cli

    allreduce = cli.commands["allreduce"]
    assert allreduce.make_context("allreduce", ["--mem", "1"]).params["memory_report"] == 1
    assert allreduce.make_context("allreduce", ["-qJ", "--iter"]).params["output_file"] == "--iter"
    assert allreduce.make_context("allreduce", ["-J", "--warm", "--iter=4"]).params["iters"] == 4
    ctx = allreduce.make_context("allreduce", ["--min", "1K"], resilient_parsing=True)
    assert ctx.params["minbytes"] is not None  # no error raised while completing
    assert cli.commands["pairs"].make_context("pairs", ["--warmup", "3"]).params["warmup_iters"] == 3
    assert cli.commands["suite"].make_context("suite", ["x.yaml", "--no-s"]).params["no_save"] is True
