"""`ncclbench fleet`: find the bad nodes of a fleet in one job (ncclbench.faults.fleet.worker); runs as
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
from ncclbench.sizes import parse_size

DEFAULT_BYTES = {"nccl": "256M", "gloo": "1M"}
NODE_BYTES = {"nccl": 64 << 20, "gloo": 256 << 10}
# gloo's exchanges on shared CPU cores are slowed by whatever else runs; more of them give the
# best one a better chance to show the link (they cost milliseconds each)
DEFAULT_ITERS = {"nccl": 5, "gloo": 20}


def build_plan(o: dict, backend: str):
    from ncclbench.faults.fleet.worker import FleetPlan
    from ncclbench.locate.bands import backend_bands, bands_for, parse_band
    from ncclbench.results.output import check_writable

    text = o["size"] or DEFAULT_BYTES[backend]
    try:
        nbytes = parse_size(text)
    except ValueError as exc:
        raise PlanError(f"-b {text!r}: {exc}") from None
    if nbytes < 1:
        raise PlanError("-b must be at least 1 byte")
    floor = o["min_busbw"]
    for path, what in ((o["json_path"], "JSON file"), (o["csv_path"], "CSV file"), (o["drain_path"], "drain file")):
        if path is not None:
            if not path.strip():
                raise PlanError(f"the {what} needs a name (got an empty one)")
            check_writable(path, what)
    asked = parse_band(o["band"])
    bands = backend_bands(asked, [backend])
    sockets = bands_for(asked, ["socket"]) if asked is None and backend == "nccl" else None
    return FleetPlan(backend=backend, nbytes=nbytes, node_bytes=NODE_BYTES[backend], iters=o["iters"] or DEFAULT_ITERS[backend],
                     warmup=o["warmup_iters"], timeout_s=o["timeout"], band=bands.rank, link_band=bands.link,
                     socket_band=sockets and max(bands.rank, sockets.rank),
                     socket_link_band=sockets and max(bands.link, sockets.link),
                     budget_s=o["budget"],
                     floor=floor, gpus_per_node=o["gpus_per_node"], all_pairs_rounds=max(1, o["all_pairs_up_to"] - 1),
                     screen_rounds=o["rounds"], max_localise=o["localise_rounds"], seed=o["seed"],
                     sim_node_size=o["sim_node_size"], json_path=o["json_path"], csv_path=o["csv_path"],
                     drain_path=o["drain_path"], drain_format=o.get("drain_format", "scontrol"),
                     metrics_path=o.get("metrics_path"))


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
                   "a probe per pair lowers it so that each measurement fits its share of --budget.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True, max=1e6), default=30.0, show_default=True,
              help="Seconds the pair rounds should take, stated up front: each pair measurement is sized by time, "
                   "so a slow NIC or link gets fewer bytes, not more time.")
@click.option("-n", "--iters", type=click.IntRange(min=1), default=None,
              help="Timed exchanges per pair measurement, judged at the best one (default 5 on NCCL, 20 on gloo).")
@click.option("-w", "--warmup_iters", "warmup_iters", type=click.IntRange(min=0), default=1, show_default=True,
              help="Untimed exchanges per pair measurement before timing.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="GPUs every node must have (default: the most common count).")
@click.option("--band", default="auto", show_default=True,
              help="How far below the fleet's reference a node's or pair's best may fall (auto: 20% on NCCL, 60% on gloo).")
@click.option("--min-busbw", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Floor in GB/s per direction per rail for every pair (the only judge with two nodes).")
@click.option("--all-pairs-up-to", type=click.IntRange(min=2), default=16, show_default=True,
              help="Test every node pair up to this many nodes; a shuffled round-robin of --rounds rounds above.")
@click.option("--rounds", type=click.IntRange(min=1), default=4, show_default=True, help="Screening rounds above --all-pairs-up-to.")
@click.option("--localise-rounds", type=click.IntRange(min=0), default=6, show_default=True,
              help="At most this many localisation rounds (suspects with clean partners).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the shuffled schedule.")
@click.option("--json", "json_path", default=None, help="Write the report to this file (top-level \"drain\" list).")
@click.option("--csv", "csv_path", default=None, help="Write one row per pair test to this CSV file.")
@drain_options
@metrics_option
@click.option("-T", "--timeout", type=click.FloatRange(min=1), default=60.0, show_default=True,
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
