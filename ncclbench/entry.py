"""The `ncclbench` console command. It imports the CLI (click, rich and the rest) inside
the same Ctrl-C handling as everything after it, so an interrupt during start-up ends in
one line and exit 130, not a traceback from some import."""

import sys


def main() -> None:
    try:
        from ncclbench.cli import main as cli_main
    except KeyboardInterrupt:
        print("ncclbench: interrupted", file=sys.stderr)
        sys.exit(130)  # ExitCode.INTERRUPTED, without importing anything more
    cli_main()
