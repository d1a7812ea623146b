"""Performance regressions between result files (`ncclbench compare BASE NEW [NEW...]`).

Rows are matched on (collective, dtype, op, root, size, placement). A row is slower when
NEW's time per op exceeds BASE's by more than the threshold (busbw below 1 - threshold
reads the same: with one rank count both come from the time, in full precision, never from
a busbw printed as 0.00). A slower row regresses only when it is also slower beyond the
noise both files carry (results.noise.judge: the samples of the timed loop, or their
summaries); without noise in a file (nccl-tests output, older files) the threshold alone
decides, as it always did, and the report says so. A matched row whose NEW run reports
wrong results (#wrong > 0) is a failure whatever its speed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ncclbench.errors import BadInput
from ncclbench.lazy import lazy_import
from ncclbench.results import noise
from ncclbench.results.readers import PLACEMENTS, ResultsFormatError, default_labels, read_results
from ncclbench.sizes import format_size

np = lazy_import("numpy")
pd = lazy_import("pandas")  # imported when results are read, not when the CLI starts

MATCH_KEYS = ["collective", "dtype", "op", "root", "size_bytes", "placement"]

# Row statuses, as written to --json/--csv.
OK, IMPROVED, REGRESSION, WRONG, NOT_COMPARABLE = "ok", "improved", "regression", "wrong", "not_comparable"
WITHIN_NOISE, HOST_COST = "within_noise", "host_cost"  # slower than the threshold, but not beyond the noise / host cost
FAILING_STATUSES = (REGRESSION, WRONG)
ALL_STATUSES = (REGRESSION, WRONG, IMPROVED, OK, WITHIN_NOISE, HOST_COST, NOT_COMPARABLE)
TINY_BUSBW = 0.05  # GB/s: printed with two decimals it keeps no digit worth a ratio
CPU_BACKENDS = ("gloo",)  # the host runs the collective itself: every row is level-noisy (results.noise)

# Ratios exactly at the threshold (0.95 for 5%) must not flip on float rounding.
_RATIO_EPSILON = 1e-9


@dataclass(frozen=True)
class Metric:
    name: str
    column: str
    unit: str
    higher_is_better: bool


METRICS = {
    "busbw": Metric("busbw", "busbw_gbps", "GB/s", True),
    "time": Metric("time", "time_us", "us", False),
}


def parse_threshold(text: str | float) -> float:
    """Allowed relative change as a fraction: '5%' -> 0.05, '0.05' -> 0.05.

    A bare number is a fraction and must be below 1: '5' is refused rather than guessed
    (5% or 500%?). Raises ValueError."""
    raw = str(text).strip()
    try:
        if raw.endswith("%"):
            value = float(raw[:-1]) / 100.0
        else:
            value = float(raw)
            if value >= 1:
                raise ValueError(
                    f"threshold {raw!r} is ambiguous: write {raw}% for percent, or a fraction below 1 such as 0.05"
                )
    except ValueError as exc:
        if "ambiguous" in str(exc):
            raise
        raise ValueError(f"cannot read threshold {raw!r} (use e.g. 5% or 0.05)") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"threshold must be a non-negative percentage or fraction, got {raw!r}")
    return value


# ---------------------------------------------------------------------------
# Comparison logic (no I/O)
# ---------------------------------------------------------------------------

@dataclass
class Comparison:
    """BASE vs one NEW file: one row per matched key, plus what did not match."""

    base_label: str
    base_source: str
    new_label: str
    new_source: str
    metric: Metric
    threshold: float
    rows: pd.DataFrame          # MATCH_KEYS + base, new, ratio, change_pct, new_nwrong, status
    base_unmatched: int
    new_unmatched: int
    new_unmatched_wrong: int    # NEW rows with wrong results that BASE lacks: still failures
    notes: list[str] = field(default_factory=list)

    def count(self, status: str) -> int:
        return int((self.rows["status"] == status).sum())

    def unmeasured_reasons(self) -> list[str]:
        """Why the not-comparable rows have no ratio, each reason once."""
        return list(dict.fromkeys(self.rows.loc[self.rows["status"] == NOT_COMPARABLE, "noise"]))

    @property
    def failed(self) -> bool:
        return any(self.count(status) for status in FAILING_STATUSES) or self.new_unmatched_wrong > 0

    def summary(self) -> dict:
        return {
            "matched": len(self.rows),
            **{status: self.count(status) for status in ALL_STATUSES},
            "base_unmatched": self.base_unmatched,
            "new_unmatched": self.new_unmatched,
            "new_unmatched_wrong": self.new_unmatched_wrong,
        }


def _comparable_rows(frame: pd.DataFrame, role: str, notes: list[str]) -> tuple[pd.DataFrame, dict]:
    """Rows worth comparing: size 0 dropped (its time is launch overhead only), one row per
    key (the last of repeats), and each key's noise.Side with every repeat's samples pooled."""
    frame = frame[frame["size_bytes"] > 0]
    repeated = int(frame.duplicated(MATCH_KEYS, keep="last").sum())
    sides = _sides(frame)
    if repeated:
        notes.append(f"{role} holds {repeated} repeated measurement(s) of the same row; the last of each is used, "
                     "and the samples of all of them are its noise")
        frame = frame.drop_duplicates(MATCH_KEYS, keep="last")
    if "complete" in frame.columns and (frame["complete"].astype(str).str.lower() == "false").any():
        notes.append(f"{role} is marked incomplete (the run stopped early)")
    if not any(side.has_summary for side in sides.values()):
        notes.append(f"{role} carries no noise (nccl-tests output, or a file written before ncclbench recorded it): "
                     "its rows are judged by the threshold alone")
    return frame, sides


def _sides(frame: pd.DataFrame) -> dict:
    """{MATCH_KEYS values: noise.Side}, repeats of a key pooled (headline time: the last)."""
    host_possible = pd.Series(False, index=frame.index)
    if "backend" in frame.columns and "mode" in frame.columns:
        host_possible = (frame["backend"].astype(str) == "nccl") & (frame["mode"].astype(str) == "eager")
    on_host = pd.Series(False, index=frame.index)
    if "backend" in frame.columns:
        on_host = frame["backend"].astype(str).isin(CPU_BACKENDS)
    columns = {c: frame[c] if c in frame.columns else pd.Series(math.nan, index=frame.index, dtype=object)
               for c in ("host_us", "noise_samples_us", "noise_run_medians_us", "noise_run_fastest_us",
                         *noise.CSV_COLUMNS)}
    sides: dict[tuple, list] = {}
    for i, key in zip(frame.index, frame[MATCH_KEYS].itertuples(index=False, name=None)):
        summary = {k: _float(columns[c][i]) for k, c in zip(noise.SUMMARY_KEYS, noise.CSV_COLUMNS)}
        samples = columns["noise_samples_us"][i]
        medians = columns["noise_run_medians_us"][i]
        fastest = columns["noise_run_fastest_us"][i]
        sides.setdefault(key, []).append(noise.Side(
            time_us=_float(frame.at[i, "time_us"]),
            samples_us=tuple(samples) if isinstance(samples, tuple) else (),
            summary=summary if not math.isnan(summary["median_us"]) else None,
            run_medians_us=tuple(medians) if isinstance(medians, tuple) else (),
            run_fastest_us=tuple(fastest) if isinstance(fastest, tuple) else (),
            host_us=_float(columns["host_us"][i]), host_bound_possible=bool(host_possible[i]),
            on_host=bool(on_host[i]), size_bytes=int(key[MATCH_KEYS.index("size_bytes")])))
    out = {}
    for key, group in sides.items():
        if len(group) == 1:
            out[key] = group[0]
        else:
            one = noise.pooled(group)
            one.time_us, one.host_us = group[-1].time_us, group[-1].host_us
            out[key] = one
    for part in _by_collective(out):
        level = noise.level_spread(part)
        for side in part:
            side.level = level
    return out


def _by_collective(sides: dict) -> list[list]:
    """The sides of each (collective, dtype, op, root): one sweep's rows."""
    groups: dict[tuple, list] = {}
    for key, side in sides.items():
        groups.setdefault(key[:4], []).append(side)
    return list(groups.values())


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _setup_differences(base: pd.DataFrame, new: pd.DataFrame) -> list[str]:
    """Notes on how the two runs were set up differently (a legitimate comparison, but worth saying)."""
    notes = []
    for column in ("ranks", "nodes", "gpu", "backend", "mode", "nccl_version"):
        if column in base.columns and column in new.columns:
            before = sorted(set(base[column].dropna().astype(str)))
            after = sorted(set(new[column].dropna().astype(str)))
            if before and after and before != after:
                notes.append(f"BASE and NEW differ in {column}: {', '.join(before)} vs {', '.join(after)}")
    return notes


