"""The command classes the subcommands share: getopt-style long options, and every bad
input ending in one line on stderr and exit code 2. Parameter types are in api.params."""

from __future__ import annotations

import sys
from typing import NoReturn

import click

from ncclbench.errors import BadInput, ExitCode, error_line


# Options about starting the ranks rather than what is measured: listed under their own
# heading in every command's help (by parameter name, the same in every command).
LAUNCH_PARAMS = ("ngpus", "backend", "nnodes", "node_rank", "master_addr", "master_port", "rdzv_endpoint")
# What plot, baseline and tune called their output before -o became the reduction op's
# letter everywhere (nccl-tests'): still read, with a notice (see docs/design/one-grammar.md).
OLD_OUTPUT_SPELLINGS = {"-o": "--out", "--output": "--out"}
SUGGESTION_CUTOFF = 0.75  # difflib ratio of names without dashes: `--itres` gets `--iters`, `--bogus` nothing


class GetoptCommand(click.Command):
    """A command that reads long options the way nccl-tests' getopt_long does, and lists
    its launch options under a heading of their own.

    `old_spellings` maps an option's former name to its name now: the old one still works,
    with a one-line notice on stderr. `elsewhere` maps an option of other commands to why
    it is not one of this command's (`--alltoallv-spread`: alltoallv only)."""

    old_spellings: dict[str, str] = {}
    elsewhere: dict[str, str] = {}

    def __init__(self, *args, old_spellings: dict[str, str] | None = None, elsewhere: dict[str, str] | None = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.old_spellings = dict(old_spellings or self.old_spellings)
        self.elsewhere = dict(elsewhere or self.elsewhere)

    def renamed(self, name: str, value: str | None) -> str | None:
        """The name an old spelling `name` (followed by `value`) stands for now, else None."""
        return self.old_spellings.get(name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, self._getopt_args(ctx, args))
        except click.NoSuchOption as exc:
            name = exc.option_name.partition("=")[0]
            if name in self.elsewhere:
                raise click.UsageError(f"{name} {self.elsewhere[name]}", ctx) from None
            exc.possibilities = self._close_names(ctx, name)
            raise

    def _close_names(self, ctx: click.Context, name: str) -> list[str]:
        """Long options whose name is close to `name`; Click's own suggestions compare the
        leading dashes too, so that `--bogus` got `--ngpus`."""
        import difflib

        names = {n.lstrip("-"): n for p in self.get_params(ctx) if isinstance(p, click.Option) and not p.hidden
                 for n in (*p.opts, *p.secondary_opts) if n.startswith("--")}
        close = difflib.get_close_matches(name.lstrip("-"), list(names), n=3, cutoff=SUGGESTION_CUTOFF)
        return [names[c] for c in close]

    def _current_spelling(self, ctx: click.Context, args: list[str], k: int) -> str:
        """args[k] (an option, not a value) with an old spelling replaced by the option's
        name now, saying so on stderr."""
        arg = args[k]
        if arg.startswith("--"):
            name, eq, attached = arg.partition("=")
            value = attached if eq else (args[k + 1] if k + 1 < len(args) else None)
        else:  # -o FILE or -oFILE
            name, value = arg[:2], (arg[2:] or (args[k + 1] if k + 1 < len(args) else None))
        new = self.renamed(name, value)
        if new is None:
            return arg
        if not ctx.resilient_parsing:
            click.echo(f"ncclbench: {self.name} {name} is now {new}; the old spelling will go away", err=True)
        rest = arg[len(name):]
        if rest and not name.startswith("--") and new.startswith("--"):  # -oFILE -> --out=FILE
            rest = "=" + rest
        return new + rest

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The options, then the launch options under their own heading."""
        sections: dict[str, list] = {"Options": [], "Launch options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and isinstance(param, click.Option):
                sections["Launch options" if param.name in LAUNCH_PARAMS else "Options"].append(record)
        for title, records in sections.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)

    def _getopt_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        """nccl-tests reads its options with getopt_long, which takes any unambiguous prefix
        of a long option (`--warmup 5` for `--warmup_iters 5`, `--iter=3`); so does this.
        A prefix of several names of one option (`--mem`: --memory, --memory_report) is that
        option. Option values (the word after an option that takes one, also at the end of
        a cluster such as `-qJ`) are left alone. Old spellings become the names now."""
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
                return out + args[k:]
            if arg.startswith("-") and len(arg) > 1:
                arg = self._current_spelling(ctx, args, k)
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
        return out


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
