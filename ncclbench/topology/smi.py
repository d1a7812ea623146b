"""nvidia-smi: running it (only where NVML cannot answer), parsing its text, and checking
what the probe found against it. The parsers are pure functions of the text."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from ncclbench.topology.model import Topology
from ncclbench.topology.pci import normalize_pci_bus_id

# nvidia-smi colours the header of `topo -m` (underline); strip that before parsing.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DEVICE_NAME = re.compile(r"(GPU|NIC)\d+")
_ROW_START = re.compile(r"^(GPU|NIC)\d+\s")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")

SMI_TIMEOUT_S = 5.0
SMI_GPU_QUERY = ["--query-gpu=index,name,pci.bus_id,memory.total,uuid", "--format=csv,noheader,nounits"]
SMI_TOPO = ["topo", "-m"]
SMI_NVLINK_STATUS = ["nvlink", "--status"]


@dataclass
class TopoMatrix:
    """What `nvidia-smi topo -m` prints, by device name ("GPU0", "NIC1")."""

    devices: list[str]
    codes: dict[str, dict[str, str]]  # row -> column -> code
    affinity: dict[str, dict[str, str | None]]  # row -> {"CPU Affinity": "0-63", ...}
    nic_names: dict[str, str]  # "NIC0" -> "mlx5_0"

    @property
    def gpus(self) -> list[str]:
        return [d for d in self.devices if d.startswith("GPU")]

    @property
    def nics(self) -> list[str]:
        return [d for d in self.devices if d.startswith("NIC")]

    def code(self, row: str, column: str) -> str | None:
        return self.codes.get(row, {}).get(column)

    def gpu_matrix(self) -> list[list[str | None]]:
        return [[self.code(row, column) for column in self.gpus] for row in self.gpus]

    def affinity_of(self, device: str, column: str) -> str | None:
        return self.affinity.get(device, {}).get(column)


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse the output of `nvidia-smi topo -m` (GPU and NIC rows, affinity, NIC legend).

    Data cells never contain spaces, so rows split on whitespace; the header splits
    on tabs (or runs of spaces, for copies pasted from a terminal) because its
    affinity column names do contain spaces. Raises ValueError without a header.
    """
    devices: list[str] = []
    extra_columns: list[str] = []
    codes: dict[str, dict[str, str]] = {}
    affinity: dict[str, dict[str, str | None]] = {}
    nic_names: dict[str, str] = {}
    for raw_line in _ANSI_ESCAPE.sub("", text).splitlines():
        if not devices:
            cells = [c.strip() for c in re.split(r"\t|\s{2,}", raw_line.strip()) if c.strip()]
            if cells and _DEVICE_NAME.fullmatch(cells[0]):
                count = 0
                while count < len(cells) and _DEVICE_NAME.fullmatch(cells[count]):
                    count += 1
                devices, extra_columns = cells[:count], cells[count:]
            continue
        legend = _NIC_LEGEND.match(raw_line)
        if legend:
            nic_names[legend.group(1)] = legend.group(2)
            continue
        if not _ROW_START.match(raw_line):
            continue
        tokens = raw_line.split()
        row = tokens[0]
        codes[row] = dict(zip(devices, tokens[1 : 1 + len(devices)]))
        rest = tokens[1 + len(devices) :]
        affinity[row] = {name: (None if value == "N/A" else value) for name, value in zip(extra_columns, rest)}
    if not devices:
        raise ValueError("no GPU header line found in `nvidia-smi topo -m` output")
    return TopoMatrix(devices=devices, codes=codes, affinity=affinity, nic_names=nic_names)


@dataclass
class GpuLinkStatus:
    """One GPU's block of `nvidia-smi nvlink --status`."""

    index: int  # NVML index
    name: str
    uuid: str | None
    links: dict[int, float | None]  # link -> GB/s per direction; None when inactive

    @property
    def active_speeds(self) -> list[float]:
        return [speed for speed in self.links.values() if speed is not None]

    @property
    def peak_gbps(self) -> float | None:
        speeds = self.active_speeds
        return sum(speeds) if speeds else None