def path_change(base: pd.DataFrame, new: pd.DataFrame) -> str | None:
    """`NCCL path changed: baseline NET/IB/GDRDMA, now NET/Socket`, when both runs' JSON named
    the path NCCL's log showed and the two differ (in transports, or in network, GDR, PXN,
    channels, NVLS); None otherwise."""
    for column in ("nccl_path", "nccl_path_facts"):
        if column not in base.columns or column not in new.columns:
            return None
        before = sorted(set(base[column].dropna().astype(str)) - {""})
        after = sorted(set(new[column].dropna().astype(str)) - {""})
        if column == "nccl_path_facts" and not _facts_differ(before, after):
            continue
        if before and after and before != after:
            what = "" if column == "nccl_path" else f"{_first(base, 'nccl_path')}: "
            return f"NCCL path changed: {what}baseline {' | '.join(before)}, now {' | '.join(after)}"
    return None


def _facts_differ(before: list[str], after: list[str]) -> bool:
    """Whether a fact both sides name has another value (`GDR 1` vs `GDR 0`, `24 channels` vs
    `4 channels`). A fact one side does not name is unknown there, not changed: some facts
    are printed only for a communicator that connected rings (docs/design/path-connection-lines.md)."""
    def facts(texts: list[str]) -> dict:
        out: dict = {}
        for text in texts:
            for item in (part.strip() for part in text.split(",")):
                if not item:
                    continue
                if item.endswith(" channels"):
                    key, value = "channels", item.split()[0]
                else:
                    key, _, value = item.partition(" ")
                out.setdefault(key, set()).add(value)
        return out

    old, now = facts(before), facts(after)
    return any(old[k] != now[k] for k in old.keys() & now.keys())


