"""Heat maps of pair measurements: drawn from made-up results of each kind (tests/fixtures/
heatmaps), checked through the figure's artists (cells, frames, label colours), not pixels."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import matplotlib.image
import pytest
from click.testing import CliRunner

from ncclbench.cli.plot import plot_command
from ncclbench.results import heatmap
from ncclbench.results.heatmap import build_figure, heatmap_from, kind_of, read_source

FIXTURES = Path(__file__).parent / "fixtures" / "heatmaps"
NCCL_TESTS = Path(__file__).parent / "fixtures" / "nccl-tests" / "h200-4gpu-nvswitch"


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def run(*args):
    return CliRunner().invoke(plot_command, [str(a) for a in args])


def panel_axes(fig):
    return [ax for ax in fig.axes if ax.images and ax.get_visible() and ax.get_title() != ""]


def marked(ax, kind: str) -> set[tuple[int, int]]:
    """Cells carrying a frame of `kind` ('slow' or 'wrong'), from the patches' ids."""
    out = set()
    for patch in ax.patches:
        gid = patch.get_gid() or ""
        if gid.startswith(kind + ":"):
            i, j = gid.split(":")[1].split(",")
            out.add((int(i), int(j)))
    return out


def red_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_yticklabels() if t.get_color() == "red"]


def symmetric(cells) -> set[tuple[int, int]]:
    return {(a, b) for a, b in cells} | {(b, a) for a, b in cells}


@pytest.mark.parametrize("name, kind", [("pairs.json", "pairs"), ("fleet.json", "fleet"),
                                        ("fleet-report.json", "fleet"), ("fleet-rails.json", "fleet"),
                                        ("preflight.json", "preflight"),
                                        ("preflight-report.json", "preflight"), ("p2p.json", "p2p")])
def test_each_kind_is_recognised_by_its_keys(name, kind):
    assert kind_of(load(name)) == kind
    assert read_source(FIXTURES / name) == load(name)


def test_sweep_results_and_other_files_are_not_heat_map_sources(tmp_path):
    assert read_source(NCCL_TESTS / "all_reduce_np4.txt") is None
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"version": 3, "results": []}))
    assert read_source(sweep) is None and read_source(tmp_path / "missing.json") is None
    assert kind_of([1, 2]) is None


def test_pairs_today_rank_matrix_with_the_flagged_pair_framed():
    fig = build_figure(heatmap_from(load("pairs.json")))
    (ax,) = panel_axes(fig)
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [f"{r} node{1 + r // 4}" for r in range(8)]
    assert marked(ax, "slow") == symmetric({(2, 6)})
    assert red_labels(ax) == [] and marked(ax, "wrong") == set()
    data = ax.images[0].get_array()
    assert data[2, 6] == pytest.approx(9.1) and data.mask[3, 3]  # the diagonal: not measured


def test_pairs_today_wrong_data_is_hatched():
    doc = load("pairs.json")
    next(p for p in doc["pairs"] if (p["rank_a"], p["rank_b"]) == (1, 4))["wrong_data"] = True
    (ax,) = panel_axes(build_figure(heatmap_from(doc)))
    assert marked(ax, "wrong") == symmetric({(1, 4)})


def test_fleet_today_one_panel_of_worst_rails_drained_host_red_and_slow_cells():
    drawn = heatmap_from(load("fleet.json"))
    (ax,) = panel_axes(build_figure(drawn))
    hosts = [f"gpu{k:02d}" for k in range(1, 7)]
    assert [t.get_text() for t in ax.get_xticklabels()] == hosts
    assert red_labels(ax) == ["gpu04"]
    gpu04 = hosts.index("gpu04")
    expected = {(gpu04, k) for k in range(6) if k != gpu04} | {(hosts.index("gpu02"), hosts.index("gpu05"))}
    assert marked(ax, "slow") == symmetric(expected)
    (panel,) = drawn.panels
    assert panel.title == "each host pair's worst rail" and panel.notes[(0, 1)].startswith("r")
    assert drawn.cells == 30  # 15 host pairs, both triangles


