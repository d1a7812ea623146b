"""What `tune --verify` says: at every measured size, NCCL's default against the same call
under the deployed config (ranges.judge_deploy), which row the plugin applied there and
whether NCCL ran it; per row, what it did; the sizes and calls the config leaves to the
example plugin's one channel; and the verdict with its exit code.

The verdict is about safety at every measured size, not only inside the rows: exit 1 when
any size is slower than NCCL's default beyond the noise (each one is named), or could not
be compared; 7 when a result was wrong under the plugin; 0 otherwise. A row whose gain did
not come back is reported, not failed: it costs nothing where it is not slower."""

from __future__ import annotations

from dataclasses import dataclass, field

from ncclbench.errors import ExitCode
from ncclbench.sizes import format_size
from ncclbench.tune import coverage
from ncclbench.tune.plan import COLLECTIVES, ONE_RANK_NOTE
from ncclbench.tune.ranges import DeployVerdict, Series, finite, judge_deploy
from ncclbench.tune.table import gbps_text

# calls the config should match beyond what tune measures (numPipeOps, regBuff)
CALL_KINDS = ((1, 0, "single calls"), (1, 1, "registered buffers or CUDA graphs"), (2, 0, "grouped calls"))


@dataclass
class Judged:
    """Every size's fate over all collectives."""

    slower: list[tuple] = field(default_factory=list)    # (collective, size, change %)
    wrong: list[tuple] = field(default_factory=list)     # (collective, size)
    unjudged: list[tuple] = field(default_factory=list)  # (collective, size, why)
    faster: int = 0
    sizes: int = 0


def series(measured, size) -> Series:
    return Series(measured.busbw.get(size, []), measured.wrong.get(size, False))


def size_line(v: DeployVerdict, row, ran, applied) -> str:
    pct = lambda x, w: f"{x:+{w - 1}.1f}%" if x is not None else f"{'-':>{w}s}"  # noqa: E731
    noise = f"{v.noise_pct:6.1f}%" if v.noise_pct is not None else f"{'N/A':>7s}"
    ran_text = "N/A" if ran is None else f"{ran[0]}/{ran[1]}" + (f" ch{ran[2]}" if ran[2] else "")
    return (f"  {format_size(v.size):>8s} {gbps_text(v.default)} {gbps_text(v.plugin)} {pct(v.change_pct, 8)} "
            f"{noise} {pct(v.drift_pct, 7)}  {(row.line if row else '-'):>5}  {ran_text:<18s} "
            f"{({True: 'yes', False: 'NO', None: '-'}[applied]):<8s} {v.why}")


def collective_report(setup, coll, runs, choices, rows, judged: Judged):
    """Lines and JSON for one collective; every size's fate goes into `judged`.
    `runs`: the default before the plugin's launch, after it, and the plugin's (Measured)."""
    before, after, tuned = runs
    name = COLLECTIVES[coll][0]
    my_rows = [r for r in rows if r.collective == name]
    lines = [f"# {coll}: busbw out-of-place GB/s, median of {setup.request.repeat} repeat(s) each; the default "
             "measured in a launch before and one after the plugin's",
             "# noise: the largest spread of one launch's repeats, or the default's drift between its two launches",
             f"# {'size':>8s} {'default':>9s} {'plugin':>9s} {'change':>8s} {'noise':>7s} {'drift':>7s}  {'row':>5s}  "
             f"{'NCCL ran':<18s} {'applied':<8s} verdict"]
    per_row = {r.line: [] for r in my_rows}
    doc_sizes = []
    sizes = sorted(s for s in {*before.busbw, *after.busbw, *tuned.busbw} if s > 0)
    for size in sizes:
        row = coverage.first_match(my_rows, name, size, setup.nnodes, setup.nranks)
        ran = choices.get(size)
        # a row's channel count is a ceiling: NCCL runs fewer for small calls
        # (see docs/design/tune-channels-ceiling.md)
        applied = None if row is None or ran is None else \
            (ran[0], ran[1]) == (row.algorithm, row.protocol) and (row.channels <= 0 or ran[2] <= row.channels)
        v = judge_deploy(size, series(before, size), series(after, size), series(tuned, size), setup.request.min_gain)
        if setup.nranks > 1:
            record(judged, coll, v)
        if row is not None:
            per_row[row.line].append((applied, v))
        lines.append(size_line(v, row, ran, applied))
        doc_sizes.append({"size": size, "row_line": row.line if row else None, "default": finite(v.default.busbw),
                          "plugin": finite(v.plugin.busbw), "nccl_ran": list(ran) if ran else None, "applied": applied,
                          "change_pct": v.change_pct, "noise_pct": v.noise_pct, "drift_pct": v.drift_pct,
                          "slower": v.slower, "faster": v.faster, "wrong": v.wrong, "why": v.why})
    if not sizes and setup.nranks > 1:
        judged.unjudged.append((coll, 0, "nothing was measured"))
    lines += row_lines(setup, coll, my_rows, per_row)
    warnings = coverage_warnings(my_rows, name, setup.nnodes, setup.nranks)
    lines += [f"#   warning: {w}" for w in warnings]
    return lines, {"sizes": doc_sizes, "coverage_warnings": warnings, "one_rank": setup.nranks == 1}


