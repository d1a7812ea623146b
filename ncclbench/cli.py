"""Command line: one subcommand per registry entry, nccl-tests' option letters.

The CLI only parses and validates into a Plan, then either runs as the rank a launcher
made this process, or spawns local ranks through torchrun that re-enter here."""

from __future__ import annotations

import math
import os
import sys

import click

from ncclbench import __version__
from ncclbench.clitypes import ALL_GPUS, CPU_RANKS_FOR_ALL, GPU_COUNT, SIZE, FiniteFloat, GetoptCommand
from ncclbench.collectives import REGISTRY, lookup
from ncclbench.dtypes import resolve_dtypes, resolve_ops
from ncclbench.errors import BenchError, ExitCode, Interrupted, LaunchError, PlanError, RankFailures, error_line
from ncclbench.sizes import parse_size


def _flag(letter, long, help_text, default=0):
    return click.option(letter, long, type=click.IntRange(0, 1), default=default, show_default=True, help=help_text)


MAX_TIMEOUT_S = 1e6  # -T: about 11.6 days; longer deadlines overflow the watchdog's clock


def collective_options(f):
    """nccl-tests 2.19.6's options with the same letters, names and defaults."""
    decorators = [
        click.option("-t", "--nthreads", type=click.IntRange(1, 1), default=1, help="Threads per process (only 1: one process per GPU)."),
        click.option("-g", "--ngpus", type=GPU_COUNT, default=None,
                     help="Local ranks to spawn, one GPU each (default 1); all: one per visible GPU, "
                          "2 CPU ranks where none is visible. Omit under torchrun/srun/mpirun."),
        click.option("-b", "--minbytes", type=SIZE, default="32M", show_default=True, help="Minimum size (8, 64K, 8M, 1G)."),
        click.option("-e", "--maxbytes", type=SIZE, default="32M", show_default=True, help="Maximum size."),
        click.option("-i", "--stepbytes", type=SIZE, default="1M", show_default=True, help="Size increment when no factor is given."),
        click.option("-f", "--stepfactor", type=FiniteFloat(), default=None, help="Size multiplication factor (> 1)."),
        click.option("-o", "--op", default="sum", show_default=True, help="sum, prod, min, max, avg, mulsum (premul-sum, GPU backends) or all."),
        click.option("-d", "--datatype", default="float", show_default=True,
                     help="int8 uint8 int32 uint32 int64 uint64 half float double bfloat16 f8e4m3 f8e5m2, or all."),
        click.option("-r", "--root", default="0", show_default=True, help="Root rank, or all / -1 for every root."),
        click.option("-n", "--iters", type=click.IntRange(min=1), default=20, show_default=True, help="Timed iterations."),
        click.option("-w", "--warmup_iters", "warmup_iters", type=click.IntRange(min=0), default=1, show_default=True, help="Warm-up iterations."),
        click.option("-m", "--agg_iters", "agg_iters", type=click.IntRange(min=1), default=1, show_default=True, help="Operations per iteration."),
        click.option("-N", "--run_cycles", "run_cycles", type=click.IntRange(min=0), default=1, show_default=True, help="Repeat the sweep N times (0: until Ctrl-C)."),
        click.option("-p", "--parallel_init", "parallel_init", type=click.IntRange(0, 1), default=0, help="Accepted for nccl-tests compatibility (one process per GPU)."),
        click.option("-c", "--check", type=click.IntRange(min=0), default=1, show_default=True, help="Check results N times, fresh inputs each time (0: off)."),
        click.option("-z", "--blocking", type=click.IntRange(0, 3), default=0, show_default=True,
                     help="1: wait and barrier after each op; 2: wait after each op; 3: wait and barrier after each "
                          "iteration of -m ops, barriers not timed (nccl-tests' -z)."),
        click.option("-a", "--average", type=click.IntRange(0, 3), default=1, show_default=True, help="Time across ranks: 0 rank 0, 1 mean, 2 min, 3 max."),
        click.option("-T", "--timeout", type=FiniteFloat(min=0, max=MAX_TIMEOUT_S), default=600.0, show_default=True, help="Seconds one size may take before the run is aborted; 0: no timeout (nccl-tests' default)."),
        _flag("-S", "--report_timestamps", "Append a timestamp to each row."),
        click.option("-G", "--cudagraph", type=click.IntRange(min=0), default=0, show_default=True, help="Capture iterations in a CUDA graph and replay it N times."),
        _flag("-C", "--report_cputime", "Report host time per op instead of device time."),
        _flag("-I", "--per_iter_timing", "Per-iteration timing columns (i_min i_max i_p99 i_cv%)."),
        click.option("-K", "--per_iter_skip", type=click.IntRange(min=0), default=0, show_default=True, help="Iterations left out of the -I summary."),
        click.option("-u", "--unalign", type=click.IntRange(min=0), default=0, show_default=True, help="Misalign every buffer by this many elements."),
        click.option("-R", "--local_register", type=click.IntRange(0, 2), default=0, show_default=True, help="Register buffers with NCCL: 1 user buffers, 2 symmetric windows."),
        click.option("-y", "--stream_null", type=click.IntRange(0, 1), default=0, help="1: run on the legacy default (NULL) stream."),
        click.option("-x", "--cta_policy", type=int, default=None, help="NCCL CTA policy (not expressible through torch.distributed or CuPy: refused)."),
        click.option("-M", "--memory_report", "--memory", "memory_report", type=click.IntRange(0, 1), default=0, help="1: memory usage trailer (context, communicator, buffers, peak)."),
        click.option("--min-bw", type=FiniteFloat(min=0), default=None, help="Fail (exit 7) when the average busbw is below 0.9 x this GB/s (default $NCCL_TESTS_MIN_BW)."),
        click.option("--min-peak-bw", type=FiniteFloat(min=0), default=None, help="Fail (exit 7) when the peak busbw is below this GB/s."),
        click.option("-J", "--output_file", type=str, default=None, help="Write results as nccl-tests JSON (version 3)."),
        click.option("--csv", "csv_path", type=str, default=None, help="Append one row per size and placement to this CSV."),
        click.option("--backend", type=click.Choice(["nccl", "gloo", "cupy"]), default=None, help="Default: nccl with CUDA GPUs, else gloo."),
        click.option("--results-dir", type=str, default=None, help="Result store (default results/ or $NCCLBENCH_RESULTS_DIR)."),
        click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes taking part in a self-spawned run (-g ranks each)."),
        click.option("--node-rank", type=click.IntRange(min=0), default=0, show_default=True, help="This node's index with --nnodes."),
        click.option("--master-addr", type=str, default=None, help="Rendezvous host for --nnodes > 1 (node 0's address)."),
        click.option("--master-port", type=click.IntRange(1, 65535), default=29500, show_default=True, help="Rendezvous port for --nnodes > 1."),
        click.option("--rdzv-endpoint", type=str, default=None, help="HOST:PORT, instead of --master-addr/--master-port."),
        click.option("--no-save", is_flag=True, help="Do not keep this run in the result store."),
        click.option("-q", "--quiet", is_flag=True, help="No progress bar (it only shows on a terminal anyway)."),
        click.option("--split", type=str, default=None, help='Run the test in parallel groups: "<AND|OR|MOD|DIV> <value>" of the rank (default $NCCL_TESTS_SPLIT / $NCCL_TESTS_SPLIT_MASK).'),
        click.option("--alltoallv-spread", "a2av_spread", type=str, default=None,
                     help="alltoallv: 0 even split over peers .. 1 distance-weighted (default $NCCL_TESTS_ALLTOALLV_SPREAD or 1)."),
        click.option("--alltoallv-matrix", "a2av_matrix", type=str, default=None,
                     help="alltoallv: square file of bytes rank i sends rank j (default $NCCL_TESTS_ALLTOALLV_MATRIX_FILE); needs -b = -e."),
        click.option("--alltoallv-scale", "a2av_scale", type=str, default=None,
                     help="alltoallv: factor on every matrix entry (default $NCCL_TESTS_ALLTOALLV_MATRIX_SCALE or 1)."),
        click.option("--alltoallv-summary", "a2av_summary", is_flag=True, default=None,
                     help="alltoallv: per-rank bytes and bandwidth under each row (default $NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY)."),
    ]
    for dec in reversed(decorators):
        f = dec(f)
    return f


