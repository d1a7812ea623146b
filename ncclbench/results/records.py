"""Plain result records. Formatting and export code take these and know nothing of
torch or distributed code."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

PLACEMENTS = ("out_of_place", "in_place")


@dataclass
class PlacementResult:
    time_us: float          # combined across ranks as -a says; host time per op with -C
    algbw: float            # GB/s
    busbw: float            # GB/s
    nwrong: int | None      # None: not checked (N/A in nccl-tests, or -c 0 shows 0 there)
    host_us: float = 0.0    # host time spent issuing one op (launch cost), mean over ranks
    per_iter: dict | None = None   # -I statistics (timing.per_iter_summary)
    device_us: float | None = None  # timed duration per op (what the bandwidths come from); None when read back
    measured: bool = True   # False: printed N/A, the numbers are NaN (onerank: no such operation was timed)
    rank_us: tuple[float, ...] = ()  # each rank's own timed duration per op, in rank order (bandwidths combine them)
    noise: dict | None = None  # the timed loop's samples and their summary (noise.summarise), always kept


@dataclass
class ResultRow:
    collective: str
    size: int               # bytes, as printed
    count: int              # elements, as printed
    dtype: str
    op: str                 # redop column text
    root: int               # -1 when the collective has none
    out_of_place: PlacementResult
    in_place: PlacementResult
    timestamp: str = ""     # -S / CSV
    notes: tuple[str, ...] = ()  # comment lines printed under the row (alltoallv summary)

    def placements(self):
        return (("out_of_place", self.out_of_place), ("in_place", self.in_place))

    def wrong_total(self) -> int:
        return sum(p.nwrong or 0 for _, p in self.placements())


@dataclass
class DeviceRecord:
    rank: int
    group: int
    pid: int
    hostname: str
    device: int
    device_hex: str
    device_info: str


@dataclass
class RunInfo:
    """Everything the header, JSON and CSV say about a run besides the rows."""

    collective: str
    args: list[str]
    backend: str
    mode: str                # TimingMode value
    timing: str              # "CUDA events" / "host clock"
    nranks: int
    devices: list[DeviceRecord]
    ncclbench_version: str
    torch_version: str
    nccl_code: int           # 22809 style, 0 without NCCL
    nccl_text: str           # "NCCL 2.28.9" / "gloo"
    config: dict             # nccl-tests' config block values (minimum_bytes, ...)
    env: list[str]
    start_time: str
    topology: str | None = None
    link_peak_gbps: float | None = None
    notes: list[str] = field(default_factory=list)
    report_cputime: bool = False   # -C: the time columns hold host time per op
    startup: dict | None = None    # start-up phases (startup.phases), for the first run of a process
    nccl_path: dict | None = None  # the path NCCL took, as its log said (topology.pathview.Path.to_dict)
    path_lines: list[str] = field(default_factory=list)  # the header's `# NCCL path` lines

    @property
    def hosts(self) -> list[str]:
        seen: list[str] = []
        for d in self.devices:
            if d.hostname not in seen:
                seen.append(d.hostname)
        return seen

    @property
    def gpu_name(self) -> str:
        names = sorted({d.device_info for d in self.devices})
        return names[0] if len(names) == 1 else ",".join(names)


@dataclass
class RunSummary:
    rows: list[ResultRow]
    complete: bool
    status: str = "ok"      # ok | wrong_results | bandwidth_low | output_error | timeout | interrupted | error
    errors: list[str] = field(default_factory=list)
    memory: dict | None = None  # -M: MiB by what holds it

    def printed_cells(self):
        """Cells that print numbers (not the N/A ones)."""
        for row in self.rows:
            for _, p in row.placements():
                if p.measured:
                    yield row, p

    @property
    def average_busbw(self) -> float:
        """nccl-tests' `Avg bus bandwidth`: plain mean over every printed cell."""
        cells = [p.busbw for _, p in self.printed_cells()]
        return sum(cells) / len(cells) if cells else 0.0

    @property
    def peak_busbw(self) -> float:
        return max((p.busbw for _, p in self.printed_cells()), default=0.0)

    @property
    def largest_size_busbw(self) -> float:
        if not self.rows:
            return 0.0
        top = max(r.size for r in self.rows)
        # out-of-place, as nccl-tests users read it; in-place where out-of-place is N/A
        return max((r.out_of_place if r.out_of_place.measured else r.in_place).busbw
                   for r in self.rows if r.size == top)

    @property
    def wrong(self) -> int:
        return sum(r.wrong_total() for r in self.rows)

    @property
    def wrong_cells(self) -> int:
        """Printed cells with #wrong > 0 (nccl-tests' "Out of bounds values")."""
        return sum(1 for _, p in self.printed_cells() if (p.nwrong or 0) > 0)

    def average_ok(self, min_bw: float) -> bool | None:
        """nccl-tests' NCCL_TESTS_MIN_BW rule (average busbw >= 0.9 x the floor); None without a floor."""
        return None if not min_bw else self.average_busbw >= 0.9 * min_bw

    def peak_ok(self, min_peak_bw: float) -> bool | None:
        return None if not min_peak_bw else self.peak_busbw >= min_peak_bw

    def bandwidth_ok(self, min_bw: float, min_peak_bw: float) -> bool | None:
        """None when no floor was set (nccl-tests' "unchecked")."""
        checks = [ok for ok in (self.average_ok(min_bw), self.peak_ok(min_peak_bw)) if ok is not None]
        return all(checks) if checks else None

    def failing_sizes(self) -> list[int]:
        return sorted({r.size for r in self.rows if r.wrong_total() > 0})


def json_number(x: float | None):
    """nccl-tests writes NaN as the string "nan"."""
    if x is None:
        return None
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    return x
