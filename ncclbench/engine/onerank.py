"""One rank per communicator: the cells whose column title would not be true.

NCCL runs a one-rank collective without a kernel (enqueue.cc, ncclLaunchOneRank): an
out-of-place call is a copy and an in-place call is skipped, except premul-sum reductions
(mulsum, and avg on floating types), which scale in a kernel. gloo's one-rank
all_reduce, broadcast and reduce return without moving data as well (see
docs/design/one-rank-limits.md).

torch.distributed has no out-of-place all_reduce, broadcast or reduce: with several
ranks the engine times the in-place call in the out-of-place column (and says so). On one
rank that stand-in is skipped, or scales in place, where an out-of-place call would copy:
its time is no out-of-place time, so that cell is N/A. An in-place call that is skipped
may print its time, as nccl-tests' in-place column does; the header says what it is, and
under -G that its captured graph is empty."""

from __future__ import annotations

import math
from dataclasses import replace

from ncclbench.dtypes import DTYPES
from ncclbench.results.records import PlacementResult

# NCCL handles all_reduce, all_gather, reduce_scatter, broadcast and reduce with
# ncclLaunchOneRank on one rank; point-to-point ones (alltoall, gather, scatter, sendrecv) move
# data through the send/recv path even there. Each registry entry says which backends skip its
# one-rank in-place call (`one_rank_noop`) and which have no out-of-place call (`in_place_only`).
_LIBRARY = {"nccl": "NCCL", "cupy": "NCCL", "gloo": "gloo"}


def out_of_place_is_stand_in(coll, backend: str, group_size: int) -> bool:
    """True where the out-of-place column would time the in-place stand-in on one rank."""
    return group_size == 1 and backend in coll.in_place_only


def scales_in_place(op: str, dtype: str) -> bool:
    """NCCL's premul-sum reductions: a kernel runs even on one rank, in place or not."""
    return op == "mulsum" or (op == "avg" and DTYPES[dtype].is_float)


def in_place_is_skipped(coll, backend: str, group_size: int, op: str, dtype: str) -> bool:
    """True where the library returns from a one-rank in-place call of registry entry `coll`
    without moving data."""
    if group_size != 1 or backend not in coll.one_rank_noop:
        return False
    return not (_LIBRARY.get(backend) == "NCCL" and scales_in_place(op, dtype))


def not_measured(cell: PlacementResult) -> PlacementResult:
    """The cell printed N/A: no time, no bandwidth, nothing checked."""
    nan = math.nan
    return replace(cell, time_us=nan, algbw=nan, busbw=nan, nwrong=None, host_us=nan, per_iter=None, noise=None, measured=False,
                   device_us=None, rank_us=tuple(nan for _ in cell.rank_us))


def honest_cells(cells: list[PlacementResult], coll, backend: str, group_size: int) -> list[PlacementResult]:
    """[out-of-place, in-place] with the out-of-place cell N/A where it would time the stand-in."""
    if out_of_place_is_stand_in(coll, backend, group_size):
        return [not_measured(cells[0]), cells[1]]
    return cells


def header_notes(plan, group_size: int) -> list[str]:
    """What the columns time, for the report header: the stand-in (several ranks), or on
    one rank why out-of-place is N/A and that in-place times a skipped call."""
    entry, coll, backend = plan.coll, plan.coll.name, plan.backend
    notes = []
    if backend in entry.in_place_only and group_size > 1:
        notes.append(f"torch.distributed has no out-of-place {coll}: both columns run it in place on distinct "
                     "buffers (use --backend cupy for a true out-of-place call)")
    if out_of_place_is_stand_in(entry, backend, group_size):
        better = "; --backend cupy times NCCL's out-of-place call (a copy)" if backend == "nccl" else ""
        notes.append(f"out-of-place is N/A on one rank: torch.distributed has no out-of-place {coll}, and the "
                     f"in-place call that stands in for it with more ranks does not copy anything here{better}")
    skipped = [(d, op) for d, op in plan.dtype_ops() if in_place_is_skipped(entry, backend, group_size, op, d)]
    if skipped:
        library = _LIBRARY.get(backend, backend)
        but = ("; avg on floating types and mulsum still run a kernel that scales in place"
               if len(skipped) < len(plan.dtype_ops()) else "")
        notes.append(f"in-place on one rank: {library} returns from an in-place {coll} without moving data, so "
                     f"that column times a call that does no work, as nccl-tests' does{but}")
        if plan.graph_replays:
            notes.append(f"-G on one rank: that skipped in-place {coll} captures nothing: the in-place graph is "
                         "empty and its time is an empty graph's replay")
    return notes