def _fail(message: str) -> PlanError:
    return PlanError(message)


def build_plan(coll_name: str, o: dict, backend: str, argv: list[str], nranks: int | None = None):
    from ncclbench.plan import Plan

    try:
        dtypes = tuple(d.name for d in resolve_dtypes(o["datatype"]))
        ops = tuple(resolve_ops(o["op"]))
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    root_text = str(o["root"]).strip().lower()
    if root_text in ("all", "-1"):
        root = -1
    else:
        try:
            root = int(root_text)
        except ValueError:
            raise _fail(f"root must be a rank number, all or -1 (got {o['root']!r})") from None
        if root < 0:
            raise _fail(f"root must be >= 0, all or -1 (got {root})")
    factor = o["stepfactor"]
    if factor is not None and factor <= 1:
        raise _fail(f"step factor must be > 1 (got {factor:g})")
    if o["cudagraph"] and o["blocking"]:
        raise _fail(f"-G (CUDA graphs) and -z {o['blocking']} cannot be combined: a wait or a barrier between "
                    "ops cannot be captured in a graph")
    samples, which = (o["cudagraph"], "-G replays") if o["cudagraph"] else (o["iters"], "-n iterations")
    if o["per_iter_timing"] and o["per_iter_skip"] >= samples:
        raise _fail(f"-K {o['per_iter_skip']} would skip every one of the {samples} {which} the -I summary is made of")
    if o.get("cta_policy") is not None:
        raise _fail(f"-x/--cta_policy is not supported on the {backend} backend: neither torch.distributed "
                    "nor CuPy exposes NCCL's CTA policy")
    if o.get("stream_null") and backend == "gloo":
        raise _fail("-y/--stream_null needs a GPU backend (nccl or cupy)")
    min_bw = o.get("min_bw")
    if min_bw is None and os.environ.get("NCCL_TESTS_MIN_BW"):
        try:
            min_bw = float(os.environ["NCCL_TESTS_MIN_BW"])
            if not (math.isfinite(min_bw) and min_bw >= 0):
                raise ValueError
        except ValueError:
            raise _fail(f"NCCL_TESTS_MIN_BW must be a number of GB/s (got {os.environ['NCCL_TESTS_MIN_BW']!r})") from None
    split = split_spec_text(o.get("split"))
    traffic, summary = alltoallv_traffic(coll_name, o)
    if traffic is not None and traffic.matrix is not None and o["minbytes"] != o["maxbytes"]:
        raise _fail("alltoallv with a matrix file needs -b and -e set to the same value (e.g. -b 32M -e 32M): "
                    "the matrix fixes every size")
    plan = Plan(
        collective=coll_name, split=split, min_bytes=o["minbytes"], max_bytes=o["maxbytes"], step_bytes=o["stepbytes"],
        step_factor=factor or 1.0, dtypes=dtypes, ops=ops, root=root, iters=o["iters"],
        warmup_iters=o["warmup_iters"], agg_iters=o["agg_iters"], run_cycles=o["run_cycles"], check=o["check"],
        blocking=o["blocking"], average=o["average"], timeout_s=o["timeout"],
        report_timestamps=bool(o["report_timestamps"]), graph_replays=o["cudagraph"],
        report_cputime=bool(o["report_cputime"]), per_iter=bool(o["per_iter_timing"]),
        per_iter_skip=o["per_iter_skip"], unalign=o.get("unalign", 0), local_register=o.get("local_register", 0), stream_null=bool(o.get("stream_null")),
        memory_report=bool(o.get("memory_report")), min_bw=min_bw or 0.0, min_peak_bw=o.get("min_peak_bw") or 0.0,
        backend=backend, traffic=traffic, traffic_summary=summary, args=tuple(argv),
    )
    if "all" in (str(o["datatype"]).strip().lower(), str(o["op"]).strip().lower()):
        group = None  # ranks per communicator, where known (a bad --split is refused later)
        if nranks and nranks > 0:
            try:
                group = len(plan.groups(nranks)[0])
            except PlanError:
                pass
        plan = plan.without_unsupported(group)
    try:
        sizes = plan.sizes()
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    if not sizes:
        raise _fail("the size range is empty")
    return plan


