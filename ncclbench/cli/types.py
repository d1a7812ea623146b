"""The command classes the subcommands share: getopt-style long options, and every bad
input ending in one line on stderr and exit code 2. Parameter types are in api.params."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from ncclbench.errors import BadInput, ExitCode, error_line


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
    `ncclbench: error: <message>`, exit code 2 (no usage dump; --help still shows it).

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
        click.echo(error_line(" ".join(message.split())), err=True)
        sys.exit(ExitCode.USAGE)
