"""nccl-tests' NCCL_TESTS_SPLIT: the world's ranks split into groups that run side by side
(--split), each group one communicator of its own."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

from ncclbench.launch.variables import read_var

__all__ = ["SplitSpec", "parse_split", "split_color", "split_groups", "split_spec_from_environ"]

_SPLIT_OPS = {"AND": "AND", "&": "AND", "OR": "OR", "|": "OR", "MOD": "MOD", "%": "MOD", "DIV": "DIV", "/": "DIV"}
_SPLIT_SPEC = re.compile(r"\s*(AND|OR|MOD|DIV|&|\||%|/)\s*(\S+)\s*", re.IGNORECASE)


@dataclass(frozen=True)
class SplitSpec:
    """nccl-tests' NCCL_TESTS_SPLIT: color = rank <op> value; ranks with the same color
    form one group (MPI_Comm_split with key = rank, so groups keep rank order)."""

    op: str  # AND, OR, MOD or DIV
    value: int

    def color(self, rank: int) -> int:
        if rank < 0:
            raise ValueError(f"rank must be >= 0, got {rank}")
        if self.op == "AND":
            return rank & self.value
        if self.op == "OR":
            return rank | self.value
        if self.op == "MOD":
            return rank % self.value
        return rank // self.value

    def __str__(self) -> str:
        return f"{self.op} {self.value:#x}" if self.op in ("AND", "OR") else f"{self.op} {self.value}"


def parse_split(spec: str) -> SplitSpec:
    """Parse "<AND|OR|MOD|DIV> <value>" (also &, |, %, /; case-insensitive; value in
    decimal, 0x hex, 0b binary or 0o octal), as nccl-tests reads NCCL_TESTS_SPLIT."""
    match = _SPLIT_SPEC.fullmatch(spec or "")
    if not match:
        raise ValueError(f"bad split spec {spec!r}: expected '<AND|OR|MOD|DIV> <value>', e.g. 'MOD 8' or 'AND 0x7'")
    op = _SPLIT_OPS[match.group(1).upper()]
    value = _split_value(match.group(2), spec)
    if op in ("MOD", "DIV") and value == 0:
        raise ValueError(f"bad split spec {spec!r}: {op} 0 divides by zero")
    return SplitSpec(op, value)


def _split_value(text: str, spec: str) -> int:
    if re.fullmatch(r"0[xX][0-9a-fA-F]+|0[bB][01]+|0[oO][0-7]+|0|[1-9][0-9]*", text):
        return int(text, 0)
    if re.fullmatch(r"0[0-9]+", text):
        # nccl-tests (strtoul base 0) reads a leading zero as octal; refuse to guess.
        raise ValueError(f"bad split spec {spec!r}: {text!r} is ambiguous (octal in nccl-tests); "
                         f"write {int(text, 10)} or 0o{text.lstrip('0') or '0'}")
    raise ValueError(f"bad split spec {spec!r}: {text!r} is not a non-negative integer (decimal, 0x.., 0b.., 0o..)")


def split_color(rank: int, spec: str | SplitSpec) -> int:
    """The group color of `rank` under a split spec such as "MOD 8" (rank % 8)."""
    parsed = spec if isinstance(spec, SplitSpec) else parse_split(spec)
    return parsed.color(rank)


def split_groups(world_size: int, spec: str | SplitSpec) -> dict[int, list[int]]:
    """Color -> ranks in that group, in rank order, for every rank of the world."""
    parsed = spec if isinstance(spec, SplitSpec) else parse_split(spec)
    groups: dict[int, list[int]] = {}
    for rank in range(world_size):
        groups.setdefault(parsed.color(rank), []).append(rank)
    return dict(sorted(groups.items()))


def split_spec_from_environ(environ: Mapping[str, str] | None = None) -> SplitSpec | None:
    """The split nccl-tests would apply: NCCL_TESTS_SPLIT_MASK (hex, color = rank & mask)
    takes precedence over NCCL_TESTS_SPLIT; None when neither is set."""
    env = os.environ if environ is None else environ
    mask = read_var(env, "NCCL_TESTS_SPLIT_MASK")
    if mask is not None:
        try:
            return SplitSpec("AND", int(mask, 16))
        except ValueError:
            raise ValueError(f"NCCL_TESTS_SPLIT_MASK={mask!r} is not a hex mask") from None
    spec = read_var(env, "NCCL_TESTS_SPLIT")
    if spec is None:
        return None
    try:
        return parse_split(spec)
    except ValueError as exc:
        raise ValueError(f"NCCL_TESTS_SPLIT: {exc}") from None
