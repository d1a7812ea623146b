"""Read benchmark results in any format we meet into one normalized pandas DataFrame.

Formats (detected from the content, not the file name):
  * text: the stdout of nccl-tests (`all_reduce_perf ...`) or of `ncclbench`, which prints
    the same table; a log may hold several tests one after another;
  * JSON: nccl-tests `-J` output (schema version 3), also written by ncclbench with an
    extra top-level "ncclbench" object;
  * CSV: written by ncclbench, one row per size x placement.

Every reader returns one row per (collective, dtype, op, root, size, placement) measured,
with the columns in CORE_COLUMNS, the METADATA_COLUMNS the file provides, and any extra
per-row columns (per-iteration statistics, ...) after them."""

from __future__ import annotations

import io
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from ncclbench.engine.collectives import lookup as _lookup_collective
from ncclbench.dtypes import DTYPE_ALIASES
from ncclbench.errors import BenchError, ExitCode
from ncclbench.inputs import InputFileError, read_text
from ncclbench.lazy import lazy_import
from ncclbench.results.noise import noise_columns

pd = lazy_import("pandas")  # imported when results are read, not when the CLI starts

CORE_COLUMNS = [
    "source", "label", "collective", "dtype", "op", "root", "size_bytes", "count",
    "placement", "time_us", "algbw_gbps", "busbw_gbps", "nwrong",
]
METADATA_COLUMNS = [
    "tool", "backend", "mode", "ranks", "nodes", "hosts", "gpu", "timestamp",
    "link_peak_gbps", "nccl_version", "torch_version", "ncclbench_version", "complete", "nccl_path", "nccl_path_facts",
]
PLACEMENTS = ("out_of_place", "in_place")

_INT_COLUMNS = ("root", "size_bytes", "count")
_FLOAT_COLUMNS = ("time_us", "algbw_gbps", "busbw_gbps", "nwrong")