def alltoallv_traffic(coll_name: str, o: dict):
    """(Traffic, print summary) for alltoallv from its options, else nccl-tests' variables;
    (None, False) for other collectives, which refuse the options."""
    from ncclbench.traffic import Traffic, parse_fraction, parse_scale, read_matrix

    keys = ("a2av_spread", "a2av_matrix", "a2av_scale", "a2av_summary")
    spread, matrix, scale, summary = (o.get(k) for k in keys)
    if lookup(coll_name).name != "alltoallv":
        given = [k for k in keys if o.get(k) is not None]
        if given:
            raise _fail(f"--{given[0].replace('a2av_', 'alltoallv-')} applies to alltoallv only")
        return None, False
    env = os.environ
    if summary is None:
        summary = env.get("NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY", "0").strip() not in ("", "0")
    if matrix is not None and spread is not None:
        raise _fail("--alltoallv-matrix and --alltoallv-spread exclude each other (the matrix sets every amount)")
    if matrix is None and spread is None:
        matrix = env.get("NCCL_TESTS_ALLTOALLV_MATRIX_FILE") or None
    if matrix is None:
        if scale is not None:
            raise _fail("--alltoallv-scale needs a matrix (--alltoallv-matrix FILE)")
        if spread is None:
            spread = parse_fraction(env.get("NCCL_TESTS_ALLTOALLV_SPREAD", "1"), "NCCL_TESTS_ALLTOALLV_SPREAD")
        else:
            spread = parse_fraction(str(spread), "--alltoallv-spread")
        return Traffic(spread=spread), bool(summary)
    if scale is None:
        scale = parse_scale(env.get("NCCL_TESTS_ALLTOALLV_MATRIX_SCALE", "1"), "NCCL_TESTS_ALLTOALLV_MATRIX_SCALE")
    else:
        scale = parse_scale(str(scale), "--alltoallv-scale")
    return Traffic(matrix=read_matrix(matrix, scale), source=matrix, scale=scale), bool(summary)


