"""The collective commands' options and their one conversion into a Plan.

The command line (one subcommand per collective) and the Python API (`ncclbench.measure`)
both read options here, with the same names, defaults, ranges and messages, so that the
two cannot drift apart."""

from __future__ import annotations

import functools
import math
import os

import click

from ncclbench.api.params import FiniteFloat, GPU_COUNT, SIZE, metrics_option
from ncclbench.engine.collectives import ALLTOALLV, lookup
from ncclbench.dtypes import resolve_dtypes, resolve_ops
from ncclbench.errors import PlanError
from ncclbench.sizes import parse_size


def _flag(letter, long, help_text, default=0):
    return click.option(letter, long, type=click.IntRange(0, 1), default=default, show_default=True, help=help_text)


MAX_TIMEOUT_S = 1e6  # -T: about 11.6 days; longer deadlines overflow the watchdog's clock
MAX_UNALIGN = 1 << 20  # -u: elements; past a page or two misalignment means nothing more, and huge values overflow


def ngpus_option():
    """-g as every command that spawns ranks reads it: a count or `all`."""
    return click.option("-g", "--ngpus", type=GPU_COUNT, default=None,
                        help="Local ranks to spawn, one GPU each (default 1); all: one per visible GPU, 2 CPU ranks "
                             "where none is visible. Omit under torchrun/srun/mpirun.")


# torchrun's multi-node rendezvous for a self-spawned run; read by multinode_args
RENDEZVOUS_OPTIONS = [
    click.option("--nnodes", type=click.IntRange(min=1), default=1, show_default=True, help="Nodes taking part in a self-spawned run (-g ranks each)."),
    click.option("--node-rank", type=click.IntRange(min=0), default=0, show_default=True, help="This node's index with --nnodes."),
    click.option("--master-addr", type=str, default=None, help="Rendezvous host for --nnodes > 1 (node 0's address)."),
    click.option("--master-port", type=click.IntRange(1, 65535), default=29500, show_default=True, help="Rendezvous port for --nnodes > 1."),
    click.option("--rdzv-endpoint", type=str, default=None, help="HOST:PORT, instead of --master-addr/--master-port."),
]


def rendezvous_options(f):
    for dec in reversed(RENDEZVOUS_OPTIONS):
        f = dec(f)
    return f


# alltoallv's own options (nccl-tests reads them from NCCL_TESTS_ALLTOALLV_*): only its command has them
ALLTOALLV_OPTIONS = [
    click.option("--alltoallv-spread", "a2av_spread", type=str, default=None,
                 help="0: even split over peers .. 1 distance-weighted (default $NCCL_TESTS_ALLTOALLV_SPREAD or 1)."),
    click.option("--alltoallv-matrix", "a2av_matrix", type=str, default=None,
                 help="Square file of bytes rank i sends rank j (default $NCCL_TESTS_ALLTOALLV_MATRIX_FILE); needs -b = -e."),
    click.option("--alltoallv-scale", "a2av_scale", type=str, default=None,
                 help="Factor on every matrix entry (default $NCCL_TESTS_ALLTOALLV_MATRIX_SCALE or 1)."),
    click.option("--alltoallv-summary", "a2av_summary", is_flag=True, default=None,
                 help="Per-rank bytes and bandwidth under each row (default $NCCL_TESTS_ALLTOALLV_PRINT_SUMMARY)."),
]
ALLTOALLV_NAMES = ("--alltoallv-spread", "--alltoallv-matrix", "--alltoallv-scale", "--alltoallv-summary")

# -x's values (NCCL_CTA_POLICY_*) and the first NCCL that reads each from NCCL_CTA_POLICY
CTA_POLICY_SINCE = {0: (2, 27), 1: (2, 27), 2: (2, 28)}


