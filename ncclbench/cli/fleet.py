"""`ncclbench fleet`: find the bad nodes of a fleet in one job (ncclbench.faults.fleet); runs as
a launched rank (srun, mpirun, torchrun: ranks per node = GPUs per node) or self-spawns -g
local ranks that re-enter here."""

from __future__ import annotations

import os
import sys

import click

from ncclbench.api.options import ngpus_option, rendezvous_options
from ncclbench.api.params import ALL_GPUS, drain_options, metrics_option
from ncclbench.cli.types import GetoptCommand
from ncclbench.errors import PlanError
from ncclbench.faults.fleet.plan import DEFAULTS, build_plan


def run_fleet(o: dict) -> int:
    from ncclbench.launch import launcher as launch
    from ncclbench.api.command import local_rank_count
    from ncclbench.api.options import choose_backend, multinode_args

    info = launch.detect()
    backend = choose_backend(o["backend"])
    plan = build_plan(o, backend)
    if info.launched:
        if o["ngpus"] not in (None, 1, ALL_GPUS, info.local_world_size) and not os.environ.get(launch.SPAWNED_ENV):
            raise PlanError(f"-g {o['ngpus']} conflicts with the launcher ({info.launcher} started "
                            f"{info.local_world_size} ranks on this node); drop -g")
        from ncclbench.faults.fleet.run import run_fleet_rank

        return run_fleet_rank(plan, info)
    ngpus = local_rank_count(o["ngpus"], backend)
    spawn = multinode_args(o, ngpus)
    child_argv = list(sys.argv[1:]) + ([] if o["backend"] else ["--backend", backend])
    return launch.spawn_local(ngpus, child_argv, **spawn)


@click.command(name="fleet", cls=GetoptCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-b", "--size", default=None,
              help="At most this many bytes each way per pair exchange, per rail (default 256M on NCCL, 1M on gloo); "
                   "where a pair's probe says its measurement would not fit its share of --budget, fewer "
                   "iterations (down to 2) and then fewer bytes.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True, max=1e6), default=DEFAULTS["budget"],
              show_default=True,
              help="Seconds the pair rounds should take, stated up front: each pair measurement is sized by time, "
                   "so a slow NIC or link gets fewer exchanges or bytes, not more time.")
@click.option("-n", "--iters", type=click.IntRange(min=1), default=None,
              help="Timed exchanges per pair measurement, judged at the best one (default 5 on NCCL, 20 on gloo).")
@click.option("-w", "--warmup_iters", "warmup_iters", type=click.IntRange(min=0), default=DEFAULTS["warmup_iters"],
              show_default=True, help="Untimed exchanges per pair measurement before timing.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="GPUs every node must have (default: the most common count).")
@click.option("--band", default=DEFAULTS["band"], show_default=True,
              help="How far below the fleet's reference a node's or pair's best may fall (auto: by transport, "
                   "docs/verdicts.md).")
@click.option("--min-busbw", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Floor in GB/s per direction per rail for every pair (the only judge with two nodes).")
@click.option("--all-pairs-up-to", type=click.IntRange(min=2), default=DEFAULTS["all_pairs_up_to"], show_default=True,
              help="Test every node pair up to this many nodes; a shuffled round-robin of --rounds rounds above.")
@click.option("--rounds", type=click.IntRange(min=1), default=DEFAULTS["rounds"], show_default=True,
              help="Screening rounds above --all-pairs-up-to.")
@click.option("--localise-rounds", type=click.IntRange(min=0), default=DEFAULTS["localise_rounds"], show_default=True,
              help="At most this many localisation rounds (suspects with clean partners).")
@click.option("--seed", type=int, default=DEFAULTS["seed"], show_default=True, help="Seed of the shuffled schedule.")
@click.option("--json", "json_path", default=None, help="Write the report to this file (top-level \"drain\" list).")
@click.option("--csv", "csv_path", default=None, help="Write one row per pair test to this CSV file.")
@drain_options
@metrics_option
@click.option("-T", "--timeout", type=click.FloatRange(min=1), default=DEFAULTS["timeout"], show_default=True,
              help="Seconds one exchange (or a node's local test) may take; a node past it is named, the run goes on "
                   "(60, not the collectives' 600: a stuck node should cost the fleet's run little).")
@click.option("--backend", type=click.Choice(["nccl", "gloo"]), default=None, help="Default: nccl with CUDA GPUs, else gloo.")
@ngpus_option()
@click.option("--sim-node-size", type=click.IntRange(min=1), default=None,
              help="Test aid: every K local ranks of a host stand for a node of their own (HOST-n0, HOST-n1, ...).")
@rendezvous_options
def fleet_command(**options):
    """Find the bad nodes and links of a fleet in one job: each node alone, then node pairs
    rail by rail, then localisation; exit 1 when a node is to drain or a link is slow."""
    sys.exit(int(run_fleet(options)))
