"""`ncclbench tune`: every bad input is one line and exit 2 (5 without the GPUs asked for),
before anything is launched."""

import shutil
import subprocess

import pytest

from conftest import run_cli

GOOD_CONF = "# a comment\nallreduce,0,65536,tree,ll,4,1,2,1,0\n"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    for name in ("NCCL_ALGO", "NCCL_PROTO", "NCCL_TUNER_PLUGIN", "NCCL_MAX_NCHANNELS", "RANK", "WORLD_SIZE",
                 "LOCAL_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")


def _refused(args, *words, env=None, code=2, capsys=None, monkeypatch=None):
    """In this process (nothing is launched on these paths): the exit code and the one line."""
    from ncclbench.cli.main import main

    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exit_:
        main(["tune", *args])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_.value.code == code, (exit_.value.code, out[-500:], err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("ncclbench"), err
    for w in words:
        assert w in lines[0], lines[0]
    assert out == ""
    return lines[0]


def test_the_console_script_says_it_in_one_line():
    r = run_cli(["tune", "allreduce", "--algos", "trees"], timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "ncclbench: error: --algos: unknown algorithm 'trees' (NCCL's algorithms: tree, ring, collnet_direct, "
        "collnet_chain, nvls, nvls_tree, pat)"]


@pytest.mark.parametrize("args,words", [
    (["allreduce", "--algos", "tree,trees"], ["unknown algorithm 'trees'"]),
    (["allreduce", "--protos", "LL64"], ["unknown protocol"]),
    (["allreduce", "--channels", "8,8"], ["given twice"]),
    (["allreduce", "--channels", "0"], ["outside 1..64"]),
    (["allreduce", "--channels", "8,x"], ["not a whole number"]),
    (["alltoall"], ["point-to-point"]),
    (["allreduce", "--backend", "gloo"], ["no NCCL", "--rehearse"]),
    (["allreduce", "--backend", "cupy"], ["cupy"]),
    (["allreduce", "-o", "xor"], ["unknown op 'xor'", "the output folder is -O/--out"]),
    (["allreduce", "-c", "0"], ["always checks"]),
    (["allreduce", "-d", "all"], ["one datatype"]),
    (["allreduce", "--verify", "x.conf"], ["go together"]),
    ([], ["name one or more collectives"]),
    (["allreduce", "--rehearse", "--verify", "x.conf", "--plugin", "y.so"], ["cannot be rehearsed"]),
    (["allgather", "--algos", "tree"], ["none is an NCCL all_gather algorithm"]),
    (["allreduce", "--rehearse", "--repeat", "0"], ["--repeat must be at least 1"]),
    (["allreduce", "--repeat", "2", "--verify", "x.conf", "--plugin", "y.so"], ["--verify needs --repeat 3 or more"]),
    (["allreduce", "--rehearse", "--timing", "graph"], ["gloo has no CUDA graphs"]),
    (["allreduce", "--rehearse", "-G", "0"], ["-G must be at least 1"]),
    (["allreduce", "--rehearse", "-N", "0"], ["--run_cycles"]),
    (["allreduce", "--rehearse", "--nnodes", "2"], ["needs --master-addr"]),
    (["allreduce", "--rehearse", "--nnodes", "2", "--node-rank", "2", "--master-addr", "h"], ["--node-rank 2"]),
])
def test_bad_input(args, words, capsys):
    _refused(args, *words, capsys=capsys)


@pytest.mark.parametrize("env,words", [
    ({"NCCL_ALGO": "Tree"}, ["NCCL_ALGO=Tree is set"]),
    ({"NCCL_PROTO": "LL"}, ["NCCL_PROTO=LL is set"]),
    ({"NCCL_TUNER_PLUGIN": "/x/libnccl-tuner.so"}, ["NCCL_TUNER_PLUGIN", "--verify"]),
    ({"NCCL_MAX_NCHANNELS": "4"}, ["NCCL_MAX_NCHANNELS=4", "--channels"]),
])
def test_environment_that_would_change_the_default(env, words, capsys, monkeypatch):
    args = ["allreduce", "--rehearse", "-g", "2"] + (["--channels", "8"] if "NCCL_MAX_NCHANNELS" in env else [])
    _refused(args, *words, env=env, capsys=capsys, monkeypatch=monkeypatch)


def test_nvls_only_with_nvls_disabled_leaves_nothing(capsys):
    _refused(["allreduce", "--rehearse", "-g", "2", "--algos", "nvls"], "NCCL_NVLS_ENABLE=0", capsys=capsys)


def test_a_verify_file_not_in_nccls_format(tmp_path, capsys):
    conf = tmp_path / "tuned.conf"
    conf.write_text("# ours\nallreduce,0,65536,Tree,ll,4,1,2,1,0\n")
    _refused(["allreduce", "-g", "2", "--verify", str(conf), "--plugin", str(tmp_path / "x.so")],
             "tuned.conf line 2", "algorithm 'Tree'", capsys=capsys)
    conf.write_text("allgather,0,65536,ring,ll,4,1,2,1,0\n")
    _refused(["allreduce", "-g", "2", "--verify", str(conf), "--plugin", str(tmp_path / "x.so")],
             "no row of", "allreduce on 2 rank(s)", capsys=capsys)


def test_a_plugin_that_does_not_load(tmp_path, capsys):
    conf = tmp_path / "tuned.conf"
    conf.write_text(GOOD_CONF)
    notso = tmp_path / "libnccl-tuner.so"
    notso.write_text("not a shared object")
    _refused(["allreduce", "-g", "2", "--verify", str(conf), "--plugin", str(notso)], "does not load", capsys=capsys)
    _refused(["allreduce", "-g", "2", "--verify", str(conf), "--plugin", str(tmp_path / "missing.so")],
             "no such file", capsys=capsys)


def _shared_object(tmp_path, name, source):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build a stand-in plugin")
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / f"{name}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    return out


_STRUCT = "typedef struct { const char* name; void* a; void* b; void* c; void* d; } T;\n"


def test_plugins_nccl_cannot_use_are_refused(tmp_path, capsys):
    conf = tmp_path / "tuned.conf"
    conf.write_text(GOOD_CONF)
    nothing = _shared_object(tmp_path, "nothing", "int unrelated = 1;\n")
    _refused(["allreduce", "-g", "2", "--verify", str(conf), "--plugin", str(nothing)], "not an NCCL tuner plugin",
             capsys=capsys)
    # NCCL's example built from a source before 2.30: one interface, v5 or v4, named Example
    old = _shared_object(tmp_path, "old", _STRUCT + 'const T ncclTunerPlugin_v5 = {"Example", 0, 0, 0, 0};\n')
    _refused(["allreduce", "-g", "2", "--verify", str(conf), "--plugin", str(old)], "before 2.30", "crashes",
             capsys=capsys)


def test_a_usable_plugin_gets_as_far_as_the_gpu_check(tmp_path, capsys):
    """2.30's example exports v6 and v5: accepted; this machine then has no GPU (exit 5)."""
    conf = tmp_path / "tuned.conf"
    conf.write_text(GOOD_CONF)
    new = _shared_object(tmp_path, "new", _STRUCT + 'const T ncclTunerPlugin_v6 = {"Example", 0, 0, 0, 0};\n'
                                                    'const T ncclTunerPlugin_v5 = {"Example", 0, 0, 0, 0};\n')
    from conftest import cuda_available

    if cuda_available():
        pytest.skip("a GPU is visible: this checks the CPU-only path")
    _refused(["allreduce", "-g", "2", "--verify", str(conf), "--plugin", str(new), "-O", str(tmp_path / "o")],
             "needs NCCL on CUDA GPUs", code=5, capsys=capsys)
    assert not (tmp_path / "o").exists()  # nothing created before the last check


def test_a_request_whose_repeats_never_end_is_refused():
    """-N 0 means "until interrupted" to the sweep commands; a suite's tune entry may pass it
    in its options: tune refuses it in one line rather than never finishing a repeat."""
    from ncclbench.errors import PlanError
    from ncclbench.tune import run

    request = run.TuneRequest(["all_reduce"], {"check": 1, "run_cycles": 0}, rehearse=True)
    with pytest.raises(PlanError, match="run_cycles must be at least 1"):
        run.check_request(request)
    run.check_request(run.TuneRequest(["all_reduce"], {"check": 1, "run_cycles": 3}, rehearse=True))
