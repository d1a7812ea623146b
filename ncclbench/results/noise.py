"""The noise a result carries, and the rule `compare` judges a slower row by (pure).

Every measured cell keeps the samples of its timed loop: per outer iteration (or block of
iterations, timing.NOISE_SAMPLES at most), the time per op, the largest over ranks (an
iteration ends when its slowest rank does, as nccl-tests' -I takes it). `summarise` turns
them into the few numbers written to the JSON (with the samples) and the CSV (without).

`judge` says whether NEW is slower than BASE beyond the threshold AND beyond the noise both
show (docs/results.md, "How compare judges a row"):

  samples on both sides (JSON)  the threshold on the headline time, the same threshold on the
      median sample, the middle halves apart (NEW's 25th percentile above BASE's 75th), and a
      one-sided Mann-Whitney test on the samples (p < ALPHA);
  summaries only (CSV)          the same without the rank test;
  no noise on one side          the threshold alone (nccl-tests text, files from before
      (nccl-tests, older files)  noise was recorded), and the row says so.

A baseline from several runs (`ncclbench baseline`) pools their samples, so its middle half
holds the spread between runs too, and NEW must also be slower than its slowest run's median.

Rows whose pace the host can set (host-bound rows of eager torch NCCL; every row of a CPU
backend: "level-noisy") also move as a whole between runs: a small row lasts a millisecond
or two, and a slower spell of the host stretches most of its iterations, which no test on
that row's samples can tell from a real change. A row's fastest block of iterations is the
least such a spell touched (on a GPU it can even be a block the device ran ahead of the
host, faster than the host's cost per call); on the latency floor (rows whose time does not
grow with the size) those fastest blocks would be alike but for the run's own state, and
`level_spread` reads each file's spread of them there. A level-noisy row must also have
its fastest block slower than BASE's by the threshold and by LEVEL_Z of the two files'
spreads combined (the host cost's rise taken off first), unless the samples show the shift
beyond doubt: every NEW block slower than every BASE block (NEW's fastest above BASE's
slowest) and the fastest block slower by the threshold, which no healthy pair of the
recorded GPU runs came near (docs/design/compare-beyond-doubt.md). A late rank or a slower
launch path slows every block, the fastest too; a busy host slows some. Known blind spot: a
change that slows about half of a file's floor rows widens that file's spread, so a small
one (1.5x) whose blocks still overlap can pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

MIN_SAMPLES = 5     # fewer samples on a side: no rank test, no spread of iterations
ALPHA = 0.01        # one-sided significance of the Mann-Whitney test
HOST_BOUND = 1.2    # a row is host-bound when its fastest block of iterations took less than this factor of its
                    # host cost per call per op (with samples: the GPU never held the host back for long), or
                    # its time is within this factor of that cost (without)
LEVEL_Z = 5.0       # a level-noisy row's fastest block must be slower beyond this many level spreads
LEVEL_MIN_ROWS = 6  # fewer level-noisy rows on a file's latency floor: no level spread is read from it
LEVEL_FLOOR = 2.0   # the latency floor: rows whose fastest block is within this factor of the smallest sizes'
FLOOR_SIZES = 3     # the smallest sizes, whose level-noisy rows' median fastest block anchors the floor

# CSV columns, in order; the JSON's `<placement>_noise` object holds the same keys without
# the `noise_` prefix, plus `samples_us`.
SUMMARY_KEYS = ("n", "min_us", "p25_us", "median_us", "p75_us", "p90_us", "max_us")
CSV_COLUMNS = tuple(f"noise_{k}" for k in SUMMARY_KEYS)


def quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of sorted values."""
    if not ordered:
        return math.nan
    pos = q * (len(ordered) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarise(samples_us: Sequence[float]) -> dict | None:
    """n, min, quartiles, median, p90, max of samples in microseconds, plus the samples."""
    kept = [float(v) for v in samples_us if v is not None and math.isfinite(v)]
    if not kept:
        return None
    ordered = sorted(kept)
    return {"n": len(ordered), "min_us": ordered[0], "p25_us": quantile(ordered, 0.25),
            "median_us": quantile(ordered, 0.5), "p75_us": quantile(ordered, 0.75),
            "p90_us": quantile(ordered, 0.9), "max_us": ordered[-1], "samples_us": kept}


def across_ranks(per_rank_seconds: Sequence[Sequence[float]]) -> dict | None:
    """summarise() of each sample's largest value over ranks, from seconds per op."""
    if not per_rank_seconds or not all(per_rank_seconds):
        return None
    return summarise([max(vals) * 1e6 for vals in zip(*per_rank_seconds)])


def noise_columns(block) -> dict:
    """A JSON `<placement>_noise` object as reader columns: noise_<key> for the summary,
    noise_samples_us and noise_run_medians_us as tuples. {} when it is not one."""
    if not isinstance(block, dict):
        return {}
    out = {}
    for key, column in zip(SUMMARY_KEYS, CSV_COLUMNS):
        value = block.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[column] = float(value)
    for key in ("samples_us", "run_medians_us", "run_fastest_us"):
        values = block.get(key)
        if isinstance(values, list):
            out[f"noise_{key}"] = tuple(float(v) for v in values if isinstance(v, (int, float)))
    return out


def mann_whitney_greater(new: Sequence[float], base: Sequence[float]) -> float:
    """One-sided p-value of the Mann-Whitney U test that `new` tends to be larger than
    `base` (normal approximation with a tie correction and a continuity correction; both
    sides should hold MIN_SAMPLES or more)."""
    n1, n2 = len(new), len(base)
    if not n1 or not n2:
        return math.nan
    pooled = sorted([(v, 0) for v in new] + [(v, 1) for v in base])
    ranks = [0.0] * len(pooled)
    ties = 0.0
    i = 0
    while i < len(pooled):
        j = i
        while j + 1 < len(pooled) and pooled[j + 1][0] == pooled[i][0]:
            j += 1
        for k in range(i, j + 1):
            ranks[k] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t ** 3 - t
        i = j + 1
    u = sum(r for r, (_, side) in zip(ranks, pooled) if side == 0) - n1 * (n1 + 1) / 2
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:
        return 1.0
    z = (u - n1 * n2 / 2 - 0.5) / math.sqrt(variance)
    return 0.5 * math.erfc(z / math.sqrt(2))


@dataclass
class Side:
    """What one file says about one row: the headline time per op, and its noise."""

    time_us: float
    samples_us: tuple[float, ...] = ()
    summary: dict | None = None        # summarise()'s numbers (from the JSON, CSV or samples)
    run_medians_us: tuple[float, ...] = ()  # one per run or repeat pooled into it (several: a baseline)
    host_us: float = math.nan          # host time per call; NaN when the file lacks it
    host_bound_possible: bool = False  # eager torch NCCL: a row can be set by the host's cost per call
    on_host: bool = False              # a CPU backend (gloo): the host does the collective itself
    run_fastest_us: tuple[float, ...] = ()  # each run's fastest block (several: a baseline)
    size_bytes: int = 0
    level: float = math.nan            # its file's level_spread

    @property
    def has_summary(self) -> bool:
        return self.summary is not None and (self.summary.get("n") or 0) >= MIN_SAMPLES

    @property
    def has_samples(self) -> bool:
        return len(self.samples_us) >= MIN_SAMPLES

    @property
    def host_bound(self) -> bool:
        """The host's cost per call can have set this row's time: its fastest block of
        iterations ran faster than HOST_BOUND x that cost per op (with samples), or its
        time is within HOST_BOUND x that cost (without)."""
        if not (self.host_bound_possible and self.host_us > 0 and math.isfinite(self.host_us)):
            return False
        fastest = (self.summary or {}).get("min_us")
        if self.has_summary and fastest is not None and math.isfinite(fastest):
            return fastest < HOST_BOUND * self.host_us
        return 0 < self.time_us <= HOST_BOUND * self.host_us

    @property
    def level_noisy(self) -> bool:
        """Its time moves with the host's pace from run to run (see the module's text)."""
        return self.on_host or self.host_bound

    @property
    def fastest_us(self) -> float:
        """Its fastest block of iterations; of a baseline, the slowest run's fastest block
        (the pooled samples' fastest is the luckiest run's)."""
        kept = [v for v in self.run_fastest_us if math.isfinite(v)]
        if len(kept) > 1:
            return max(kept)
        return (self.summary or {}).get("min_us", math.nan) if self.has_summary else math.nan


@dataclass
class Verdict:
    slower: bool      # slower than the threshold and beyond the noise: a regression
    basis: str        # "samples" | "summaries" | "threshold only"
    detail: str       # the numbers the decision read, for the report
    host_bound: bool = False  # set by the host's cost per call in BASE or NEW
    p_value: float = math.nan


def level_spread(sides: Sequence[Side]) -> float:
    """The level spread of one file: 1.4826 x the median absolute deviation of the log
    fastest block of its level-noisy rows on the latency floor (a standard deviation for
    normal noise, unmoved by a few outliers). The floor: rows whose fastest block is within
    LEVEL_FLOOR x the median fastest block of the level-noisy rows of the file's
    FLOOR_SIZES smallest sizes (one odd row there moves it little), whose time does not grow
    with the size. NaN with fewer than LEVEL_MIN_ROWS such rows."""
    noisy = [(s.size_bytes, s.fastest_us) for s in sides if s.level_noisy and s.size_bytes > 0]
    noisy = [(size, v) for size, v in noisy if math.isfinite(v) and v > 0]
    if len(noisy) < LEVEL_MIN_ROWS:
        return math.nan
    smallest = sorted({size for size, _ in noisy})[:FLOOR_SIZES]
    floor = quantile(sorted(v for size, v in noisy if size in smallest), 0.5)
    logs = sorted(math.log(v) for _, v in noisy if v <= LEVEL_FLOOR * floor)
    if len(logs) < LEVEL_MIN_ROWS:
        return math.nan
    mid = quantile(logs, 0.5)
    return 1.4826 * quantile(sorted(abs(v - mid) for v in logs), 0.5)


def judge(base: Side, new: Side, threshold: float) -> Verdict:
    """Whether NEW (slower than BASE by more than `threshold` on the headline time, which the
    caller has checked) is slower beyond the noise both files show."""
    host_bound = new.host_bound or base.host_bound
    shift = 0.0  # host-bound: what the host's cost per call rose by, excused everywhere below
    if host_bound and math.isfinite(new.host_us) and math.isfinite(base.host_us):
        shift = max(0.0, new.host_us - base.host_us)
        # The row's time is the host's cost per call: judged against it, so that a host that
        # issues calls more slowly is told apart from a collective that got slower. The part
        # of the slowdown the host cost per call rose by is the host's.
        if not new.time_us > (base.time_us + shift) * (1 + threshold):
            return Verdict(False, "host cost", f"time {base.time_us:.2f} -> {new.time_us:.2f} us, host cost per "
                           f"call {base.host_us:.2f} -> {new.host_us:.2f} us", host_bound)
    if not (base.has_summary and new.has_summary):
        return Verdict(True, "threshold only", "no noise recorded in "
                       + ("either file" if not (base.has_summary or new.has_summary)
                          else "BASE" if not base.has_summary else "NEW"), host_bound)
    b, n = base.summary, new.summary
    checks = [n["median_us"] > (b["median_us"] + shift) * (1 + threshold), n["p25_us"] > b["p75_us"] + shift]
    if len(base.run_medians_us) > 1:
        checks.append(n["median_us"] > max(base.run_medians_us) + shift)
    detail = (f"median {b['median_us']:.4g} -> {n['median_us']:.4g} us, "
              f"NEW p25 {n['p25_us']:.4g} vs BASE p75 {b['p75_us']:.4g} us")
    if base.level_noisy or new.level_noisy:
        level = math.hypot(*(v for v in (base.level, new.level) if math.isfinite(v)))
        allowed = max(1 + threshold, math.exp(LEVEL_Z * level))
        fastest_base, fastest_new = base.fastest_us, new.fastest_us
        if math.isfinite(fastest_base) and math.isfinite(fastest_new):
            beyond_level = fastest_new - shift > fastest_base * allowed
            # beyond doubt, however wide the level spread: every NEW block slower than every BASE block
            apart = n["min_us"] - shift > b["max_us"] and fastest_new - shift > fastest_base * (1 + threshold)
            checks.append(beyond_level or apart)
            detail += f", fastest block {fastest_base:.4g} -> {fastest_new:.4g} us (level spread allows x{allowed:.3g}"
            detail += "; every NEW block slower than every BASE block)" if apart and not beyond_level else ")"
    if shift:
        detail += f", host cost per call up {shift:.3g} us"
    p = math.nan
    basis = "summaries"
    if base.has_samples and new.has_samples:
        basis = "samples"
        p = mann_whitney_greater([v - shift for v in new.samples_us], base.samples_us)
        checks.append(p < ALPHA)
        detail += f", Mann-Whitney p={p:.2g}"
    return Verdict(all(checks), basis, detail, host_bound, p)


def pooled(sides: Sequence[Side]) -> Side:
    """One Side from several runs of the same row (a baseline, or a run's repeats): the best
    headline time, every sample, the median of each run."""
    samples = tuple(v for s in sides for v in s.samples_us)
    medians = tuple(s.summary["median_us"] for s in sides if s.summary)
    summary = summarise(samples) if samples else None
    if summary is None and medians:
        summary = _pooled_summaries([s.summary for s in sides if s.summary])
    hosts = [s.host_us for s in sides if math.isfinite(s.host_us)]
    return Side(time_us=min(s.time_us for s in sides), samples_us=samples, summary=summary,
                run_medians_us=medians, host_us=min(hosts) if hosts else math.nan,
                host_bound_possible=any(s.host_bound_possible for s in sides),
                on_host=any(s.on_host for s in sides), size_bytes=sides[0].size_bytes if sides else 0)


def _pooled_summaries(summaries: list[dict]) -> dict:
    """Summaries without samples (CSV): the widest middle half and the middle median."""
    medians = sorted(s["median_us"] for s in summaries)
    return {"n": sum(int(s.get("n") or 0) for s in summaries), "min_us": min(s["min_us"] for s in summaries),
            "p25_us": min(s["p25_us"] for s in summaries), "median_us": quantile(medians, 0.5),
            "p75_us": max(s["p75_us"] for s in summaries), "p90_us": max(s["p90_us"] for s in summaries),
            "max_us": max(s["max_us"] for s in summaries)}
