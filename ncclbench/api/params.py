"""Click parameter types of the options the command line and the Python API share
(api.options): sizes, -g all, finite floats; and the output options every measuring command
declares alike (--metrics, --drain-file). Each bad value is a ValueError turned into
Click's usage error, so both faces refuse it with the same words."""

from __future__ import annotations

import math
import os

import click

from ncclbench.sizes import parse_size


class ParsedType(click.ParamType):
    """A parameter read by `parse(text)`, whose ValueError becomes Click's usage error."""

    def __init__(self, name: str, parse):
        self.name = name
        self._parse = parse

    def convert(self, value, param, ctx):
        try:
            return self._parse(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


SIZE = ParsedType("size", parse_size)  # a byte size such as 8, 64K, 1G (powers of 1024, like nccl-tests)


def parse_bytes(text) -> int:
    """A size of at least one byte (a copy's or an exchange's), read as SIZE reads it."""
    nbytes = parse_size(text)
    if nbytes < 1:
        raise ValueError(f"a size of at least 1 byte is needed (got {text!r})")
    return nbytes


BYTES = ParsedType("size", parse_bytes)


class FiniteFloat(click.FloatRange):
    """A float range that also refuses nan and inf (click.FloatRange lets both through)."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number

    def _describe_range(self) -> str:
        # Click describes an unbounded range as "x<=None" in --help; say nothing instead
        if self.min is None and self.max is None:
            return ""
        return super()._describe_range()


ALL_GPUS = "all"
CPU_RANKS_FOR_ALL = 2  # -g all without a GPU: the smallest world in which every collective moves data


def parse_gpu_count(text) -> int | str:
    """-g: a number of local ranks, or `all` (one per visible GPU)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    word = str(text).strip().lower()
    if word == ALL_GPUS:
        return ALL_GPUS
    try:
        return int(word)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of ranks or 'all'") from None


GPU_COUNT = ParsedType("N|all", parse_gpu_count)


def _first_rank() -> bool:
    """This process reports (rank 0, or the command before it spawns ranks): ranks of other
    hosts need not see rank 0's folders."""
    for var in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(var) not in (None, ""):
            return os.environ[var].strip() == "0"
    return True


def _output_path(what: str):
    def check(ctx, param, value):
        if value is None or not _first_rank():
            return value
        from ncclbench.results.output import check_writable

        if not value.strip():
            raise click.BadParameter(f"the {what} needs a name (got an empty one)", ctx, param)
        try:
            check_writable(value, what)
        except Exception as exc:  # PlanError: one line, as Click's usage errors
            raise click.BadParameter(str(exc), ctx, param) from None
        return value
    return check


def metrics_option(f):
    """--metrics FILE, the same on every measuring command: rank 0 writes Prometheus text there
    (node_exporter's textfile collector; results/metrics.py)."""
    return click.option("--metrics", "metrics_path", default=None, metavar="FILE", callback=_output_path("metrics file"),
                        help="Write Prometheus metrics to FILE (node_exporter's textfile collector reads *.prom; "
                             "docs/monitoring.md).")(f)


def drain_options(f):
    """--drain-file F and --drain-format, the same on fleet and preflight (results/drain.py)."""
    f = click.option("--drain-format", type=click.Choice(["scontrol", "kubectl", "hosts"]), default="scontrol",
                     show_default=True, help="scontrol update lines (SLURM), kubectl cordon/taint lines "
                     "(Kubernetes), or one host name per line.")(f)
    return click.option("--drain-file", "drain_path", default=None, metavar="FILE", callback=_output_path("drain file"),
                        help="Write the hosts to drain to FILE in --drain-format, every field shell-quoted "
                             "(never run by ncclbench).")(f)