def split_spec_text(option: str | None) -> str | None:
    """The --split spec (or nccl-tests' variables), normalised, or None."""
    from ncclbench.launchenv import LaunchEnvError, parse_split, split_spec_from_environ

    try:
        spec = parse_split(option) if option else split_spec_from_environ()
    except (ValueError, LaunchEnvError) as exc:
        raise _fail(str(exc)) from None
    return f"{spec.op} {spec.value}" if spec else None


def validate_for_backend(plan, nranks: int | None) -> None:
    """What can be refused before any process starts (nranks: the whole world, if known)."""
    plan.check_runnable(len(plan.groups(nranks)[0]) if nranks is not None else None)


def choose_backend(requested: str | None) -> str:
    from ncclbench.launch import visible_gpu_count

    if requested:
        return requested
    return "nccl" if visible_gpu_count() > 0 else "gloo"


def announce_backend(requested: str | None, chosen: str, rank: int, all_ranks: int | None = None) -> None:
    """Say once, after validation, that a GPU-less machine falls back to gloo (and with
    how many ranks `-g all` runs there)."""
    from ncclbench.launch import say

    if requested is None and chosen == "gloo" and rank == 0 and not os.environ.get("NCCLBENCH_SPAWNED"):
        ranks = f" with {all_ranks} ranks (-g all)" if all_ranks else ""
        say(f"no CUDA GPU visible: using the gloo CPU backend{ranks} (timings are host-clock CPU numbers)")


