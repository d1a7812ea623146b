"""Heat maps of pair measurements (`ncclbench plot` of a pairs, preflight, fleet or p2p result).

A result file is read as JSON and recognised by its keys (``kind_of``): the report shape
every fault-finding command writes (``command`` and a ``pairs`` list of
``{ranks, hosts, rail, busbw_gbps, slow}``), the older files of pairs (a ``busbw_gbps``
matrix), fleet (``nodes`` and ``tests`` rows), preflight (``groups``, two-rank groups being
pairs) and p2p (``unidirectional_gbps``). Each becomes one or more panels: rank x rank, or
host x host per rail; cells the command found slow are framed in red, wrong data is
cross-hatched, drained hosts' labels are red.

Pure up to ``build_figure``, which uses matplotlib's object API (no pyplot, no display)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

KINDS = ("pairs", "preflight", "fleet", "p2p")
DPI = 100
ANNOTATE_UP_TO = 16      # labels per axis up to which every cell carries its number
_CELL_IN = 0.5           # inches per cell (grows the figure with the matrix, within bounds)
_PANEL_MIN_IN, _PANEL_MAX_IN = 3.2, 9.0
SLOW_COLOR, DRAIN_COLOR = "red", "red"


@dataclass
class Panel:
    """One matrix: rows and columns share `labels`; values[i][j] in GB/s (None: not measured)."""

    title: str
    labels: list[str]
    values: list[list[float | None]]
    slow: set[tuple[int, int]] = field(default_factory=set)
    wrong: set[tuple[int, int]] = field(default_factory=set)
    drained: set[int] = field(default_factory=set)  # label indices
    notes: dict[tuple[int, int], str] = field(default_factory=dict)  # a cell's text under its number (a rail)


@dataclass
class HeatMap:
    kind: str
    title: str
    unit: str
    panels: list[Panel]

    @property
    def cells(self) -> int:
        return sum(1 for p in self.panels for row in p.values for v in row if v is not None)


# ------------------------------------------------------------------ recognising


def kind_of(doc: Any) -> str | None:
    """Which result a JSON document is ('pairs', 'preflight', 'fleet', 'p2p'), or None."""
    if not isinstance(doc, dict):
        return None
    if str(doc.get("schema", "")).startswith("ncclbench.p2p") or ("unidirectional_gbps" in doc and "devices" in doc):
        return "p2p"
    if doc.get("command") in ("pairs", "preflight", "fleet"):
        return doc["command"]
    if isinstance(doc.get("busbw_gbps"), list) and "devices" in doc and "rounds" in doc:
        return "pairs"
    if "nodes" in doc and "tests" in doc:
        return "fleet"
    if "groups" in doc and "hosts" in doc and "failures" in doc:
        return "preflight"
    return None


def read_source(path: str | Path) -> dict | None:
    """The JSON document at `path` when it is a result a heat map is drawn from, else None
    (not JSON, another kind of file, or unreadable: the caller's other readers say why)."""
    from ncclbench.inputs import InputFileError, read_text

    try:
        text = read_text(path, "results")  # bounded: a device, pipe or huge file is left to the other readers
        if not text.startswith("{"):
            return None
        doc = json.loads(text)
    except (InputFileError, ValueError, RecursionError):
        return None
    return doc if kind_of(doc) else None


# ------------------------------------------------------------------ converting


@dataclass
class _Pair:
    a: Any
    b: Any
    busbw: float | None
    slow: bool = False
    wrong: bool = False
    rail: int | None = None


def heatmap_from(doc: dict) -> HeatMap:
    """The panels of a recognised result. ValueError (one line) when it holds no pair or
    is malformed."""
    kind = kind_of(doc)
    if kind is None:
        raise ValueError("not a pairs, preflight, fleet or p2p result")
    try:
        return _convert(kind, doc)
    except (KeyError, TypeError, IndexError, AttributeError) as error:
        raise ValueError(f"malformed {kind} result ({type(error).__name__}: {error})") from None


def _convert(kind: str, doc: dict) -> HeatMap:
    if kind == "p2p":
        return _p2p(doc)
    new = [p for p in doc.get("pairs") or [] if isinstance(p, dict) and ("ranks" in p or "hosts" in p)]
    if new:
        return _from_report(kind, doc, new)
    if kind == "pairs" and isinstance(doc.get("busbw_gbps"), list):
        return _pairs_today(doc)
    if kind == "fleet" and isinstance(doc.get("tests"), list) and doc["tests"]:
        return _fleet_today(doc)
    if kind == "preflight" and isinstance(doc.get("groups"), list):
        return _preflight_today(doc)
    raise ValueError(f"this {kind} result holds no pair measurements to draw")


def _drained_hosts(doc: dict) -> set[str]:
    """Hosts to drain: the `drain` list (host names, or {host, reason} in older fleet files)
    and every host whose verdict is drain."""
    out = {d["host"] if isinstance(d, dict) else str(d) for d in doc.get("drain") or []}
    for record in list(doc.get("hosts") or []) + list(doc.get("nodes") or []):
        if isinstance(record, dict) and record.get("verdict") == "drain":
            out.add(record["host"])
    return out


def _rank_hosts(doc: dict, pairs: Iterable[dict] = ()) -> dict[int, str]:
    """{rank: host} from the report's hosts (or nodes) and from the pair entries."""
    out: dict[int, str] = {}
    for record in list(doc.get("hosts") or []) + list(doc.get("nodes") or []):
        if isinstance(record, dict):
            for rank in record.get("ranks") or []:
                out[int(rank)] = record["host"]
    for d in doc.get("devices") or []:
        if isinstance(d, dict) and "rank" in d:
            out[int(d["rank"])] = d.get("host", "?")
    for p in pairs:
        for rank, host in zip(p.get("ranks") or [], p.get("hosts") or []):
            out.setdefault(int(rank), host)
    return out


def _from_report(kind: str, doc: dict, entries: list[dict]) -> HeatMap:
    """The report shape: pairs between hosts (a rail, or no ranks: fleet's) are host x host
    per rail, the others rank x rank."""
    drained = _drained_hosts(doc)
    links = [link for link in doc.get("links") or [] if isinstance(link, dict)]

    def on_link(entry: dict) -> bool:
        """On a slow link of the report: its two hosts, and where both name ranks, the
        entry's ranks among the link's (a link of one rail names that rail's ranks)."""
        for link in links:
            if frozenset(link.get("hosts") or []) != frozenset(entry.get("hosts") or []):
                continue
            if not link.get("ranks") or not entry.get("ranks") or set(entry["ranks"]) <= set(link["ranks"]):
                return True
        return False

    def slow(entry: dict) -> bool:
        return bool(entry.get("slow")) or bool(entry.get("flagged")) or on_link(entry)

    def wrong(entry: dict) -> bool:
        return bool(entry.get("wrong")) or bool(entry.get("wrong_data"))

    if any(e.get("rail") is not None or not e.get("ranks") for e in entries):
        pairs = [_Pair(e["hosts"][0], e["hosts"][1], e.get("busbw_gbps"), slow(e), wrong(e), e.get("rail"))
                 for e in entries]  # fmt: skip
        hosts = sorted({h for e in entries for h in e["hosts"]} | {r["host"] for r in doc.get("hosts") or []})
        panels = _host_panels(pairs, hosts, drained)
        return HeatMap(kind, f"{kind}: busbw between hosts", "busbw (GB/s)", panels)
    rank_host = _rank_hosts(doc, entries)
    pairs = [_Pair(int(e["ranks"][0]), int(e["ranks"][1]), e.get("busbw_gbps"), slow(e), wrong(e)) for e in entries]
    detail = f"{len(rank_host)} ranks on {len(set(rank_host.values()))} hosts"
    if doc.get("size_bytes"):
        detail += f", {_size_text(doc['size_bytes'])} per exchange"
    panel = _rank_panel(pairs, rank_host, drained, detail)
    return HeatMap(kind, f"{kind}: busbw per pair of ranks", "busbw (GB/s)", [panel])


def _pairs_today(doc: dict) -> HeatMap:
    matrix = doc["busbw_gbps"]
    rank_host = _rank_hosts(doc) or {r: "?" for r in range(len(matrix))}
    records = {(p["rank_a"], p["rank_b"]): p for p in doc.get("pairs") or [] if isinstance(p, dict) and "rank_a" in p}
    pairs = []
    for a in range(len(matrix)):
        for b in range(a + 1, len(matrix)):
            record = records.get((a, b), {})
            pairs.append(_Pair(a, b, matrix[a][b], bool(record.get("flagged")), bool(record.get("wrong_data"))))
    size = doc.get("size_bytes")
    detail = f"{len(matrix)} ranks" + (f", {_size_text(size)} per exchange" if size else "")
    panel = _rank_panel(pairs, rank_host, _drained_hosts(doc), detail)
    return HeatMap("pairs", "pairs: busbw per direction", "busbw per direction (GB/s)", [panel])


def _fleet_today(doc: dict) -> HeatMap:
    link_hosts = {frozenset(link.get("hosts") or []) for link in doc.get("links") or []}
    pairs = [_Pair(t["host_a"], t["host_b"], t.get("busbw_gbps"),
                   bool(t.get("slow")) or bool(t.get("error")) or frozenset((t["host_a"], t["host_b"])) in link_hosts,
                   rail=t.get("rail"))
             for t in doc["tests"] if isinstance(t, dict) and "host_a" in t]  # fmt: skip
    hosts = sorted({p.a for p in pairs} | {p.b for p in pairs} | {n["host"] for n in doc.get("nodes") or []})
    panels = _host_panels(pairs, hosts, _drained_hosts(doc))
    return HeatMap("fleet", "fleet: busbw between hosts", "busbw (GB/s)", panels)


def _preflight_today(doc: dict) -> HeatMap:
    """Two-rank groups are pairs: their best busbw of the first collective they all ran."""
    groups = [g for g in doc["groups"]
              if isinstance(g, dict) and len(g.get("ranks") or []) == 2 and g.get("best_busbw")]
    if not groups:
        raise ValueError("this preflight result holds no pair measurements to draw (no group of two ranks)")
    collectives = [c for c in groups[0]["best_busbw"] if all(c in g["best_busbw"] for g in groups)]
    collective = collectives[0] if collectives else next(iter(groups[0]["best_busbw"]))
    pairs = [_Pair(g["ranks"][0], g["ranks"][1], g["best_busbw"].get(collective),
                   g.get("verdict") == "slow", g.get("verdict") == "wrong") for g in groups]
    rank_host = _rank_hosts(doc)
    panel = _rank_panel(pairs, rank_host, _drained_hosts(doc), f"{collective}, best busbw of each two-rank group")
    return HeatMap("preflight", "preflight: busbw per pair of ranks", "busbw (GB/s)", [panel])


def _p2p(doc: dict) -> HeatMap:
    labels = [f"GPU{d.get('index', k)}" for k, d in enumerate(doc.get("devices") or [])]
    verified = doc.get("verified") or []
    wrong = {(i, j) for i, row in enumerate(verified) for j, ok in enumerate(row) if ok is False}
    panels = []
    for key, title in (("unidirectional_gbps", "unidirectional copy, row = source, column = destination"),
                       ("bidirectional_gbps", "bidirectional copy, both directions together")):  # fmt: skip
        # the diagonal, a copy within one GPU, is no GPU-to-GPU path: left out
        matrix = [[None if i == j else v for j, v in enumerate(row)] for i, row in enumerate(doc.get(key) or [])]
        if matrix and any(v is not None for row in matrix for v in row):
            # the copies checked are the unidirectional ones
            checked = wrong if key == "unidirectional_gbps" else set()
            panels.append(Panel(title, labels, [list(row) for row in matrix], wrong=set(checked)))
    if not panels:
        raise ValueError("this p2p result holds no copy bandwidth to draw")
    size = (doc.get("config") or {}).get("size_bytes")
    return HeatMap("p2p", "p2p: GPU-to-GPU copy bandwidth" + (f", {_size_text(size)} copies" if size else ""),
                   "GB/s", panels)


def _best(pairs: list[_Pair]) -> _Pair:
    """A cell measured more than once shows its best reading, slow only if every reading
    was (the commands judge by the best of repeated readings)."""
    measured = [p for p in pairs if p.busbw is not None]
    best = max(measured, key=lambda p: p.busbw) if measured else pairs[0]
    return _Pair(best.a, best.b, best.busbw, all(p.slow for p in pairs), any(p.wrong for p in pairs), best.rail)


def _fill(panel: Panel, index: dict, cells: dict) -> None:
    for (a, b), pair in cells.items():
        i, j = index[a], index[b]
        panel.values[i][j] = panel.values[j][i] = pair.busbw
        for target in (panel.slow if pair.slow else None, panel.wrong if pair.wrong else None):
            if target is not None:
                target.update({(i, j), (j, i)})


def _key(a: Any, b: Any) -> tuple:
    return (a, b) if str(a) <= str(b) else (b, a)


def _rank_panel(pairs: list[_Pair], rank_host: dict[int, str], drained: set[str], title: str) -> Panel:
    ranks = sorted(set(rank_host) | {p.a for p in pairs} | {p.b for p in pairs})
    index = {r: k for k, r in enumerate(ranks)}
    labels = [f"{r} {rank_host.get(r, '?')}" for r in ranks]
    panel = Panel(title, labels, [[None] * len(ranks) for _ in ranks],
                  drained={index[r] for r in ranks if rank_host.get(r) in drained})
    grouped: dict[tuple, list[_Pair]] = {}
    for p in pairs:
        grouped.setdefault((min(p.a, p.b), max(p.a, p.b)), []).append(p)
    _fill(panel, index, {k: _best(v) for k, v in grouped.items()})
    return panel


def _host_panels(pairs: list[_Pair], hosts: list[str], drained: set[str]) -> list[Panel]:
    """One panel per rail where every rail was measured on the same host pairs; else one
    panel of each host pair's worst rail (its best reading there), the rail in the cell."""
    if not pairs:
        raise ValueError("no pair measurements to draw")
    index = {h: k for k, h in enumerate(hosts)}
    by_rail: dict[Any, dict[tuple, list[_Pair]]] = {}
    rails_known = sorted({p.rail for p in pairs if p.rail is not None})
    for p in pairs:
        # a test without a rail (it failed before any rail was timed) counts on every rail
        for rail in [p.rail] if p.rail is not None or not rails_known else rails_known:
            by_rail.setdefault(rail, {}).setdefault(_key(p.a, p.b), []).append(p)
    best = {rail: {k: _best(v) for k, v in cells.items()} for rail, cells in by_rail.items()}
    rails = sorted(best, key=lambda r: (r is None, r))

    def empty(title: str) -> Panel:
        return Panel(title, list(hosts), [[None] * len(hosts) for _ in hosts],
                     drained={index[h] for h in hosts if h in drained})

    if len(rails) > 1 and all(set(best[r]) == set(best[rails[0]]) for r in rails):
        panels = []
        for rail in rails:
            panel = empty(f"rail {rail}")
            _fill(panel, index, best[rail])
            panels.append(panel)
        return panels
    worst: dict[tuple, _Pair] = {}
    for rail in rails:
        for key, pair in best[rail].items():
            held = worst.get(key)
            if held is None or (pair.busbw is not None and (held.busbw is None or pair.busbw < held.busbw)):
                worst[key] = pair
    title = "each host pair's worst rail"
    if len(rails) == 1:
        title = "host pairs" if rails[0] is None else f"rail {rails[0]}"
    panel = empty(title)
    _fill(panel, index, worst)
    if len(rails) > 1:
        for (a, b), pair in worst.items():
            if pair.rail is not None:
                panel.notes[(index[a], index[b])] = panel.notes[(index[b], index[a])] = f"r{pair.rail}"
    return [panel]


def _size_text(size: int) -> str:
    from ncclbench.sizes import format_size

    return format_size(int(size))


# ------------------------------------------------------------------ drawing


def figure_size_inches(heatmap: HeatMap) -> tuple[float, float, int]:
    """(width, height, columns of panels): panels side by side up to 4, then in rows."""
    n = max(len(p.labels) for p in heatmap.panels)
    side = min(_PANEL_MAX_IN, max(_PANEL_MIN_IN, _CELL_IN * n + 1.8))
    columns = min(len(heatmap.panels), 4)
    rows = math.ceil(len(heatmap.panels) / columns)
    return side * columns + 1.0, side * rows + 0.9, columns


def _minor_label(value: float, _pos: int = 0) -> str:
    """Labels 2 and 5 of each decade on a log colour bar (20, 50, 200 ...), no others."""
    if value <= 0:
        return ""
    leading = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if leading in (2, 5) else ""


def _cell_text(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if value >= 0.01 else f"{value:.1e}"


def build_figure(heatmap: HeatMap, title: str | None = None, dpi: int = DPI):
    """The figure of a heat map: one image per panel on one colour scale, a colour bar, slow
    cells framed, wrong cells hatched, drained hosts' labels in red."""
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle
    from matplotlib.ticker import FuncFormatter, NullFormatter

    width, height, columns = figure_size_inches(heatmap)
    fig = Figure(figsize=(width, height), dpi=dpi, layout="constrained")
    rows = math.ceil(len(heatmap.panels) / columns)
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    values = [v for p in heatmap.panels for row in p.values for v in row if v is not None and math.isfinite(v)]
    low, high = min(values, default=0.0), max(values, default=1.0)
    # From 0, so that the noise among healthy pairs does not look like a fault; but NVLink
    # and network pairs in one matrix differ tenfold, and there a log scale keeps a slow
    # pair among the network pairs visible.
    norm = LogNorm(vmin=low, vmax=high) if low > 0 and high / low > 10 else Normalize(vmin=0, vmax=high or 1.0)
    cmap = colormaps["viridis"].with_extremes(bad="#e0e0e0")
    image = None
    for ax, panel in zip(axes, heatmap.panels):
        data = np.array([[np.nan if v is None else float(v) for v in row] for row in panel.values], dtype=float)
        image = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, norm=norm, interpolation="nearest")
        n = len(panel.labels)
        ax.set_xticks(range(n), panel.labels, rotation=90, fontsize="small")
        ax.set_yticks(range(n), panel.labels, fontsize="small")
        for axis_labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            for k, label in enumerate(axis_labels):
                if k in panel.drained:
                    label.set_color(DRAIN_COLOR)
                    label.set_fontweight("bold")
                    label.set_gid(f"drained:{k}")
        ax.set_title(panel.title, fontsize="medium")
        if n <= ANNOTATE_UP_TO:
            for i in range(n):
                for j in range(n):
                    if not math.isnan(data[i, j]):
                        text = _cell_text(data[i, j]) + (f"\n{panel.notes[(i, j)]}" if (i, j) in panel.notes else "")
                        shade = norm(data[i, j])
                        ax.text(j, i, text, ha="center", va="center", fontsize=6 if n > 8 else 7,
                                color="black" if shade > 0.6 else "white")
        for i, j in sorted(panel.wrong):
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="xxx", edgecolor="black",
                                   linewidth=0, gid=f"wrong:{i},{j}"))  # fmt: skip
        for i, j in sorted(panel.slow):
            ax.add_patch(Rectangle((j - 0.45, i - 0.45), 0.9, 0.9, fill=False, edgecolor=SLOW_COLOR,
                                   linewidth=2, gid=f"slow:{i},{j}"))  # fmt: skip
    for ax in axes[len(heatmap.panels):]:
        ax.set_visible(False)
    if image is not None:
        bar = fig.colorbar(image, ax=list(axes[: len(heatmap.panels)]), label=heatmap.unit, shrink=0.8)
        bar.ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
        bar.ax.yaxis.set_minor_formatter(FuncFormatter(_minor_label) if isinstance(norm, LogNorm) else NullFormatter())
    legend = [Patch(facecolor="none", edgecolor=SLOW_COLOR, linewidth=2, label="slow")] if any(
        p.slow for p in heatmap.panels) else []  # fmt: skip
    if any(p.wrong for p in heatmap.panels):
        legend.append(Patch(facecolor="none", edgecolor="black", hatch="xxx", label="wrong data"))
    if any(p.drained for p in heatmap.panels):
        legend.append(Patch(facecolor=DRAIN_COLOR, label="drained host (red label)"))
    if legend:
        fig.legend(handles=legend, loc="outside lower center", ncols=len(legend), fontsize="small")
    fig.suptitle(title if title is not None else heatmap.title)
    return fig


def plot_heatmap(doc: dict, output: str | Path, title: str | None = None, dpi: int = DPI) -> HeatMap:
    """Draw the heat map of a recognised result to `output` (format by extension).
    ValueError when it holds nothing to draw, OSError when the file cannot be written."""
    heatmap = heatmap_from(doc)
    build_figure(heatmap, title, dpi).savefig(output, dpi=dpi)
    return heatmap
