"""The `ncclbench` console command. It imports the CLI (click, rich and the rest) inside
the same Ctrl-C handling as everything after it, so an interrupt during start-up ends in
one line and exit 130, not a traceback from some import.

A rank leaves without Python's interpreter teardown: its run is over and written (files
fsynced, communicators destroyed), and unwinding torch's and CUDA's modules and objects
costs about half a second per process, time the user still waits for."""

import os
import sys


def main() -> None:
    try:
        from ncclbench.cli.main import main as cli_main
    except KeyboardInterrupt:
        print("ncclbench: interrupted", file=sys.stderr)
        sys.exit(130)  # ExitCode.INTERRUPTED, without importing anything more
    try:
        cli_main()
    except SystemExit as done:
        from ncclbench.launch import launcher as launch

        if launch.ran_as_rank:
            leave_now(done.code)
        raise


def leave_now(code) -> None:
    """Exit with `code` (as sys.exit reads it) after flushing stdout and stderr, skipping
    the interpreter's teardown."""
    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe: nothing more to say
            pass
    os._exit(int(code or 0))
