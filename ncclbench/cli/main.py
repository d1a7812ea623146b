"""Command line: one subcommand per registry entry, nccl-tests' option letters.

The CLI only parses and validates into a Plan, then either runs as the rank a launcher
made this process, or spawns local ranks through torchrun that re-enter here."""

from __future__ import annotations

import os
import sys

import click

from ncclbench import __version__
from ncclbench.api.params import ALL_GPUS, CPU_RANKS_FOR_ALL, GPU_COUNT
from ncclbench.cli.types import GetoptCommand
from ncclbench.engine.collectives import REGISTRY, lookup
from ncclbench.errors import BenchError, ExitCode, Interrupted, LaunchError, PlanError, RankFailures, error_line
# the option table and its conversion into a Plan, shared with the Python API
from ncclbench.api.options import (MAX_TIMEOUT_S, _fail, alltoallv_traffic, build_plan, choose_backend,  # noqa: F401
                                   collective_options, multinode_args, options_for, split_spec_text,
                                   validate_for_backend)


def announce_backend(requested: str | None, chosen: str, rank: int, all_ranks: int | None = None) -> None:
    """Say once, after validation, that a GPU-less machine falls back to gloo (and with
    how many ranks `-g all` runs there)."""
    from ncclbench.launch.failures import say

    if requested is None and chosen == "gloo" and rank == 0 and not os.environ.get("NCCLBENCH_SPAWNED"):
        ranks = f" with {all_ranks} ranks (-g all)" if all_ranks else ""
        say(f"no CUDA GPU visible: using the gloo CPU backend{ranks} (timings are host-clock CPU numbers)")


def output_spec(plan, o: dict):
    from ncclbench.results.output import OutputSpec, check_csv_appendable, check_writable, default_results_dir, probe_directory

    for flag, key in (("-J", "output_file"), ("--csv", "csv_path")):
        if o[key] is not None and not o[key].strip():
            raise _fail(f"{flag} needs a file name (got an empty one)")
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


def local_rank_count(requested, backend: str) -> int:
    """The ranks to start on this node for -g `requested` (None: 1; `all`: one per visible
    GPU, CPU_RANKS_FOR_ALL on gloo without a GPU); PlanError, exit 5 as in nccl-tests, when
    a GPU backend cannot have that many GPUs."""
    from ncclbench.launch import launcher as launch
    from ncclbench.topology import visible as topo_visible

    ngpus = 1 if requested is None else requested
    if ngpus != ALL_GPUS and ngpus < 1:
        raise _fail(f"-g must be at least 1 (got {ngpus})")
    if backend not in ("nccl", "cupy"):
        if ngpus == ALL_GPUS:
            return topo_visible.visible_gpu_count() or CPU_RANKS_FOR_ALL
        return ngpus
    visible = topo_visible.visible_gpu_count()
    if visible == 0 and requested in (None, ALL_GPUS):
        raise PlanError(f"the {backend} backend needs a CUDA GPU and none is visible (--backend gloo runs on the CPU)",
                        ExitCode.BAD_GPU_COUNT)
    if ngpus == ALL_GPUS:
        return visible
    if ngpus > visible:
        raise PlanError(f"-g {ngpus} asks for more GPUs than the {visible} visible", ExitCode.BAD_GPU_COUNT)
    return ngpus


def run_collective(coll_name: str, o: dict) -> int:
    from ncclbench.launch import launcher as launch

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


def run_as_rank(plan, info, spec) -> int:
    from dataclasses import replace

    from ncclbench.launch import launcher as launch
    from ncclbench.results.output import Reporter
    from ncclbench.engine.runner import leave_launched_rank, run_rank

    launch.prepare_environ(info)

    def make_report(plan, run_info):
        run_info.topology, run_info.link_peak_gbps, peak_line_for = topology_context(plan)
        return Reporter(run_info, replace(spec, expected_rows=plan.expected_rows(run_info.nranks)),
                        peak_line_for=peak_line_for)

    return leave_launched_rank(info, run_rank([plan], info, make_report))


def topology_context(plan):
    """(summary line, NVLink peak GB/s, trailer-line maker) for GPU runs; empty otherwise."""
    try:
        from ncclbench.topology.header import header_context
    except ImportError:
        return None, None, None
    return header_context(plan.backend)


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


def _register_tool_commands():
    """The commands that are not one collective each: each lives in its own module of cli/."""
    from ncclbench.cli import compare, fleet, pairs, plot, preflight, show, suite, topo, tune

    for command in (topo.topo_command, topo.p2p_command, compare.compare_command, plot.plot_command,
                    suite.suite_command, show.show_command, pairs.pairs_command, tune.tune_command,
                    preflight.preflight_command, fleet.fleet_command):
        cli.add_command(command)


_register_tool_commands()


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
            from ncclbench.engine.watchdog import hard_exit

            hard_exit(int(exc.exit_code))
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        print("ncclbench: interrupted", file=sys.stderr)
        sys.exit(ExitCode.INTERRUPTED)
