"""`ncclbench preflight`: the preflight check (ncclbench.faults.preflight) as a batch job's command,
under srun/torchrun/mpirun or self-spawned with -g, with an exit code CI can gate on."""

from __future__ import annotations

import socket
import sys

import click

from ncclbench.api.options import ngpus_option, rendezvous_options
from ncclbench.api.params import drain_options, metrics_option
from ncclbench.faults.preflight.inputs import ONE_RANK, PREFLIGHT_COLLECTIVES, make_groups
from ncclbench.cli.types import GetoptCommand
from ncclbench.errors import PlanError


def run_preflight_rank(o: dict, info) -> int:
    """One rank of `ncclbench preflight` under a launcher: its own process group, the checks,
    rank 0 prints and writes the report; the exit code a CI job can gate on."""
    from ncclbench.launch import launcher as launch
    from ncclbench.backends import create_backend
    from ncclbench.faults.preflight.run import Preflight

    launch.prepare_environ(info)
    backend = create_backend(o["backend"], info, o["timeout"])
    try:
        hosts = backend.all_gather_object(socket.gethostname())
        groups = make_groups(o["mesh"], hosts)
        report = Preflight(groups, o["min_peak_busbw"], o["budget"], o["band"], o["collectives"].split(","),
                           o["baseline_tolerance"], "float", o["timeout"], o["json_path"], exit_on_timeout=True,
                           metrics_path=o.get("metrics_path"), drain_path=o.get("drain_path"),
                           drain_format=o.get("drain_format", "scontrol")).run()
    finally:
        backend.close()
    if info.rank == 0:
        print("\n".join(report.lines()), flush=True)
        if not report.passed:
            from ncclbench.errors import error_line

            print(error_line(f"{report.failures[0]}"), file=sys.stderr, flush=True)
    return int(report.exit_code)


@click.command(name="preflight", cls=GetoptCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--mesh", default=None, help="Dimensions of the job's mesh, outer first: dp=2,tp=4 (default: the "
              "whole job, and each host's ranks when there are several hosts).")
@click.option("--min-peak-busbw", "min_peak_busbw", default=None,
              help="Floor: GB/s, a percentage of the link peak (80%), or a baseline results file.")
@click.option("--baseline-tolerance", default="10%", show_default=True, help="How far below a baseline is a failure.")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="Seconds the measurement should take (a failure costs about this much more).")
@click.option("--band", default="auto", show_default=True,
              help="How far below its peers a group, rank or pair may fall (auto: 20% on NCCL, 50% for pairs across hosts over TCP sockets; on gloo 60%, 95% for one pair).")
@click.option("--collectives", default=",".join(PREFLIGHT_COLLECTIVES), show_default=True)
@click.option("--json", "json_path", default=None, help="Write the report (hosts to drain, evidence) to this file.")
@drain_options
@metrics_option
@click.option("-T", "--timeout", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds one step may take; past it the run ends with exit 4 naming the late ranks (60, not the "
                   "collectives' 600: a check before a job should fail fast).")
@click.option("--backend", type=click.Choice(["nccl", "gloo"]), default=None, help="Default: nccl with CUDA GPUs, else gloo.")
@ngpus_option()
@rendezvous_options
def preflight_command(**o):
    """Check the job's groups before training: exit 0 when they run as they should, 1 when a
    group, rank or host is slow (the report names it), 7 wrong data, 4 timeout."""
    from ncclbench.launch import launcher as launch
    from ncclbench.api.command import local_rank_count
    from ncclbench.api.options import choose_backend, multinode_args
    from ncclbench.results.output import check_writable

    info = launch.detect()
    o["backend"] = choose_backend(o["backend"])
    if o["json_path"]:
        check_writable(o["json_path"], "JSON file")
    if info.launched:
        sys.exit(run_preflight_rank(o, info))
    ngpus = local_rank_count(o["ngpus"], o["backend"])
    if ngpus * o["nnodes"] < 2:
        raise PlanError(ONE_RANK)
    spawn = multinode_args(o, ngpus)
    argv = list(sys.argv[1:]) + ([] if "--backend" in sys.argv else ["--backend", o["backend"]])
    sys.exit(int(launch.spawn_local(ngpus, argv, **spawn)))