def output_spec(plan, o: dict):
    from ncclbench.output import OutputSpec, check_csv_appendable, check_writable, default_results_dir, probe_directory

    if o["output_file"] and o["csv_path"] and os.path.realpath(o["output_file"]) == os.path.realpath(o["csv_path"]):
        raise _fail(f"-J and --csv name the same file {o['csv_path']}: the JSON rewrites would erase the CSV rows")
    if o["output_file"]:
        check_writable(o["output_file"], "JSON file")
    if o["csv_path"]:
        check_csv_appendable(o["csv_path"])
    results_dir = None
    if not o["no_save"]:
        results_dir = o["results_dir"] or default_results_dir()
        try:
            os.makedirs(results_dir, exist_ok=True)
        except OSError as exc:
            raise _fail(f"cannot use result store {results_dir}: {exc.strerror}") from None
        if not os.access(results_dir, os.W_OK):
            raise _fail(f"cannot write to result store {results_dir} (use --results-dir or --no-save)")
        probe_directory(results_dir, f"cannot write to result store {results_dir} (use --results-dir or --no-save)")
    return OutputSpec(json_path=o["output_file"], csv_path=o["csv_path"], results_dir=results_dir,
                      timestamps=plan.report_timestamps, per_iter=plan.per_iter, per_iter_skip=plan.per_iter_skip,
                      progress=not o.get("quiet"))


def options_for(values: dict) -> dict:
    """A full options dict (what Click would pass) from a partial one, e.g. a suite entry."""
    cmd = cli.commands["allreduce"]
    opts = {p.name: p.default for p in cmd.params}
    for key, value in values.items():
        if key not in opts:
            raise PlanError(f"unknown option {key!r}")
        opts[key] = value
    # every value through its command-line option's own type: the same ranges and messages
    ctx = click.Context(cmd)
    for param in cmd.params:
        if param.name in values and opts[param.name] is not None:
            if isinstance(opts[param.name], (dict, list)):
                raise PlanError(f"{param.name} must be a single value (got {opts[param.name]!r})")
            try:
                opts[param.name] = param.type_cast_value(ctx, opts[param.name])
            except click.BadParameter as exc:
                raise PlanError(f"{param.name}: {exc.format_message()}") from None
    for key in ("minbytes", "maxbytes", "stepbytes"):  # the defaults are size strings too
        opts[key] = parse_size(opts[key])
    opts["datatype"], opts["op"], opts["root"] = str(opts["datatype"]), str(opts["op"]), str(opts["root"])
    return opts


def local_rank_count(requested, backend: str) -> int:
    """The ranks to start on this node for -g `requested` (None: 1; `all`: one per visible
    GPU, CPU_RANKS_FOR_ALL on gloo without a GPU); PlanError, exit 5 as in nccl-tests, when
    a GPU backend cannot have that many GPUs."""
    from ncclbench import launch

    ngpus = 1 if requested is None else requested
    if ngpus != ALL_GPUS and ngpus < 1:
        raise _fail(f"-g must be at least 1 (got {ngpus})")
    if backend not in ("nccl", "cupy"):
        if ngpus == ALL_GPUS:
            return launch.visible_gpu_count() or CPU_RANKS_FOR_ALL
        return ngpus
    visible = launch.visible_gpu_count()
    if visible == 0 and requested in (None, ALL_GPUS):
        raise PlanError(f"the {backend} backend needs a CUDA GPU and none is visible (--backend gloo runs on the CPU)",
                        ExitCode.BAD_GPU_COUNT)
    if ngpus == ALL_GPUS:
        return visible
    if ngpus > visible:
        raise PlanError(f"-g {ngpus} asks for more GPUs than the {visible} visible", ExitCode.BAD_GPU_COUNT)
    return ngpus


