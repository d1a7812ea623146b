"""Rank 0's report: the nccl-tests text on stdout plus JSON (nccl-tests schema v3), CSV and
the result store. Every finished row reaches stdout and the CSV before the next size
starts, so an interrupted or crashed run leaves valid files with the rows done so far. The
JSON (one document, rewritten whole) follows each row too up to 1000 rows; past that (long
-N 0 soaks) it is rewritten at most about every 20 x its own write time, so the rewrites
take <= ~5 % of the run, and finish() (done, failed, timed out or interrupted) writes it in
full. A file that cannot be written any more (full disk, folder gone) is dropped with one
warning and the sweep goes on; the run then ends as an output error (exit 6)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import stat
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ncclbench import startup
from ncclbench.results import noise, report
from ncclbench.errors import PlanError
from ncclbench.results.records import ResultRow, RunInfo, RunSummary, json_number

CSV_COLUMNS = [
    "timestamp", "collective", "placement", "size_bytes", "count", "dtype", "op", "root",
    "time_us", "algbw_gbps", "busbw_gbps", "nwrong", "ranks", "nodes", "hosts", "gpu", "backend",
    "mode", "torch_version", "nccl_version", "ncclbench_version", "host_us",
    "i_min_us", "i_p50_us", "i_p99_us", "i_max_us", "i_cv_pct", "link_peak_gbps", *noise.CSV_COLUMNS,
]


@dataclass(frozen=True)
class OutputSpec:
    json_path: str | None = None
    csv_path: str | None = None
    results_dir: str | None = None   # None: no result store (--no-save)
    timestamps: bool = False
    per_iter: bool = False
    per_iter_skip: int = 0
    progress: bool = True            # a progress bar on stderr when it is a terminal
    expected_rows: int = 0           # rows the sweep will produce (0: unknown, -N 0)
    metrics_path: str | None = None  # --metrics: Prometheus text of every run of the process
    metrics_merge: bool = False      # keep the file's other series (a suite's later launches)
    command: str = ""                # the command named in the metrics (default: the collective)


class Progress:
    """Sizes done / to do, current size and elapsed time, on stderr, only on a terminal: the
    table on stdout stays byte-for-byte what scripts parse."""

    def __init__(self, total: int, label: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as RichProgress, TextColumn, \
            TimeElapsedColumn
        from rich.console import Console

        self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[size]}"), TimeElapsedColumn(),
                                 console=Console(stderr=True), transient=True)
        self._task = self._bar.add_task(label, total=total or None, size="")
        self._bar.start()

    def advance(self, row: ResultRow) -> None:
        from ncclbench.sizes import format_size

        self._bar.update(self._task, advance=1, size=f"last: {format_size(row.size)} {row.dtype} {row.op}")

    def stop(self) -> None:
        self._bar.stop()


def wants_progress(spec: OutputSpec) -> bool:
    return spec.progress and sys.stderr.isatty() and not os.environ.get("CI")


def default_results_dir() -> str:
    return os.environ.get("NCCLBENCH_RESULTS_DIR", "results")


# ---- checks made before launching ----------------------------------------------------------
def check_writable(path: str, what: str) -> None:
    try:
        _check_writable(path, what)
    except (OSError, RuntimeError) as exc:  # a name too long, a symlink loop (resolve raises RuntimeError)
        raise PlanError(f"cannot write {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _check_writable(path: str, what: str) -> None:
    parent = Path(path).expanduser().resolve().parent
    if not parent.is_dir():
        raise PlanError(f"cannot write {what} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise PlanError(f"cannot write {what} {path}: directory {parent} is not writable")
    if Path(path).is_dir():
        raise PlanError(f"cannot write {what} {path}: it is a directory")
    if is_special(path):  # /dev/null, a pipe: written as it is, nothing created beside it
        try:  # a pipe with no reader refuses at once (ENXIO) rather than blocking the open
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_APPEND))
        except OSError as exc:
            raise PlanError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
        return
    probe_directory(parent, f"cannot write {what} {path}")
    if Path(path).exists():
        try:
            open(path, "a").close()  # opened for appending, nothing written
        except OSError as exc:
            raise PlanError(f"cannot write {what} {path}: {exc.strerror or exc}") from None


def probe_directory(directory, prefix: str) -> None:
    """Create and remove a file there: os.access trusts permission bits, which say yes to
    root on a read-only or pseudo file system (/proc) where creating a file still fails."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".ncclbench-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise PlanError(f"{prefix}: {exc.strerror or exc}") from None