def test_fleet_report_one_rail_per_test_draws_each_host_pairs_worst_rail():
    """The report fleet writes: a pairs entry per test, at its worst rail, no ranks; the
    slow link names every rank of its two hosts."""
    drawn = heatmap_from(load("fleet-report.json"))
    (ax,) = panel_axes(build_figure(drawn))
    hosts = [f"gpu{k:02d}" for k in range(1, 7)]
    assert [t.get_text() for t in ax.get_xticklabels()] == hosts and red_labels(ax) == ["gpu04"]
    gpu04 = hosts.index("gpu04")
    expected = {(gpu04, k) for k in range(6) if k != gpu04} | {(hosts.index("gpu02"), hosts.index("gpu05"))}
    assert marked(ax, "slow") == symmetric(expected)
    rail = next(p["rail"] for p in load("fleet-report.json")["pairs"] if set(p["hosts"]) == {"gpu02", "gpu05"})
    assert ax.get_title() == "each host pair's worst rail"
    assert f"27.5\nr{rail}" in {t.get_text() for t in ax.texts}  # the busbw, the rail under it


def test_fleet_report_of_every_rail_draws_one_panel_per_rail():
    fig = build_figure(heatmap_from(load("fleet-rails.json")))
    rail0, rail1 = panel_axes(fig)
    assert (rail0.get_title(), rail1.get_title()) == ("rail 0", "rail 1")
    node3 = 2
    slow_node3 = symmetric({(node3, k) for k in range(4) if k != node3})
    assert marked(rail0, "slow") == slow_node3
    assert marked(rail1, "slow") == slow_node3 | symmetric({(0, 3)})  # the node1 - node4 link, rail 1 only
    assert red_labels(rail0) == red_labels(rail1) == ["node3"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["slow", "drained host (red label)"]


def test_a_link_of_the_report_is_framed_even_where_its_pair_entries_are_not_slow():
    doc = load("fleet-rails.json")
    for entry in doc["pairs"]:
        entry["slow"] = False
    rail0, rail1 = panel_axes(build_figure(heatmap_from(doc)))
    assert marked(rail0, "slow") == set() and marked(rail1, "slow") == symmetric({(0, 3)})  # its ranks: rail 1
    del doc["links"][0]["ranks"]  # a link named by its hosts only: every rail between them
    rail0, rail1 = panel_axes(build_figure(heatmap_from(doc)))
    assert marked(rail0, "slow") == marked(rail1, "slow") == symmetric({(0, 3)})


def test_preflight_report_rank_matrix_drained_host_ranks_red():
    (ax,) = panel_axes(build_figure(heatmap_from(load("preflight-report.json"))))
    assert red_labels(ax) == ["4 node2", "5 node2", "6 node2", "7 node2"]
    assert marked(ax, "slow") == symmetric({(4, 5), (1, 5), (5, 0), (5, 2)})
    data = ax.images[0].get_array()
    assert data.mask[0, 7] and not data.mask[0, 4]  # only the pairs measured are drawn


def test_preflight_today_two_rank_groups_are_the_pairs():
    drawn = heatmap_from(load("preflight.json"))
    (panel,) = drawn.panels
    assert panel.title.startswith("all_reduce")
    measured = {(i, j) for i, row in enumerate(panel.values) for j, v in enumerate(row) if v is not None}
    assert measured == symmetric({(0, 1), (2, 3), (4, 5), (6, 7)})
    assert panel.slow == symmetric({(4, 5)}) and panel.drained == {4, 5, 6, 7}


def test_p2p_matrices_unidirectional_and_bidirectional():
    fig = build_figure(heatmap_from(load("p2p.json")))
    uni, bi = panel_axes(fig)
    assert uni.get_title().startswith("unidirectional") and bi.get_title().startswith("bidirectional")
    assert [t.get_text() for t in uni.get_xticklabels()] == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert marked(uni, "wrong") == {(2, 3)} and marked(bi, "wrong") == set()
    assert uni.images[0].get_array()[1, 2] == pytest.approx(load("p2p.json")["unidirectional_gbps"][1][2])
    assert uni.images[0].get_array().mask[1, 1] and bi.images[0].get_array().mask[1, 1]  # within one GPU: left out


def test_a_cell_measured_twice_shows_its_best_and_is_slow_only_if_both_were():
    doc = load("preflight-report.json")
    doc["pairs"].append({"ranks": [5, 0], "hosts": ["node2", "node1"], "rail": None, "busbw_gbps": 23.0, "slow": False})
    (panel,) = heatmap_from(doc).panels
    assert panel.values[0][5] == 23.0 and (0, 5) not in panel.slow


def test_each_cell_carries_its_number_on_small_matrices():
    (ax,) = panel_axes(build_figure(heatmap_from(load("pairs.json"))))
    texts = {t.get_text() for t in ax.texts}
    assert "9.1" in texts and len(ax.texts) == 8 * 7


# ------------------------------------------------------------------ the command


@pytest.mark.parametrize("name, panels", [("pairs.json", 1), ("fleet.json", 1), ("fleet-report.json", 1),
                                          ("fleet-rails.json", 2),
                                          ("preflight.json", 1), ("preflight-report.json", 1), ("p2p.json", 2)])
def test_plot_writes_the_heat_map_of_each_kind(tmp_path, name, panels):
    out = tmp_path / "map.png"
    result = run(FIXTURES / name, "--out", out)
    assert result.exit_code == 0, result.output
    kind = kind_of(load(name))
    assert result.stdout == f"wrote {out} (heat map of a {kind} result, {panels} panel{'s' if panels > 1 else ''})\n"
    image = matplotlib.image.imread(out)
    assert image.shape[0] > 200 and image[..., :3].std() > 0.05


def test_plot_heat_map_as_svg_with_a_title(tmp_path):
    out = tmp_path / "map.svg"
    assert run(FIXTURES / "fleet.json", "--out", out, "--title", "cluster A, 2026-12-06").exit_code == 0
    assert "cluster A, 2026-12-06" in out.read_text()


def one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_plot_of_two_results_or_a_result_and_a_sweep_is_one_error_line(tmp_path):
    out = tmp_path / "map.png"
    line = one_error_line(run(FIXTURES / "pairs.json", FIXTURES / "p2p.json", "--out", out))
    assert line.endswith("a heat map is drawn from one pairs, preflight, fleet or p2p result at a time (2 files given)")
    one_error_line(run(FIXTURES / "pairs.json", NCCL_TESTS / "all_reduce_np4.txt", "--out", out))
    assert not out.exists()


@pytest.mark.parametrize("doc, why", [
    ({"command": "fleet", "pairs": [], "hosts": []}, "this fleet result holds no pair measurements to draw"),
    ({"command": "pairs", "pairs": [{"ranks": [0]}]}, "malformed pairs result (IndexError"),
    ({"groups": [{"ranks": [0, 1, 2]}], "hosts": [], "failures": []},
     "this preflight result holds no pair measurements to draw (no group of two ranks)"),
])  # fmt: skip
def test_a_result_without_pairs_or_malformed_is_one_error_line(tmp_path, doc, why):
    source = tmp_path / "result.json"
    source.write_text(json.dumps(doc))
    line = one_error_line(run(source, "--out", tmp_path / "map.png"))
    assert f"{source}: {why}" in line


def test_a_sweep_result_still_plots_against_size(tmp_path):
    out = tmp_path / "busbw.png"
    result = run(NCCL_TESTS / "all_reduce_np4.txt", "--out", out)
    assert result.exit_code == 0 and "series" in result.stdout


def test_figure_grows_with_the_matrix_and_stays_within_bounds():
    small = heatmap_from(load("p2p.json"))
    big = copy.deepcopy(small)
    big.panels = big.panels[:1]
    big.panels[0].labels = [f"GPU{k}" for k in range(64)]
    assert heatmap.figure_size_inches(big)[0] <= heatmap._PANEL_MAX_IN + 1.0
    assert heatmap.figure_size_inches(small)[2] == 2


def test_the_example_script_draws_every_kind_small(tmp_path):
    """scripts/heatmap_examples.py draws docs/'s images: one per kind, each under 100 KB."""
    import os
    import subprocess
    import sys

    script = Path(__file__).parent.parent / "scripts" / "heatmap_examples.py"
    env = dict(os.environ, PYTHONPATH=str(script.parent.parent))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    images = sorted(p.name for p in tmp_path.iterdir())
    assert images == ["heatmap_fleet.png", "heatmap_p2p.png", "heatmap_pairs.png", "heatmap_preflight.png"]
    assert all(0 < (tmp_path / name).stat().st_size < 100_000 for name in images)
    docs = script.parent.parent / "docs"
    assert all((docs / name).is_file() and (docs / name).stat().st_size < 100_000 for name in images)


# ------------------------------------------------------------------ the writers' own files


def test_the_file_pairs_writes_is_drawn_with_its_flagged_pair(tmp_path):
    """ncclbench.faults.pairs writes the JSON (4 ranks on 2 hosts, the 1 - 2 exchange 5x slower)."""
    from ncclbench.faults.pairs.report import PairsResult
    from ncclbench.faults.pairs.run import PairsPlan

    plan = PairsPlan(nbytes=1 << 20, iters=5, warmup_iters=1, backend="gloo", timeout_s=60, fail_below=20.0,
                     json_path=str(tmp_path / "pairs.json"), csv_path=None)
    devices = [{"rank": r, "pid": 100 + r, "host": f"host{r // 2}", "device": r % 2, "device_hex": "00",
                "device_info": "cpu"} for r in range(4)]
    busbw = {(a, b): (0.2 if (a, b) == (1, 2) else 1.0) for a in range(4) for b in range(a + 1, 4)}
    PairsResult(plan, devices, [[(0, 1), (2, 3)], [(0, 2), (1, 3)], [(0, 3), (1, 2)]], busbw, []).write_files()
    doc = read_source(tmp_path / "pairs.json")
    assert kind_of(doc) == "pairs"
    (ax,) = panel_axes(build_figure(heatmap_from(doc)))
    assert marked(ax, "slow") == symmetric({(1, 2)})
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0 host0", "1 host0", "2 host1", "3 host1"]


def test_the_file_preflight_writes_is_drawn_with_its_drained_host(tmp_path):
    from ncclbench.faults.preflight.verdict import PreflightReport

    groups = [{"name": f"pair[{k}]", "dim": "pair", "ranks": [2 * k, 2 * k + 1], "hosts": [f"host{k}"],
               "backend": "gloo", "best_busbw": {"all_reduce": 2.0 if k else 0.5},
               "verdict": "slow" if k == 0 else "ok"}
              for k in range(2)]
    hosts = [{"host": "host0", "verdict": "drain", "ranks": [0, 1], "evidence": ["rank 1 is slow alone"]},
             {"host": "host1", "verdict": "ok", "ranks": [2, 3], "evidence": []}]
    PreflightReport(passed=False, failures=["rank 1 (host0) is slow alone: drain host0"], hosts=hosts,
                    groups=groups).to_json(tmp_path / "preflight.json")
    doc = read_source(tmp_path / "preflight.json")
    assert kind_of(doc) == "preflight"
    (ax,) = panel_axes(build_figure(heatmap_from(doc)))
    assert red_labels(ax) == ["0 host0", "1 host0"] and marked(ax, "slow") == symmetric({(0, 1)})


def test_the_report_fleet_writes_is_drawn_with_its_drained_node_and_link(tmp_path):
    from ncclbench.faults.fleet.report import FleetReport
    from ncclbench.locate.finding import Finding

    names = ["a1", "a2", "a3", "a4"]
    hosts = [{"host": h, "ranks": [k], "verdict": "drain" if h == "a3" else "ok", "evidence": [], "causes": []}
             for k, h in enumerate(names)]
    tests = [{"round": 1, "kind": "screen", "host_a": a, "host_b": b, "rail": 0, "bytes": 1024,
              "busbw_gbps": 1.0 if "a3" in (a, b) else 4.0, "reference_gbps": 4.0, "below_reference_pct": 0.0,
              "slow": "a3" in (a, b), "error": None} for i, a in enumerate(names) for b in names[i + 1:]]
    tests.append({"round": 2, "kind": "confirm", "host_a": "a2", "host_b": "a4", "rail": None, "bytes": None,
                  "busbw_gbps": None, "reference_gbps": None, "below_reference_pct": 100.0, "slow": True,
                  "error": "rank 3 gone"})
    links = [{"hosts": ["a1", "a2"], "ranks": [0, 1], "evidence": "slow", "below_pct": 40.0, "path": None}]
    report = FleetReport(plan={"backend": "gloo"}, finding=Finding(hosts=hosts, links=links), tests=tests)
    (tmp_path / "fleet.json").write_text(json.dumps(report.to_dict()))
    (ax,) = panel_axes(build_figure(heatmap_from(read_source(tmp_path / "fleet.json"))))
    assert red_labels(ax) == ["a3"] and ax.get_title() == "rail 0"
    # a2 - a4 measured fine on rail 0, then failed: its best reading stands, not slow
    assert marked(ax, "slow") == symmetric({(2, 0), (2, 1), (2, 3), (0, 1)})
