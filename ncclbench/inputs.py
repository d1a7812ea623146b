"""Every file a command takes as input is read here, bounded: results files, nccl-tests
output, baselines, suites, alltoallv matrices, tuner configs and NCCL's logs.

The rule, in one place: only a regular file is read (a device such as /dev/zero, a pipe or
a socket never ends, or blocks); a file larger than its kind's cap is refused before a
byte is read (a 2 GiB file costs a stat); what is read is at most cap + 1 bytes (a /proc
file reports size 0); NUL bytes or bytes that are not UTF-8 mean a binary file, refused.
Each refusal is an InputFileError: one line `PATH: why`, exit code 2. '-' reads stdin,
bounded the same way, where the caller allows it."""

from __future__ import annotations

import os
import stat
import sys

from ncclbench.errors import BadInput

MiB = 1 << 20

# kind -> (what the message calls it, the most bytes read). Caps are far above any real
# file of the kind (a 13-size JSON run is ~25 KB, a 2-host NCCL INFO log a few MB) and low
# enough that parsing what passes stays within a few hundred MB to a GB of memory.
LIMITS = {
    "results": ("a results file", 64 * MiB),    # ncclbench JSON/CSV, nccl-tests text or JSON, baselines
    "nccl log": ("an NCCL log", 256 * MiB),     # NCCL_DEBUG=INFO output, read by explain and tune
    "suite": ("a suite file", 4 * MiB),
    "matrix": ("an alltoallv matrix", 16 * MiB),  # a 1024 x 1024 matrix of 2 GiB entries is ~11 MiB
    "tuner config": ("a tuner config", 4 * MiB),
}

_FILE_TYPES = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISFIFO, "a pipe"), (stat.S_ISSOCK, "a socket"))


class InputFileError(BadInput):
    """An input file refused or unreadable; str() is one line naming the file and why."""

    def __init__(self, path: str, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


def _size_text(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"


def _kind(kind: str) -> tuple[str, int]:
    try:
        return LIMITS[kind]
    except KeyError:
        raise ValueError(f"unknown input kind {kind!r} (one of {', '.join(LIMITS)})") from None


def _check_type(path: str, mode: int, noun: str) -> None:
    if stat.S_ISREG(mode):
        return
    what = next((name for test, name in _FILE_TYPES if test(mode)), "of another kind")
    raise InputFileError(path, f"not a regular file ({what}); {noun} is read from a regular file")


def read_bytes(path: str | os.PathLike, kind: str, *, stdin_ok: bool = False) -> bytes:
    """At most the kind's cap of bytes of a regular file (or of stdin for '-' when
    `stdin_ok`); InputFileError for anything else, a file over the cap included."""
    noun, cap = _kind(kind)
    path = os.fspath(path)
    if path == "-" and stdin_ok:
        data = sys.stdin.buffer.read(cap + 1)
        if len(data) > cap:
            raise InputFileError("<stdin>", f"more than {_size_text(cap)}, the most {noun} may be")
        return data
    try:
        _check_type(path, os.stat(path).st_mode, noun)  # refused before opening: no open() of a device
        # O_NONBLOCK: a file swapped for a pipe after the stat still does not block the open
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputFileError(path, f"cannot read {noun}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        _check_type(path, info.st_mode, noun)
        if info.st_size > cap:
            raise InputFileError(path, f"{_size_text(info.st_size)}, larger than {_size_text(cap)}, "
                                       f"the most {noun} may be")
        try:
            data = f.read(cap + 1)
        except OSError as exc:
            raise InputFileError(path, f"cannot read {noun}: {exc.strerror or exc}") from None
    if len(data) > cap:  # a file that grew, or one whose size the kernel does not report
        raise InputFileError(path, f"more than {_size_text(cap)}, the most {noun} may be")
    return data


def decode(data: bytes, path: str, kind: str, *, lenient: bool = False) -> str:
    """UTF-8 text of `data`; InputFileError when it holds a NUL byte or (unless `lenient`:
    NCCL's logs may carry another program's stray bytes, replaced) is not UTF-8."""
    noun, _ = _kind(kind)
    nul = data.find(b"\0")
    if nul >= 0:
        raise InputFileError(path, f"a binary file (a NUL byte at offset {nul}), not {noun}")
    if lenient:
        return data.decode("utf-8", errors="replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(path, f"a binary file (not UTF-8 text at byte {exc.start}), not {noun}") from None


def read_text(path: str | os.PathLike, kind: str, *, stdin_ok: bool = False, lenient: bool = False) -> str:
    """The text of an input file under the rule above (the one reader every command uses)."""
    name = "<stdin>" if os.fspath(path) == "-" and stdin_ok else os.fspath(path)
    return decode(read_bytes(path, kind, stdin_ok=stdin_ok), name, kind, lenient=lenient)


def read_open(handle, path: str, kind: str) -> str:
    """The rest of an already open text handle (NCCL's own log, kept open), at most the
    kind's cap of characters; InputFileError beyond it."""
    noun, cap = _kind(kind)
    text = handle.read(cap + 1)
    if len(text) > cap:
        raise InputFileError(path, f"more than {_size_text(cap)}, the most {noun} may be")
    return text
