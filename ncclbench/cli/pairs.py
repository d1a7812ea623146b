"""`ncclbench pairs`: the command over ncclbench.pairs (send/recv bandwidth between every pair
of ranks); runs as a launched rank, or self-spawns -g local ranks that re-enter here."""

from __future__ import annotations

import os
import sys

import click

from ncclbench.api.options import ngpus_option, rendezvous_options
from ncclbench.api.params import ALL_GPUS, metrics_option
from ncclbench.cli.types import GetoptCommand
from ncclbench.faults.pairs.run import PairsPlan, parse_percent, run_rank
from ncclbench.errors import PlanError
from ncclbench.sizes import parse_size



def build_plan(o: dict, backend: str) -> PairsPlan:
    from ncclbench.results.output import check_writable

    try:
        nbytes = parse_size(o["size"])
    except ValueError as exc:
        raise PlanError(str(exc)) from None
    if nbytes < 1:
        raise PlanError("-b must be at least 1 byte")
    fail_below = parse_percent(o["fail_below"]) if o["fail_below"] is not None else None
    for path, what in ((o["json_path"], "JSON file"), (o["csv_path"], "CSV file")):
        if path:
            check_writable(path, what)
    from ncclbench.locate.bands import parse_band

    return PairsPlan(nbytes, o["iters"], o["warmup_iters"], backend, o["timeout"], fail_below,
                     o["json_path"], o["csv_path"], band=parse_band(o.get("band")), metrics_path=o.get("metrics_path"))


def run_pairs(o: dict) -> int:
    """Run as a launched rank, or self-spawn -g local ranks that re-enter here (as the
    collectives do, see cli.run_collective)."""
    from ncclbench.launch import launcher as launch
    from ncclbench.api.command import local_rank_count
    from ncclbench.api.options import choose_backend, multinode_args

    argv = sys.argv[1:]
    info = launch.detect()
    launched = info.launcher != "none"
    backend = choose_backend(o["backend"])
    plan = build_plan(o, backend)
    if launched:
        if o["ngpus"] not in (None, 1, ALL_GPUS, info.local_world_size) and not os.environ.get(launch.SPAWNED_ENV):
            raise PlanError(f"-g {o['ngpus']} conflicts with the launcher ({info.launcher} started "
                            f"{info.local_world_size} ranks on this node); drop -g")
        if info.world_size < 2:
            raise PlanError("pairs needs at least 2 ranks")
        return run_rank(plan, info)
    ngpus = local_rank_count(o["ngpus"], backend)
    if ngpus * o["nnodes"] < 2:
        raise PlanError("pairs needs at least 2 ranks: use -g 2 or more, or start it under torchrun/srun/mpirun")
    spawn = multinode_args(o, ngpus)
    child_argv = list(argv) + ([] if o["backend"] else ["--backend", backend])
    return launch.spawn_local(ngpus, child_argv, **spawn)


@click.command(name="pairs", cls=GetoptCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-b", "--size", default="256M", show_default=True, help="Bytes each way per exchange (8, 64K, 256M, 1G).")
@click.option("-n", "--iters", type=click.IntRange(min=1), default=20, show_default=True, help="Timed exchanges per pair.")
@click.option("-w", "--warmup_iters", "warmup_iters", type=click.IntRange(min=0), default=1, show_default=True,
              help="Untimed exchanges per pair before timing.")
@click.option("--backend", type=click.Choice(["nccl", "gloo"]), default=None, help="Default: nccl with CUDA GPUs, else gloo.")
@ngpus_option()
@click.option("--fail-below", "fail_below", default=None, metavar="X%",
              help="Also exit 1 when any pair is more than X% below the median pair (a floor beside the verdict).")
@click.option("--band", default="auto", show_default=True,
              help="How far below its peers a rank's or pair's best may fall (20%, 0.2); auto: by transport.")
@click.option("--json", "json_path", default=None, help="Write the matrix and every pair to this JSON file.")
@click.option("--csv", "csv_path", default=None, help="Write one row per pair to this CSV file (overwritten).")
@metrics_option
@click.option("-T", "--timeout", type=click.FloatRange(min=0, min_open=True), default=600.0, show_default=True,
              help="Seconds an exchange may take before the run is aborted.")
@rendezvous_options
def pairs_command(**options):
    """Send/recv bandwidth between every pair of ranks, in round-robin rounds that keep
    every rank busy; names the host to drain or the slow link (exit 1)."""
    sys.exit(int(run_pairs(options)))