def _rank_difference(base: pd.DataFrame, new: pd.DataFrame) -> str:
    """"" on one rank count on both sides (or unknown): time and busbw then say the same;
    else "BASE 8 vs NEW 2 ranks"."""
    if "ranks" not in base.columns or "ranks" not in new.columns:
        return ""
    before, after = set(base["ranks"].dropna()), set(new["ranks"].dropna())
    if not before or not after or before == after:
        return ""
    return f"BASE {'/'.join(f'{v:g}' for v in sorted(before))} vs NEW {'/'.join(f'{v:g}' for v in sorted(after))} ranks"


def _unmeasured(record: dict, metric: Metric, ranks: str) -> str:
    """Why a row has no NEW/BASE ratio, named as it is (shown with the row and in the summary)."""
    for side in ("BASE", "NEW"):
        if not record[side.lower()] > 0:
            return f"{side} {metric.name} 0 or N/A"
    tiny = " and ".join(side for side in ("BASE", "NEW") if record[side.lower()] < TINY_BUSBW)
    if ranks:
        return (f"busbw below {TINY_BUSBW} GB/s in {tiny}, and the rank counts differ ({ranks}), "
                "so time cannot stand in for it")
    return f"busbw below {TINY_BUSBW} GB/s in {tiny} and no time to judge by"


