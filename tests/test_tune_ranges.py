"""The noise rule and the size ranges a tuner config gets."""

import math
import random

import pytest

from ncclbench.tune.ranges import DEFAULT_REPEATS, MIN_REPEATS, Series, judge, size_bounds, win_ranges

DEFAULT = Series([100.0, 101.0, 99.0], setting=("ring", "ll128", 16))


def test_a_clear_win():
    v = judge(1 << 20, DEFAULT, {"tree/ll128": Series([110.0, 111.0, 109.0], setting=("tree", "ll128", 16))}, 3)
    assert v.win is True and v.best == "tree/ll128" and v.gain_pct == pytest.approx(10.0)
    assert v.noise_pct == pytest.approx(2.0)  # the largest spread of one configuration's repeats: the default's


@pytest.mark.parametrize("candidate,why", [
    (Series([106.0, 98.5, 107.0]), "within noise"),                    # its slowest repeat is below the default's fastest
    (Series([101.6, 101.7, 101.8]), "gain below 2 %"),                  # clear of the noise but too small to matter
    (Series([110.0, 111.0, 109.0], setting=("ring", "ll128", 16)), "NCCL's own choice"),
])
def test_no_win(candidate, why):
    v = judge(1 << 20, DEFAULT, {"x": candidate}, 3)
    assert v.win is False and v.why.startswith(why)


def test_a_gain_inside_another_configurations_spread_is_noise():
    """+5 %, clear of the default's repeats, but a forced configuration measured at the same
    size moved 9.6 % between its own repeats: a gain that size is not shown."""
    noisy = Series([50.0, 55.0, 52.0])
    v = judge(4096, DEFAULT, {"x": Series([105.0, 106.0, 104.9]), "noisy": noisy}, 3)
    assert v.win is False and v.why.startswith("within noise (a configuration's repeats spread 9.6 %")
    assert v.noise_pct == pytest.approx(5 / 52 * 100)
    assert judge(4096, DEFAULT, {"x": Series([105.0, 106.0, 104.9])}, 3).win is True
    # a configuration with a wrong result is no measure of the noise
    assert judge(4096, DEFAULT, {"x": Series([105.0, 106.0, 104.9]), "bad": Series([50.0, 55.0, 52.0], wrong=True)},
                 3).win is True


def test_wrong_results_and_missing_repeats_never_win():
    cands = {"fast but wrong": Series([300.0, 300.0, 300.0], wrong=True), "fast, one repeat lost": Series([300.0, 300.0]),
             "honest": Series([105.0, 105.0, 105.0])}
    v = judge(8, DEFAULT, cands, 3)
    assert v.best == "honest" and v.win is True


@pytest.mark.parametrize("repeats", [1, 2])
def test_fewer_than_three_repeats_call_nothing(repeats):
    v = judge(8, Series([100.0] * repeats), {"x": Series([150.0] * repeats)}, repeats)
    assert v.win is None and "too few to tell a gain from noise" in v.why and v.gain_pct == pytest.approx(50.0)
    assert MIN_REPEATS == 3 and DEFAULT_REPEATS == 5


def _best_of_equal_candidates(rule, repeats, rng, candidates=5, sigma=0.05):
    """One size where every forced combination is exactly as fast as the default (small
    sizes under eager timing: the host's cost per call): whether the best one is called a
    win. Relative noise sigma per repeat, one repeat in ten slowed by a stall."""
    def draw():
        x = rng.gauss(0, sigma)
        return 100 * math.exp(x - (abs(rng.gauss(0, 3 * sigma)) if rng.random() < 0.1 else 0))

    default = Series([draw() for _ in range(repeats)])
    cands = {f"c{k}": Series([draw() for _ in range(repeats)]) for k in range(candidates)}
    if rule == "old":  # median >= 2 % up and no overlap: the rule before the noise term
        best = max(cands.values(), key=lambda s: s.median)
        return best.median >= default.median * 1.02 and min(best.busbw) > max(default.busbw)
    return judge(4096, default, cands, max(repeats, MIN_REPEATS)).win is True if repeats >= MIN_REPEATS else False


