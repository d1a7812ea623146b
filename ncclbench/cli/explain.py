"""`ncclbench explain [LOG...]`: the path NCCL took and the known causes of a lower number;
the logic is in ncclbench.explain."""

from __future__ import annotations

import click

from ncclbench.api.params import GPU_COUNT
from ncclbench.cli.types import OneLineErrorCommand


@click.command("explain", cls=OneLineErrorCommand)
@click.argument("logs", nargs=-1, type=str)
@click.option("-g", "--ngpus", type=GPU_COUNT, default="all", show_default=True,
              help="Without LOG: ranks of the short measurement run here (a number or `all`).")
@click.option("--backend", type=click.Choice(["nccl", "cupy", "gloo"]), default=None,
              help="Without LOG: the backend of the measurement (default: nccl with a GPU, else gloo).")
def explain_command(logs, ngpus, backend):
    """Why is my bandwidth low: the path NCCL took (network, NICs, GDR, PXN, the transport of
    each rank pair, channels, NVLS) and the known causes of a lower number.

    With LOG arguments: read NCCL INFO logs saved by any job (the files NCCL_DEBUG_FILE
    wrote, one per process; a folder of them; a combined job log with other output mixed
    in). No GPU needed. Without: run a short all_reduce sweep here with NCCL's log on, and
    explain that."""
    if logs:
        from ncclbench.explain.report import explain_logs

        for line in explain_logs(logs):
            click.echo(line)
        return
    from ncclbench.explain.here import explain_here

    lines, code = explain_here(ngpus, backend)
    for line in lines:
        click.echo(line)
    if code:
        raise SystemExit(code)
