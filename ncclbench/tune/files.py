"""The two CSV formats of NCCL's example tuner plugin (plugins/tuner/example, formerly
ext-tuner/example): the performance data its scripts/optimize_config.py reads, and the
config file the plugin itself reads (NCCL_TUNER_CONFIG_FILE).

The plugin's own parser is lenient in ways that turn a typo into a different setting: an
unknown collective becomes allreduce, an unknown algorithm ring, an unknown protocol
simple (names are case-sensitive), consecutive commas collapse (strtok), and a line is
cut at 255 characters (fgets into 256 bytes). read_config() therefore checks a file
strictly and names the first line it would misread."""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass, field

from ncclbench.engine.collectives import REGISTRY
from ncclbench.tune.plan import ALGO, MAX_CHANNELS, PROTO

PERF_COLUMNS = ["collective", "size_bytes", "algorithm", "protocol", "channels", "nodes", "ranks", "pipeOps",
                "regBuff", "cost_metric", "bandwidth_gbps", "latency_us"]
CONFIG_FIELDS = "collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff"
# the plugin's names, in its (ncclFunc_t) order
CONFIG_COLLECTIVES = tuple(t.plugin for t in sorted((c.tuning for c in REGISTRY.values() if c.tuning),
                                                    key=lambda t: t.func))
_MAX_LINE = 255  # the plugin reads lines with fgets into a 256-byte buffer
MAX_BYTES = 2 ** 64 - 1  # size_t on a 64-bit host: the plugin reads min/max_bytes with strtoull


@dataclass(frozen=True)
class PerfRow:
    collective: str          # the plugin's name: allreduce
    size_bytes: int
    algorithm: str           # the plugin's spelling: nvls_tree
    protocol: str
    channels: int            # channels the combination ran with at this size (-1: not known)
    nodes: int
    ranks: int
    bandwidth_gbps: float    # median busbw over the repeats
    latency_us: float        # median time over the repeats
    pipe_ops: int = 1        # ops per NCCL call as measured: one
    reg_buff: int = 0        # buffers registered with NCCL as measured: no


def performance_csv(rows: list[PerfRow]) -> str:
    """optimize_config.py's input. cost_metric (which that script does not read) repeats
    latency_us: a cost, lower is better."""
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(PERF_COLUMNS)
    for r in rows:
        w.writerow([r.collective, r.size_bytes, r.algorithm, r.protocol, r.channels, r.nodes, r.ranks, r.pipe_ops,
                    r.reg_buff, f"{r.latency_us:.3f}", f"{r.bandwidth_gbps:.3f}", f"{r.latency_us:.3f}"])
    return out.getvalue()


@dataclass(frozen=True)
class ConfigRow:
    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str
    protocol: str
    channels: int
    nnodes: int
    nranks: int
    pipe_ops: int | None = None   # None: field left out (matches any)
    reg_buff: int | None = None
    line: int = 0                 # where read_config found it
    role: str = field(default="", compare=False)  # tune's: won | nccl (NCCL's own choice) | fallback

    def text(self) -> str:
        fields = [self.collective, self.min_bytes, self.max_bytes, self.algorithm, self.protocol, self.channels,
                  self.nnodes, self.nranks]
        if self.pipe_ops is not None or self.reg_buff is not None:
            fields.append(-1 if self.pipe_ops is None else self.pipe_ops)
        if self.reg_buff is not None:
            fields.append(self.reg_buff)
        return ",".join(str(f) for f in fields)

    def matches(self, collective: str, nbytes: int, nnodes: int, nranks: int, pipe_ops: int = 1,
                reg_buff: int = 0) -> bool:
        """The plugin's own test; by default for one unaggregated call on unregistered buffers
        (what tune measures)."""
        return (self.collective == collective and self.min_bytes <= nbytes <= self.max_bytes
                and self.nnodes in (-1, nnodes) and self.nranks in (-1, nranks)
                and self.pipe_ops in (None, -1, pipe_ops) and self.reg_buff in (None, -1, reg_buff))


