"""When a forced combination beats NCCL's default, when a deployed config is slower than
NCCL's default, and over which size ranges a win holds.

Noise, from the numbers of the run itself: at one size, the largest spread (fastest minus
slowest repeat, in % of the median) that any one configuration showed over its repeats.
Every repeat runs on a fresh communicator, so the spread covers communicator-to-
communicator differences as well as timing noise; taking the largest over all
configurations measured at that size (the default and every forced one: 7 for all_reduce
on one node with NVLS off) does not trust a default that happened to repeat closely.

The rule (printed with every table): at one size a combination wins when
  * it ran every repeat with no wrong result, and the default did too;
  * its median busbw is at least `min_gain_pct` % above the default's median, and more
    than the noise at that size;
  * its slowest repeat is faster than the default's fastest (the two spreads do not
    overlap);
  * there were MIN_REPEATS repeats or more;
  * it is not what NCCL itself runs at that size (same algorithm, protocol and channel
    count): forcing NCCL's own choice changes nothing, so its gain is noise.
Why MIN_REPEATS = 3 and DEFAULT_REPEATS = 5: with fewer repeats the best of several
combinations no faster than the default is called a win too often; simulated in
tests/test_tune_ranges.py (see docs/design/tune-graph-timing.md).
Winning sizes next to each other with the same row setting merge into one range. A
measured size stands for the sizes halfway to its neighbours (the first from 0, the last
up to itself), as NCCL's optimize_config.py draws its ranges."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

MIN_REPEATS = 3
DEFAULT_REPEATS = 5
RULE_TEXT = ("a combination wins at a size when its median busbw is >= {gain:g} % above the default's and above the "
             "noise (the largest spread of any configuration's repeats there), its slowest repeat beats the default's "
             f"fastest, none of its results is wrong, there were {MIN_REPEATS} repeats or more, and it is not the "
             "algorithm, protocol and channel count NCCL already runs there")


@dataclass
class Series:
    """One configuration's repeats at one size."""

    busbw: list[float]            # GB/s, one per repeat that ran
    wrong: bool = False           # any wrong element in any repeat
    setting: tuple | None = None  # (algo, proto, channels) NCCL actually ran, when known
    channel_limit: int | None = None  # the combination's --channels limit; None: NCCL's own count
    timing: str = ""              # graph | eager ('' unknown): a configuration timed unlike the default
                                  # (an eager fallback) never widens the noise of the others
    rounds: list[int] | None = None   # the repeat each value came from (--paired pairs them by it)
    sets: list | None = None          # --paired: the launch that ran each value (a set's communicators are its)

    @property
    def median(self) -> float:
        """nan where the cell was N/A (one rank on torch's backends: no out-of-place call)."""
        return statistics.median(self.busbw) if self.busbw else 0.0

    @property
    def measured(self) -> bool:
        return bool(self.busbw) and not math.isnan(self.median)

    @property
    def spread_pct(self) -> float | None:
        """Fastest minus slowest repeat, in % of the median (None: under 2 repeats)."""
        if len(self.busbw) < 2 or not self.measured or self.median <= 0 or any(math.isnan(b) for b in self.busbw):
            return None
        return (max(self.busbw) - min(self.busbw)) / self.median * 100

    @property
    def row_setting(self) -> tuple | None:
        """(algo, proto, channels) for a config row reproducing this run: channels 0 (NCCL's own
        count, as the run had) without a limit, else the count NCCL ran; None if not known."""
        if not self.setting or self.setting[0] is None or self.setting[1] is None:
            return None
        if self.channel_limit is None:
            return (self.setting[0], self.setting[1], 0)
        return self.setting if self.setting[2] else None


def finite(values: list[float]) -> list[float | None]:
    """Repeats for JSON: nan (not measured) as null."""
    return [None if math.isnan(v) else v for v in values]


def noise_at(series) -> float | None:
    """The noise at one size: the largest spread of any clean configuration's repeats there."""
    spreads = [s.spread_pct for s in series if not s.wrong]
    spreads = [x for x in spreads if x is not None]
    return max(spreads) if spreads else None


