"""One grammar across the subcommands: a letter or long option means one thing everywhere
(nccl-tests' meaning where it has the letter), -g takes `all` wherever it exists, sizes
have one parser, errors one prefix, each help shows what applies to its command.

Read from Click's command objects (no process started), except the error lines, which
are checked as a user meets them: `python -m ncclbench ...` in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from conftest import ROOT
from ncclbench.api.options import ALLTOALLV_NAMES
from ncclbench.api.params import ALL_GPUS
from ncclbench.cli.main import cli
from ncclbench.engine.collectives import ALLTOALLV, REGISTRY

FIXTURES = Path(__file__).parent / "fixtures" / "nccl-tests"

# Parameter names that mean the same thing under different names in different commands
# (the meaning an option has is its parameter's name, else this table's word for it).
SAME_MEANING = {
    "size": "minbytes",            # pairs, fleet, p2p: the one size; collectives, tune: the smallest
    "warmup": "warmup_iters",      # p2p's untimed copies
    "graph_replays": "cudagraph",  # tune's -G
    "output_dir": "output",        # tune's -O folder, plot's image, baseline's file
    "as_json": "json_path",        # topo --json: the topology as JSON (on stdout)
}

# nccl-tests' letters and what each means there; a command that has the letter must mean it
NCCL_TESTS_LETTERS = {
    "-b": "minbytes", "-e": "maxbytes", "-i": "stepbytes", "-f": "stepfactor", "-o": "op", "-d": "datatype",
    "-r": "root", "-n": "iters", "-w": "warmup_iters", "-m": "agg_iters", "-N": "run_cycles", "-g": "ngpus",
    "-t": "nthreads", "-c": "check", "-a": "average", "-T": "timeout", "-G": "cudagraph", "-J": "output_file",
    "-x": "cta_policy", "-z": "blocking", "-C": "report_cputime", "-I": "per_iter_timing", "-K": "per_iter_skip",
}


def meaning(param: click.Parameter) -> str:
    return SAME_MEANING.get(param.name, param.name)


def all_commands() -> dict[str, click.Command]:
    return dict(cli.commands)


def options_of(command: click.Command):
    for param in command.params:
        if isinstance(param, click.Option) and param.name != "help":
            yield param, [*param.opts, *param.secondary_opts]


def conflicts(commands: dict[str, click.Command]) -> dict[str, dict[str, list[str]]]:
    """Option name -> {meaning: [commands]} for every name used with more than one meaning."""
    uses: dict[str, dict[str, list[str]]] = {}
    for name, command in commands.items():
        for param, names in options_of(command):
            for option in names:
                uses.setdefault(option, {}).setdefault(meaning(param), []).append(name)
    return {option: seen for option, seen in uses.items() if len(seen) > 1}


def test_every_option_name_means_one_thing_in_every_command():
    assert conflicts(all_commands()) == {}


def test_a_letter_with_two_meanings_is_caught():
    """The check above fails on what it exists for: plot's old -o (the image) beside the
    collectives' -o (the op)."""
    planted = click.Command("planted", params=[click.Option(["-o", "--output"])])
    found = conflicts(all_commands() | {"planted": planted})
    assert set(found) == {"-o"} and found["-o"]["output"] == ["planted"] and "op" in found["-o"]


def test_nccl_tests_letters_keep_their_meaning():
    wrong = [(name, option, meaning(param)) for name, command in all_commands().items()
             for param, names in options_of(command) for option in names
             if option in NCCL_TESTS_LETTERS and meaning(param) != NCCL_TESTS_LETTERS[option]]
    assert wrong == []


def test_minus_g_takes_all_wherever_it_exists():
    having = {}
    for name, command in all_commands().items():
        for param, names in options_of(command):
            if "-g" in names:
                having[name] = param.type.convert("all", param, click.Context(command))
    assert {"pairs", "preflight", "fleet", "tune", "suite", "explain", "allreduce"} <= set(having)
    assert set(having.values()) == {ALL_GPUS}


