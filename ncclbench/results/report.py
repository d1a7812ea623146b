"""nccl-tests text layout, line for line, from plain result records.

Extra facts (backend, timing mode, topology, warnings) go on lines starting with `#`,
so scripts written for nccl-tests output read ours unchanged."""

from __future__ import annotations

from ncclbench.results.records import PlacementResult, ResultRow, RunInfo, RunSummary
from ncclbench.startup import summary_line as summary_line_of_startup

_GROUP_PLAIN = "#                                                              out-of-place                       in-place          "
_HEAD_PLAIN = "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong "
_UNITS_PLAIN = "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         "
_GROUP_ITER = ("#                                                                 out-of-place (+ per-iteration)"
               "                                in-place (+ per-iteration)")
_HEAD_ITER = ("#       size         count      type   redop    root     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv%"
              "     time   algbw   busbw  #wrong    i_min    i_max    i_p99    i_cv% ")
_UNITS_ITER = ("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)     (us)     (us)      (%)"
               "     (us)  (GB/s)  (GB/s)             (us)     (us)     (us)      (%) ")


# nccl-tests' header line per -z mode (files written before -z had modes hold only
# blocking_collectives "true", which meant mode 2)
_BLOCKING_LINES = {
    1: "# Blocking Enabled: wait and barrier after each inner iteration (-m) ",
    2: "# Blocking Enabled: wait after each inner iteration (-m), no barrier ",
    3: "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes barrier ",
}


def test_name(collective: str) -> str:
    return f"{collective}_perf"


def fixed_width(value: float, width: int) -> str:
    """A number in exactly `width` characters the way nccl-tests fills its columns: two
    decimals while they fit, then one, then none, then exponent form (time is 7 wide, so
    8.36, 2316.50, 17786.6, 123456, 1.2e+07; bandwidth is 6 wide: 359.54, 1160.8)."""
    digits = 0  # digits before the decimal point (0 below 1, as for 0.05)
    while digits < 40 and value >= 10.0 ** digits:
        digits += 1
    if digits < width - 2:
        return f"{value:{width}.2f}"
    if digits < width - 1:
        return f"{value:{width}.1f}"
    if digits < width + 1:
        return f"{value:{width}.0f}"
    return f"{value:{width}.1e}" if width >= 7 else f"{value:{width}.0e}"


def format_step(info: RunInfo) -> str:
    c = info.config
    if "step_factor" in c:
        f = c["step_factor"]
        return f"{int(f) if float(f).is_integer() else f}(factor)"
    return f"{c['step_bytes']}(bytes)"


def _table_head(per_iter: bool, cputime: bool, timestamps: bool) -> list[str]:
    """The three column-title lines; -C names the time columns `cputime`, -S adds a
    right-aligned `timestamp` title (and its format under it), as nccl-tests does."""
    group, head, units = (_GROUP_ITER, _HEAD_ITER, _UNITS_ITER) if per_iter else (_GROUP_PLAIN, _HEAD_PLAIN, _UNITS_PLAIN)
    if cputime:
        head = head.replace("     time", "  cputime")
    if timestamps:
        head += f"{'timestamp':>19s}"
        units += "  %Y-%m-%d %H:%M:%S"
    return [group, head, units]


def header_lines(info: RunInfo, per_iter: bool = False, skip: int = 0, timestamps: bool = False) -> list[str]:
    c = info.config
    lines = [
        f"# ncclbench version {info.ncclbench_version} torch={info.torch_version} nccl-library={info.nccl_code}",
        f"# Collective test starting: {test_name(info.collective)}",
        f"# nThread 1 nGpus 1 minBytes {c['minimum_bytes']} maxBytes {c['maximum_bytes']} "
        f"step: {format_step(info)} warmup iters: {c['warmup_iters']} iters: {c['iterations']} "
        f"agg iters: {c['aggregated_iterations']} validation: {c['validation']} graph: {c['graph']} unalign: {c.get('unalign', 0)}",
    ]
    blocking = _BLOCKING_LINES.get(c.get("blocking_mode", 2 if c.get("blocking_collectives") == "true" else 0))
    if blocking:
        lines.append(blocking)
    if per_iter:
        lines.append(f"# Per-Iteration Report: {info.timing} timing; i_* uses max over process rows"
                     + (f"; summary skips first {skip} iterations" if skip else "") + " ")
    nodes = len(info.hosts)
    lines.append(f"# Backend: {info.backend} ({info.nccl_text}), timing: {info.mode} ({info.timing}), "
                 f"{info.nranks} ranks on {nodes} node{'s' if nodes != 1 else ''} ({', '.join(info.hosts)})")
    lines.append(f"# NCCL environment: {nccl_environment(info.env)}")
    if info.topology:
        lines.append(f"# Topology: {info.topology}")
    lines.extend(f"# {p}" for p in info.path_lines)
    lines.extend(f"# Note: {n}" for n in info.notes)
    lines += ["#", "# Using devices"]
    for d in info.devices:
        lines.append(f"#  Rank {d.rank:2d} Group {d.group:2d} Pid {d.pid:6d} on {d.hostname:>10s} "
                     f"device {d.device:2d} [{d.device_hex}] {d.device_info}")
    lines.append("#")
    return lines + _table_head(per_iter, info.report_cputime, timestamps)


def nccl_environment(env: list[str]) -> str:
    """The NCCL_* settings the ranks ran with (nccl-tests' own NCCL_TESTS_* are not NCCL's),
    so that two runs are compared knowingly; ncclbench sets none itself."""
    nccl = [e for e in env if e.startswith("NCCL_") and not e.startswith("NCCL_TESTS_")]
    return " ".join(nccl) if nccl else "NCCL defaults (no NCCL_* set)"