@dataclass
class Verdict:
    size: int
    default: Series
    best: str | None = None        # the best eligible combination's label
    best_series: Series | None = None
    gain_pct: float | None = None
    win: bool | None = None        # None: not judged (why says so)
    why: str = ""
    noise_pct: float | None = None  # noise_at() over the default and every candidate timed as it was
    confirmation: str = ""          # how a second launch confirmed (or refuted) the win (precision.confirm)
    interval: tuple | None = None   # --paired: the 95 % interval of the best's median ratio to the default


def too_few_repeats(repeats: int) -> str:
    return (f"{repeats} repeat(s): too few to tell a gain from noise, no win called (needs {MIN_REPEATS}; "
            f"default {DEFAULT_REPEATS})")


def default_unusable(default: Series) -> str:
    """Why NCCL's default at a size cannot be compared with ('' when it can)."""
    if not default.busbw:
        return "the default did not run"
    return "the default's results were wrong" if default.wrong else ""


def judge(size: int, default: Series, candidates: dict[str, Series], repeats: int,
          min_gain_pct: float = 2.0) -> Verdict:
    """The verdict at one size (candidates: label -> Series, refused ones not included)."""
    alike = [s for s in candidates.values() if s.timing == default.timing]
    v = Verdict(size, default, noise_pct=noise_at([default, *alike]))
    v.why = default_unusable(default)
    if v.why:
        return v
    eligible = {k: s for k, s in candidates.items() if len(s.busbw) == repeats and not s.wrong}
    if not eligible:
        v.why = "no forced combination ran cleanly"
        return v
    v.best, v.best_series = max(eligible.items(), key=lambda kv: kv[1].median)
    base = default.median
    v.gain_pct = (v.best_series.median / base - 1) * 100 if base > 0 and v.best_series.measured else None
    if repeats < MIN_REPEATS or len(default.busbw) < MIN_REPEATS:
        v.why = too_few_repeats(min(repeats, len(default.busbw)))
        return v
    if v.gain_pct is None:
        v.win, v.why = False, "the default measured 0 GB/s"
    elif v.gain_pct <= 0:
        v.win, v.why = False, "the default is faster"
    elif v.gain_pct < min_gain_pct:
        v.win, v.why = False, f"gain below {min_gain_pct:g} %"
    elif min(v.best_series.busbw) <= max(default.busbw):
        v.win, v.why = False, "within noise (the repeats overlap)"
    elif (noise := _noise_for(v)) is not None and v.gain_pct <= noise:
        v.win, v.why = False, f"within noise (a configuration's repeats spread {noise:.1f} % here)"
    elif v.best_series.setting is not None and v.best_series.setting == default.setting:
        v.win, v.why = False, "NCCL's own choice"
    else:
        v.win, v.why = True, "above noise"
    return v


def _noise_for(v: Verdict) -> float | None:
    """The noise the best must clear: the size's noise, and its own spread when it was timed
    unlike the default (an eager fallback's spread is in no other column)."""
    if v.best_series.timing == v.default.timing:
        return v.noise_pct
    own = [x for x in (v.noise_pct, v.best_series.spread_pct) if x is not None]
    return max(own) if own else None


def size_bounds(sizes, last_max: int | None = None) -> dict[int, tuple[int, int]]:
    """size -> (min_bytes, max_bytes) it stands for: halfway to its neighbours (the integer
    midpoint goes to the smaller size), the first from 0, the last up to `last_max` (None:
    up to itself, optimize_config.py's automatic ranges)."""
    ordered = sorted(set(sizes))
    out, lo = {}, 0
    for i, s in enumerate(ordered):
        hi = (s + ordered[i + 1]) // 2 if i + 1 < len(ordered) else (s if last_max is None else last_max)
        out[s] = (lo, hi)
        lo = hi + 1
    return out


@dataclass
class Range:
    setting: tuple                 # (algo, proto, channels) as the config row will say (0: NCCL's own count)
    label: str                     # the combination's label
    sizes: list[int] = field(default_factory=list)
    gains: list[float] = field(default_factory=list)
    confirmations: list[str] = field(default_factory=list)  # per size, how launch 2 confirmed it
    min_bytes: int = 0
    max_bytes: int = 0


