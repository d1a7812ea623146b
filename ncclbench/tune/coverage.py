"""The rows of a tuner config that is safe to deploy with NCCL's example plugin: every size
of every tuned collective is matched by a row, and a row that is not a measured win
reproduces what NCCL itself runs there.

Why every size needs a row (plugins/tuner/example/plugin.c, NCCL 2.30, and
src/enqueue.cc ncclGetAlgoInfo, 2.26 to 2.30): the plugin sets `*nChannels = 1` before it
looks for a row, and NCCL takes any non-zero count the plugin returns as the channel
count of the call. A call no row matches therefore runs on ONE channel, 80-93 % slower
at large sizes (docs/design/tune-channels-ceiling.md). A row's `-1` keeps that 1. A row's `0`
is passed on as 0, which NCCL reads as "no override": it computes its own count for the
row's algorithm and protocol at that size (topoGetAlgoInfo), exactly as without a
plugin. A row sets the cost of its algorithm/protocol pair to 0, so NCCL runs that pair.

So per collective the file holds, in this order (the plugin takes the first row that
matches):
  * the ranges won beyond the noise, restricted to what was measured: one call per
    launch (numPipeOps 1) on unregistered buffers (regBuff 0). channels 0 when the winner
    ran with NCCL's own count; the logged count when it was a --channels limit;
  * NCCL's own choice over 0..MAX_BYTES, algorithm and protocol from its TUNING log at each
    measured size, channels 0, any numPipeOps and regBuff (NCCL's cost table does not
    depend on registration; for aggregated calls, numPipeOps > 1, NCCL's single-call
    choice is used). A measured size stands for the sizes halfway to its neighbours; above
    the largest measured size NCCL's choice there is extended up to MAX_BYTES;
  * a last row, ring/simple with NCCL's own count over 0..MAX_BYTES. The plugin skips a
    matching row whose algorithm/protocol NCCL marked unusable for the call (cost -1,
    NCCL_ALGO_PROTO_IGNORE) and tries the next: NVLS for a datatype or op it cannot
    reduce, PAT for an averaging reduce_scatter, in a job calling with another datatype or
    op than the one tuned. Such a call reaches this row instead of the plugin's one
    channel; NCCL has ring/simple for every collective.

Rows match one communicator shape (nNodes, nRanks): calls of any other shape, and of
collectives not in the file, match nothing and run on one channel."""

from __future__ import annotations

from ncclbench.sizes import format_size
from ncclbench.tune.files import MAX_BYTES, ConfigRow
from ncclbench.tune.plan import ALGO, PROTO
from ncclbench.tune.ranges import size_bounds


NCCL_OWN_CHANNELS = 0     # a row's channel count that NCCL treats as "not set" (its own count)


class UnknownChoice(ValueError):
    """NCCL's own choice is not known at some measured size: no row may be guessed there."""


def nccl_choice_rows(name: str, choices: dict[int, tuple], nnodes: int, nranks: int) -> list[ConfigRow]:
    """Rows reproducing NCCL's own choice over 0..MAX_BYTES for one collective (the plugin's
    name). `choices`: measured size -> (algo, proto, ...) from the TUNING log; every
    value must name a known algorithm and protocol (UnknownChoice otherwise)."""
    if not choices:
        raise UnknownChoice(f"{name}: nothing was measured")
    unknown = [s for s, c in sorted(choices.items()) if not c or c[0] not in ALGO or c[1] not in PROTO]
    if unknown:
        raise UnknownChoice(f"{name}: NCCL's choice is not in its TUNING log at "
                            f"{', '.join(format_size(s) for s in unknown[:8])}{' ...' if len(unknown) > 8 else ''}")
    rows: list[ConfigRow] = []
    for size, (lo, hi) in sorted(size_bounds(choices, MAX_BYTES).items()):
        algo, proto = choices[size][:2]
        last = rows[-1] if rows else None
        if last is not None and (last.algorithm, last.protocol) == (algo, proto):
            rows[-1] = ConfigRow(name, last.min_bytes, hi, algo, proto, NCCL_OWN_CHANNELS, nnodes, nranks, role="nccl")
        else:
            rows.append(ConfigRow(name, lo, hi, algo, proto, NCCL_OWN_CHANNELS, nnodes, nranks, role="nccl"))
    return rows


def fallback_rows(name: str, nnodes: int, nranks: int, before: list[ConfigRow]) -> list[ConfigRow]:
    """The last row (see above), unless the rows before already end with the same one."""
    row = ConfigRow(name, 0, MAX_BYTES, "ring", "simple", NCCL_OWN_CHANNELS, nnodes, nranks, role="fallback")
    if before and before[-1].text() == row.text():
        return []
    return [row]


def first_match(rows, collective: str, nbytes: int, nnodes: int, nranks: int, pipe_ops: int = 1,
                reg_buff: int = 0, unusable=()) -> ConfigRow | None:
    """The row the example plugin applies to one call (the first that matches and whose
    algorithm/protocol pair is not in `unusable` for that call), or None (one channel)."""
    return next((r for r in rows if r.matches(collective, nbytes, nnodes, nranks, pipe_ops, reg_buff)
                 and (r.algorithm, r.protocol) not in unusable), None)


def gaps(rows, collective: str, nnodes: int, nranks: int, pipe_ops: int = 1, reg_buff: int = 0) -> list[tuple]:
    """(lo, hi) byte ranges of 0..MAX_BYTES where no row matches such a call: the example
    plugin runs one channel there."""
    spans = sorted((r.min_bytes, r.max_bytes) for r in rows
                   if r.matches(collective, r.min_bytes, nnodes, nranks, pipe_ops, reg_buff))
    out, nxt = [], 0
    for lo, hi in spans:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= MAX_BYTES:
        out.append((nxt, MAX_BYTES))
    return out


def one_channel_rows(rows) -> list[ConfigRow]:
    """Rows whose `-1` keeps the example plugin's one channel."""
    return [r for r in rows if r.channels == -1]


def span_text(lo: int, hi: int) -> str:
    return f"{lo}-{'max' if hi == MAX_BYTES else hi} B"