class ResultsFormatError(BenchError):
    """A results file that cannot be understood. str() is one line naming file and problem."""

    exit_code = ExitCode.USAGE

    def __init__(self, path: str | Path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")


# ---------------------------------------------------------------------------
# Name normalization shared by all formats
# ---------------------------------------------------------------------------

def canonical_collective(name: str) -> str:
    """nccl-tests name without binary suffixes: '/x/all_reduce_perf_mpi' -> 'all_reduce'.

    Names ncclbench knows (including CLI spellings like 'allreduce') map to the registry
    name; others (hypercube, alltoallv, ...) are kept as written, minus the suffixes."""
    key = Path(str(name).strip()).name.lower().replace("-", "_")
    for suffix in ("_mpi", "_perf"):  # all_reduce_perf_mpi: _mpi comes last
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    try:
        return _lookup_collective(key).name
    except KeyError:
        return key


def canonical_dtype(name: str) -> str:
    key = str(name).strip().lower()
    return DTYPE_ALIASES.get(key, key)


def canonical_op(name: object) -> str:
    # hypercube prints an empty redop column, CSV may leave it empty: both mean "no op".
    if name is None or (isinstance(name, float) and math.isnan(name)):
        return "none"
    key = str(name).strip().lower()
    return key or "none"


def canonical_placement(name: str) -> str:
    key = str(name).strip().lower().replace("-", "_")
    aliases = {"oop": "out_of_place", "outofplace": "out_of_place", "ip": "in_place", "inplace": "in_place"}
    key = aliases.get(key, key)
    if key not in PLACEMENTS:
        raise ValueError(f"unknown placement {name!r} (expected out_of_place or in_place)")
    return key


def nccl_version_string(code: int) -> str:
    """NCCL_VERSION_CODE -> '2.28.9' (codes from 2.9 on are X*10000+Y*100+Z, older X*1000+Y*100+Z)."""
    code = int(code)
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _number(text: object) -> float:
    """A measured value: 'N/A', None and 'nan' (nccl-tests JSON writes NaN as a string) -> NaN."""
    if text is None:
        return math.nan
    if isinstance(text, (int, float)):
        return float(text)
    text = str(text).strip()
    if text.upper() in ("N/A", "NA", ""):
        return math.nan
    return float(text)  # float() also takes 'nan', '-nan', 'inf'


def _hosts_metadata(hosts: Iterable[str]) -> dict:
    unique = list(dict.fromkeys(h for h in hosts if h))
    if not unique:
        return {}
    return {"hosts": ";".join(unique), "nodes": len(unique)}


# ---------------------------------------------------------------------------
# Text (nccl-tests / ncclbench stdout)
# ---------------------------------------------------------------------------

_VERSION_LINE = re.compile(r"^#\s*(?P<tool>nccl-tests|ncclbench)\s+version\s+(?P<version>\S+)(?P<rest>.*)$")
_START_LINE = re.compile(r"^#\s*Collective test starting:\s*(?P<name>\S+)")
_DEVICE_LINE = re.compile(
    r"^#\s*Rank\s+\d+\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(?P<host>\S+)\s+device\s+\d+\s+\[[^\]]*\]\s*(?P<gpu>.*?)\s*$"
)
_PLACEMENT_TITLE = re.compile(r"out-of-place|in-place")
_INTEGER = re.compile(r"^-?\d+$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_CLOCK = re.compile(r"^\d{2}:\d{2}:\d{2}$")

_TEXT_PREFIX = ["size", "count", "type", "redop", "root"]
_TEXT_METRICS = {
    "time": "time_us", "cputime": "time_us", "algbw": "algbw_gbps", "busbw": "busbw_gbps",
    "#wrong": "nwrong", "#bitdiff": "nbitdiff",
    # Per-iteration statistics (-I): the names ncclbench's CSV uses.
    "i_min": "i_min_us", "i_max": "i_max_us", "i_p99": "i_p99_us", "i_cv%": "i_cv_pct",
}


def _metric_column(header_name: str) -> str:
    if header_name in _TEXT_METRICS:
        return _TEXT_METRICS[header_name]
    return re.sub(r"[^0-9a-z]+", "_", header_name.lower()).strip("_") or "value"


@dataclass
class _TableLayout:
    """Column layout of one result table, read from its header line."""

    placements: list[str]
    metrics: list[list[str]]  # normalized column names of each placement group
    has_timestamp: bool

    @classmethod
    def from_header(cls, tokens: list[str], title: str) -> "_TableLayout":
        if tokens[: len(_TEXT_PREFIX)] != _TEXT_PREFIX:
            raise ValueError(f"unrecognised table header (expected it to start with {' '.join(_TEXT_PREFIX)})")
        rest = tokens[len(_TEXT_PREFIX):]
        has_timestamp = bool(rest) and rest[-1] == "timestamp"
        if has_timestamp:
            rest = rest[:-1]
        # Each placement group starts with its time column.
        starts = [i for i, name in enumerate(rest) if name in ("time", "cputime")]
        if not starts or starts[0] != 0:
            raise ValueError("unrecognised table header (no time column after root)")
        groups = [rest[a:b] for a, b in zip(starts, starts[1:] + [len(rest)])]
        titled = [t.replace("-", "_") for t in _PLACEMENT_TITLE.findall(title)]
        placements = titled if len(titled) == len(groups) else list(PLACEMENTS[: len(groups)])
        if len(groups) > len(PLACEMENTS):
            raise ValueError(f"unrecognised table header ({len(groups)} time columns)")
        return cls(placements, [[_metric_column(n) for n in g] for g in groups], has_timestamp)

    def split_row(self, tokens: list[str]) -> tuple[list[str], list[tuple[str, list[str], list[str]]]] | None:
        """(prefix fields, [(placement, column names, fields)]), or None when the field count fits no shape.

        Shapes: hypercube leaves redop empty (one field fewer), and nccl-tests leaves the
        out-of-place block blank when it only measures in place."""
        sizes = [len(g) for g in self.metrics]
        for groups_present in (list(range(len(sizes))), [len(sizes) - 1]):
            width = sum(sizes[i] for i in groups_present)
            for prefix_len in (5, 4):
                if len(tokens) != prefix_len + width:
                    continue
                prefix = tokens[:prefix_len]
                if prefix_len == 4:
                    prefix = prefix[:3] + [""] + prefix[3:]
                blocks, pos = [], prefix_len
                for i in groups_present:
                    blocks.append((self.placements[i], self.metrics[i], tokens[pos: pos + sizes[i]]))
                    pos += sizes[i]
                return prefix, blocks
        return None

    @property
    def expected_fields(self) -> int:
        return len(_TEXT_PREFIX) + sum(len(g) for g in self.metrics)


@dataclass
class _TextTest:
    """What we know about the test whose lines we are reading."""

    metadata: dict = field(default_factory=dict)
    collective: str | None = None
    hosts: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)

    def row_metadata(self) -> dict:
        meta = dict(self.metadata)
        if self.hosts:
            meta["ranks"] = len(self.hosts)
            meta.update(_hosts_metadata(self.hosts))
        if self.gpus:
            meta["gpu"] = ";".join(dict.fromkeys(self.gpus))
        return meta


def _version_metadata(match: re.Match) -> dict:
    tool = match["tool"]
    meta = {"tool": tool}
    if tool == "ncclbench":
        meta["ncclbench_version"] = match["version"]
    lib = re.search(r"nccl-library=(\d+)", match["rest"])
    if lib:
        meta["nccl_version"] = nccl_version_string(int(lib.group(1)))
    return meta


def _text_rows(text: str, path: str) -> list[dict]:
    rows: list[dict] = []
    test = _TextTest()
    layout: _TableLayout | None = None
    previous_comment = ""
    for lineno, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            if m := _VERSION_LINE.match(stripped):
                test, layout = _TextTest(metadata=_version_metadata(m)), None
            elif m := _START_LINE.match(stripped):
                if test.collective is not None:  # a second test without its own version line
                    test = _TextTest(metadata=dict(test.metadata))
                test.collective = canonical_collective(m["name"])
                layout = None
            elif m := _DEVICE_LINE.match(stripped):
                test.hosts.append(m["host"])
                test.gpus.append(m["gpu"])
            else:
                tokens = stripped.lstrip("#").split()
                if tokens[:3] == ["size", "count", "type"]:
                    try:
                        layout = _TableLayout.from_header(tokens, previous_comment)
                    except ValueError as exc:
                        raise ResultsFormatError(path, f"line {lineno}: {exc}") from None
                elif stripped.startswith(("# Out of bounds", "# Collective test concluded")):
                    layout = None
            previous_comment = stripped
            continue
        tokens = stripped.split()
        # Only lines inside a table that start with a number are results; anything else
        # (NCCL INFO/WARN lines, launcher noise) may be interleaved with them.
        if layout is None or not _INTEGER.match(tokens[0]):
            continue
        if test.collective is None:
            raise ResultsFormatError(path, f"line {lineno}: result row before any '# Collective test starting:' line")
        rows.extend(_text_row(tokens, layout, test, path, lineno))
    return rows


def _text_row(tokens: list[str], layout: _TableLayout, test: _TextTest, path: str, lineno: int) -> list[dict]:
    timestamp = None
    if layout.has_timestamp and len(tokens) >= 2 and _DATE.match(tokens[-2]) and _CLOCK.match(tokens[-1]):
        timestamp = f"{tokens[-2]} {tokens[-1]}"
        tokens = tokens[:-2]
    split = layout.split_row(tokens)
    if split is None:
        raise ResultsFormatError(
            path, f"line {lineno}: expected {layout.expected_fields} fields in a result row, found {len(tokens)}"
        )
    (size, count, dtype, op, root), blocks = split
    try:
        common = {
            "collective": test.collective,
            "dtype": canonical_dtype(dtype),
            "op": canonical_op(op),
            "root": int(root),
            "size_bytes": int(size),
            "count": int(count),
        }
        rows = []
        for placement, columns, values in blocks:
            row = dict(common, placement=placement)
            for column, value in zip(columns, values):
                row[column] = _number(value)
            row.update(test.row_metadata())
            if timestamp:
                row["timestamp"] = timestamp
            rows.append(row)
    except ValueError as exc:
        raise ResultsFormatError(path, f"line {lineno}: bad value in result row ({exc})") from None
    return rows


# ---------------------------------------------------------------------------
# JSON (nccl-tests -J, schema 3; ncclbench adds a top-level "ncclbench" object)
# ---------------------------------------------------------------------------

# JSON per-iteration keys -> the column names ncclbench's CSV (and our text reader) use.
_PER_ITER_KEYS = {
    "min_us": "i_min_us", "max_us": "i_max_us", "avg_us": "i_avg_us", "p50_us": "i_p50_us",
    "p95_us": "i_p95_us", "p99_us": "i_p99_us", "stdev_us": "i_stdev_us", "cv_pct": "i_cv_pct",
}


_JSON_PLACEMENT_KEYS = {"time", "cpu_time", "alg_bw", "bus_bw", "nwrong", "bitwise"}


def _json_document_metadata(doc: dict) -> tuple[str | None, dict]:
    """(collective, metadata) of one JSON document."""
    meta: dict = {"tool": "nccl-tests"}
    collective = None
    args = doc.get("args")
    if isinstance(args, list) and args:
        collective = canonical_collective(str(args[0]))
    if doc.get("start_time"):
        meta["timestamp"] = str(doc["start_time"])
    if isinstance(doc.get("nccl_version"), int):
        meta["nccl_version"] = nccl_version_string(doc["nccl_version"])
    devices = (doc.get("config") or {}).get("devices") or []
    if isinstance(devices, list) and devices:
        meta["ranks"] = len(devices)
        meta.update(_hosts_metadata(str(d.get("hostname", "")) for d in devices if isinstance(d, dict)))
        gpus = [str(d["device_info"]) for d in devices if isinstance(d, dict) and d.get("device_info")]
        if gpus:
            meta["gpu"] = ";".join(dict.fromkeys(gpus))
    bench = doc.get("ncclbench")
    if isinstance(bench, dict):
        meta["tool"] = "ncclbench"
        for key, value in bench.items():
            if key == "collective" and value:
                collective = canonical_collective(str(value))
            elif key == "version":
                meta["ncclbench_version"] = value
            elif key == "hosts" and isinstance(value, list):
                meta["hosts"] = ";".join(str(h) for h in value)
            elif key == "nccl_path" and isinstance(value, dict):  # the path NCCL's log named (compare sets them side by side)
                meta["nccl_path"], meta["nccl_path_facts"] = value.get("label"), value.get("facts")
            elif isinstance(value, bool) or value is None or isinstance(value, (int, float, str)):
                meta[key] = value
    return collective, meta


def _json_document_rows(doc: object, path: str, where: str) -> list[dict]:
    """Rows of one document; `where` prefixes messages ("" or "document [2]: " in a list)."""
    if not isinstance(doc, dict):
        raise ResultsFormatError(path, f"{where}expected a JSON object with a 'results' list")
    results = doc.get("results")
    if results is None:
        results = []
    if not isinstance(results, list):
        raise ResultsFormatError(path, f"{where}'results' is not a list")
    collective, meta = _json_document_metadata(doc)
    if collective is None and results:
        raise ResultsFormatError(path, f"{where}cannot tell the collective (no args[0], no ncclbench.collective)")
    rows = []
    for i, result in enumerate(results):
        try:
            rows.extend(_json_result_rows(result, collective, meta))
        except (KeyError, TypeError, ValueError) as exc:
            detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
            raise ResultsFormatError(path, f"{where}results[{i}]: {detail}") from None
    return rows


def _json_result_rows(result: dict, collective: str, meta: dict) -> list[dict]:
    common = {
        "collective": collective,
        "dtype": canonical_dtype(result["type"]),
        "op": canonical_op(result.get("redop")),
        "root": int(str(result.get("root", -1)).strip()),  # nccl-tests pads it: "    -1"
        "size_bytes": int(result["size"]),
        "count": int(result["count"]),
    }
    rows = []
    for placement in PLACEMENTS:
        measured = result.get(placement)
        if not measured:  # null when that placement was not run
            continue
        row = dict(common, placement=placement)
        row["time_us"] = _number(measured["time"] if "time" in measured else measured["cpu_time"])
        row["algbw_gbps"] = _number(measured["alg_bw"])
        row["busbw_gbps"] = _number(measured["bus_bw"])
        row["nwrong"] = _number(measured.get("nwrong"))
        for key, value in measured.items():  # writer-specific extras, e.g. ncclbench's host_us
            if key not in _JSON_PLACEMENT_KEYS and isinstance(value, (int, float)) and not isinstance(value, bool):
                row[key] = float(value)
        bitwise = measured.get("bitwise")
        if isinstance(bitwise, dict) and "different_bits" in bitwise:
            row["nbitdiff"] = _number(bitwise["different_bits"])
        per_iter = result.get(f"{placement}_per_iter")
        if isinstance(per_iter, dict):
            for key, column in _PER_ITER_KEYS.items():
                if key in per_iter:
                    row[column] = _number(per_iter[key])
            if "skipped_iterations" in per_iter:
                row["i_skipped"] = int(per_iter["skipped_iterations"])
        row.update(noise_columns(result.get(f"{placement}_noise")))
        # ncclbench adds per-row fields: host_us {placement: us} and the -S timestamp.
        host_us = result.get("host_us")
        if isinstance(host_us, dict) and placement in host_us:
            row["host_us"] = _number(host_us[placement])
        row.update(meta)
        if result.get("timestamp"):
            row["timestamp"] = str(result["timestamp"])
        rows.append(row)
    return rows


def _json_rows(text: str, path: str) -> list[dict]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResultsFormatError(path, f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:  # '[[[[...' deeper than Python's stack
        raise ResultsFormatError(path, "invalid JSON: nested deeper than any results file") from None
    # A list of documents lets one file hold several tests.
    if isinstance(doc, list):
        rows = []
        for i, item in enumerate(doc):
            rows.extend(_json_document_rows(item, path, f"document [{i}]: "))
        return rows
    return _json_document_rows(doc, path, "")


# ---------------------------------------------------------------------------
# CSV (ncclbench)
# ---------------------------------------------------------------------------

_CSV_REQUIRED = ("collective", "placement", "size_bytes", "count", "dtype", "time_us", "algbw_gbps", "busbw_gbps")


def _csv_frame(text: str, path: str) -> pd.DataFrame:
    try:
        frame = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, ValueError) as exc:
        raise ResultsFormatError(path, f"unreadable CSV: {str(exc).splitlines()[0]}") from None
    missing = [c for c in _CSV_REQUIRED if c not in frame.columns]
    if missing:
        raise ResultsFormatError(path, f"CSV lacks column(s) {', '.join(missing)}")
    frame = frame.drop(columns=[c for c in ("source", "label") if c in frame.columns])
    if "op" not in frame.columns:
        frame["op"] = "none"
    if "root" not in frame.columns:
        frame["root"] = -1
    if "nwrong" not in frame.columns:
        frame["nwrong"] = math.nan
    if "tool" not in frame.columns:
        frame.insert(len(frame.columns), "tool", "ncclbench")
    try:
        frame["collective"] = frame["collective"].map(canonical_collective)
        frame["dtype"] = frame["dtype"].map(canonical_dtype)
        frame["op"] = frame["op"].map(canonical_op)
        frame["placement"] = frame["placement"].map(canonical_placement)
        frame["root"] = frame["root"].fillna(-1)
        if "nccl_version" in frame.columns:  # ncclbench writes "NCCL 2.28.9"; text and JSON give "2.28.9"
            frame["nccl_version"] = frame["nccl_version"].map(
                lambda v: v[len("NCCL "):] if isinstance(v, str) and v.startswith("NCCL ") else v
            )
        for column in _FLOAT_COLUMNS:
            frame[column] = pd.to_numeric(frame[column], errors="raise").astype(float)
        for column in _INT_COLUMNS:
            frame[column] = pd.to_numeric(frame[column], errors="raise").astype("int64")
    except (ValueError, TypeError) as exc:
        raise ResultsFormatError(path, f"bad value in CSV: {exc}") from None
    return frame


# ---------------------------------------------------------------------------
# Detection and the public entry points
# ---------------------------------------------------------------------------

def detect_format(text: str) -> str | None:
    """'json', 'csv' or 'text' from the content; None when it looks like none of them."""
    body = text.lstrip("\ufeff \t\r\n")
    if body.startswith(("{", "[")):
        return "json"
    first_line = body.split("\n", 1)[0]
    if not first_line.startswith("#") and "," in first_line:
        header = {c.strip().strip('"') for c in first_line.split(",")}
        if {"collective", "size_bytes"} <= header:
            return "csv"
    if re.search(r"^#\s*(nccl-tests|ncclbench) version|^#\s*Collective test starting:|^#\s+size\s+count\s+type",
                 body, re.MULTILINE):
        return "text"
    return None


def _frame_from_rows(rows: list[dict]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    for column in _FLOAT_COLUMNS:
        if column not in frame.columns:
            frame[column] = math.nan
    return frame


def _normalize(frame: pd.DataFrame, source: str, label: str) -> pd.DataFrame:
    """Fixed column order and types, whatever format the frame came from."""
    frame = frame.copy()
    frame["source"] = source
    frame["label"] = label
    for column in _INT_COLUMNS:
        frame[column] = frame[column].astype("int64")
    for column in _FLOAT_COLUMNS:
        frame[column] = frame[column].astype(float)
    for column in ("collective", "dtype", "op", "placement"):
        frame[column] = frame[column].astype(str)
    metadata = [c for c in METADATA_COLUMNS if c in frame.columns]
    extras = [c for c in frame.columns if c not in CORE_COLUMNS and c not in metadata]
    return frame[CORE_COLUMNS + metadata + extras].reset_index(drop=True)


def read_results(path: str | Path, label: str | None = None) -> pd.DataFrame:
    """One results file (text, JSON or CSV, told by content; read through ncclbench.inputs),
    labelled `label` or its stem. ResultsFormatError when unreadable, malformed or empty."""
    try:
        text = read_text(path, "results")
    except InputFileError as exc:
        raise ResultsFormatError(exc.path, exc.reason) from None
    return parse_results(text, str(path), label if label is not None else Path(path).stem)


def parse_results(text: str, source: str, label: str) -> pd.DataFrame:
    """The rows of a results file's text (read_results without the reading)."""
    kind = detect_format(text)
    if kind is None:
        raise ResultsFormatError(source, "not a recognised results file (expected nccl-tests/ncclbench text, JSON or CSV)")
    if kind == "csv":
        frame = _csv_frame(text, source)
    elif kind == "json":
        frame = _frame_from_rows(_json_rows(text, source))
    else:
        frame = _frame_from_rows(_text_rows(text, source))
    if frame.empty:
        raise ResultsFormatError(source, f"no result rows in this {kind} file")
    return _normalize(frame, source, label)


def default_labels(paths: Sequence[str | Path]) -> list[str]:
    """File stems, made unique by prefixing parent folders where different files' stems collide.

    ('a/x.txt', 'b/x.txt', 'c/y.txt') -> ['a/x', 'b/x', 'y']; the same path twice keeps its stem."""
    unique = list(dict.fromkeys(str(p) for p in paths))
    parts = {p: Path(p).with_suffix("").parts for p in unique}
    depth = dict.fromkeys(unique, 1)
    while True:
        labels = {p: "/".join(parts[p][-depth[p]:]) for p in unique}
        counts = Counter(labels.values())
        clashing = [p for p in unique if counts[labels[p]] > 1 and depth[p] < len(parts[p])]
        if not clashing:
            return [labels[str(p)] for p in paths]
        for p in clashing:
            depth[p] += 1


def read_many(paths: Sequence[str | Path], labels: Sequence[str] | None = None) -> pd.DataFrame:
    """read_results for each path, concatenated; labels default to default_labels(paths)."""
    if labels is not None and len(labels) != len(paths):
        raise ValueError(f"got {len(labels)} labels for {len(paths)} files")
    labels = list(labels) if labels is not None else default_labels(paths)
    frames = [read_results(p, lab) for p, lab in zip(paths, labels)]
    return pd.concat(frames, ignore_index=True, sort=False)


def filter_results(
    frame: pd.DataFrame,
    placement: str | None = None,
    min_size: int | None = None,
    max_size: int | None = None,
) -> pd.DataFrame:
    """Rows of one placement ('out_of_place', 'in_place'; None or 'both' keeps both) within [min_size, max_size]."""
    keep = pd.Series(True, index=frame.index)
    if placement not in (None, "both"):
        keep &= frame["placement"] == canonical_placement(placement)
    if min_size is not None:
        keep &= frame["size_bytes"] >= min_size
    if max_size is not None:
        keep &= frame["size_bytes"] <= max_size
    return frame[keep]