def collective_options(f, alltoallv: bool = True):
    """nccl-tests 2.19.6's options with the same letters, names and defaults; alltoallv's
    own options where `alltoallv` (the Python API and suite files read them all)."""
    decorators = [
        click.option("-t", "--nthreads", type=click.IntRange(1, 1), default=1, help="Threads per process (only 1: one process per GPU)."),
        ngpus_option(),
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
        click.option("-u", "--unalign", type=click.IntRange(0, MAX_UNALIGN), default=0, show_default=True, help="Misalign every buffer by this many elements."),
        click.option("-R", "--local_register", type=click.IntRange(0, 2), default=0, show_default=True, help="Register buffers with NCCL: 1 user buffers, 2 symmetric windows."),
        click.option("-y", "--stream_null", type=click.IntRange(0, 1), default=0, help="1: run on the legacy default (NULL) stream."),
        click.option("-x", "--cta_policy", type=click.IntRange(0, max(CTA_POLICY_SINCE)), default=None,
                     help="NCCL's CTA policy, given to NCCL as NCCL_CTA_POLICY: 0 default, 1 efficiency (NCCL 2.27+), "
                          "2 zero (NCCL 2.28+); refused where the NCCL in use does not read it, and on gloo (no NCCL)."),
        click.option("-M", "--memory_report", "--memory", "memory_report", type=click.IntRange(0, 1), default=0, help="1: memory usage trailer (context, communicator, buffers, peak)."),
        click.option("--min-bw", type=FiniteFloat(min=0), default=None, help="Fail (exit 7) when the average busbw is below 0.9 x this GB/s (default $NCCL_TESTS_MIN_BW)."),
        click.option("--min-peak-bw", type=FiniteFloat(min=0), default=None, help="Fail (exit 7) when the peak busbw is below this GB/s."),
        click.option("-J", "--output_file", type=str, default=None, help="Write results as nccl-tests JSON (version 3)."),
        click.option("--csv", "csv_path", type=str, default=None, help="Append one row per size and placement to this CSV."),
        metrics_option,
        click.option("--backend", type=click.Choice(["nccl", "gloo", "cupy"]), default=None, help="Default: nccl with CUDA GPUs, else gloo."),
        click.option("--results-dir", type=str, default=None, help="Result store (default results/ or $NCCLBENCH_RESULTS_DIR)."),
        *RENDEZVOUS_OPTIONS,
        click.option("--no-save", is_flag=True, help="Do not keep this run in the result store."),
        click.option("-q", "--quiet", is_flag=True, help="No progress bar (it only shows on a terminal anyway)."),
        click.option("--split", type=str, default=None, help='Run the test in parallel groups: "<AND|OR|MOD|DIV> <value>" of the rank (default $NCCL_TESTS_SPLIT / $NCCL_TESTS_SPLIT_MASK).'),
    ]
    if alltoallv:
        decorators += ALLTOALLV_OPTIONS
    for dec in reversed(decorators):
        f = dec(f)
    return f


def _fail(message: str) -> PlanError:
    return PlanError(message)


def build_plan(coll_name: str, o: dict, backend: str, argv: list[str], nranks: int | None = None):
    from ncclbench.engine.plan import Plan

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
    if o.get("cta_policy") is not None and backend == "gloo":
        raise _fail("-x sets NCCL's CTA policy (NCCL_CTA_POLICY) and the gloo backend runs no NCCL; "
                    "use --backend nccl or cupy")
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
    from ncclbench.engine.traffic import Traffic, parse_fraction, parse_scale, read_matrix

    keys = ("a2av_spread", "a2av_matrix", "a2av_scale", "a2av_summary")
    spread, matrix, scale, summary = (o.get(k) for k in keys)
    if lookup(coll_name) is not ALLTOALLV:
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
    from ncclbench.engine.groups import parse_split, split_spec_from_environ

    try:
        spec = parse_split(option) if option else split_spec_from_environ()
    except ValueError as exc:
        raise _fail(str(exc)) from None
    return f"{spec.op} {spec.value}" if spec else None