def _judge_row(record: dict, base: noise.Side, new: noise.Side, metric: Metric, threshold: float,
               ranks: str) -> tuple[str, float, str, bool]:
    """(status, NEW/BASE of the metric, how the noise was judged (or why the row cannot be
    judged), host-bound) of one row; `ranks` is "" on one rank count, else "BASE n vs NEW m"."""
    measured = record["base"] > 0 and record["new"] > 0  # a busbw of 0 (one rank, or 0.00 printed) or N/A: no ratio
    if measured and not ranks and base.time_us > 0 and new.time_us > 0:
        slowdown = new.time_us / base.time_us  # full precision in JSON, never a busbw rounded to 0.00
        ratio = slowdown if not metric.higher_is_better else 1 / slowdown
    elif measured and (not metric.higher_is_better or min(record["base"], record["new"]) >= TINY_BUSBW):
        ratio = record["new"] / record["base"]
    elif record["new_nwrong"] > 0:
        return WRONG, math.nan, "", False
    else:
        return NOT_COMPARABLE, math.nan, _unmeasured(record, metric, ranks), False
    if record["new_nwrong"] > 0:
        return WRONG, ratio, "", False
    if metric.higher_is_better:
        worse, better = ratio < 1 - threshold - _RATIO_EPSILON, ratio > 1 + threshold + _RATIO_EPSILON
        time_threshold = 1 / (1 - threshold) - 1 if threshold < 1 else math.inf  # the same line in time
    else:
        worse, better = ratio > 1 + threshold + _RATIO_EPSILON, ratio < 1 - threshold - _RATIO_EPSILON
        time_threshold = threshold
    if better:
        return IMPROVED, ratio, "", False
    if not worse:
        return OK, ratio, "", new.host_bound or base.host_bound
    verdict = noise.judge(base, new, time_threshold)
    if verdict.slower:
        return REGRESSION, ratio, f"{verdict.basis}: {verdict.detail}", verdict.host_bound
    status = HOST_COST if verdict.basis == "host cost" else WITHIN_NOISE
    return status, ratio, f"{verdict.basis}: {verdict.detail}", verdict.host_bound


def compare_frames(base: pd.DataFrame, new: pd.DataFrame, metric: str = "busbw", threshold: float = 0.05) -> Comparison:
    """Compare two single-file frames (as read_results returns them)."""
    chosen = METRICS[metric]
    notes: list[str] = []
    notes.extend(_setup_differences(base, new))
    path_note = path_change(base, new)
    base_rows, base_sides = _comparable_rows(base, "BASE", notes)
    new_rows, new_sides = _comparable_rows(new, "NEW", notes)
    left = base_rows[MATCH_KEYS + [chosen.column]].rename(columns={chosen.column: "base"})
    left["_base_order"] = range(len(left))
    right = new_rows[MATCH_KEYS + [chosen.column, "nwrong"]]
    right = right.rename(columns={chosen.column: "new", "nwrong": "new_nwrong"})
    merged = left.merge(right, on=MATCH_KEYS, how="outer", indicator=True)
    matched = merged[merged["_merge"] == "both"].drop(columns="_merge")
    new_only = merged[merged["_merge"] == "right_only"]

    ranks = _rank_difference(base_rows, new_rows)
    judged = []
    for record in matched.assign(new_nwrong=matched["new_nwrong"].fillna(0)).to_dict("records"):
        key = tuple(record[k] for k in MATCH_KEYS)
        judged.append(_judge_row(record, base_sides[key], new_sides[key], chosen, threshold, ranks))
    status, ratio, noise_text, host_bound = (list(column) for column in zip(*judged)) if judged else ([], [], [], [])
    ratio = pd.Series(ratio, index=matched.index, dtype=float)
    matched = matched.assign(ratio=ratio, change_pct=(ratio - 1) * 100, status=status, noise=noise_text,
                             host_bound=host_bound)
    # Out-of-place block first, then in-place, each in BASE's own row order (nccl-tests' order).
    matched = matched.assign(_placement_order=matched["placement"].map(PLACEMENTS.index))
    matched = matched.sort_values(["_placement_order", "_base_order"], kind="stable").reset_index(drop=True)
    if path_note:  # first of the notes: the likeliest cause of any change in the numbers
        regressed = (matched["status"] == REGRESSION).any()
        notes.insert(0, path_note + (" (the likely cause of the regression)" if regressed else ""))
    return Comparison(
        base_label=_first(base, "label"),
        base_source=_first(base, "source"),
        new_label=_first(new, "label"),
        new_source=_first(new, "source"),
        metric=chosen,
        threshold=threshold,
        rows=matched[MATCH_KEYS + ["base", "new", "ratio", "change_pct", "new_nwrong", "status", "noise",
                                   "host_bound"]],
        base_unmatched=int((merged["_merge"] == "left_only").sum()),
        new_unmatched=len(new_only),
        new_unmatched_wrong=int((new_only["new_nwrong"].fillna(0) > 0).sum()),
        notes=notes,
    )


def _first(frame: pd.DataFrame, column: str) -> str:
    return str(frame[column].iloc[0]) if len(frame) else ""


# ---------------------------------------------------------------------------
# Machine-readable output (--json, --csv)
# ---------------------------------------------------------------------------

