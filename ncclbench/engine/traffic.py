"""alltoallv traffic: the bytes each rank sends each peer, as nccl-tests 2.19.6's
alltoallv_perf defines them.

Two modes, as its NCCL_TESTS_ALLTOALLV_* variables choose:
- generated (default): each message size is what every rank sends in total; a spread
  s in [0, 1] blends an even split (s = 0) with a distance-weighted one (s = 1: the peer
  d ranks ahead gets d / (n(n-1)/2) of the total, nothing to oneself). Every rank sends
  and receives the same total, unevenly over its peers.
- matrix: a square whitespace-separated file, cell [i][j] = bytes rank i sends rank j,
  times a scale factor; the first n rows and columns serve n ranks.
Every per-peer amount is rounded down to a multiple of 16 bytes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ncclbench.errors import PlanError

ALIGN = 16


def _align(nbytes: float) -> int:
    return int(nbytes) & ~(ALIGN - 1)


@dataclass(frozen=True)
class Traffic:
    spread: float = 1.0
    matrix: tuple[tuple[int, ...], ...] | None = None   # bytes, scaled and aligned
    source: str | None = None                           # the matrix file, for the header
    scale: float = 1.0

    @property
    def generated(self) -> bool:
        return self.matrix is None

    def peer_bytes(self, src: int, dst: int, nranks: int, total_bytes: int) -> int:
        if self.matrix is not None:
            return self.matrix[src][dst]
        if nranks == 1:
            return _align(total_bytes)
        distance = (dst - src) % nranks
        even = total_bytes / nranks
        weighted = distance * total_bytes / (nranks * (nranks - 1) // 2)
        return _align((1.0 - self.spread) * even + self.spread * weighted)

    def counts(self, nranks: int, total_bytes: int, itemsize: int) -> tuple[tuple[int, ...], ...]:
        """Element counts: [src][dst] = elements rank src sends rank dst."""
        return tuple(tuple(self.peer_bytes(i, j, nranks, total_bytes) // itemsize for j in range(nranks))
                     for i in range(nranks))

    def busiest_rank_bytes(self, nranks: int) -> int:
        """Matrix mode: the largest total any rank sends or receives (what -e must hold)."""
        if self.matrix is None:
            return 0
        return max(busiest_totals([row[:nranks] for row in self.matrix[:nranks]]))

    def describe(self) -> str:
        if self.matrix is None:
            return f"alltoallv traffic: generated, spread {self.spread:.3f} (0 even, 1 distance-weighted)"
        n = len(self.matrix)
        return f"alltoallv traffic: matrix {self.source} ({n}x{n} bytes, scale {self.scale:g})"


def busiest_totals(m) -> tuple[int, int]:
    """(largest row sum, largest column sum) of a square [src][dst] table: what the
    busiest sender sends and the busiest receiver receives."""
    return max(sum(row) for row in m), max(sum(col) for col in zip(*m))


def parse_fraction(text: str, what: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise PlanError(f"{what} must be a number from 0 to 1 (got {text!r})") from None
    if not 0.0 <= value <= 1.0 or math.isnan(value):
        raise PlanError(f"{what} must be from 0 to 1 (got {text})")
    return value


def parse_scale(text: str, what: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise PlanError(f"{what} must be a number >= 0 (got {text!r})") from None
    if value < 0 or math.isnan(value) or math.isinf(value):
        raise PlanError(f"{what} must be a finite number >= 0 (got {text})")
    return value


def read_matrix(path: str, scale: float = 1.0) -> tuple[tuple[int, ...], ...]:
    """The byte matrix of `path`, scaled and 16-byte aligned; PlanError (one line) if bad."""
    from ncclbench.inputs import InputFileError, read_text

    try:
        text = read_text(path, "matrix")  # bounded: /dev/zero or a wrong huge file must not hang
    except InputFileError as exc:
        raise PlanError(str(exc)) from None
    rows: list[tuple[int, ...]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        row = []
        for col, field in enumerate(fields, 1):
            try:
                value = float(field)
            except ValueError:
                raise PlanError(f"alltoallv matrix {path} line {lineno} column {col}: "
                                f"{field!r} is not a number") from None
            if value < 0 or math.isnan(value) or math.isinf(value):
                raise PlanError(f"alltoallv matrix {path} line {lineno} column {col}: "
                                f"bytes must be a finite number >= 0 (got {field})")
            row.append(_align(value * scale))
        if rows and len(row) != len(rows[0]):
            raise PlanError(f"alltoallv matrix {path} line {lineno}: {len(row)} columns, "
                            f"the first row has {len(rows[0])}")
        rows.append(tuple(row))
    if not rows:
        raise PlanError(f"alltoallv matrix {path} is empty")
    if len(rows) != len(rows[0]):
        raise PlanError(f"alltoallv matrix {path} must be square (got {len(rows)}x{len(rows[0])})")
    return tuple(rows)