def win_ranges(verdicts: list[Verdict]) -> list[Range]:
    """Winning sizes merged into ranges: consecutive measured sizes won with the same row
    setting (a size without a win, or a different setting, ends a range). A win whose
    setting cannot be written (no TUNING line) makes no range."""
    ordered = sorted((v for v in verdicts if v.size > 0), key=lambda v: v.size)
    bounds = size_bounds([v.size for v in ordered])
    ranges: list[Range] = []
    current = None
    for v in ordered:
        setting = v.best_series.row_setting if v.win and v.best_series else None
        if setting is None:
            current = None
            continue
        if current is None or current.setting != setting:
            current = Range(setting, v.best, min_bytes=bounds[v.size][0])
            ranges.append(current)
        current.sizes.append(v.size)
        current.gains.append(v.gain_pct)
        current.confirmations.append(v.confirmation)
        current.max_bytes = bounds[v.size][1]
    return ranges


# ---- a deployed config against NCCL's default (--verify) -----------------------------------
def _steady_spread(series: Series) -> float | None:
    """A launch's repeat spread in % of its median with its slowest repeat left out (from
    three repeats: one stall is not the launch's noise)."""
    kept = sorted(series.busbw)[1:] if len(series.busbw) >= 3 else list(series.busbw)
    return Series(kept).spread_pct if len(kept) >= 2 else None


@dataclass
class DeployVerdict:
    """NCCL's default (measured in a launch before and one after the plugin's) against the
    plugin's launch, at one size."""

    size: int
    default: Series               # every repeat of the default, both launches
    plugin: Series
    change_pct: float | None = None
    noise_pct: float | None = None
    drift_pct: float | None = None  # the default's median after the plugin's launch against before, %
    slower: bool | None = None      # None: not judged (why says so)
    faster: bool = False
    wrong: bool = False             # a wrong element under the plugin
    why: str = ""


def judge_deploy(size: int, before: Series, after: Series, plugin: Series, min_change_pct: float = 2.0,
                 min_repeats: int = MIN_REPEATS) -> DeployVerdict:
    """Whether the plugin's config made this size slower (or faster) than NCCL's default
    beyond the noise. One-sided, for safety: slower is judged against the better-for-the-
    plugin of the default's two launches (the lower median), and the noise is the default's
    alone (each launch's repeat spread, one stalled repeat left out, and its drift between
    the two launches): a plugin whose own repeats scatter, or a default with one stall,
    widens nothing. Slower: at least `min_change_pct` % and more than that noise. Faster
    needs more: beyond the noise of every launch, the plugin's included, and no overlap."""
    default = Series(before.busbw + after.busbw, before.wrong or after.wrong)
    v = DeployVerdict(size, default, plugin)
    if plugin.wrong:
        v.wrong, v.why = True, "WRONG RESULTS under the plugin"
        return v
    if not default.measured or default.wrong:
        v.why = "the default was not measured cleanly here"
        return v
    if not plugin.measured:
        v.why = "not measured under the plugin"
        return v
    v.change_pct = (plugin.median / default.median - 1) * 100 if default.median > 0 else None
    if before.measured and after.measured and default.median > 0:
        v.drift_pct = (after.median - before.median) / default.median * 100
    drift = abs(v.drift_pct) if v.drift_pct is not None else 0.0
    default_noise = max([drift] + [x for x in (_steady_spread(before), _steady_spread(after)) if x is not None])
    parts = [x for x in (before.spread_pct, after.spread_pct, plugin.spread_pct, drift) if x is not None]
    v.noise_pct = max(parts) if parts else None
    if len(default.busbw) < min_repeats or len(plugin.busbw) < min_repeats or v.change_pct is None:
        v.why = f"fewer than {min_repeats} repeats: not judged"
        return v
    reference = min(x.median for x in (before, after) if x.measured)
    loss_pct = (1 - plugin.median / reference) * 100 if reference > 0 else 0.0
    beyond = abs(v.change_pct) >= min_change_pct and (v.noise_pct is None or abs(v.change_pct) > v.noise_pct)
    if loss_pct >= min_change_pct and loss_pct > default_noise:
        v.slower, v.why = True, "SLOWER beyond noise"
        v.change_pct, v.noise_pct = -loss_pct, default_noise
    elif v.change_pct > 0 and beyond and min(plugin.busbw) > max(default.busbw):
        v.slower, v.faster, v.why = False, True, "faster beyond noise"
    else:
        v.slower, v.why = False, "within noise"
    return v