def comment_lines(text: str, width: int = 150) -> list[str]:
    """One comment as `#` lines short enough for the plugin: it reads 255 characters of a line
    at a time, and the rest of a longer comment would be read as a line of its own (one
    that does not start with '#')."""
    words, lines, line = text.split(" "), [], ""
    for word in words:
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = "  " + word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return [f"# {line}".rstrip()[:_MAX_LINE - 1] for line in lines]


def config_text(rows: list[ConfigRow], comments: list[str]) -> str:
    lines = [part for c in comments for part in (comment_lines(c) if c else ["#"])]
    lines.append(f"# {CONFIG_FIELDS}")
    lines += [r.text() for r in rows]
    return "\n".join(lines) + "\n"


_DIGITS = re.compile(r"[+-]?[0-9]+")  # what strtoull/atoi read whole: no '_', no non-ASCII digits (Python's int takes both)


def _int(text: str, what: str, lo: int | None = None, hi: int | None = None, allowed=()) -> int:
    if not _DIGITS.fullmatch(text):
        raise ValueError(f"{what} {text!r} is not a whole number")
    value = int(text, 10)
    if value in allowed:
        return value
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        extra = f" or {', '.join(map(str, allowed))}" if allowed else ""
        raise ValueError(f"{what} {value} is outside {lo}..{hi if hi is not None else 'any'}{extra}")
    return value


def parse_config_line(text: str, number: int) -> ConfigRow:
    fields = text.split(",")
    if not 8 <= len(fields) <= 10:
        raise ValueError(f"{len(fields)} fields, the plugin reads 8 to 10 ({CONFIG_FIELDS})")
    if any(not f.strip() for f in fields):
        raise ValueError("an empty field (the plugin's tokenizer would shift every field after it)")
    f = [x.strip(" \t") for x in fields]
    if f[0] not in CONFIG_COLLECTIVES:
        raise ValueError(f"collective {f[0]!r} is not one the plugin reads ({', '.join(CONFIG_COLLECTIVES)})")
    if f[3] not in ALGO:
        raise ValueError(f"algorithm {f[3]!r} is not one the plugin reads ({', '.join(ALGO)}; lower case)")
    if f[4] not in PROTO:
        raise ValueError(f"protocol {f[4]!r} is not one the plugin reads ({', '.join(PROTO)}; lower case)")
    lo = _int(f[1], "min_bytes", 0, MAX_BYTES)
    hi = _int(f[2], "max_bytes", 0, MAX_BYTES)
    if lo > hi:
        raise ValueError(f"min_bytes {lo} is larger than max_bytes {hi}")
    return ConfigRow(
        f[0], lo, hi, f[3], f[4], _int(f[5], "channels", 0, MAX_CHANNELS, allowed=(-1,)),
        _int(f[6], "nNodes", 1, allowed=(-1,)), _int(f[7], "nRanks", 1, allowed=(-1,)),
        _int(f[8], "numPipeOps", 1, allowed=(-1,)) if len(f) > 8 else None,
        _int(f[9], "regBuff", -1, 1) if len(f) > 9 else None, line=number)


def read_config(path: str) -> list[ConfigRow]:
    """Every row of a tuner config, checked as strictly as described above; ValueError
    `PATH line N: ...` on the first line the plugin would misread."""
    from ncclbench.inputs import InputFileError, read_text

    try:
        text = read_text(path, "tuner config")
    except InputFileError as exc:
        raise ValueError(str(exc)) from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) >= _MAX_LINE:  # a comment too: its rest would be read as a line not starting with '#'
            raise ValueError(f"{path} line {number}: longer than the plugin's {_MAX_LINE} characters")
        if line.startswith("#") or not line.strip():
            continue  # the plugin skips a line whose first character is '#', and empty lines
        try:
            rows.append(parse_config_line(line, number))
        except ValueError as exc:
            raise ValueError(f"{path} line {number}: {exc}; not NCCL's tuner config format") from None
    if not rows:
        raise ValueError(f"{path} has no config rows ({CONFIG_FIELDS})")
    return rows