def check_csv_appendable(path: str) -> None:
    """Appending to a CSV with other columns would corrupt it: refuse up front."""
    check_writable(path, "CSV file")
    p = Path(path)
    if p.exists() and p.stat().st_size > 0:
        with open(p, newline="", errors="replace") as f:
            first = f.readline(1 << 16).strip()  # bounded: a binary file may hold no newline
        if first.split(",") != CSV_COLUMNS:
            raise PlanError(f"cannot append to {path}: its columns differ from ncclbench's "
                            "(write to a new file or move the old one away)")


def is_special(path: str) -> bool:
    """An existing file that is not a regular file or a folder (/dev/null, a pipe)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def exclusive_json_path(path: str) -> str:
    """nccl-tests' -J never overwrites: name.0, name.1, ... when the name is taken; a special
    file (/dev/null, a pipe) is written as it is."""
    if not os.path.exists(path) or is_special(path):
        return path
    i = 0
    while os.path.exists(f"{path}.{i}"):
        i += 1
    return f"{path}.{i}"


def store_path(results_dir: str, info: RunInfo) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(results_dir) / f"{stamp}_{info.collective}_{info.nranks}r_{info.backend}"
    candidate, i = f"{base}.json", 1
    while os.path.exists(candidate):
        candidate, i = f"{base}-{i}.json", i + 1
    return candidate


# ---- JSON ------------------------------------------------------------------------------------
def _placement_json(p, cputime: bool) -> dict:
    # as nccl-tests: -C names the time `cpu_time`; an unchecked cell's nwrong is null, and
    # so is every number of a cell printed N/A
    def number(value):
        return value if p.measured else None

    return {"cpu_time" if cputime else "time": number(p.time_us), "alg_bw": number(p.algbw),
            "bus_bw": number(p.busbw), "nwrong": float(p.nwrong) if p.nwrong is not None else None}


def row_json(row: ResultRow, iterations: int, cputime: bool = False) -> dict:
    out = {"size": row.size, "count": row.count, "type": row.dtype, "redop": row.op,
           "root": f"{row.root:6d}"}
    for name, p in row.placements():
        out[name] = _placement_json(p, cputime)
        if p.per_iter is not None:
            out[f"{name}_per_iter"] = p.per_iter
        if p.noise is not None:
            out[f"{name}_noise"] = p.noise
    out["actual_iterations"] = iterations
    out["experiment_name"] = ""
    out["timestamp"] = row.timestamp
    out["host_us"] = {name: p.host_us if p.measured else None for name, p in row.placements()}
    return out


def run_json(info: RunInfo, summary: RunSummary, end_time: str | None) -> dict:
    doc = {
        "version": 3,
        "start_time": info.start_time,
        "args": info.args,
        "env": info.env,
        "nccl_version": info.nccl_code,
        "config": dict(info.config, devices=[vars(d) for d in info.devices]),
        "results": [row_json(r, info.config["iterations"], info.report_cputime) for r in summary.rows],
        "out_of_bounds": {"count": summary.wrong_cells,
                          "okay": "true" if summary.wrong == 0 else "false"},
        "average_bus_bandwidth": {"bandwidth": json_number(summary.average_busbw),
                                  "okay": _okay(summary.bandwidth_ok(info.config.get("min_bw", 0.0),
                                                                     info.config.get("min_peak_bw", 0.0)))},
        "errors": summary.errors or [""],
    }
    if end_time:
        doc["end_time"] = end_time
    doc["ncclbench"] = {
        "collective": info.collective, "backend": info.backend, "mode": info.mode, "timing": info.timing,
        "ranks": info.nranks, "nodes": len(info.hosts), "hosts": info.hosts, "gpu": info.gpu_name,
        "link_peak_gbps": info.link_peak_gbps, "topology": info.topology,
        "nccl_path": info.nccl_path, "path_lines": info.path_lines,
        "torch_version": info.torch_version, "nccl": info.nccl_text,
        "ncclbench_version": info.ncclbench_version, "notes": info.notes, "startup": info.startup,
        "complete": summary.complete, "status": summary.status,
        "peak_bus_bandwidth": summary.peak_busbw, "largest_size_bus_bandwidth": summary.largest_size_busbw,
    }
    repeats = repeat_spread(summary.rows)
    if repeats:
        doc["ncclbench"]["repeats"] = repeats
    return doc


def repeat_spread(rows) -> list[dict]:
    """-N > 1: per row and placement measured more than once, the spread of its headline
    times over the repeats (min, median, max, n), in the order first measured."""
    times: dict[tuple, list[float]] = {}
    for row in rows:
        for name, p in row.placements():
            if p.measured and math.isfinite(p.time_us):
                times.setdefault((row.size, row.dtype, row.op, row.root, name), []).append(p.time_us)
    out = []
    for (size, dtype, op, root, name), values in times.items():
        if len(values) > 1:
            ordered = sorted(values)
            out.append({"size": size, "type": dtype, "redop": op, "root": root, "placement": name,
                        "n": len(values), "min_us": ordered[0], "median_us": noise.quantile(ordered, 0.5),
                        "max_us": ordered[-1]})
    return out


def _okay(flag: bool | None) -> str:
    return "unchecked" if flag is None else ("true" if flag else "false")


def write_json_atomic(path: str, doc: dict) -> None:
    if is_special(path):  # replacing /dev/null by a regular file would break the host
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # a disk that filled up mid-write keeps no half document
        raise


# ---- CSV -------------------------------------------------------------------------------------
def csv_records(info: RunInfo, row: ResultRow) -> list[dict]:
    records = []
    for name, p in row.placements():
        it = p.per_iter or {}
        records.append({
            "timestamp": row.timestamp, "collective": row.collective, "placement": name,
            "size_bytes": row.size, "count": row.count, "dtype": row.dtype, "op": row.op, "root": row.root,
            "time_us": round(p.time_us, 4), "algbw_gbps": round(p.algbw, 4), "busbw_gbps": round(p.busbw, 4),
            "nwrong": p.nwrong, "ranks": info.nranks, "nodes": len(info.hosts), "hosts": ";".join(info.hosts),
            "gpu": info.gpu_name, "backend": info.backend, "mode": info.mode,
            "torch_version": info.torch_version, "nccl_version": info.nccl_text,
            "ncclbench_version": info.ncclbench_version, "host_us": round(p.host_us, 4),
            "i_min_us": it.get("min_us"), "i_p50_us": it.get("p50_us"), "i_p99_us": it.get("p99_us"),
            "i_max_us": it.get("max_us"), "i_cv_pct": it.get("cv_pct"), "link_peak_gbps": info.link_peak_gbps,
            **{column: (p.noise or {}).get(key) for column, key in zip(noise.CSV_COLUMNS, noise.SUMMARY_KEYS)},
        })
    return records


def csv_cell(value) -> str:
    """A CSV field as pandas writes it (missing and NaN empty, floats by repr): the rank
    writes its CSV with the csv module, not pandas, whose import (~0.5 s) would land
    between the first two rows."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return repr(value) if isinstance(value, float) else str(value)