def test_the_noise_rule_against_equal_configurations():
    """The numbers behind the rule (docs/tuning.md): with 2 repeats the old rule called the
    best of five equal combinations a win at about a third of such sizes (the three wins
    of 11-24 % with --repeat 2 that did not reproduce); the rule now calls one at under 3 %
    with 3 repeats and under 0.5 % with the default 5."""
    rng = random.Random(38)
    trials = 1500
    rate = lambda rule, r: sum(_best_of_equal_candidates(rule, r, rng) for _ in range(trials)) / trials  # noqa: E731
    assert rate("old", 2) > 0.25
    assert rate("old", 3) > 0.06
    assert rate("new", 3) < 0.03
    assert rate("new", DEFAULT_REPEATS) < 0.005


def test_a_bad_default_gets_no_verdict():
    assert judge(8, Series([100.0, 100.0], wrong=True), {"x": Series([150.0, 150.0])}, 2).why == \
        "the default's results were wrong"
    assert judge(8, Series([]), {"x": Series([150.0, 150.0])}, 2).win is None


def test_bounds_are_halfway_to_the_neighbours_like_optimize_config():
    """NCCL's optimize_config.py: the first range from 0 to the midpoint with the next size,
    each next from the previous end + 1, the last ending at the largest size."""
    assert size_bounds([32, 8, 16]) == {8: (0, 12), 16: (13, 24), 32: (25, 32)}
    assert size_bounds([1024]) == {1024: (0, 1024)}


def _verdicts(wins, limit=None):
    """sizes 1K..64K; wins: size -> setting NCCL ran for the winner (None: no win); `limit`:
    the winner's --channels limit."""
    out = []
    for k, size in enumerate([1 << e for e in range(10, 17)]):
        setting = wins.get(size)
        v = judge(size, Series([100.0, 100.5, 99.5], setting=("ring", "ll", 4)),
                  {f"c{k}": Series([120.0, 120.5, 119.5] if setting else [99.0] * 3, setting=setting,
                                   channel_limit=limit)}, 3)
        out.append(v)
    return out


def test_adjacent_wins_of_one_setting_merge():
    """Rows leave the channel count to NCCL (0) when the winner ran with NCCL's own count:
    the count it logged may differ between sizes of one range, as it did when measured."""
    a, a16, b = ("tree", "ll", 4), ("tree", "ll", 16), ("tree", "ll128", 8)
    ranges = win_ranges(_verdicts({2048: a, 4096: a16, 8192: a, 16384: b, 65536: a}))
    row_a, row_b = ("tree", "ll", 0), ("tree", "ll128", 0)
    assert [(r.setting, r.sizes) for r in ranges] == [(row_a, [2048, 4096, 8192]), (row_b, [16384]), (row_a, [65536])]
    assert (ranges[0].min_bytes, ranges[0].max_bytes) == (1537, 12288)
    assert (ranges[1].min_bytes, ranges[1].max_bytes) == (12289, 24576)
    assert (ranges[2].min_bytes, ranges[2].max_bytes) == (49153, 65536)
    assert ranges[0].gains == pytest.approx([20.0, 20.0, 20.0])


def test_a_channel_limited_winner_keeps_the_count_it_ran_with():
    a, a16 = ("tree", "ll", 4), ("tree", "ll", 16)
    ranges = win_ranges(_verdicts({2048: a, 4096: a16, 8192: ("tree", "ll", None)}, limit=16))
    assert [(r.setting, r.sizes) for r in ranges] == [(a, [2048]), (a16, [4096])]  # 8K: count not logged, no row


def test_a_gap_splits_a_range():
    a = ("tree", "ll", 4)
    ranges = win_ranges(_verdicts({1024: a, 4096: a}))
    assert [r.sizes for r in ranges] == [[1024], [4096]]
    assert ranges[0].min_bytes == 0


def test_a_win_without_a_known_setting_makes_no_range():
    assert win_ranges(_verdicts({})) == []
    v = judge(8, Series([100.0, 100.0, 100.0]), {"x": Series([120.0, 120.0, 120.0])}, 3)  # setting unknown
    assert v.win is True and win_ranges([v]) == []
