"""Click commands `topo` and `p2p` (registered by ncclbench.cli.main with add_command).

Results go to stdout, messages to stderr. Bad input: one line on stderr, exit 2.
Tables are drawn with rich on a terminal and as plain aligned text otherwise,
so that output piped to a file stays readable and diffable.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Sequence

import click

from ncclbench.topology import model as topo_model
from ncclbench.errors import BadInput
from ncclbench.api.params import BYTES
from ncclbench.cli.types import OneLineErrorCommand
from ncclbench.errors import error_line

# --------------------------------------------------------------- click plumbing


def _fail(message: str, code: int = 1) -> NoReturn:
    """One line on stderr (`ncclbench: error: ...`, as OneLineErrorCommand writes bad
    input), then exit with `code`.

    SystemExit rather than click's Exit: click returns (not raises) Exit codes when
    run with standalone_mode=False, so a wrapper could lose them; SystemExit passes
    through click untouched and never prints a traceback.
    """
    click.echo(error_line(message), err=True)
    raise SystemExit(code)


# ------------------------------------------------------------------- rendering


@dataclass
class TextTable:
    title: str
    headers: list[str]
    rows: list[list[str]]
    numeric: bool = False  # right-align every column but the first (number matrices)


def _cell(value: Any, fmt: str = "{}") -> str:
    if value is None:
        return "?"
    if value is True:
        return "yes"
    if value is False:
        return "no"
    return fmt.format(value)


def render_plain(table: TextTable) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    lines = [table.title]
    if not table.rows:
        return table.title + "\n  (none)"
    widths = [max(len(str(r[k])) for r in [table.headers, *table.rows]) for k in range(len(table.headers))]

    def line(cells: Sequence[str]) -> str:
        out = []
        for k, cell in enumerate(cells):
            right = k > 0 and (table.numeric or cell.replace(".", "", 1).isdigit())
            out.append(cell.rjust(widths[k]) if right else cell.ljust(widths[k]))
        return "  " + "  ".join(out).rstrip()

    lines.append(line(table.headers))
    lines.extend(line(r) for r in table.rows)
    return "\n".join(lines)


def emit(tables: Sequence[TextTable | str]) -> None:
    """Print text lines and tables: rich on a terminal, plain text otherwise."""
    if sys.stdout.isatty():
        from rich import box
        from rich.console import Console
        from rich.table import Table

        console = Console(soft_wrap=True)
        for item in tables:
            if isinstance(item, str):
                console.print(item, markup=False, highlight=False)
                continue
            table = Table(title=item.title, title_justify="left", box=box.SIMPLE_HEAD)
            for k, header in enumerate(item.headers):
                table.add_column(header, no_wrap=True, justify="right" if item.numeric and k else "left")
            for row in item.rows:
                table.add_row(*row)
            # Folded cells make bus ids and matrices unreadable: print wide tables plain.
            # rich pads each cell by one space more on each side than the plain layout.
            plain = render_plain(item)
            if max(len(line) for line in plain.splitlines()) + len(item.headers) + 2 > console.width:
                console.print(plain + "\n", markup=False, highlight=False, soft_wrap=True)
            else:
                console.print(table)
    else:
        for item in tables:
            click.echo(item if isinstance(item, str) else render_plain(item) + "\n")


def matrix_table(title: str, labels: Sequence[str], values: Sequence[Sequence[Any]], fmt: str = "{}",
                 corner: str = "", diagonal: str | None = None) -> TextTable:  # fmt: skip
    rows = []
    for i, label in enumerate(labels):
        row = [label]
        for j in range(len(labels)):
            value = values[i][j] if i < len(values) and j < len(values[i]) else None
            row.append(diagonal if diagonal is not None and i == j else _cell(value, fmt))
        rows.append(row)
    return TextTable(title, [corner, *labels], rows, numeric=fmt != "{}")


# ------------------------------------------------------------------------ topo

LINK_LEGEND = (
    "Legend: X = self, NV# = # bonded NVLinks, PIX = at most one PCIe bridge, PXB = several PCIe bridges, "
    "PHB = PCIe host bridge, NODE = between host bridges of one NUMA node, SYS = across NUMA nodes, ? = unknown"
)


def topo_report(topo: topo_model.Topology) -> list[TextTable | str]:
    host, versions = topo.host, topo.versions
    numa = ", ".join(f"{node}: {cpus}" for node, cpus in topo.host.numa_nodes.items()) or "?"
    out: list[TextTable | str] = [
        f"# host {host.hostname} ({host.os}), {host.cpu_count} CPUs ({host.usable_cpus} usable), NUMA nodes {numa}",
        "# driver {} | CUDA driver {} | CUDA runtime {} | NCCL {} | torch {} | python {}".format(
            *(_cell(v) for v in (versions.driver, versions.cuda_driver, versions.cuda_runtime, versions.nccl,
                                 versions.torch, versions.python))  # fmt: skip
        ),
    ]
    summary = topo_model.summary_line(topo)
    if summary:
        out.append(f"# {summary}")
    out.append("")
    if topo.gpus:
        out.append(_gpu_table(topo))
        labels = [g.label for g in topo.gpus]
        nic_labels = [f"NIC{k}" for k in range(len(topo.nics))]
        links = [row + (topo.nic_links[i] if i < len(topo.nic_links) else []) for i, row in enumerate(topo.link_matrix)]
        table = matrix_table("Link matrix (nvidia-smi topo -m codes)", labels, links)
        table.headers = ["", *labels, *nic_labels]
        for i, row in enumerate(table.rows):
            row.extend(_cell(c) for c in links[i][len(labels):])
        out.append(table)
        out.append(LINK_LEGEND + "\n")
        if topo.peer_access is not None:
            out.append(matrix_table("CUDA peer access (cudaDeviceCanAccessPeer), row -> column",
                                    labels, topo.peer_access, diagonal="X"))  # fmt: skip
        p2p = topo.nvml_p2p
        if p2p and any(code not in (None, "X") for row in p2p.get("read", []) for code in row):
            def statuses(i: int, j: int) -> str:
                return "/".join(_cell(p2p[cap][i][j]) for cap in ("read", "write", "nvlink"))

            combined = [[statuses(i, j) for j in range(len(labels))] for i in range(len(labels))]
            out.append(matrix_table("NVML P2P status read/write/nvlink", labels, combined, diagonal="X"))
            out.append("P2P legend: " + ", ".join(f"{k} = {v}" for k, v in topo_model.P2P_STATUS_LEGEND.items()) + "\n")
        verdict = {True: "yes", False: "no", None: "unknown"}[topo.nvswitch]
        out.append(f"NVSwitch: {verdict} ({topo.nvswitch_evidence})")
        out.append(f"GPU order: {topo.gpu_order}; CUDA-NVML join: {topo.join}\n")
    if topo.nics:
        out.append(
            TextTable(
                "RDMA NICs",
                ["NIC", "name", "PCI bus id", "NUMA", "netdevs", "ports"],
                [
                    [f"NIC{k}", nic.name, _cell(nic.pci_bus_id), _cell(nic.numa_node), ",".join(nic.netdevs) or "-",
                     "; ".join(_port_text(p) for p in nic.ports)]
                    for k, nic in enumerate(topo.nics)
                ],  # fmt: skip
            )
        )
    if topo.notes:
        out.append("Notes:\n" + "\n".join(f"  - {note}" for note in topo.notes))
    return out


def health_report(readings: list[dict], causes: list[str]) -> list[TextTable | str]:
    """Each GPU's health readings and the causes they name (ncclbench.topology.health)."""
    from ncclbench.topology.health import reading_cells

    if not readings:
        return ["", "GPU health: not read (NVML could not be used)"]
    cells = [reading_cells(r) for r in readings]
    table = TextTable("GPU health (NVML and sysfs; NVML's GPU numbers)", list(cells[0]),
                      [list(c.values()) for c in cells])
    if causes:
        return ["", table, "Causes:\n" + "\n".join(f"  - {line}" for line in causes)]
    return ["", table, "Causes: none (PCIe, NVLink, ECC, row remapping and clocks as expected)"]