def run_collective(coll_name: str, o: dict) -> int:
    from ncclbench import launch

    argv = sys.argv[1:]
    info = launch.detect()
    launched = info.launcher != "none"
    backend = choose_backend(o["backend"])
    if launched:
        plan = build_plan(coll_name, o, backend, argv, info.world_size)
        if o["ngpus"] not in (None, 1, ALL_GPUS, info.local_world_size) and not os.environ.get(launch.SPAWNED_ENV):
            raise _fail(f"-g {o['ngpus']} conflicts with the launcher ({info.launcher} started "
                        f"{info.local_world_size} ranks on this node); drop -g")
        validate_for_backend(plan, info.world_size)
        spec = output_spec(plan, o) if info.rank == 0 else None
        announce_backend(o["backend"], backend, info.rank)
        return run_as_rank(plan, info, spec)
    ngpus = local_rank_count(o["ngpus"], backend)
    nranks = ngpus * o.get("nnodes", 1)
    plan = build_plan(coll_name, o, backend, argv, nranks)
    validate_for_backend(plan, nranks)
    output_spec(plan, o)  # refuse unwritable outputs before spawning anything
    spawn = multinode_args(o, ngpus)
    announce_backend(o["backend"], backend, 0, ngpus if o["ngpus"] == ALL_GPUS else None)
    child_argv = list(argv)
    if o["backend"] is None:
        child_argv += ["--backend", backend]
    return launch.spawn_local(ngpus, child_argv, **spawn)


def multinode_args(o: dict, ngpus: int) -> dict:
    """torchrun's multi-node rendezvous from --nnodes/--node-rank/--master-*/--rdzv-endpoint."""
    nnodes, node_rank = o.get("nnodes", 1), o.get("node_rank", 0)
    endpoint = o.get("rdzv_endpoint")
    if nnodes == 1:
        if node_rank:
            raise _fail(f"--node-rank {node_rank} needs --nnodes > {node_rank}")
        if endpoint or o.get("master_addr"):
            given = "--rdzv-endpoint" if endpoint else "--master-addr"
            raise _fail(f"{given} applies to --nnodes > 1 (a single node's ranks meet on a free local port)")
        return {}
    if node_rank >= nnodes:
        raise _fail(f"--node-rank {node_rank} does not exist with --nnodes {nnodes} (use 0..{nnodes - 1})")
    if endpoint is None:
        if not o.get("master_addr"):
            raise _fail("--nnodes > 1 needs --master-addr (node 0's address) or --rdzv-endpoint HOST:PORT")
        endpoint = f"{o['master_addr']}:{o['master_port']}"
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _fail(f"--rdzv-endpoint must be HOST:PORT with a port from 1 to 65535 (got {endpoint!r})")
    return {"nnodes": nnodes, "node_rank": node_rank, "rdzv_endpoint": endpoint}


def run_as_rank(plan, info, spec) -> int:
    from dataclasses import replace

    from ncclbench import launch
    from ncclbench.output import Reporter
    from ncclbench.runner import leave_launched_rank, run_rank

    launch.prepare_environ(info)

    def make_report(plan, run_info):
        run_info.topology, run_info.link_peak_gbps, peak_line_for = topology_context(plan)
        return Reporter(run_info, replace(spec, expected_rows=plan.expected_rows(run_info.nranks)),
                        peak_line_for=peak_line_for)

    return leave_launched_rank(info, run_rank([plan], info, make_report))


def topology_context(plan):
    """(summary line, NVLink peak GB/s, trailer-line maker) for GPU runs; empty otherwise."""
    if plan.backend == "gloo":
        return None, None, None
    try:
        from ncclbench import topo
    except ImportError:
        return None, None, None
    try:
        t = topo.probe(include_nics=False)
        summary, peak = topo.summary_line(t), topo.link_peak_gbps(t)
    except Exception:  # noqa: BLE001 - topology is context, never a reason to fail a run
        return None, None, None
    if not peak:
        return summary, None, None
    return summary, peak, lambda s: topo.peak_percent_line(s.peak_busbw, peak)


