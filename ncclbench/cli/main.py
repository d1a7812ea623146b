"""Command line: one subcommand per registry entry, nccl-tests' option letters.

The CLI only parses and validates into a Plan, then either runs as the rank a launcher
made this process, or spawns local ranks through torchrun that re-enter here."""

from __future__ import annotations

import os
import sys

import click

from ncclbench import __version__
from ncclbench.api.params import ALL_GPUS
from ncclbench.cli.types import GetoptCommand
from ncclbench.engine.collectives import ALLTOALLV, REGISTRY, lookup
from ncclbench.errors import BenchError, ExitCode, Interrupted, LaunchError, PlanError, RankFailures, error_line
# the option table and its conversion into a Plan, shared with the Python API
from ncclbench.api.options import (ALLTOALLV_NAMES, apply_cta_policy, build_plan, choose_backend, collective_options,
                                   multinode_args, validate_for_backend)


def run_collective(coll_name: str, o: dict) -> int:
    from ncclbench.api.command import announce_backend, local_rank_count, output_spec, run_as_rank
    from ncclbench.launch import launcher as launch

    argv = sys.argv[1:]
    info = launch.detect()
    launched = info.launcher != "none"
    backend = choose_backend(o["backend"])
    if launched:
        plan = build_plan(coll_name, o, backend, argv, info.world_size)
        if o["ngpus"] not in (None, 1, ALL_GPUS, info.local_world_size) and not os.environ.get(launch.SPAWNED_ENV):
            raise PlanError(f"-g {o['ngpus']} conflicts with the launcher ({info.launcher} started "
                            f"{info.local_world_size} ranks on this node); drop -g")
        validate_for_backend(plan, info.world_size)
        apply_cta_policy(o["cta_policy"], backend)
        spec = output_spec(plan, o) if info.rank == 0 else None
        announce_backend(o["backend"], backend, info.rank)
        return run_as_rank([plan], info, spec)
    ngpus = local_rank_count(o["ngpus"], backend)
    nranks = ngpus * o.get("nnodes", 1)
    plan = build_plan(coll_name, o, backend, argv, nranks)
    validate_for_backend(plan, nranks)
    output_spec(plan, o)  # refuse unwritable outputs before spawning anything
    _fits_host([plan], ngpus, nranks, backend)
    spawn = multinode_args(o, ngpus)
    announce_backend(o["backend"], backend, 0, ngpus if o["ngpus"] == ALL_GPUS else None)
    child_argv = list(argv)
    if o["backend"] is None:
        child_argv += ["--backend", backend]
    return launch.spawn_local(ngpus, child_argv, **spawn)


def _fits_host(plans, local: int, nranks: int, backend: str) -> None:
    """Refuse (exit 5) ranks this host's memory cannot hold; warn of gloo ranks beyond its CPUs."""
    from ncclbench.api.capacity import check_host_capacity
    from ncclbench.launch.failures import say

    for line in check_host_capacity(plans, local, nranks, backend):
        say(line)


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

    def format_commands(self, ctx, formatter):
        """Two lists, collectives and tools, each description whole (Click cuts them to
        one line), and the nccl-tests names that reach each collective."""
        collectives = {coll.command for coll in REGISTRY.values()}
        for title, names in (("Collectives", sorted(collectives)),
                             ("Tools", sorted(set(self.list_commands(ctx)) - collectives))):
            rows = [(name, self.get_command(ctx, name).get_short_help_str(limit=10_000)) for name in names]
            with formatter.section(title):
                formatter.write_dl(rows)
        with formatter.section("nccl-tests names"):
            names = [n for coll in REGISTRY.values() for n in (coll.name, f"{coll.name}_perf") if n != coll.command]
            formatter.write_text("Each collective also answers to its nccl-tests names: " + ", ".join(names) + ".")


@click.group(cls=CollectiveGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ncclbench")
def cli():
    """NCCL collective benchmarks with nccl-tests' options and output, on torch.distributed."""


def _make_command(coll):
    def command(**options):
        code = run_collective(coll.name, options)
        sys.exit(int(code))

    alltoallv = coll is ALLTOALLV
    command = collective_options(command, alltoallv=alltoallv)
    command.__doc__ = (f"Benchmark {coll.name} (like nccl-tests' {coll.name}_perf). "
                       f"busbw = algbw x {_factor_text(coll)}.")
    elsewhere = {} if alltoallv else {name: "applies to alltoallv only" for name in ALLTOALLV_NAMES}
    return click.command(name=coll.command, cls=GetoptCommand, elsewhere=elsewhere,
                         short_help=f"{coll.name}_perf: busbw = algbw x {_factor_text(coll)}")(command)


def _factor_text(coll) -> str:
    """The registry's bus-bandwidth factor, in nccl-tests' notation (read off at n = 8)."""
    return {1.0: "1", 7 / 8: "(n-1)/n", 14 / 8: "2(n-1)/n"}[coll.bus_factor(8)]


for _coll in REGISTRY.values():
    cli.add_command(_make_command(_coll))


def _register_tool_commands():
    """The commands that are not one collective each: each lives in its own module of cli/."""
    from ncclbench.cli import baseline, compare, explain, fleet, pairs, plot, preflight, show, suite, topo, tune

    for command in (topo.topo_command, topo.p2p_command, compare.compare_command, baseline.baseline_command,
                    plot.plot_command,
                    suite.suite_command, show.show_command, pairs.pairs_command, tune.tune_command,
                    preflight.preflight_command, fleet.fleet_command, explain.explain_command):
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
        print(error_line(exc.format_message()), file=sys.stderr)
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
            print(error_line(f"{prefix}{exc}"), file=sys.stderr)
        if getattr(exc, "launched_rank", False):
            # at once: the launcher's SIGTERM to the ranks left would otherwise kill the
            # rank while its interpreter shuts down (Python's handlers reset), its code lost
            from ncclbench.engine.watchdog import hard_exit

            hard_exit(int(exc.exit_code))
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        print("ncclbench: interrupted", file=sys.stderr)
        sys.exit(ExitCode.INTERRUPTED)
