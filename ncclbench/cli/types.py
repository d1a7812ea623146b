"""Click plumbing shared by the subcommands: parameter types, and the command class
whose every bad input ends in one line on stderr and exit code 2."""

from __future__ import annotations

import math
import sys
from typing import NoReturn

import click

from ncclbench.errors import BenchError, ExitCode, error_line
from ncclbench.sizes import parse_size


class BadInput(BenchError):
    """Bad input found inside a command (exit code 2); OneLineErrorCommand prints it as one line."""

    exit_code = ExitCode.USAGE


class GetoptCommand(click.Command):
    """A command that reads long options the way nccl-tests' getopt_long does."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """nccl-tests reads its options with getopt_long, which takes any unambiguous prefix
        of a long option (`--warmup 5` for `--warmup_iters 5`, `--iter=3`); so does this.
        A prefix of several names of one option (`--mem`: --memory, --memory_report) is that
        option. Option values (the word after an option that takes one, also at the end of
        a cluster such as `-qJ`) are left alone."""
        owner, takes_value = {}, set()
        for param in self.get_params(ctx):
            if not isinstance(param, click.Option):
                continue
            names = [*param.opts, *param.secondary_opts]
            owner.update((n, param) for n in names if n.startswith("--"))
            if not param.is_flag and not param.count:
                takes_value.update(names)
        out, value_next = [], False
        for k, arg in enumerate(args):
            if value_next:
                out.append(arg)
                value_next = False
                continue
            if arg == "--":
                return super().parse_args(ctx, out + args[k:])
            if arg.startswith("--") and len(arg) > 2:
                name, eq, value = arg.partition("=")
                if name not in owner:
                    hits = sorted(n for n in owner if n.startswith(name))
                    if len({id(owner[h]) for h in hits}) > 1:
                        if not ctx.resilient_parsing:  # shell completion: leave it to Click
                            raise click.UsageError(f"option {name} is ambiguous: it could be {', '.join(hits)}", ctx)
                    elif hits:
                        name = hits[0]
                arg = name + eq + value
                value_next = name in takes_value and not eq
            elif arg.startswith("-") and len(arg) > 1:
                # -b, -b8, or a cluster -qJ: the first letter that takes a value eats the
                # rest of the word, or the next word when it is the last letter
                for j in range(1, len(arg)):
                    if f"-{arg[j]}" in takes_value:
                        value_next = j == len(arg) - 1
                        break
            out.append(arg)
        return super().parse_args(ctx, out)


class OneLineErrorCommand(GetoptCommand):
    """A command whose bad input, usage errors included, ends it with one line on stderr:
    `ncclbench <name>: error: <message>`, exit code 2 (no usage dump; --help still shows it).

    It prints and exits itself (SystemExit) instead of leaving that to Click, so the
    result is the same standalone, under CliRunner, and inside a group run with
    standalone_mode=False (where Click would re-raise or return the code instead)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            self._fail(f"{exc.format_message()} (see --help)")

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except BadInput as exc:
            self._fail(str(exc))

    def _fail(self, message: str) -> NoReturn:
        click.echo(error_line(self.name, " ".join(message.split())), err=True)
        sys.exit(ExitCode.USAGE)


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