def parse_nvlink_status(text: str) -> list[GpuLinkStatus]:
    """Parse `nvidia-smi nvlink --status`: per GPU, the speed of each link."""
    gpus: list[GpuLinkStatus] = []
    for line in _ANSI_ESCAPE.sub("", text).splitlines():
        gpu = re.match(r"^GPU (\d+): (.*?)(?: \(UUID: ([^)]*)\))?\s*$", line)
        if gpu:
            gpus.append(GpuLinkStatus(int(gpu.group(1)), gpu.group(2).strip(), gpu.group(3), {}))
            continue
        link = re.match(r"^\s+Link (\d+): (.*?)\s*$", line)
        if link and gpus:
            speed = re.match(r"([\d.]+)\s*(GB/s|MB/s)", link.group(2))
            value = None
            if speed:
                value = float(speed.group(1)) / (1000.0 if speed.group(2) == "MB/s" else 1.0)
            gpus[-1].links[int(link.group(1))] = value
    return gpus


def parse_smi_gpu_query(text: str) -> list[dict[str, Any]]:
    """Parse `nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total,uuid
    --format=csv,noheader,nounits` (memory in MiB)."""
    gpus = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 5 or not cells[0].isdigit():
            continue
        memory = int(float(cells[3])) * 2**20 if re.fullmatch(r"[\d.]+", cells[3]) else None
        gpus.append(
            {
                "index": int(cells[0]),
                "name": cells[1],
                "pci_bus_id": normalize_pci_bus_id(cells[2]),
                "memory_bytes": memory,
                "uuid": cells[4] or None,
            }
        )
    return gpus


def run_nvidia_smi(args: Sequence[str], timeout: float = SMI_TIMEOUT_S) -> str | None:
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return None
    try:
        done = subprocess.run(
            [executable, *args], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


class SmiText:
    """nvidia-smi's output per argument list, run at most once each (None: not run)."""

    def __init__(self, run: Callable[[Sequence[str]], str | None] | None):
        self.run = run
        self._cache: dict[tuple[str, ...], str | None] = {}

    def __call__(self, args: Sequence[str]) -> str | None:
        if self.run is None:
            return None
        if tuple(args) not in self._cache:
            self._cache[tuple(args)] = self.run(args)
        return self._cache[tuple(args)]


def compare_with_smi(topo: Topology, topo_m_text: str | None, nvlink_status_text: str | None) -> list[str]:
    """Where what probe() found disagrees with nvidia-smi's own text; [] when it agrees.

    Compared: the GPU link matrix, CPU and NUMA affinity, active NVLinks and the
    NVLink peak per GPU. nvidia-smi numbers GPUs like NVML, hence nvml_index.
    """
    problems: list[str] = []
    if topo_m_text:
        try:
            matrix = parse_topo_matrix(topo_m_text)
        except ValueError as error:
            problems.append(f"nvidia-smi topo -m: {error}")
            matrix = None
        if matrix is not None:
            for i, a in enumerate(topo.gpus):
                for j, b in enumerate(topo.gpus):
                    if a.nvml_index is None or b.nvml_index is None:
                        continue
                    theirs = matrix.code(f"GPU{a.nvml_index}", f"GPU{b.nvml_index}")
                    ours = topo.link_matrix[i][j]
                    if theirs == "SOC":
                        theirs = "SYS"
                    if theirs != ours:
                        problems.append(f"link {a.label}-{b.label}: ncclbench {ours}, nvidia-smi {theirs}")
            for gpu in topo.gpus:
                row = f"GPU{gpu.nvml_index}"
                for column, ours in (("CPU Affinity", gpu.cpu_affinity), ("NUMA Affinity", gpu.numa_affinity)):
                    theirs = matrix.affinity_of(row, column)
                    if gpu.nvml_index is not None and theirs is not None and theirs != ours:
                        problems.append(f"{gpu.label} {column}: ncclbench {ours}, nvidia-smi {theirs}")
    if nvlink_status_text:
        for status in parse_nvlink_status(nvlink_status_text):
            gpu = next((g for g in topo.gpus if g.nvml_index == status.index), None)
            if gpu is None:
                continue
            ours_links = gpu.nvlink.active_links if gpu.nvlink else 0
            if ours_links != len(status.active_speeds):
                problems.append(
                    f"{gpu.label}: ncclbench {ours_links} active NVLinks, nvidia-smi {len(status.active_speeds)}"
                )
            theirs_peak = status.peak_gbps
            ours_peak = gpu.nvlink.peak_gbps if gpu.nvlink else None
            if (theirs_peak is None) != (ours_peak is None) or (
                theirs_peak and ours_peak and abs(theirs_peak - ours_peak) > 0.01 * theirs_peak
            ):
                problems.append(f"{gpu.label}: NVLink peak ncclbench {ours_peak} GB/s, nvidia-smi {theirs_peak} GB/s")
    return problems