def _port_text(port: topo_model.NicPort) -> str:
    return " ".join(part for part in (f"{port.port}:", port.state or "?", port.rate, port.link_layer) if part)


def _gpu_table(topo: topo_model.Topology) -> TextTable:
    rows = []
    for gpu in topo.gpus:
        link = gpu.nvlink
        speeds = sorted({round(s, 3) for s in link.link_gbps if s}) if link else []
        rows.append(
            [
                gpu.label,
                _cell(gpu.nvml_index),
                gpu.name,
                _cell(gpu.pci_bus_id),
                _cell(gpu.memory_bytes / 2**30 if gpu.memory_bytes else None, "{:.1f} GiB"),
                _cell(gpu.cpu_affinity),
                _cell(gpu.numa_affinity),
                str(link.active_links) if link else "0",
                _cell(link.version) if link else "-",
                ",".join(f"{s:g}" for s in speeds) or ("?" if link else "-"),
                _cell(link.peak_gbps, "{:.1f}") if link else "-",
                _cell(link.remote) if link else "-",
            ]
        )
    headers = ["GPU", "NVML", "name", "PCI bus id", "memory", "CPU affinity", "NUMA", "NVLinks", "version",
               "GB/s per link", "peak GB/s/dir", "far end"]  # fmt: skip
    return TextTable("GPUs", headers, rows)