def _clean(value):
    """JSON-safe scalar: numpy types to Python, NaN to null."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def comparisons_to_frame(comparisons: Sequence[Comparison]) -> pd.DataFrame:
    """All compared rows, one per NEW file x key, labelled: the --csv output."""
    frames = []
    for c in comparisons:
        frame = c.rows.rename(columns={"base": "base_value", "new": "new_value"})
        frame.insert(0, "metric", c.metric.name)
        frame.insert(0, "new_source", c.new_source)
        frame.insert(0, "new_label", c.new_label)
        frame.insert(0, "base_label", c.base_label)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def comparisons_to_json(comparisons: Sequence[Comparison], filters: dict) -> dict:
    """The --json document: settings, overall verdict, and per NEW file a summary and rows."""
    first = comparisons[0]
    return {
        "metric": first.metric.name,
        "unit": first.metric.unit,
        "higher_is_better": first.metric.higher_is_better,
        "threshold": first.threshold,
        "filters": filters,
        "base": {"label": first.base_label, "source": first.base_source},
        "passed": not any(c.failed for c in comparisons),
        "comparisons": [
            {
                "new": {"label": c.new_label, "source": c.new_source},
                "passed": not c.failed,
                "summary": c.summary(),
                "notes": c.notes,
                "rows": [
                    {key: _clean(value) for key, value in record.items()}
                    for record in c.rows.rename(columns={"base": "base_value", "new": "new_value"}).to_dict("records")
                ],
            }
            for c in comparisons
        ],
    }


# ---------------------------------------------------------------------------
# Human-readable output
# ---------------------------------------------------------------------------

_STATUS_TEXT = {OK: "ok", IMPROVED: "improved", REGRESSION: "REGRESSION", WRONG: "WRONG RESULTS", NOT_COMPARABLE: "n/a",
                WITHIN_NOISE: "ok: slower, within noise", HOST_COST: "ok: slower host"}
_STATUS_STYLE = {IMPROVED: "green", REGRESSION: "bold red", WRONG: "bold red", NOT_COMPARABLE: "dim",
                 WITHIN_NOISE: "yellow", HOST_COST: "yellow"}
_KEY_COLUMNS = ("collective", "dtype", "op", "root", "placement")  # MATCH_KEYS but size, in display order


@dataclass
class _DisplayTable:
    """What both the plain and the rich renderer print for one Comparison."""

    title: list[str]        # lines above the table
    headers: list[str]
    right_aligned: list[bool]
    cells: list[list[str]]
    statuses: list[str]
    footer: list[str]       # verdict and notes


def _rule_text(c: Comparison) -> str:
    if c.metric.higher_is_better:
        return f"regression when NEW/BASE < {1 - c.threshold:.3g} and beyond the noise"
    return f"regression when NEW/BASE > {1 + c.threshold:.3g} and beyond the noise"


def _value_text(value) -> str:
    """Two decimals, as the tables print; small values keep three significant digits."""
    if pd.isna(value):
        return "N/A"
    return f"{value:.2f}" if abs(value) >= 1 or value == 0 else f"{value:.3g}"


def _status_cell(record: dict) -> str:
    status = _STATUS_TEXT[record["status"]]
    if record["status"] == WRONG:
        status += f" (#wrong {record['new_nwrong']:g})"
    if record.get("host_bound"):
        status += " [host-bound]"
    if record.get("noise") and record["status"] in (REGRESSION, WITHIN_NOISE, HOST_COST, NOT_COMPARABLE):
        status += f" ({record['noise']})"
    return status


def _display_table(c: Comparison) -> _DisplayTable:
    rows = c.rows
    # Key columns with one value throughout go into the title instead of every line.
    varying = [k for k in _KEY_COLUMNS if rows[k].nunique() > 1]
    common = [f"{k}={rows[k].iloc[0]}" for k in _KEY_COLUMNS if k not in varying and len(rows)]
    direction = "higher is better" if c.metric.higher_is_better else "lower is better"
    title = [
        f"BASE  {c.base_label}  ({c.base_source})",
        f"NEW   {c.new_label}  ({c.new_source})",
        f"{c.metric.name} in {c.metric.unit} ({direction}); threshold {c.threshold * 100:g}%: {_rule_text(c)}",
    ]
    if common:
        title.append("rows: " + " ".join(common))
    headers = varying + ["size", "BASE", "NEW", "NEW/BASE", "change", "status"]
    right = [False] * len(varying) + [True] * 5 + [False]
    cells = []
    for record in rows.to_dict("records"):
        ratio = record["ratio"]
        cells.append([str(record[k]) for k in varying] + [
            format_size(int(record["size_bytes"])),
            _value_text(record["base"]),
            _value_text(record["new"]),
            "n/a" if pd.isna(ratio) else f"{ratio:.3f}",
            "" if pd.isna(ratio) else f"{round(record['change_pct'], 1) + 0.0:+.1f}%",  # + 0.0: no "-0.0%"
            _status_cell(record),
        ])
    return _DisplayTable(title, headers, right, cells, list(rows["status"]), _footer(c))


def _footer(c: Comparison) -> list[str]:
    s = c.summary()
    verdict = "FAIL" if c.failed else "PASS"
    counts = [f"{s[REGRESSION]} regression(s)", f"{s[WRONG]} with wrong results"]
    counts += [f"{s[IMPROVED]} improved"] if s[IMPROVED] else []
    counts += [f"{s[OK]} ok"]
    counts += [f"{s[WITHIN_NOISE]} slower within noise"] if s[WITHIN_NOISE] else []
    counts += [f"{s[HOST_COST]} slower with the host's cost per call"] if s[HOST_COST] else []
    counts += [f"{s[NOT_COMPARABLE]} not comparable ({'; '.join(c.unmeasured_reasons())})"] if s[NOT_COMPARABLE] else []
    lines = [f"{verdict}: {', '.join(counts)}, of {s['matched']} matched rows"]
    if c.base_unmatched or c.new_unmatched:
        lines.append(f"note: {c.base_unmatched} BASE row(s) and {c.new_unmatched} NEW row(s) had no match")
    if c.new_unmatched_wrong:
        lines.append(
            f"note: NEW reports wrong results in {c.new_unmatched_wrong} row(s) that BASE lacks: counted as failures"
        )
    if c.rows["host_bound"].any():
        lines.append("note: [host-bound] rows ran their fastest iterations within 1.2 x the host's cost per call "
                     "(eager torch NCCL): "
                     "they are judged against that cost; -G (CUDA graphs) or --backend cupy time the collective")
    lines.extend(f"note: {n}" for n in c.notes)
    return lines


def format_plain(c: Comparison) -> str:
    table = _display_table(c)
    widths = [max([len(h)] + [len(row[i]) for row in table.cells]) for i, h in enumerate(table.headers)]

    def line(values):
        parts = [v.rjust(w) if r else v.ljust(w) for v, w, r in zip(values, widths, table.right_aligned)]
        return "  ".join(parts).rstrip()

    body = [line(table.headers)] + [line(row) for row in table.cells]
    return "\n".join(table.title + [""] + body + [""] + table.footer)


def print_rich(c: Comparison, console) -> None:
    from rich.table import Table

    table = _display_table(c)
    for text in table.title:
        console.print(text, highlight=False, markup=False)
    grid = Table(show_edge=False, header_style="bold")
    for header, right in zip(table.headers, table.right_aligned):
        grid.add_column(header, justify="right" if right else "left")
    for cells, status in zip(table.cells, table.statuses):
        grid.add_row(*cells, style=_STATUS_STYLE.get(status))
    console.print(grid)
    for i, text in enumerate(table.footer):
        style = ("bold red" if c.failed else "bold green") if i == 0 else None
        console.print(text, style=style, highlight=False, markup=False)


# ---------------------------------------------------------------------------
# Input reading shared with `plot`
# ---------------------------------------------------------------------------

def read_inputs(paths: Sequence[str], labels: Sequence[str]) -> list[pd.DataFrame]:
    """One frame per path (read_results), with every failure turned into a one-line BadInput."""
    if labels and len(labels) != len(paths):
        raise BadInput(f"--label given {len(labels)} time(s) for {len(paths)} file(s); give one per file or none")
    chosen = list(labels) if labels else default_labels(paths)
    frames = []
    for path, label in zip(paths, chosen):
        try:
            frames.append(read_results(path, label))
        except ResultsFormatError as exc:
            raise BadInput(str(exc)) from None
        except OSError as exc:
            raise BadInput(f"{path}: cannot read: {exc.strerror or exc}") from None
    return frames
