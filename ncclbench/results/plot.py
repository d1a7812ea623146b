"""Plots of result files: bus bandwidth and time against message size (`ncclbench plot`).

Uses matplotlib's object API with the Agg renderer (no pyplot, no display, no global
backend switch), so it works headless and inside other programs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from ncclbench.lazy import lazy_import
from ncclbench.sizes import format_size

pd = lazy_import("pandas")  # imported when results are read; matplotlib only when a figure is drawn

OUTPUT_FORMATS = (".png", ".svg", ".pdf")
SERIES_KEYS = ["label", "collective", "dtype", "op", "root", "placement"]

DPI = 100
_PLOTS_SIZE_IN = (10.0, 5.0)      # the two side-by-side subplots
_LEGEND_ROWS = 16                 # entries per legend column before starting another
_LEGEND_CHAR_IN = 0.06            # width of one legend character at fontsize "small"
_LEGEND_MARGIN_IN = 0.6           # line sample, padding and frame of one legend column
_MAX_SIZE_TICKS = 12


def legend_columns(n_entries: int) -> int:
    return max(1, math.ceil(n_entries / _LEGEND_ROWS))


def figure_size_inches(legend_labels: Sequence[str]) -> tuple[float, float]:
    """Plots plus room for the legend on their right, so the legend never gets cut:
    the figure grows wider with longer labels and with more legend columns."""
    longest = max((len(text) for text in legend_labels), default=0)
    column_in = _LEGEND_MARGIN_IN + _LEGEND_CHAR_IN * longest
    return _PLOTS_SIZE_IN[0] + column_in * legend_columns(len(legend_labels)), _PLOTS_SIZE_IN[1]


def _series_name(key: dict, varying: list[str]) -> str:
    """Series legend text: the file label plus whatever else tells the series apart."""
    parts = [str(key["label"])]
    for column in varying:
        if column == "label":
            continue
        value = key[column]
        if column == "root":
            if value >= 0:  # -1 means "no root": nothing worth printing
                parts.append(f"root {value}")
        else:
            parts.append(str(value))
    return " ".join(parts)


def _size_ticks(sizes: pd.Series) -> list[int]:
    """Powers of two spanning the data; every 2nd/5th/10th when there would be too many,
    aligned so that 1K, 1M, 1G are kept where possible."""
    lo = int(math.floor(math.log2(sizes.min())))
    hi = int(math.ceil(math.log2(sizes.max())))
    for step in (1, 2, 5, 10):
        exponents = [e for e in range(lo, hi + 1) if e % step == 0]
        if len(exponents) <= _MAX_SIZE_TICKS:
            break
    return [2**e for e in exponents] or [2**lo]


def _title(rows: pd.DataFrame) -> str:
    parts = []
    for column in ("collective", "dtype", "op", "placement"):
        values = rows[column].unique()
        if len(values) == 1 and not (column == "op" and values[0] == "none"):
            parts.append(str(values[0]))
    return " ".join(parts)


def build_figure(frame: pd.DataFrame, title: str | None = None) -> tuple[Figure, int]:
    """(figure, number of series) with busbw and time vs size for every series in frame.

    One series per (label, collective, dtype, op, root, placement); size-0 rows are left
    out (log axis). Raises ValueError when nothing is left to plot."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogFormatter, NullLocator

    rows = frame[frame["size_bytes"] > 0]
    if rows.empty:
        raise ValueError("no rows with a size above 0 to plot")
    rows = rows[pd.to_numeric(rows["time_us"], errors="coerce").notna()]  # N/A cells: nothing measured
    if rows.empty:
        raise ValueError("every cell left to plot is N/A (one rank on torch's backends has no out-of-place "
                         "call: try --placement in_place)")
    # Repeated measurements of a point (a log holding the same test twice): keep the last.
    rows = rows.drop_duplicates(SERIES_KEYS + ["size_bytes"], keep="last")
    varying = [c for c in SERIES_KEYS if rows[c].nunique() > 1]
    groups = list(rows.groupby(SERIES_KEYS, sort=False))
    peaks = _link_peaks(rows)
    series_names = [_series_name(dict(zip(SERIES_KEYS, key)), varying) for key, _ in groups]
    peak_names = [f"link peak {peak:g} GB/s" + (f" ({label})" if len(peaks) > 1 else "") for label, peak in peaks]

    fig = Figure(figsize=figure_size_inches(series_names + peak_names), dpi=DPI, layout="constrained")
    ax_bw, ax_time = fig.subplots(1, 2)
    for name, (_, series) in zip(series_names, groups):
        series = series.sort_values("size_bytes")
        line, = ax_bw.plot(series["size_bytes"], series["busbw_gbps"], marker="o", markersize=3, label=name)
        ax_time.plot(series["size_bytes"], series["time_us"], marker="o", markersize=3, color=line.get_color())
    for name, (_, peak) in zip(peak_names, peaks):
        ax_bw.axhline(peak, linestyle="--", linewidth=1, color="gray", label=name)

    ticks = _size_ticks(rows["size_bytes"])
    for ax in (ax_bw, ax_time):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _pos: format_size(int(round(value)))))
        ax.set_xlabel("message size")
        ax.grid(True, which="major", alpha=0.3)
    ax_bw.set_ylabel("bus bandwidth (GB/s)")
    ax_bw.set_ylim(bottom=0)
    ax_bw.set_title("Bus bandwidth")
    ax_time.set_ylabel("time (us)")
    ax_time.set_yscale("log")  # times span microseconds to tens of milliseconds
    # Plain numbers (20, 1000) rather than 2x10^1; minor ticks get labels only on short ranges.
    ax_time.yaxis.set_major_formatter(LogFormatter())
    ax_time.yaxis.set_minor_formatter(LogFormatter(minor_thresholds=(2, 0.5)))
    ax_time.set_title("Time")
    suptitle = fig.suptitle(title if title is not None else _title(rows))
    # "outside" puts the legend right of both plots and makes the layout leave room for it.
    handles, labels = ax_bw.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", ncols=legend_columns(len(labels)), fontsize="small")
    # Centre the title over the plots rather than the figure, where a wide legend would
    # run into it: one layout pass tells where the plots ended up.
    fig.draw_without_rendering()
    suptitle.set_x((ax_bw.get_position().x0 + ax_time.get_position().x1) / 2)
    return fig, len(groups)


def plot_results(frame: pd.DataFrame, output: str | Path, title: str | None = None) -> int:
    """Write build_figure(frame) to output (.png, .svg or .pdf, by extension); returns the series count.

    Raises ValueError for an unsupported extension or nothing to plot, OSError when the
    file cannot be written."""
    output = Path(output)
    check_output_name(output)
    fig, count = build_figure(frame, title)
    fig.savefig(output, dpi=DPI)
    return count


def check_output_name(output: str | Path) -> None:
    """ValueError unless the extension names a format plot writes."""
    output = Path(output)
    if output.suffix.lower() not in OUTPUT_FORMATS:
        raise ValueError(f"cannot write {output.name!r}: use a file name ending in {', '.join(OUTPUT_FORMATS)}")


def _link_peaks(rows: pd.DataFrame) -> list[tuple[str, float]]:
    """(label, peak) for each distinct link peak the files report."""
    if "link_peak_gbps" not in rows.columns:
        return []
    peaks = rows[["label", "link_peak_gbps"]].dropna()
    peaks = peaks[pd.to_numeric(peaks["link_peak_gbps"], errors="coerce") > 0]
    peaks = peaks.drop_duplicates("link_peak_gbps")
    return [(str(label), float(peak)) for label, peak in peaks.itertuples(index=False)]