def _cell(p: PlacementResult, per_iter: bool) -> str:
    if not p.measured:  # the column's operation was not timed (onerank): no number stands in for it
        return f"  {'N/A':>7s}  {'N/A':>6s}  {'N/A':>6s}  {'N/A':>5s}" + f"  {'N/A':>7s}" * (4 if per_iter else 0)
    wrong = f"  {float(p.nwrong):6g}" if p.nwrong is not None else f"  {'N/A':>5s}"
    text = f"  {fixed_width(p.time_us, 7)}  {fixed_width(p.algbw, 6)}  {fixed_width(p.busbw, 6)}{wrong}"
    if per_iter:
        s = p.per_iter or {}
        for key in ("min_us", "max_us", "p99_us", "cv_pct"):
            text += f"  {fixed_width(s.get(key, float('nan')), 7)}"
    return text


def row_line(row: ResultRow, per_iter: bool = False, timestamp: bool = False) -> str:
    line = f"{row.size:12d}  {row.count:12d}  {row.dtype:>8s}  {row.op:>6s}  {row.root:6d}"
    line += _cell(row.out_of_place, per_iter) + _cell(row.in_place, per_iter)
    if timestamp:  # -S: nccl-tests appends the wall-clock time to each row
        line += f"  {row.timestamp}"
    return line


def trailer_lines(info: RunInfo, summary: RunSummary, peak_line: str | None = None) -> list[str]:
    wrong_cells = summary.wrong_cells
    lines = [
        f"# Out of bounds values : {wrong_cells} {'OK' if wrong_cells == 0 else 'FAILED'}",
        f"# Avg bus bandwidth    : {summary.average_busbw:g} {_average_verdict(info, summary)}",
        f"# Peak bus bandwidth   : {summary.peak_busbw:g} (largest size: {summary.largest_size_busbw:g})",
    ]
    if peak_line:
        lines.append(peak_line)
    lines.extend(bandwidth_gate_lines(info, summary))
    if summary.memory:
        lines.append("# Memory usage (rank 0, MiB): " + ", ".join(f"{k} {v:.1f}" for k, v in summary.memory.items()))
    launch_bound = launch_bound_sizes(info, summary)
    if launch_bound:
        lines.append(
            f"# Warning: at {', '.join(str(s) for s in launch_bound)} B the time is within 20% of the "
            f"host cost per call ({host_cost_us(summary):.1f} us, {info.backend} backend): these rows measure "
            "the launch rate, not the fabric; "
            "use -G <n> (CUDA graphs) or --backend cupy for latency")
    if summary.failing_sizes():
        lines.append(f"# Wrong results at sizes: {', '.join(map(str, summary.failing_sizes()))}")
    for err in summary.errors:
        lines.append(f"# Error: {err}")
    if not summary.complete:
        lines.append(f"# Incomplete run ({summary.status}): {len(summary.rows)} rows finished and kept")
    started = summary_line_of_startup(info.startup)
    if started:
        lines.append(started)
    lines += ["#", f"# Collective test concluded: {test_name(info.collective)}", "#"]
    return lines


def _verdict(ok: bool | None) -> str:
    return "" if ok is None else ("OK" if ok else "FAILED")


def _average_verdict(info: RunInfo, summary: RunSummary) -> str:
    """nccl-tests ends the Avg line with OK / FAILED when NCCL_TESTS_MIN_BW is set, nothing otherwise."""
    return _verdict(summary.average_ok(info.config.get("min_bw", 0.0)))


def bandwidth_gate_lines(info: RunInfo, summary: RunSummary) -> list[str]:
    lines = []
    avg_floor = info.config.get("min_bw", 0.0)
    if avg_floor:
        lines.append(f"# Bandwidth check: average busbw {summary.average_busbw:g} GB/s vs 0.9 x {avg_floor:g} "
                     f"(NCCL_TESTS_MIN_BW / --min-bw): {_average_verdict(info, summary)}")
    peak_floor = info.config.get("min_peak_bw", 0.0)
    if peak_floor:
        lines.append(f"# Bandwidth check: peak busbw {summary.peak_busbw:g} GB/s vs {peak_floor:g} "
                     f"(--min-peak-bw): {_verdict(summary.peak_ok(peak_floor))}")
    return lines


def launch_bound_sizes(info: RunInfo, summary: RunSummary) -> list[int]:
    """Sizes whose eager time is no more than 1.2 x the host time spent issuing each op
    (torch NCCL backend: the GPU then waits for the CPU)."""
    if info.mode != "eager" or info.backend != "nccl":
        return []
    return sorted({r.size for r in summary.rows
                   if r.size and r.out_of_place.measured and 0 < _timed_us(info, r.out_of_place) <= 1.2 * r.out_of_place.host_us})


def _timed_us(info: RunInfo, p: PlacementResult) -> float:
    """The timed (device) duration per op; 0 when unknown (a -C run read back from JSON
    holds only the host time)."""
    if p.device_us is not None:
        return p.device_us
    return 0.0 if info.report_cputime else p.time_us


def host_cost_us(summary: RunSummary) -> float:
    """Median host time per call over the sweep's out-of-place cells."""
    costs = sorted(r.out_of_place.host_us for r in summary.rows if r.size and r.out_of_place.measured)
    return costs[len(costs) // 2] if costs else 0.0