@click.command("topo", cls=OneLineErrorCommand)
@click.option("--json", "as_json", is_flag=True, help="Print the topology as JSON on stdout, for scripts.")
@click.option("--no-nics", is_flag=True, help="Do not look for RDMA NICs.")
@click.option(
    "--compare-smi",
    is_flag=True,
    help="Also run `nvidia-smi topo -m` and `nvidia-smi nvlink --status` and report where they "
    "disagree with what ncclbench found (exit 1 if they do).",
)
def topo_command(as_json: bool, no_nics: bool, compare_smi: bool) -> None:
    """Show the GPUs of this host and how they are connected.

    Per GPU: PCI bus id, memory, CPU and NUMA affinity, NVLinks (count, version,
    speed, peak per direction). Pairwise: the link matrix of `nvidia-smi topo -m`,
    CUDA peer access and NVML P2P status. Also whether NVLinks go through an
    NVSwitch, RDMA NICs, and driver/CUDA/NCCL/torch versions.
    """
    from ncclbench.topology import health, probe as topo_probe, smi

    topo = topo_probe.probe(include_nics=not no_nics)
    readings: list[dict] = []
    if not topo.gpus:
        click.echo("ncclbench: no GPU visible: reporting host and versions only", err=True)
    else:
        readings = health.read_host()
    causes = [line for lines in health.causes_by_host(dict(enumerate(readings))).values() for line in lines]
    problems: list[str] | None = None
    if compare_smi:
        topo_text = smi.run_nvidia_smi(smi.SMI_TOPO)
        nvlink_text = smi.run_nvidia_smi(smi.SMI_NVLINK_STATUS)
        if topo_text is None and nvlink_text is None:
            problems = ["nvidia-smi is not available: nothing to compare with"]
        else:
            problems = smi.compare_with_smi(topo, topo_text, nvlink_text)
    if as_json:
        data = topo.to_dict()
        if topo.gpus:
            data["health"] = {"readings": readings, "causes": causes}
        if problems is not None:
            data["smi_check"] = {"agrees": not problems, "problems": problems}
        click.echo(json.dumps(data, indent=2))
    else:
        emit(topo_report(topo) + (health_report(readings, causes) if topo.gpus else []))
    if problems:
        _fail("nvidia-smi check failed: " + "; ".join(problems), 1)
    if problems is not None:
        click.echo("nvidia-smi check: link matrix, NVLink counts and peaks agree", err=True)


# ------------------------------------------------------------------------- p2p


def _devices_option(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        devices = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated GPU indices like 0,1,3, got {value!r}") from None
    if len(devices) < 2 or len(set(devices)) != len(devices) or min(devices) < 0:
        raise click.BadParameter(f"need at least 2 different GPU indices, got {value!r}")
    return devices


def p2p_report(result: Any, summary: str | None, peak: float | None) -> list[TextTable | str]:
    config = result.config
    from ncclbench.topology.p2p import format_size

    labels = [str(d.index) for d in result.devices]
    corner = "src\\dst"
    out: list[TextTable | str] = []
    if summary:
        out.append(f"# {summary}")
    out.append("# devices: " + ", ".join(f"{d.index} [{d.pci_bus_id or '?'}] {d.name}" for d in result.devices))
    out.append("")
    reps, iters = config["reps"], config["iters"]
    size = format_size(config["size_bytes"])
    out.append(matrix_table(f"Unidirectional copy bandwidth (GB/s), {size} copies, median of {reps} x {iters}; "
                            "row = source, column = destination", labels, result.unidirectional_gbps, "{:.2f}",
                            corner))  # fmt: skip
    if config.get("bidirectional"):
        out.append(matrix_table(f"Bidirectional copy bandwidth (GB/s, both directions together), {size} each way",
                                labels, result.bidirectional_gbps, "{:.2f}", corner, diagonal="-"))  # fmt: skip
    out.append(matrix_table(f"Copy latency (us), {format_size(config['latency_bytes'])} copies, median of {reps} x "
                            f"{config['latency_iters']}", labels, result.latency_us, "{:.2f}", corner))  # fmt: skip
    out.append(matrix_table("CUDA peer access", labels, result.peer_access, corner=corner, diagonal="X"))
    off_diagonal = [
        value for i, row in enumerate(result.unidirectional_gbps) for j, value in enumerate(row) if i != j and value
    ]
    if off_diagonal:
        best = max(off_diagonal)
        line = f"# Best GPU-to-GPU copy {best:.2f} GB/s"
        if peak:
            line += f" = {100 * best / peak:.1f} % of NVLink peak {peak:.1f} GB/s per GPU per direction"
        out.append(line)
    out.append(f"# {result.elapsed_s:.1f} s")
    if result.notes:
        out.append("Notes:\n" + "\n".join(f"  - {note}" for note in result.notes))
    return out


def _write(path: str, text: str) -> None:
    if path == "-":
        click.echo(text, nl=False)
        return
    try:
        Path(path).write_text(text)
    except OSError as error:
        _fail(f"cannot write {path}: {error.strerror or error}", 1)


@click.command("p2p", cls=OneLineErrorCommand)
@click.option("-b", "--size", type=BYTES, default="256M", show_default=True,
              help="Bytes per bandwidth copy (8, 64K, 256M, 1G; K/M/G are powers of 1024).")
@click.option("--reps", type=click.IntRange(1, 1000), default=5, show_default=True,
              help="Timed repetitions per pair; the median is reported.")
@click.option("-n", "--iters", type=click.IntRange(1, 10000), default=5, show_default=True,
              help="Copies per timed repetition (bandwidth): with --reps, 25 copies per pair by default.")
@click.option("-w", "--warmup_iters", "warmup", type=click.IntRange(0, 1000), default=2, show_default=True,
              help="Untimed copies per pair before timing (2, not 1: the first copy of a pair also enables peer "
                   "access).")
@click.option("--latency-size", type=BYTES, default="4", show_default=True,
              help="Bytes per latency copy.")
@click.option("--latency-iters", type=click.IntRange(1, 100000), default=100, show_default=True,
              help="Back-to-back copies per latency repetition.")
@click.option("--devices", callback=_devices_option, default=None,
              help="Comma-separated CUDA GPU indices (default: all visible).")
@click.option("--no-bidir", is_flag=True, help="Skip the bidirectional measurement.")
@click.option("--time-limit", type=click.FloatRange(1, 3600), default=120, show_default=True,
              help="Seconds after which remaining pairs are skipped.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write the result as JSON to FILE ('-' for stdout, which replaces the tables).")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False, allow_dash=True),
              help="Write one row per GPU pair as CSV to FILE ('-' for stdout).")  # fmt: skip
