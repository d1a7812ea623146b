"""Performance regressions between result files (`ncclbench compare BASE NEW [NEW...]`).

Rows are matched on (collective, dtype, op, root, size, placement); for each match the
ratio NEW/BASE of the chosen metric decides: busbw regresses when the ratio falls below
1 - threshold, time when it rises above 1 + threshold. A matched row whose NEW run
reports wrong results (#wrong > 0) is a failure whatever its speed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ncclbench.errors import BadInput
from ncclbench.lazy import lazy_import
from ncclbench.results.readers import PLACEMENTS, ResultsFormatError, default_labels, read_results
from ncclbench.sizes import format_size

np = lazy_import("numpy")
pd = lazy_import("pandas")  # imported when results are read, not when the CLI starts

MATCH_KEYS = ["collective", "dtype", "op", "root", "size_bytes", "placement"]

# Row statuses, as written to --json/--csv.
OK, IMPROVED, REGRESSION, WRONG, NOT_COMPARABLE = "ok", "improved", "regression", "wrong", "not_comparable"
FAILING_STATUSES = (REGRESSION, WRONG)

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

    @property
    def failed(self) -> bool:
        return any(self.count(status) for status in FAILING_STATUSES) or self.new_unmatched_wrong > 0

    def summary(self) -> dict:
        return {
            "matched": len(self.rows),
            **{status: self.count(status) for status in (REGRESSION, WRONG, IMPROVED, OK, NOT_COMPARABLE)},
            "base_unmatched": self.base_unmatched,
            "new_unmatched": self.new_unmatched,
            "new_unmatched_wrong": self.new_unmatched_wrong,
        }


def _comparable_rows(frame: pd.DataFrame, role: str, notes: list[str]) -> pd.DataFrame:
    """Rows worth comparing: size 0 dropped (its time is launch overhead only), one row per key."""
    frame = frame[frame["size_bytes"] > 0]
    repeated = int(frame.duplicated(MATCH_KEYS, keep="last").sum())
    if repeated:
        notes.append(f"{role} holds {repeated} repeated measurement(s) of the same row; the last of each is used")
        frame = frame.drop_duplicates(MATCH_KEYS, keep="last")
    if "complete" in frame.columns and (frame["complete"].astype(str).str.lower() == "false").any():
        notes.append(f"{role} is marked incomplete (the run stopped early)")
    return frame


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
        if before and after and before != after:
            what = "" if column == "nccl_path" else f"{_first(base, 'nccl_path')}: "
            return f"NCCL path changed: {what}baseline {' | '.join(before)}, now {' | '.join(after)}"
    return None


def _classify(ratio: pd.Series, new_nwrong: pd.Series, metric: Metric, threshold: float) -> np.ndarray:
    if metric.higher_is_better:
        worse = ratio < 1 - threshold - _RATIO_EPSILON
        better = ratio > 1 + threshold + _RATIO_EPSILON
    else:
        worse = ratio > 1 + threshold + _RATIO_EPSILON
        better = ratio < 1 - threshold - _RATIO_EPSILON
    return np.select(
        [new_nwrong.fillna(0) > 0, ratio.isna(), worse, better],
        [WRONG, NOT_COMPARABLE, REGRESSION, IMPROVED],
        default=OK,
    )


def compare_frames(base: pd.DataFrame, new: pd.DataFrame, metric: str = "busbw", threshold: float = 0.05) -> Comparison:
    """Compare two single-file frames (as read_results returns them)."""
    chosen = METRICS[metric]
    notes: list[str] = []
    notes.extend(_setup_differences(base, new))
    path_note = path_change(base, new)
    base_rows = _comparable_rows(base, "BASE", notes)
    new_rows = _comparable_rows(new, "NEW", notes)
    left = base_rows[MATCH_KEYS + [chosen.column]].rename(columns={chosen.column: "base"})
    left["_base_order"] = range(len(left))
    right = new_rows[MATCH_KEYS + [chosen.column, "nwrong"]]
    right = right.rename(columns={chosen.column: "new", "nwrong": "new_nwrong"})
    merged = left.merge(right, on=MATCH_KEYS, how="outer", indicator=True)
    matched = merged[merged["_merge"] == "both"].drop(columns="_merge")
    new_only = merged[merged["_merge"] == "right_only"]

    # A BASE of 0 (busbw printed as 0.00 for tiny sizes) gives no meaningful ratio.
    ratio = (matched["new"] / matched["base"]).where(matched["base"] > 0)
    matched = matched.assign(
        ratio=ratio,
        change_pct=(ratio - 1) * 100,
        status=_classify(ratio, matched["new_nwrong"], chosen, threshold),
    )
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
        rows=matched[MATCH_KEYS + ["base", "new", "ratio", "change_pct", "new_nwrong", "status"]],
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

_STATUS_TEXT = {OK: "ok", IMPROVED: "improved", REGRESSION: "REGRESSION", WRONG: "WRONG RESULTS", NOT_COMPARABLE: "n/a"}
_STATUS_STYLE = {IMPROVED: "green", REGRESSION: "bold red", WRONG: "bold red", NOT_COMPARABLE: "dim"}
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
        return f"regression when NEW/BASE < {1 - c.threshold:.3g}"
    return f"regression when NEW/BASE > {1 + c.threshold:.3g}"


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
        status = _STATUS_TEXT[record["status"]]
        if record["status"] == WRONG:
            status += f" (#wrong {record['new_nwrong']:g})"
        cells.append([str(record[k]) for k in varying] + [
            format_size(int(record["size_bytes"])),
            "N/A" if pd.isna(record["base"]) else f"{record['base']:.2f}",
            "N/A" if pd.isna(record["new"]) else f"{record['new']:.2f}",
            "n/a" if pd.isna(ratio) else f"{ratio:.3f}",
            "" if pd.isna(ratio) else f"{round(record['change_pct'], 1) + 0.0:+.1f}%",  # + 0.0: no "-0.0%"
            status,
        ])
    return _DisplayTable(title, headers, right, cells, list(rows["status"]), _footer(c))


def _footer(c: Comparison) -> list[str]:
    s = c.summary()
    verdict = "FAIL" if c.failed else "PASS"
    counts = [f"{s[REGRESSION]} regression(s)", f"{s[WRONG]} with wrong results"]
    counts += [f"{s[IMPROVED]} improved"] if s[IMPROVED] else []
    counts += [f"{s[OK]} ok"]
    counts += [f"{s[NOT_COMPARABLE]} not comparable (BASE value 0 or N/A)"] if s[NOT_COMPARABLE] else []
    lines = [f"{verdict}: {', '.join(counts)}, of {s['matched']} matched rows"]
    if c.base_unmatched or c.new_unmatched:
        lines.append(f"note: {c.base_unmatched} BASE row(s) and {c.new_unmatched} NEW row(s) had no match")
    if c.new_unmatched_wrong:
        lines.append(
            f"note: NEW reports wrong results in {c.new_unmatched_wrong} row(s) that BASE lacks: counted as failures"
        )
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