@pytest.mark.parametrize("command", ["pairs", "fleet", "p2p", "tune", "allreduce"])
def test_one_size_parser(command):
    """1M is 1,048,576 bytes in every command that reads a size with -b (p2p read 1MB as 10**6)."""
    (param,) = [p for p, names in options_of(cli.commands[command]) if "-b" in names]
    ctx = click.Context(cli.commands[command])
    value = param.type_cast_value(ctx, "1MB") if not isinstance(param.type, click.types.StringParamType) else None
    if value is None:  # pairs and fleet read -b when they plan, through the same parser
        from ncclbench.sizes import parse_size

        value = parse_size("1MB")
    assert value == 1 << 20


def test_the_twin_size_parser_is_gone():
    import ncclbench.topology.p2p as p2p

    assert not hasattr(p2p, "parse_size")
    defined = [path for path in (ROOT / "ncclbench").rglob("*.py") if "def parse_size(" in path.read_text()]
    assert defined == [ROOT / "ncclbench" / "sizes.py"]


def test_alltoallv_options_only_under_alltoallv():
    for coll in REGISTRY.values():
        names = {n for _param, ns in options_of(cli.commands[coll.command]) for n in ns}
        assert (set(ALLTOALLV_NAMES) <= names) == (coll is ALLTOALLV), coll.name
        assert set(ALLTOALLV_NAMES).isdisjoint(names) == (coll is not ALLTOALLV), coll.name
    text = CliRunner().invoke(cli, ["allreduce", "--help"]).output
    assert "alltoallv" not in text.lower()
    assert "--alltoallv-matrix" in CliRunner().invoke(cli, ["alltoallv", "--help"]).output


@pytest.mark.parametrize("command", ["allreduce", "pairs", "preflight", "fleet"])
def test_launch_options_under_one_heading(command):
    text = CliRunner().invoke(cli, [command, "--help"]).output
    options, launch = text.split("Launch options:")
    for name in ("--ngpus", "--nnodes", "--node-rank", "--master-addr", "--master-port", "--rdzv-endpoint", "--backend"):
        assert name in launch and name not in options, name


def test_top_level_help_is_whole_and_names_nccl_tests_binaries():
    text = CliRunner().invoke(cli, ["--help"]).output
    assert [line for line in text.splitlines()[1:] if "..." in line] == []  # Click cuts descriptions with ...
    flat = " ".join(text.split())
    for coll in REGISTRY.values():
        assert f"{coll.name}_perf" in flat, coll.name
    for name in ("all_reduce_perf", "all_gather", "reduce_scatter_perf", "sendrecv_perf"):
        assert name in flat
        assert cli.get_command(click.Context(cli), name) is not None