def p2p_command(size: int, reps: int, iters: int, warmup: int, latency_size: int, latency_iters: int,
                devices: tuple[int, ...] | None, no_bidir: bool, time_limit: float,
                json_path: str | None, csv_path: str | None) -> None:  # fmt: skip
    """Measure GPU-to-GPU copy bandwidth and latency for every ordered pair.

    Like CUDA's p2pBandwidthLatencyTest, in one process: peer copies
    (dst.copy_(src) on a stream of the source GPU, one cudaMemcpyAsync each)
    timed with CUDA events. Unidirectional and bidirectional bandwidth in GB/s
    (1e9 bytes/s) and small-copy latency in microseconds; the diagonal is a copy
    within one GPU.
    """
    if json_path == "-" and csv_path == "-":
        raise BadInput("--json - and --csv - cannot both write to stdout")
    from ncclbench.topology import p2p, probe as topo_probe, visible

    count = visible.visible_gpu_count()
    if count == 0:
        _fail("no CUDA GPU visible: p2p needs at least 2 GPUs", 2)
    if count == 1:
        _fail("only 1 CUDA GPU visible: p2p needs at least 2 GPUs", 2)
    if devices is not None and max(devices) >= count:
        raise BadInput(f"--devices: no CUDA GPU {max(devices)} ({count} visible)")

    config = p2p.P2PConfig(
        size_bytes=size, reps=reps, iters=iters, warmup=warmup, latency_bytes=latency_size,
        latency_iters=latency_iters, bidirectional=not no_bidir, devices=devices, time_limit_s=time_limit,
    )  # fmt: skip
    try:
        result = p2p.run_p2p(config, progress=lambda message: click.echo(message, err=True))
    except p2p.P2PError as error:
        _fail(str(error), 2)
    except Exception as error:  # CUDA errors: out of memory, peer access failures ...
        first_line = (str(error).strip().splitlines() or [""])[0]
        _fail(f"{type(error).__name__}: {first_line}", 1)

    topo = topo_probe.probe(include_nics=False)
    summary, peak = topo_model.summary_line(topo), topo_model.link_peak_gbps(topo)
    if json_path:
        data = result.to_dict() | {"topology_summary": summary, "nvlink_peak_gbps": peak}
        _write(json_path, json.dumps(data, indent=2) + "\n")
    if csv_path:
        _write(csv_path, result.csv_text())
    if "-" not in (json_path, csv_path):
        emit(p2p_report(result, summary, peak))
    failed = result.failed_pairs()
    if failed:
        _fail("copy verification failed (destination did not hold the source data) for pairs "
              + ", ".join(f"{a}->{b}" for a, b in failed), 1)  # fmt: skip
