"""The noise rule and the size ranges a tuner config gets."""

import pytest

from ncclbench.tune.ranges import Series, judge, size_bounds, win_ranges

DEFAULT = Series([100.0, 101.0, 99.0], setting=("ring", "ll128", 16))


def test_a_clear_win():
    v = judge(1 << 20, DEFAULT, {"tree/ll128": Series([110.0, 111.0, 109.0], setting=("tree", "ll128", 16))}, 3)
    assert v.win is True and v.best == "tree/ll128" and v.gain_pct == pytest.approx(10.0)
    assert v.noise_pct == pytest.approx(1.0)


@pytest.mark.parametrize("candidate,why", [
    (Series([106.0, 98.5, 107.0]), "within noise"),                    # its slowest repeat is below the default's fastest
    (Series([101.6, 101.7, 101.8]), "gain below 2 %"),                  # clear of the noise but too small to matter
    (Series([110.0, 111.0, 109.0], setting=("ring", "ll128", 16)), "NCCL's own choice"),
])
def test_no_win(candidate, why):
    v = judge(1 << 20, DEFAULT, {"x": candidate}, 3)
    assert v.win is False and v.why.startswith(why)


def test_wrong_results_and_missing_repeats_never_win():
    cands = {"fast but wrong": Series([300.0, 300.0, 300.0], wrong=True), "fast, one repeat lost": Series([300.0, 300.0]),
             "honest": Series([105.0, 105.0, 105.0])}
    v = judge(8, DEFAULT, cands, 3)
    assert v.best == "honest" and v.win is True


def test_one_repeat_calls_nothing():
    v = judge(8, Series([100.0]), {"x": Series([150.0])}, 1)
    assert v.win is None and "one repeat" in v.why and v.gain_pct == pytest.approx(50.0)


def test_a_bad_default_gets_no_verdict():
    assert judge(8, Series([100.0, 100.0], wrong=True), {"x": Series([150.0, 150.0])}, 2).why == \
        "the default's results were wrong"
    assert judge(8, Series([]), {"x": Series([150.0, 150.0])}, 2).win is None


def test_bounds_are_halfway_to_the_neighbours_like_optimize_config():
    """NCCL's optimize_config.py: the first range from 0 to the midpoint with the next size,
    each next from the previous end + 1, the last ending at the largest size."""
    assert size_bounds([32, 8, 16]) == {8: (0, 12), 16: (13, 24), 32: (25, 32)}
    assert size_bounds([1024]) == {1024: (0, 1024)}


def _verdicts(wins):
    """sizes 1K..64K; wins: size -> setting (None: no win)."""
    out = []
    for k, size in enumerate([1 << e for e in range(10, 17)]):
        setting = wins.get(size)
        v = judge(size, Series([100.0, 100.0], setting=("ring", "ll", 4)),
                  {f"c{k}": Series([120.0, 120.0] if setting else [99.0, 99.0], setting=setting)}, 2)
        out.append(v)
    return out


def test_adjacent_wins_of_one_setting_merge():
    a, b = ("tree", "ll", 4), ("tree", "ll128", 8)
    ranges = win_ranges(_verdicts({2048: a, 4096: a, 8192: a, 16384: b, 65536: a}))
    assert [(r.setting, r.sizes) for r in ranges] == [(a, [2048, 4096, 8192]), (b, [16384]), (a, [65536])]
    assert (ranges[0].min_bytes, ranges[0].max_bytes) == (1537, 12288)
    assert (ranges[1].min_bytes, ranges[1].max_bytes) == (12289, 24576)
    assert (ranges[2].min_bytes, ranges[2].max_bytes) == (49153, 65536)
    assert ranges[0].gains == pytest.approx([20.0, 20.0, 20.0])


def test_a_gap_splits_a_range():
    a = ("tree", "ll", 4)
    ranges = win_ranges(_verdicts({1024: a, 4096: a}))
    assert [r.sizes for r in ranges] == [[1024], [4096]]
    assert ranges[0].min_bytes == 0


def test_a_win_without_a_known_setting_makes_no_range():
    assert win_ranges(_verdicts({})) == []
    v = judge(8, Series([100.0, 100.0]), {"x": Series([120.0, 120.0])}, 2)  # setting unknown
    assert v.win is True and win_ranges([v]) == []