def options_for(values: dict) -> dict:
    """A full options dict (what Click would pass) from a partial one, e.g. a suite entry."""
    cmd = option_command()
    opts = {p.name: p.default for p in cmd.params}
    for key, value in values.items():
        if key not in opts:
            raise PlanError(f"unknown option {key!r}")
        opts[key] = value
    if values.get("cta_policy") is not None:  # only the command line's ranks set it (apply_cta_policy)
        raise PlanError("cta_policy: set NCCL_CTA_POLICY in the environment instead (a suite entry's env block); "
                        "NCCL reads it when a communicator is made")
    # every value through its command-line option's own type: the same ranges and messages
    ctx = click.Context(cmd)
    for param in cmd.params:
        if param.name in values and opts[param.name] is not None:
            if isinstance(opts[param.name], (dict, list)):
                raise PlanError(f"{param.name} must be a single value (got {opts[param.name]!r})")
            opts[param.name] = _whole_number(param, opts[param.name])
            try:
                opts[param.name] = param.type_cast_value(ctx, opts[param.name])
            except click.BadParameter as exc:
                raise PlanError(f"{param.name}: {exc.format_message()}") from None
    for key in ("minbytes", "maxbytes", "stepbytes"):  # the defaults are size strings too
        opts[key] = parse_size(opts[key])
    opts["datatype"], opts["op"], opts["root"] = str(opts["datatype"]), str(opts["op"]), str(opts["root"])
    return opts


def _whole_number(param: click.Parameter, value):
    """A count from Python (the API, a suite file) as the command line would read it: Click
    truncates 2.7 to 2 and reads True as 1, so both are refused here; a bool is fine for a
    0/1 switch (report_cputime=True)."""
    if not isinstance(param.type, click.types.IntParamType):
        return value
    switch = isinstance(param.type, click.IntRange) and (param.type.min, param.type.max) == (0, 1)
    if isinstance(value, bool):
        if switch:
            return int(value)
        raise PlanError(f"{param.name} must be a whole number (got {value!r})")
    if isinstance(value, float) and not value.is_integer():
        raise PlanError(f"{param.name} must be a whole number (got {value!r})")
    return value


@functools.lru_cache(maxsize=None)
def option_command() -> click.Command:
    """A command holding every collective option (for options_for's defaults and types)."""
    return click.command("options")(collective_options(lambda **_options: None))


def validate_for_backend(plan, nranks: int | None) -> None:
    """What can be refused before any process starts (nranks: the whole world, if known)."""
    plan.check_runnable(len(plan.groups(nranks)[0]) if nranks is not None else None)


def checked_plan(coll_name: str, values: dict, backend: str, argv: list[str], nranks: int | None):
    """A Plan from partial options (a suite entry, tune's run options), every value read as
    its command-line option would be and the plan refused now if it cannot run."""
    plan = build_plan(coll_name, options_for(values), backend, argv, nranks)
    validate_for_backend(plan, nranks)
    return plan


def apply_cta_policy(policy: int | None, backend: str) -> None:
    """-x on a rank, before its backend makes a communicator (NCCL reads NCCL_CTA_POLICY
    then): the variable set for this process, or PlanError where the NCCL in use does not
    read that value (its version from the library this rank loads, as the header reports it).
    See docs/design/one-grammar.md."""
    if policy is None:
        return
    since = CTA_POLICY_SINCE[policy]
    version = nccl_version(backend)
    if version is None or version[:2] < since:
        have = ".".join(map(str, version)) if version else "unknown"
        raise PlanError(f"-x {policy} needs NCCL {since[0]}.{since[1]} or later, which reads NCCL_CTA_POLICY; "
                        f"this run's NCCL is {have}")
    os.environ["NCCL_CTA_POLICY"] = str(policy)


def nccl_version(backend: str) -> tuple[int, ...] | None:
    """(major, minor, patch) of the NCCL the `backend` would use in this process, or None."""
    try:
        if backend == "cupy":
            from cupy.cuda import nccl

            code = nccl.get_version()
            return code // 10000, code // 100 % 100, code % 100
        import torch  # noqa: F401 - loaded, so that torch_versions asks the library itself

        from ncclbench.topology.model import Versions
        from ncclbench.topology.versions import torch_versions

        versions = Versions()
        torch_versions(versions)
        return tuple(int(part) for part in versions.nccl.split(".")[:3]) if versions.nccl else None
    except Exception:  # noqa: BLE001 - no NCCL in this torch or CuPy: none to set a policy for
        return None


def choose_backend(requested: str | None) -> str:
    from ncclbench.topology.visible import visible_gpu_count

    if requested:
        return requested
    return "nccl" if visible_gpu_count() > 0 else "gloo"


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