def append_csv(path: str, records: list[dict]) -> None:
    import csv

    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        if new:
            writer.writerow(CSV_COLUMNS)
        for record in records:
            writer.writerow([csv_cell(record.get(column)) for column in CSV_COLUMNS])
        f.flush()
        os.fsync(f.fileno())


# ---- the reporter ------------------------------------------------------------------------------
class Reporter:
    JSON_EVERY_ROW_UP_TO = 1000  # rows: up to here the running JSON is rewritten after every row;
    JSON_SHARE = 0.05            # past it, at most this share of the wall time goes to rewriting it

    def __init__(self, info: RunInfo, spec: OutputSpec, stream=None, peak_line_for=None, clock=time.monotonic,
                 metrics_runs: list | None = None):
        self.info = info
        self.metrics_runs = [] if metrics_runs is None else metrics_runs  # shared by a process's reporters
        if not startup.marked("first_row"):  # the first run of this process: its start-up is news
            info.startup = startup.phases()
        self.clock = clock
        self._json_next = 0.0  # clock value before which a running-JSON rewrite is deferred
        self.spec = spec
        self.stream = stream or sys.stdout
        self.rows: list[ResultRow] = []
        self.peak_line_for = peak_line_for
        self.output_errors: list[str] = []  # result files that failed; the run goes on without them
        self._finishing = threading.Lock()  # the -T watchdog's thread may end the run beside the main one
        self._finished = False
        self.csv_path = spec.csv_path
        self.json_path = exclusive_json_path(spec.json_path) if spec.json_path else None
        self.store_path = None
        if spec.results_dir:
            try:
                os.makedirs(spec.results_dir, exist_ok=True)
                self.store_path = store_path(spec.results_dir, info)
            except OSError as exc:
                self._lost("result store", spec.results_dir, exc)
        if self.json_path:
            self._print(f"# Writing JSON output to {self.json_path}")
            if self.json_path != spec.json_path:  # a CI script reading the name it gave must know
                print(f"ncclbench: {spec.json_path} exists: the JSON goes to {self.json_path} (-J never overwrites)",
                      file=sys.stderr, flush=True)
        self._json_special = bool(self.json_path) and is_special(self.json_path)
        for line in report.header_lines(info, spec.per_iter, spec.per_iter_skip, spec.timestamps):
            self._print(line)
        self._write_running_json()
        self.progress = Progress(spec.expected_rows, info.collective) if wants_progress(spec) else None

    def _print(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def _lost(self, what: str, path: str, exc: OSError) -> None:
        """A result file could not be written (disk full, removed directory, ...): say so once,
        stop writing it, and keep measuring: the table on stdout and the other files still
        get every row, and finish() lists it and makes the exit code non-zero."""
        message = f"cannot write {what} {path}: {exc.strerror or exc}"
        self.output_errors.append(message)
        print(f"ncclbench: warning: {message}; the run goes on without it (stdout keeps every row)",
              file=sys.stderr, flush=True)

    def _write_json(self, summary: RunSummary, end_time: str | None = None) -> None:
        doc = None
        for attr, what in (("json_path", "JSON file"), ("store_path", "result store file")):
            path = getattr(self, attr)
            if path and attr == "json_path" and self._json_special and end_time is None:
                continue  # a pipe or device gets the final document once, not each running rewrite
            if path:
                doc = doc or run_json(self.info, summary, end_time)
                try:
                    write_json_atomic(path, doc)
                except OSError as exc:
                    setattr(self, attr, None)
                    self._lost(what, path, exc)

    def _write_metrics(self, summary: RunSummary, end_time: str) -> None:
        """--metrics: this run and the process's earlier ones (a suite's plans), rewritten whole."""
        if not self.spec.metrics_path:
            return
        from ncclbench.results import metrics

        self.metrics_runs.append(run_json(self.info, summary, end_time))
        try:
            metrics.write_textfile(self.spec.metrics_path,
                                   metrics.sweeps_text(self.spec.command or self.info.collective, self.metrics_runs),
                                   merge=self.spec.metrics_merge)
        except OSError as exc:
            self.output_errors.append(f"cannot write metrics file {self.spec.metrics_path}: {exc.strerror or exc}")
            print(f"ncclbench: warning: {self.output_errors[-1]}", file=sys.stderr, flush=True)

    def _write_running_json(self) -> None:
        if not (self.json_path or self.store_path):
            return
        # A rank killed by its launcher (a lost peer) never reaches finish(): the document is
        # kept current row by row, until it is so long (a -N 0 soak) that rewriting it whole
        # after each row would cost more than the rows; then it is rewritten less often.
        start = self.clock()
        if len(self.rows) > self.JSON_EVERY_ROW_UP_TO and start < self._json_next:
            return
        self._write_json(RunSummary(self.rows, complete=False, status="running"))
        self._json_next = start + (self.clock() - start) / self.JSON_SHARE

    def add_row(self, row: ResultRow) -> None:
        if self.info.startup is not None and not startup.marked("first_row"):
            startup.mark("first_row")
            self.info.startup = startup.phases()
        self.rows.append(row)
        if self.progress:
            self.progress.advance(row)
        self._print(report.row_line(row, self.spec.per_iter, self.spec.timestamps))
        for line in row.notes:
            self._print(line)
        if self.csv_path:
            try:
                append_csv(self.csv_path, csv_records(self.info, row))
            except OSError as exc:
                path, self.csv_path = self.csv_path, None
                self._lost("CSV file", path, exc)
        self._write_running_json()

    def finish(self, summary: RunSummary) -> None:
        """The trailer and the final files, once: a second call (the other thread) returns."""
        with self._finishing:
            if self._finished:
                return
            self._finished = True
            self._finish(summary)

    def _finish(self, summary: RunSummary) -> None:
        if self.progress:
            self.progress.stop()
            self.progress = None
        peak_line = self.peak_line_for(summary) if self.peak_line_for else None
        end_time = _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        self._write_json(summary, end_time=end_time)  # first: a failure here is reported below
        self._write_metrics(summary, end_time)
        if self.output_errors:
            summary.errors.extend(e for e in self.output_errors if e not in summary.errors)
            if summary.status == "ok":
                summary.status = "output_error"
            self._write_json(summary, end_time=end_time)  # the files that still work say so too
        for line in report.trailer_lines(self.info, summary, peak_line):
            self._print(line)
        self.summary = summary
        if self.store_path:
            print(f"ncclbench: results saved to {self.store_path}", file=sys.stderr)
