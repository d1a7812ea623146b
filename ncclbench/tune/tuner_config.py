"""nccl_tuner.conf as a whole: the rows of every tuned collective (coverage.py says which
and why), the comments that say what the file does, and when no file may be written.

No file is written when it could not be safe: when NCCL's own choice is unknown at a
measured size (no TUNING line there: NCCL before 2.20, a symmetric kernel, a log line
missing), a row there would impose a setting NCCL did not choose, and a gap would run one
channel; tune refuses with one line (exit 6). Nor on gloo (a rehearsal: NCCL chose
nothing) or one rank (NCCL never asks a tuner plugin there): a note says so."""

from __future__ import annotations

from dataclasses import dataclass, field

from ncclbench.sizes import format_size
from ncclbench.tune import analysis, coverage
from ncclbench.tune.files import ConfigRow, config_text
from ncclbench.tune.plan import COLLECTIVES
from ncclbench.tune.paired import rule_text
from ncclbench.tune.ranges import win_ranges

FILE_NAME = "nccl_tuner.conf"


@dataclass
class TunerConfig:
    rows: list[ConfigRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)          # on wins that could not be written
    explained: dict[str, list[str]] = field(default_factory=dict)  # collective -> one line per row
    refused: str | None = None   # why no file may be written (an error)
    skipped: str | None = None   # why no file is written (not an error)

    def text(self, comments: list[str]) -> str:
        return config_text(self.rows, comments)


def build(setup, outcomes) -> TunerConfig:
    config = TunerConfig()
    if setup.backend == "gloo":
        config.skipped = "rehearsal on gloo: NCCL chose nothing here, so no row could reproduce its choice"
        return config
    if setup.nranks == 1:
        config.skipped = "one rank: NCCL copies locally and never asks a tuner plugin"
        return config
    unknown = []
    for outcome in outcomes:
        try:
            rows, notes = analysis.config_rows(outcome, setup.nnodes, setup.nranks)
        except coverage.UnknownChoice as exc:
            unknown.append(str(exc))
            continue
        config.rows += rows
        config.notes += notes
        config.explained[outcome.collective] = explain(rows, outcome)
    if unknown:
        config.refused = (f"{'; '.join(unknown)}; a row there would impose a setting NCCL did not choose and a "
                          "missing row runs one channel (docs/tuning.md)")
    return config


def explain(rows: list[ConfigRow], outcome) -> list[str]:
    """One line per row: the row, and which measured sizes it stands for."""
    sizes = analysis.measured_sizes(outcome)
    ranges = {(r.min_bytes, r.max_bytes): r for r in win_ranges(outcome.verdicts)}
    lines = []
    for row in rows:
        inside = [s for s in sizes if row.min_bytes <= s <= row.max_bytes]
        where = (f"{format_size(inside[0])}-{format_size(inside[-1])}" if len(inside) > 1 else
                 format_size(inside[0]) if inside else "no measured size")
        if row.role == "won":
            won = ranges.get((row.min_bytes, row.max_bytes))
            text = f"won at {where} ({gains_text(won.gains)})" if won else f"won at {where}"
            confirmed = [c for c in (won.confirmations if won else []) if c]
            text += f"; {'; '.join(confirmed)}" if confirmed else ""
            text += "; unregistered buffers, single calls (NCCL also matches groups of up to one op per channel)"
        elif row.role == "fallback":
            text = ("only for calls NCCL cannot run a row above for (e.g. NVLS for a datatype it does not reduce): "
                    "ring/simple, NCCL's own channel count")
        else:
            text = f"NCCL's own choice at {where}, NCCL's own channel count"
            if row.max_bytes == coverage.MAX_BYTES and sizes:
                text += f"; above {format_size(sizes[-1])} (not measured): NCCL's choice there, extended"
                if row.protocol.lower() != "simple":
                    text += (f"; WARNING: larger calls are held to {row.protocol} (NCCL runs simple for large calls): "
                             "re-run tune with a larger -e")
        lines.append(f"{row.text():<52s} {text}")
    return lines


def gains_text(gains: list[float]) -> str:
    low, high = f"{min(gains):+.1f}", f"{max(gains):+.1f}"
    return f"{low} %" if low == high else f"{low} .. {high} %"


def comments(setup, config: TunerConfig, nccl_text: str) -> list[str]:
    names = ", ".join(COLLECTIVES[c][0] for c in setup.request.collectives)
    return [
        "NCCL tuner config (plugins/tuner/example format) written by ncclbench tune",
        f"{nccl_text or 'NCCL version unknown'}; rows match communicators of {setup.nranks} rank(s) on "
        f"{setup.nnodes} node(s) only; collectives: {names}",
        f"Every size from 0 to {coverage.MAX_BYTES} bytes is covered for each of them. Per collective, first the "
        "size ranges where a forced setting beat NCCL's default beyond the noise (numPipeOps 1, regBuff 0: "
        "unregistered buffers, single calls as measured; NCCL also matches groups of up to one op per channel), then NCCL's own choice at every size (algorithm and protocol "
        "from its TUNING log; any numPipeOps and regBuff). The plugin applies the first row that matches.",
        "A measured size stands for the sizes halfway to its neighbours. Above the largest measured size, NCCL's "
        "choice at that size is extended to the largest size: not measured there; re-run tune with a larger -e if "
        "your job runs larger calls.",
        "A last row per collective, ring/simple over every size, is reached only by calls for which NCCL cannot run "
        "the algorithm/protocol of the row that matched (the plugin then tries the next row): NVLS for a datatype or "
        "op it does not reduce, PAT for an averaging reduce_scatter.",
        "channels 0: NCCL computes its own channel count for the row's algorithm and protocol (NCCL takes 0 from the "
        "plugin as no override). -1 would keep the example plugin's ONE channel.",
        "Calls no row matches (another collective, a communicator of another size) run ONE channel under the "
        "example plugin: run tune for every communicator size your job uses and concatenate the files.",
        f"{setup.request.repeat} repeat(s); rule: {rule_text(setup.request.min_gain, setup.request.paired)}",
        f"timing: {setup.timing.text if getattr(setup, 'timing', None) else 'not recorded'}. A win is written only "
        "where a second, independent launch reproduced it beyond its own noise; each winning row below says how.",
    ] + [f"won: {' '.join(line.split())}" for coll in config.explained.values() for line in coll if " won at " in line] \
      + [f"note: {n}" for n in config.notes]