def ncclbench(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "ncclbench", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


@pytest.mark.parametrize("args", [
    ["allreduce", "--bogus"],
    ["compare", "/nonexistent/base.json", "/nonexistent/new.json"],
    ["plot", "--bogus"],
    ["topo", "--bogus"],
    ["p2p", "-b", "0"],
    ["pairs", "-g", "two"],
    ["tune"],
    ["allreduce", "--backend", "gloo", "-x", "1"],
])
def test_one_error_prefix(args, tmp_path):
    result = ncclbench(*args, cwd=tmp_path)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith("ncclbench: error: "), lines[0]
    assert "Traceback" not in result.stderr


def test_an_unknown_option_gets_no_far_fetched_suggestion():
    far = ncclbench("allreduce", "--bogus").stderr
    assert "Did you mean" not in far and "--ngpus" not in far
    close = ncclbench("allreduce", "--itres", "3").stderr
    assert "Did you mean '--iters'" in close


def test_old_output_spellings_work_with_a_notice(tmp_path):
    source = FIXTURES / "h200-2gpu-nvswitch" / "all_reduce_np2.txt"
    for spelling in ("-o", "--output"):
        out = tmp_path / f"base{spelling}.json"
        result = CliRunner().invoke(cli, ["baseline", str(source), str(source), spelling, str(out)])
        assert result.exit_code == 0, result.output
        assert out.is_file()
        assert result.stderr.strip() == f"ncclbench: baseline {spelling} is now --out; the old spelling will go away"
    result = CliRunner().invoke(cli, ["baseline", str(source), str(source), "-O", str(tmp_path / "b.json")])
    assert result.exit_code == 0 and result.stderr == ""


def test_tune_reads_minus_o_as_the_op_and_an_old_folder_with_a_notice():
    command = cli.commands["tune"]
    ctx = command.make_context("tune", ["allreduce", "-o", "max", "--rehearse"])
    assert ctx.params["op"] == "max" and ctx.params["output_dir"] is None
    result = CliRunner().invoke(cli, ["tune", "allreduce", "-o", "/tmp/folder", "--bogus-to-stop"])
    assert "ncclbench: tune -o is now --out" in result.stderr
    ctx = command.make_context("tune", ["allreduce", "-o", "some/folder"])
    assert ctx.params["output_dir"] == "some/folder" and ctx.params["op"] == "sum"


@pytest.mark.parametrize("policy,version,allowed", [
    (1, (2, 26, 6), False), (0, (2, 27, 3), True), (1, (2, 27, 7), True), (2, (2, 27, 7), False),
    (2, (2, 28, 9), True), (1, None, False),
])
def test_cta_policy_reaches_nccl_only_where_it_reads_the_variable(policy, version, allowed, monkeypatch):
    """-x on a rank: NCCL_CTA_POLICY set where the NCCL loaded reads that value (the NCCL
    version stands in for a GPU host's library), one refusal naming the version elsewhere."""
    from ncclbench.api import options
    from ncclbench.errors import PlanError

    monkeypatch.delenv("NCCL_CTA_POLICY", raising=False)
    monkeypatch.setattr(options, "nccl_version", lambda backend: version)
    if allowed:
        options.apply_cta_policy(policy, "nccl")
        assert os.environ["NCCL_CTA_POLICY"] == str(policy)
    else:
        with pytest.raises(PlanError, match=rf"-x {policy} needs NCCL 2\.2[78] or later"):
            options.apply_cta_policy(policy, "nccl")
        assert "NCCL_CTA_POLICY" not in os.environ


def test_cta_policy_in_a_suite_entry_is_pointed_to_the_environment():
    from ncclbench.api.options import options_for
    from ncclbench.errors import PlanError

    with pytest.raises(PlanError, match="NCCL_CTA_POLICY in the environment"):
        options_for({"cta_policy": 1})


@pytest.mark.gpu
def test_cta_policy_on_a_gpu(tmp_path):
    """`-x 1` on a GPU host: refused in one line before NCCL 2.27, else the run passes and
    records NCCL_CTA_POLICY=1 among its settings."""
    import json

    import torch

    out = tmp_path / "r.json"
    result = ncclbench("allreduce", "-g", "1", "-b", "1M", "-e", "1M", "-n", "5", "-x", "1", "-J", str(out),
                       "--no-save", cwd=tmp_path)
    if torch.cuda.nccl.version() < (2, 27):
        assert result.returncode == 2 and "needs NCCL 2.27" in result.stderr
        return
    assert result.returncode == 0, result.stderr[-2000:]
    assert "NCCL_CTA_POLICY=1" in json.loads(out.read_text())["env"]


def test_an_old_spelling_as_an_option_value_is_left_alone():
    command = cli.commands["baseline"]
    ctx = command.make_context("baseline", ["a.txt", "b.txt", "--label", "-o", "--label", "x", "-O", "out.json"])
    assert ctx.params["labels"] == ("-o", "x") and ctx.params["output"] == "out.json"
    ctx = command.make_context("baseline", ["a.txt", "b.txt", "-oold.json"])  # getopt's attached value
    assert ctx.params["output"] == "old.json"


def test_pairs_runs_with_minus_g_all(tmp_path):
    """`-g all` reaches pairs' own rank count (2 CPU ranks here), not only its parser."""
    out = tmp_path / "pairs.json"
    result = ncclbench("pairs", "-g", "all", "--backend", "gloo", "-b", "4K", "-n", "2", "--json", str(out),
                       cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ncclbench: error" not in result.stderr and out.is_file()
