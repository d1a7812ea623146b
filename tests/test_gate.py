"""The CI gate: every row's noise, compare judging beyond it, baselines from several runs,
and a run that never takes the host down (-g checked against its memory)."""

from __future__ import annotations

import json
import math
import random
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import run_cli, slower_copy
from ncclbench.cli.baseline import baseline_command
from ncclbench.cli.compare import compare_command
from ncclbench.results import noise
from ncclbench.results.compare import compare_frames
from ncclbench.results.readers import read_results

SIZES = (8, 1024, 65536, 1 << 20, 16 << 20)


# ---- the pure rule ------------------------------------------------------------------------------
def test_summary_and_rank_test():
    s = noise.summarise([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s["n"], s["min_us"], s["p25_us"], s["median_us"], s["p75_us"], s["max_us"]) == (5, 1, 2, 3, 4, 5)
    assert noise.across_ranks([[1e-6, 5e-6], [2e-6, 3e-6]])["samples_us"] == pytest.approx([2.0, 5.0])
    apart = noise.mann_whitney_greater([float(v) for v in range(120, 140)], [float(v) for v in range(100, 120)])
    assert apart < 1e-6
    rng = random.Random(1)
    same = [rng.gauss(100, 5) for _ in range(40)]
    assert noise.mann_whitney_greater(same[:20], same[20:]) > 0.01
    assert noise.mann_whitney_greater([1.0] * 10, [1.0] * 10) == 1.0  # all tied: nothing to tell


def _side(median, spread=0.03, n=20, seed=0, time_us=None, host_us=float("nan"), eager=False, outlier=None):
    rng = random.Random(seed)
    samples = [median * (1 + rng.uniform(-spread, spread)) for _ in range(n)]
    if outlier:
        samples[3] = outlier
    mean = sum(samples) / n
    return noise.Side(time_us=time_us or mean, samples_us=tuple(samples), summary=noise.summarise(samples),
                      host_us=host_us, host_bound_possible=eager)


def test_a_shift_of_every_iteration_regresses_and_one_hiccup_does_not():
    base = _side(100.0, seed=1)
    assert noise.judge(base, _side(120.0, seed=2), 0.05).slower  # planted: every iteration 20% slower
    # one iteration stalled 500 us: the mean is 25% slower, the typical iteration is not
    hiccup = _side(100.0, seed=3, outlier=600.0)
    assert hiccup.time_us > base.time_us * 1.2
    verdict = noise.judge(base, hiccup, 0.05)
    assert not verdict.slower and verdict.basis == "samples"


def test_summaries_alone_and_no_noise_at_all():
    base, new = _side(100.0, seed=1), _side(130.0, seed=2)
    strip = lambda s: noise.Side(time_us=s.time_us, summary={k: v for k, v in s.summary.items() if k != "samples_us"})
    assert noise.judge(strip(base), strip(new), 0.05).basis == "summaries"
    assert noise.judge(strip(base), strip(new), 0.05).slower
    wide = _side(100.0, spread=0.6, seed=4)  # a spread wider than the shift: within noise
    assert not noise.judge(strip(wide), strip(_side(115.0, spread=0.6, seed=5)), 0.05).slower
    bare = noise.judge(noise.Side(100.0), noise.Side(110.0), 0.05)
    assert bare.slower and bare.basis == "threshold only"


def test_host_bound_rows_are_judged_against_the_host_cost():
    base = _side(20.0, seed=1, host_us=19.0, eager=True)
    slower_host = _side(26.0, seed=2, host_us=25.5, eager=True)  # the time follows the host's cost per call
    verdict = noise.judge(base, slower_host, 0.05)
    assert verdict.host_bound and not verdict.slower and verdict.basis == "host cost"
    late = _side(120.0, seed=3, host_us=45.0, eager=True)  # a late rank: far beyond the host's cost
    assert noise.judge(base, late, 0.05).slower


def test_host_bound_is_read_from_the_fastest_block():
    """With samples, a row is host-bound when even its fastest block of iterations was not
    held back by the GPU (faster than HOST_BOUND x the host's cost per call)."""
    paced = _side(50.0, spread=0.1, host_us=48.0, eager=True)       # fastest ~45 us < 1.1 x 48
    device = _side(65.0, spread=0.02, host_us=50.0, eager=True)     # fastest ~64 us > 1.1 x 50
    assert paced.host_bound and not device.host_bound
    assert not _side(50.0, spread=0.1, host_us=48.0, eager=False).host_bound  # gloo, graphs: never


def _floor_sides(times, on_host=True):
    return [noise.Side(time_us=t, samples_us=(t,) * 20, summary=noise.summarise([t] * 20), on_host=on_host,
                       size_bytes=8 << i) for i, t in enumerate(times)]


def test_level_spread_reads_the_latency_floor_only():
    rng = random.Random(4)
    floor = [50.0 * math.exp(rng.gauss(0, 0.2)) for _ in range(12)]
    big = [400.0, 1600.0, 6400.0]  # rows whose time grows with the size: not the floor
    spread = noise.level_spread(_floor_sides(floor + big))
    assert 0.1 < spread < 0.35  # ~0.2, the spread planted, whatever the large rows do
    assert math.isnan(noise.level_spread(_floor_sides(floor[:5] + big)))  # too few rows on the floor
    assert math.isnan(noise.level_spread(_floor_sides(floor, on_host=False)))  # device-paced rows carry none


def _floor_doc(times: list, seed: int, spread=0.02, backend="gloo"):
    """An ncclbench JSON document of one sweep whose rows take `times` us, tight iterations."""
    rng = random.Random(seed)
    results = []
    for i, t in enumerate(times):
        size = 8 << (2 * i)
        row = {"size": size, "count": max(1, size // 4), "type": "float", "redop": "sum", "root": "    -1"}
        for placement in ("out_of_place", "in_place"):
            samples = [t * (1 + rng.uniform(-spread, spread)) for _ in range(20)]
            mean = sum(samples) / 20
            row[placement] = {"time": mean, "alg_bw": size / mean / 1e3, "bus_bw": size / mean / 1e3, "nwrong": 0.0}
            row[f"{placement}_noise"] = noise.summarise(samples)
        results.append(row)
    return {"version": 3, "args": ["all_reduce"], "results": results,
            "ncclbench": {"collective": "all_reduce", "backend": backend, "mode": "eager", "ranks": 2}}


def test_a_row_moved_by_the_hosts_pace_passes_a_late_rank_does_not(tmp_path):
    """Two gloo runs whose floor rows (8 B-8 KiB) spread 25% apart from each other, as a busy
    host leaves them, with iterations +-30% wide: one row 1.6x slower in NEW, its quartiles
    apart but its blocks overlapping BASE's, is within the runs' level spread; a rank 2 ms
    late per call, and every row 4x slower (whose blocks all lie beyond BASE's: beyond doubt,
    however wide the spread), fail; in runs whose floors are tight, the same 1.6x fails."""
    pattern = [-0.3, 0.2, 0.0, -0.15, 0.35, -0.25]  # log spread 0.3 (1.4826 x its median deviation)
    base_times = [60.0 * math.exp(v) for v in pattern]
    new_times = [60.0 * math.exp(v) for v in reversed(pattern)]
    new_times[2] = base_times[2] * 1.6
    base = _write(tmp_path / "a.json", _floor_doc(base_times, seed=1, spread=0.3))
    new = _write(tmp_path / "b.json", _floor_doc(new_times, seed=2, spread=0.3))
    moved = _compare(base, new)
    assert moved.exit_code == 0 and "level spread allows" in moved.output, moved.output
    assert "quartiles" not in moved.output and "NEW p25" in moved.output  # the 1.6x row: quartiles apart
    late = _write(tmp_path / "late.json", _floor_doc([t + 2000.0 for t in base_times], seed=3, spread=0.3))
    caught = _compare(base, late)
    assert caught.exit_code == 1 and caught.output.count("REGRESSION") == 12, caught.output
    slower = _write(tmp_path / "x4.json", _floor_doc([t * 4 for t in base_times], seed=1, spread=0.3))
    shown = _compare(base, slower)
    assert shown.exit_code == 1 and shown.output.count("REGRESSION") == 12, shown.output
    assert shown.output.count("every NEW block slower than every BASE block") == 12
    tight = [60.0 * (1 + 0.01 * i) for i in range(6)]
    tight_new = list(tight)
    tight_new[2] *= 1.6
    shown = _compare(_write(tmp_path / "c.json", _floor_doc(tight, seed=4)),
                     _write(tmp_path / "d.json", _floor_doc(tight_new, seed=5)))
    assert shown.exit_code == 1 and shown.output.count("REGRESSION") == 2, shown.output


# ---- recorded GPU runs ----------------------------------------------------------------------------------
H200 = Path(__file__).parent / "fixtures" / "gate" / "h200-4gpu"
H100 = Path(__file__).parent / "fixtures" / "gate" / "h100-4gpu"  # recorded after the rule was set


def _regressed(base, new) -> list:
    c = compare_frames(read_results(base), read_results(new))
    rows = c.rows[c.rows["status"] == "regression"]
    return sorted({int(v) for v in rows["size_bytes"]})


@pytest.mark.parametrize("recorded", [H200, H100], ids=["h200", "h100"])
def test_recorded_healthy_pairs_pass_and_every_plant_is_caught(recorded, tmp_path):
    """11 back-to-back healthy runs and 3 planted ones on 4 H200 (fixtures/gate/h200-4gpu,
    the set the level rule was set on) and on 4 H100 (h100-4gpu, recorded afterwards): every
    healthy pair and every run against a baseline of the first three pass; fewer channels,
    another protocol and a late rank fail at the sizes they slow."""
    healthy = [recorded / f"healthy{i:02d}.json" for i in range(11)]
    assert [_regressed(a, b) for a, b in zip(healthy, healthy[1:])] == [[]] * 10
    base = tmp_path / "base.json"
    made = CliRunner().invoke(baseline_command, [*map(str, healthy[:3]), "-O", str(base)])
    assert made.exit_code == 0, made.output
    assert [_regressed(base, h) for h in healthy[3:]] == [[]] * 8
    for against in (healthy[-1], base):
        assert _regressed(against, recorded / "planted-nchannels2.json") == [2 << 20, 8 << 20, 32 << 20, 128 << 20]
        assert _regressed(against, recorded / "planted-proto-simple.json") == [8 << 20]
        assert len(_regressed(against, recorded / "planted-late-rank.json")) == 13  # every size


def _slowed(path, tmp_path, factor: float, up_to: int):
    """A copy of a recorded run whose rows up to `up_to` bytes take `factor` x as long in every
    iteration (a slower launch path or a late rank, as small rows see it)."""
    doc = slower_copy(json.loads(path.read_text()), factor, up_to)
    return _write(tmp_path / f"x{factor}-{path.name}", doc)


@pytest.mark.parametrize("recorded", [H200, H100], ids=["h200", "h100"])
def test_recorded_small_rows_twice_as_slow_fail_against_a_run_and_a_baseline(recorded, tmp_path):
    """Every row up to 2 MiB of each later healthy run made 2x slower in every iteration:
    caught against run 0 and against the baseline of runs 0-2, each time."""
    healthy = [recorded / f"healthy{i:02d}.json" for i in range(11)]
    base = tmp_path / "base.json"
    assert CliRunner().invoke(baseline_command, [*map(str, healthy[:3]), "-O", str(base)]).exit_code == 0
    assert json.loads(base.read_text())["results"][0]["in_place_noise"]["run_fastest_us"]
    for run in healthy[3:]:
        slow = _slowed(run, tmp_path, 2.0, 2 << 20)
        assert _regressed(healthy[0], slow) and _regressed(base, slow), run.name


@pytest.mark.parametrize("recorded", [H200, H100], ids=["h200", "h100"])
def test_recorded_pairs_never_lie_apart_and_a_4x_copy_does(recorded, tmp_path):
    """The healthy pairs' false alarms stay 0 with the beyond-doubt rule: in no healthy pair
    does every NEW block of a row lie beyond every BASE block (the closest: NEW's fastest at
    0.96 of BASE's slowest), while a copy of a run 4x slower in every iteration fails against
    that run on every row it slows, however wide the level spread."""
    healthy = [recorded / f"healthy{i:02d}.json" for i in range(11)]
    for a, b in zip(healthy, healthy[1:]):
        c = compare_frames(read_results(a), read_results(b))
        assert (c.rows["status"] != "regression").all()
        assert not c.rows["noise"].str.contains("every NEW block").any(), (a.name, b.name)
    caught = total = 0
    for run in healthy:  # issue 63's case: a run against its own copy, 4x slower
        base, new = read_results(run), read_results(_slowed(run, tmp_path, 4.0, 2 << 20))
        c = compare_frames(base, new)
        keys = ["size_bytes", "placement"]
        both = c.rows.merge(base[keys + ["noise_max_us"]], on=keys).merge(new[keys + ["noise_min_us"]], on=keys)
        both = both[both["size_bytes"] <= 2 << 20]
        # a row whose own blocks spread over 4x (a block the GPU ran ahead of the host, a slow
        # spell) still overlaps its copy: within its own noise; every row apart fails
        apart = both[both["noise_min_us"] > both["noise_max_us"]]
        assert (apart["status"] == "regression").all(), apart[["size_bytes", "status", "noise"]].to_string()
        caught, total = caught + len(apart), total + len(both)
    assert caught >= 0.8 * total, (caught, total)


def test_recorded_h200_pairs_fail_without_the_level_rule(monkeypatch):
    """The same healthy pairs under the rule without the level spread (LEVEL_Z = 0): most
    fail, as they did before it (7 of 10), so the rule above is what passes them."""
    monkeypatch.setattr(noise, "LEVEL_Z", 0.0)
    healthy = [H200 / f"healthy{i:02d}.json" for i in range(11)]
    failed = sum(1 for a, b in zip(healthy, healthy[1:]) if _regressed(a, b))
    assert failed >= 5


# ---- compare on files ------------------------------------------------------------------------------
def _doc(times: dict, seed: int, spread=0.03, noise_kept=True, wrong=0.0, ranks=4):
    """An ncclbench JSON document: all_reduce rows with samples around `times[size]` us."""
    rng = random.Random(seed)
    results = []
    for size in SIZES:
        row = {"size": size, "count": size // 4, "type": "float", "redop": "sum", "root": "    -1"}
        for placement in ("out_of_place", "in_place"):
            samples = [times[size] * (1 + rng.uniform(-spread, spread)) for _ in range(20)]
            t = sum(samples) / len(samples)
            bw = size / t / 1e3
            row[placement] = {"time": t, "alg_bw": bw, "bus_bw": bw * 1.5, "nwrong": wrong}
            if noise_kept:
                row[f"{placement}_noise"] = noise.summarise(samples)
        results.append(row)
    return {"version": 3, "args": ["all_reduce"], "results": results,
            "ncclbench": {"collective": "all_reduce", "backend": "gloo", "mode": "eager", "ranks": ranks}}


BASE_TIMES = {8: 40.0, 1024: 45.0, 65536: 120.0, 1 << 20: 900.0, 16 << 20: 12000.0}


def _write(path, doc):
    path.write_text(json.dumps(doc))
    return path


def _compare(*args):
    return CliRunner().invoke(compare_command, [str(a) for a in args])


def test_noisy_healthy_files_pass_where_the_threshold_alone_fails(tmp_path):
    """Planted: two healthy runs with 25% spread per iteration; the headline times differ by
    more than 5% at some sizes (the old rule failed them), the samples do not."""
    base = _write(tmp_path / "a.json", _doc(BASE_TIMES, seed=1, spread=0.25))
    new = _write(tmp_path / "b.json", _doc(BASE_TIMES, seed=2, spread=0.25))
    frame_a, frame_b = read_results(base), read_results(new)
    ratios = (frame_b["time_us"] / frame_a["time_us"]).tolist()
    assert max(ratios) > 1.06  # beyond the threshold on the headline time
    result = _compare(base, new)
    assert result.exit_code == 0, result.output
    assert "within noise" in result.output
    bare_a = _write(tmp_path / "a0.json", _doc(BASE_TIMES, seed=1, spread=0.25, noise_kept=False))
    bare_b = _write(tmp_path / "b0.json", _doc(BASE_TIMES, seed=2, spread=0.25, noise_kept=False))
    old_rule = _compare(bare_a, bare_b)
    assert old_rule.exit_code == 1 and "judged by the threshold alone" in old_rule.output


def test_planted_regressions_are_caught(tmp_path):
    base = _write(tmp_path / "a.json", _doc(BASE_TIMES, seed=1, spread=0.1))
    slower_large = {**BASE_TIMES, 1 << 20: 1400.0, 16 << 20: 19000.0}  # as if fewer channels
    result = _compare(base, _write(tmp_path / "b.json", _doc(slower_large, seed=2, spread=0.1)))
    assert result.exit_code == 1 and result.output.count("REGRESSION") == 4, result.output
    late = {s: t + 2000.0 for s, t in BASE_TIMES.items()}  # a rank 2 ms late per call
    result = _compare(base, _write(tmp_path / "c.json", _doc(late, seed=3, spread=0.1)))
    # every row up to 1 MiB; the 16 MiB row, 17% slower, stays within six level spreads of
    # the late run's floor (its rows, all ~2 ms, spread 3%)
    assert result.exit_code == 1 and result.output.count("REGRESSION") == 8, result.output


def test_tiny_busbw_is_never_judged_by_rounded_numbers(tmp_path):
    """8 B rows: busbw ~1e-4 GB/s prints 0.00; the ratio comes from the times."""
    base = read_results(_write(tmp_path / "a.json", _doc(BASE_TIMES, seed=1, noise_kept=False)))
    new = read_results(_write(tmp_path / "b.json", _doc(BASE_TIMES, seed=1, noise_kept=False)))
    comparison = compare_frames(base, new)
    row = comparison.rows[comparison.rows["size_bytes"] == 8].iloc[0]
    assert row["ratio"] == pytest.approx(1.0) and row["status"] == "ok"
    rows = comparison.rows.assign(status=comparison.rows["status"])
    assert (rows["status"] == "ok").all()


def test_a_baseline_of_several_runs(tmp_path):
    runs = [_write(tmp_path / f"r{i}.json", _doc(BASE_TIMES, seed=i, spread=0.2)) for i in range(3)]
    out = tmp_path / "base.json"
    made = CliRunner().invoke(baseline_command, [*map(str, runs), "-O", str(out)])
    assert made.exit_code == 0, made.output
    doc = json.loads(out.read_text())
    row = doc["results"][0]
    assert row["out_of_place_noise"]["runs"] == 3 and len(row["out_of_place_noise"]["run_medians_us"]) == 3
    assert len(row["out_of_place_noise"]["samples_us"]) == 60
    best = min(json.loads(r.read_text())["results"][0]["out_of_place"]["time"] for r in runs)
    assert row["out_of_place"]["time"] == pytest.approx(best)
    healthy = _write(tmp_path / "new.json", _doc(BASE_TIMES, seed=9, spread=0.2))
    assert _compare(out, healthy).exit_code == 0
    slow = _write(tmp_path / "slow.json", _doc({s: t * 1.6 for s, t in BASE_TIMES.items()}, seed=9, spread=0.2))
    assert _compare(out, slow).exit_code == 1
    wrong = _write(tmp_path / "wrong.json", _doc(BASE_TIMES, seed=5, wrong=1.0))
    refused = CliRunner().invoke(baseline_command, [str(runs[0]), str(wrong), "-O", str(out)])
    assert refused.exit_code == 2 and "wrong results" in refused.output
    other = _write(tmp_path / "other.json", _doc(BASE_TIMES, seed=5, ranks=8))
    refused = CliRunner().invoke(baseline_command, [str(runs[0]), str(other), "-O", str(out)])
    assert refused.exit_code == 2 and "differ in ranks" in refused.output


# ---- the host's memory ------------------------------------------------------------------------------
def test_capacity_rule():
    from ncclbench.api.capacity import IDLE_RANK_BYTES, RESERVE_BYTES, check_host_capacity
    from ncclbench.engine.plan import Plan
    from ncclbench.errors import PlanError

    plan = Plan("all_reduce", min_bytes=64 << 20, max_bytes=64 << 20)
    with pytest.raises(PlanError) as refused:
        check_host_capacity([plan], 99, 99, "gloo", available=23 << 30)
    assert refused.value.exit_code == 5 and "at most" in str(refused.value)
    assert check_host_capacity([plan], 2, 2, "gloo", available=23 << 30) == []
    # GPU ranks keep their buffers on the GPU: only the idle rank counts here
    assert check_host_capacity([plan], 8, 8, "nccl", available=8 * IDLE_RANK_BYTES + RESERVE_BYTES) == []
    warnings = check_host_capacity([Plan("all_reduce", min_bytes=8, max_bytes=8)], 64, 64, "gloo",
                                   available=1 << 40)
    assert len(warnings) == 1 and "64 gloo ranks on" in warnings[0]


def test_ranks_far_beyond_memory_are_refused_before_any_starts():
    start = time.monotonic()
    r = run_cli(["allreduce", "-g", "4096", "-b", "1G", "-e", "1G", "--backend", "gloo", "--no-save"], timeout=60)
    took = time.monotonic() - start
    assert r.returncode == 5, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "of host memory" in lines[0] and len(lines[0]) < 300, r.stderr
    assert r.stdout == ""  # no header: no rank started
    assert took < 30  # a generous bound on a loaded host (it takes ~1 s)


def test_a_launcher_line_about_many_dead_ranks_stays_short():
    from ncclbench.launch import spawn

    line, = spawn.describe_exits([spawn.RankExit(r, 1000 + r, -9) for r in range(99)])
    assert "ranks 3-98 were killed by signals too" in line and len(line) < 400


# ---- real gloo runs ------------------------------------------------------------------------------
RUN = ["allreduce", "-g", "2", "--backend", "gloo", "-b", "8", "-e", "4K", "-f", "8", "--no-save"]


def _gloo_run(path, env=None):
    r = run_cli(RUN + ["-J", str(path)], env=env, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    return path


def _attempt(tmp_path, k: int) -> tuple[list, list]:
    """Three healthy runs and one with rank 1 late by 10 ms per call; the exit codes of
    compare on each healthy pair, and of each healthy run against the late one."""
    healthy = [_gloo_run(tmp_path / f"h{k}_{i}.json") for i in range(3)]
    late = _gloo_run(tmp_path / f"late{k}.json", env={"NCCLBENCH_FAULT": "slow:rank=1,us=10000"})
    pairs = [_compare(healthy[a], healthy[b]) for a, b in ((0, 1), (1, 2), (0, 2))]
    caught = [_compare(h, late) for h in healthy]
    return pairs, caught


def _busy() -> str | None:
    """Why this host cannot time anything now (other work keeps both cores busy), or None."""
    import os

    load, cpus = os.getloadavg()[0], len(os.sched_getaffinity(0))
    return f"load average {load:.1f} on {cpus} CPU(s)" if load > 3 * cpus else None


def test_healthy_gloo_pairs_pass_and_a_late_rank_fails(tmp_path):
    """With compare's defaults: three healthy pairs pass, a rank 10 ms late per call fails.
    Not 2 ms: on a 2-core CI host one healthy file's floor spread allowed x8.07 (fastest blocks
    345-457 us against 0.3-3.5 ms medians), and a 2 ms late rank's fastest block (~2.4 ms) stays
    inside that against it; 10 ms is beyond it by ~3x and still far inside what the healthy
    pairs may differ by under the threshold alone. On a shared host other work can make one run ten times slower than the next (seen on a
    2-core host at load average 16: 8 B medians of 0.5 ms and 8 ms in back-to-back runs): the
    host changed, not ncclbench, and no rule can tell that from a late rank. A round spoilt so
    is measured once more; on a host that busy the test is skipped saying so, never passed.
    A rule that always passes misses the late rank; one that fails on noise fails the pairs."""
    rounds = []
    for k in range(2):
        pairs, caught = _attempt(tmp_path, k)
        rounds.append(([int(p.exit_code) for p in pairs], [int(c.exit_code) for c in caught]))
        if all(p.exit_code == 0 for p in pairs) and all(c.exit_code == 1 for c in caught):
            return
        busy = _busy()
        if busy:
            pytest.skip(f"host too busy to time ({busy}); compare's exit codes were {rounds}")
    pytest.fail(f"no round with three passing healthy pairs and a caught late rank: {rounds}; "
                f"last healthy pair output:\n{pairs[0].output[-1500:]}")


def test_rows_write_their_noise_and_repeats_their_spread():
    from ncclbench.results.output import CSV_COLUMNS, repeat_spread, row_json
    from ncclbench.results.records import PlacementResult, ResultRow

    def row(t):
        cell = PlacementResult(t, 1.0, 1.0, 0, noise=noise.summarise([t, t * 1.1, t * 0.9, t, t]))
        return ResultRow("all_reduce", 1024, 256, "float", "sum", -1, cell, cell)

    doc = row_json(row(10.0), 20)
    assert doc["out_of_place_noise"]["n"] == 5 and len(doc["in_place_noise"]["samples_us"]) == 5
    assert noise.noise_columns(doc["out_of_place_noise"])["noise_median_us"] == pytest.approx(10.0)
    assert set(noise.CSV_COLUMNS) <= set(CSV_COLUMNS)
    spread = repeat_spread([row(10.0), row(12.0), row(11.0)])  # -N 3
    assert [(s["placement"], s["n"], s["min_us"], s["median_us"], s["max_us"]) for s in spread] == \
        [("out_of_place", 3, 10.0, 11.0, 12.0), ("in_place", 3, 10.0, 11.0, 12.0)]
    assert repeat_spread([row(10.0)]) == []
