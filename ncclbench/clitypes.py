"""Click parameter types shared by the subcommands."""

from __future__ import annotations

import click

from ncclbench.sizes import parse_size


class SizeType(click.ParamType):
    """A byte size such as 8, 64K, 1G (powers of 1024, like nccl-tests)."""

    name = "size"

    def convert(self, value, param, ctx):
        try:
            return parse_size(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


SIZE = SizeType()