class CollectiveGroup(click.Group):
    """Accepts nccl-tests names (all_reduce, all_reduce_perf) for the collectives."""

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is not None:
            return cmd
        try:
            return super().get_command(ctx, lookup(name).command)
        except KeyError:
            return None

    def resolve_command(self, ctx, args):
        cmd_name, cmd, rest = super().resolve_command(ctx, args)
        return (cmd.name if cmd else cmd_name), cmd, rest


@click.group(cls=CollectiveGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ncclbench")
def cli():
    """NCCL collective benchmarks with nccl-tests' options and output, on torch.distributed."""


def _make_command(coll):
    @collective_options
    def command(**options):
        code = run_collective(coll.name, options)
        sys.exit(int(code))

    command.__doc__ = (f"Benchmark {coll.name} (like nccl-tests' {coll.name}_perf). "
                       f"busbw = algbw x {_factor_text(coll)}.")
    return click.command(name=coll.command, cls=GetoptCommand)(command)


def _factor_text(coll) -> str:
    """The registry's bus-bandwidth factor, in nccl-tests' notation (read off at n = 8)."""
    return {1.0: "1", 7 / 8: "(n-1)/n", 14 / 8: "2(n-1)/n"}[coll.bus_factor(8)]


for _coll in REGISTRY.values():
    cli.add_command(_make_command(_coll))


def _register_optional_commands():
    """Commands that live in their own modules (topology, results tools)."""
    import importlib

    for module, names in (("ncclbench.topo_cli", ("topo_command", "p2p_command")),
                          ("ncclbench.compare", ("compare_command",)),
                          ("ncclbench.plot", ("plot_command",)),
                          ("ncclbench.tools", ("show_command", "suite_command")),
                          ("ncclbench.pairs", ("pairs_command",)),
                          ("ncclbench.tune.cli", ("tune_command",))):
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        for name in names:
            cmd = getattr(mod, name, None)
            if cmd is not None:
                cli.add_command(cmd)


_register_optional_commands()


def main(argv: list[str] | None = None) -> None:
    """Entry point: every error is one line on stderr and a known exit code."""
    try:
        # standalone_mode=False makes Click return (not raise) a command's ctx.exit(code)
        code = cli.main(args=argv, standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except click.UsageError as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `ncclbench`: the help, not an error
            print(exc.format_message())
            sys.exit(ExitCode.OK)
        print(error_line(None, exc.format_message()), file=sys.stderr)
        sys.exit(ExitCode.USAGE)
    except click.exceptions.Abort:
        print("ncclbench: interrupted", file=sys.stderr)
        sys.exit(ExitCode.INTERRUPTED)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except RankFailures as exc:  # every rank knows; one of them has said why
        # Left at once: a launcher tearing the ranks down sends SIGTERM, and one landing while
        # the interpreter finalizes (Python's handlers already reset) would replace the code.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(exc.exit_code))
    except BenchError as exc:
        # identical plan errors on every rank: rank 0 speaks for all; an interruption is said
        # once per node (the first local rank), so that every node's log shows it
        said_once = isinstance(exc, PlanError) and not isinstance(exc, LaunchError)
        per_node = isinstance(exc, Interrupted)
        if os.environ.get("RANK", "0") == "0" or not (said_once or per_node) \
                or (per_node and os.environ.get("LOCAL_RANK") == "0"):
            prefix = "" if os.environ.get("RANK", "0") == "0" else f"[rank {os.environ.get('RANK')}] "
            print(error_line(None, f"{prefix}{exc}"), file=sys.stderr)
        if getattr(exc, "launched_rank", False):
            # at once: the launcher's SIGTERM to the ranks left would otherwise kill the
            # rank while its interpreter shuts down (Python's handlers reset), its code lost
            from ncclbench.watchdog import hard_exit

            hard_exit(int(exc.exit_code))
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        print("ncclbench: interrupted", file=sys.stderr)
        sys.exit(ExitCode.INTERRUPTED)