def record(judged: Judged, coll: str, v: DeployVerdict) -> None:
    judged.sizes += 1
    if v.wrong:
        judged.wrong.append((coll, v.size))
    elif v.slower:
        judged.slower.append((coll, v.size, v.change_pct))
    elif v.slower is None:
        judged.unjudged.append((coll, v.size, v.why))
    elif v.faster:
        judged.faster += 1


def row_lines(setup, coll, rows, per_row) -> list[str]:
    lines = [f"# {coll}: per config row"]
    if setup.nranks == 1:  # NCCL copies locally: it never asks the plugin
        return lines + [f"#   line {r.line}: {r.text()}: not judged: {ONE_RANK_NOTE}" for r in rows]
    for r in rows:
        got = per_row[r.line]
        if not got:
            lines.append(f"#   line {r.line}: {r.text()}: applies to no measured size")
            continue
        applied = sum(1 for a, _v in got if a)
        faster = sum(1 for _a, v in got if v.faster)
        slower = sum(1 for _a, v in got if v.slower or v.wrong)
        lines.append(f"#   line {r.line}: {r.text()}: {len(got)} size(s), NCCL applied it at {applied}; faster "
                     f"beyond noise at {faster}, slower at {slower}"
                     + ("" if applied == len(got) else ": NCCL did NOT run the row's setting everywhere"))
    return lines


def coverage_warnings(rows, name: str, nnodes: int, nranks: int) -> list[str]:
    """Sizes of this collective and job shape no row matches (one channel under the example
    plugin), per kind of call, and rows whose -1 keeps that one channel."""
    out = []
    for pipe_ops, reg_buff, kind in CALL_KINDS:
        holes = coverage.gaps(rows, name, nnodes, nranks, pipe_ops, reg_buff)
        if holes:
            spans = ", ".join(coverage.span_text(lo, hi) for lo, hi in holes[:4]) + (" ..." if len(holes) > 4 else "")
            out.append(f"{name} {kind} (numPipeOps {pipe_ops}, regBuff {reg_buff}) match no row at {spans}: the "
                       "example plugin runs ONE channel there")
    out += [f"line {r.line}: channels -1 keeps the example plugin's ONE channel (0 leaves the count to NCCL)"
            for r in coverage.one_channel_rows(rows)]
    return out


def verdict(judged: Judged, nranks: int, interrupted: bool) -> tuple[int, str]:
    """(exit code, one line) for the whole --verify run."""
    if interrupted:
        return ExitCode.INTERRUPTED, "interrupted: not judged"
    if nranks == 1:
        return ExitCode.OK, f"not judged: {ONE_RANK_NOTE}"
    where = lambda items: ", ".join(f"{c} {format_size(s)}" + (f" ({x:+.1f} %)" if x is not None else "")  # noqa: E731
                                    for c, s, x in items)
    if judged.wrong:
        return ExitCode.WRONG_RESULTS, ("NOT safe to deploy: wrong results under the plugin at "
                                        + where((c, s, None) for c, s in judged.wrong))
    if judged.slower:
        return ExitCode.REGRESSION, ("NOT safe to deploy: slower than NCCL's default beyond noise at "
                                     + where(judged.slower))
    if judged.unjudged:
        return ExitCode.REGRESSION, ("not shown safe: could not compare at "
                                     + ", ".join(f"{c} {format_size(s)} ({why})" for c, s, why in judged.unjudged))
    return ExitCode.OK, (f"no measured size slower than NCCL's default beyond noise ({judged.sizes} size(s); faster "
                         f"beyond noise at {judged.faster})")
