"""When a forced combination beats NCCL's default, and over which size ranges.

The rule (printed with every table): at one size a combination wins when
  * it ran every repeat with no wrong result, and the default did too;
  * its median busbw is at least `min_gain_pct` % above the default's median;
  * its slowest repeat is faster than the default's fastest (the two spreads do not
    overlap), which needs two repeats or more: with one repeat no win is called;
  * it is not what NCCL itself runs at that size (same algorithm, protocol and channel
    count): forcing NCCL's own choice changes nothing, so its gain is noise.
Winning sizes next to each other with the same setting merge into one range. A measured
size stands for the sizes halfway to its neighbours (the first from 0, the last up to
itself), as NCCL's optimize_config.py draws its ranges."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

RULE_TEXT = ("a combination wins at a size when its median busbw is >= {gain:g} % above the default's, its slowest "
             "repeat beats the default's fastest, none of its results is wrong, and it is not the algorithm, "
             "protocol and channel count NCCL already runs there")


@dataclass
class Series:
    """One combination's repeats at one size."""

    busbw: list[float]            # GB/s, one per repeat that ran
    wrong: bool = False           # any wrong element in any repeat
    setting: tuple | None = None  # (algo, proto, channels) NCCL actually ran, when known

    @property
    def median(self) -> float:
        """nan where the cell was N/A (one rank on torch's backends: no out-of-place call)."""
        return statistics.median(self.busbw) if self.busbw else 0.0

    @property
    def measured(self) -> bool:
        return bool(self.busbw) and not math.isnan(self.median)


def finite(values: list[float]) -> list[float | None]:
    """Repeats for JSON: nan (not measured) as null."""
    return [None if math.isnan(v) else v for v in values]


@dataclass
class Verdict:
    size: int
    default: Series
    best: str | None = None        # the best eligible combination's label
    best_series: Series | None = None
    gain_pct: float | None = None
    win: bool | None = None        # None: not judged (why says so)
    why: str = ""

    @property
    def noise_pct(self) -> float | None:
        """The default's repeats: half their spread, in % of their median."""
        d = self.default
        if len(d.busbw) < 2 or not d.measured or d.median <= 0:
            return None
        return (max(d.busbw) - min(d.busbw)) / 2 / d.median * 100


def judge(size: int, default: Series, candidates: dict[str, Series], repeats: int,
          min_gain_pct: float = 2.0) -> Verdict:
    """The verdict at one size (candidates: label -> Series, refused ones not included)."""
    v = Verdict(size, default)
    if not default.busbw:
        v.why = "the default did not run"
        return v
    if default.wrong:
        v.why = "the default's results were wrong"
        return v
    eligible = {k: s for k, s in candidates.items() if len(s.busbw) == repeats and not s.wrong}
    if not eligible:
        v.why = "no forced combination ran cleanly"
        return v
    v.best, v.best_series = max(eligible.items(), key=lambda kv: kv[1].median)
    base = default.median
    v.gain_pct = (v.best_series.median / base - 1) * 100 if base > 0 and v.best_series.measured else None
    if repeats < 2 or len(default.busbw) < 2:
        v.why = "one repeat: no noise band, no win called (use --repeat 3)"
        return v
    if v.gain_pct is None:
        v.win, v.why = False, "the default measured 0 GB/s"
    elif v.gain_pct <= 0:
        v.win, v.why = False, "the default is faster"
    elif v.gain_pct < min_gain_pct:
        v.win, v.why = False, f"gain below {min_gain_pct:g} %"
    elif min(v.best_series.busbw) <= max(default.busbw):
        v.win, v.why = False, "within noise (the repeats overlap)"
    elif v.best_series.setting is not None and v.best_series.setting == default.setting:
        v.win, v.why = False, "NCCL's own choice"
    else:
        v.win, v.why = True, "above noise"
    return v


def size_bounds(sizes: list[int]) -> dict[int, tuple[int, int]]:
    """size -> (min_bytes, max_bytes) it stands for: halfway to its neighbours, the first
    from 0, the last up to itself (optimize_config.py's automatic ranges)."""
    ordered = sorted(set(sizes))
    out, lo = {}, 0
    for i, s in enumerate(ordered):
        hi = (s + ordered[i + 1]) // 2 if i + 1 < len(ordered) else s
        out[s] = (lo, hi)
        lo = hi + 1
    return out


@dataclass
class Range:
    setting: tuple                 # (algo, proto, channels) as the config row will say
    label: str                     # the combination's label
    sizes: list[int] = field(default_factory=list)
    gains: list[float] = field(default_factory=list)
    min_bytes: int = 0
    max_bytes: int = 0


def win_ranges(verdicts: list[Verdict]) -> list[Range]:
    """Winning sizes merged into ranges: consecutive measured sizes won by the same
    setting (a size without a win, or a different setting, ends a range)."""
    ordered = sorted((v for v in verdicts if v.size > 0), key=lambda v: v.size)
    bounds = size_bounds([v.size for v in ordered])
    ranges: list[Range] = []
    current = None
    for v in ordered:
        setting = v.best_series.setting if v.win and v.best_series else None
        if not v.win or setting is None:
            current = None
            continue
        if current is None or current.setting != setting:
            current = Range(setting, v.best, min_bytes=bounds[v.size][0])
            ranges.append(current)
        current.sizes.append(v.size)
        current.gains.append(v.gain_pct)
        current.max_bytes = bounds[v.size][1]
    return ranges
