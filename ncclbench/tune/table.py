"""The text `tune` prints on stdout: per collective and size NCCL's default and its choice,
the best forced combination, the gain and whether it rises above the noise; then what
happened to each combination and the size ranges won. Pure formatting."""

from __future__ import annotations

from ncclbench.sizes import format_size
from ncclbench.tune.precision import precision_line
from ncclbench.tune.ranges import Range, Verdict

COLUMNS = (f"# {'size':>8s} {'default':>9s} {'noise':>7s}  {'NCCL chose':<18s} {'best forced':<18s} "
           f"{'busbw':>9s} {'gain':>8s}  {'win':<4s} why")


def setting_text(setting: tuple | None) -> str:
    if not setting:
        return "N/A"
    algo, proto, channels = setting
    return f"{algo or '?'}/{proto or '?'}" + (f" ch{channels}" if channels else "")


def gbps_text(series) -> str:
    """A median busbw in 9 columns: N/A where the cell was not measured."""
    if series is None:
        return f"{'-':>9s}"
    return f"{series.median:9.2f}" if series.measured else f"{'N/A':>9s}"


def verdict_line(v: Verdict) -> str:
    noise = f"{v.noise_pct:.1f}%" if v.noise_pct is not None else "N/A"
    best = v.best or "-"
    busbw = gbps_text(v.best_series)
    gain = f"{v.gain_pct:+7.1f}%" if v.gain_pct is not None else f"{'-':>8s}"
    win = {True: "yes", False: "no", None: "-"}[v.win]
    why = f"{v.why}; {v.confirmation}" if v.win and v.confirmation else v.why
    return (f"  {format_size(v.size):>8s} {gbps_text(v.default)} {noise:>7s}  {setting_text(v.default.setting):<18s} "
            f"{best:<18s} {busbw} {gain}  {win:<4s} {why}")


def range_text(r: Range) -> str:
    span = f"{format_size(min(r.sizes))}-{format_size(max(r.sizes))}" if len(r.sizes) > 1 else format_size(r.sizes[0])
    low, high = f"{min(r.gains):+.1f}", f"{max(r.gains):+.1f}"
    gains = f"{low} %" if low == high else f"{low} .. {high} %"
    what = r.label if setting_text(r.setting) == r.label else f"{setting_text(r.setting)} ({r.label})"
    text = f"{what} wins at {span} (config {r.min_bytes}-{r.max_bytes} B): {gains}"
    said = [f"{format_size(size)} {c}" for size, c in zip(r.sizes, r.confirmations) if c]
    return text + (f"; {', '.join(said)}" if said else "")


def collective_lines(title: str, header: list[str], verdicts: list[Verdict], combo_lines: list[str],
                     ranges: list[Range], notes: list[str], rule: str, config: list[str] = ()) -> list[str]:
    lines = [f"# {title}"] + [f"# {h}" for h in header]
    lines.append(f"# rule: {rule}")
    lines.append("#")
    if verdicts:
        lines.append(COLUMNS)
        lines += [verdict_line(v) for v in verdicts]
    else:
        lines.append("#   no measurement of NCCL's default to compare with")
    lines.append("# combinations:")
    lines += [f"#   {c}" for c in combo_lines]
    lines.append("# size ranges where a forced combination wins (each confirmed by a second launch):")
    lines += [f"#   {range_text(r)}" for r in ranges] or ["#   none"]
    summary = precision_line(verdicts)
    if summary:
        lines.append(f"# {summary}")
    lines.append("# tuner config (nccl_tuner.conf; the plugin applies the first row that matches):")
    lines += [f"#   {c}" for c in config] or ["#   none"]
    lines += [f"# note: {n}" for n in notes]
    return lines
