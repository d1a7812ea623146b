"""Click parameter types of the options the command line and the Python API share
(api.options): sizes, -g all, finite floats. Each bad value is a ValueError turned into
Click's usage error, so both faces refuse it with the same words."""

from __future__ import annotations

import math

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
