"""The topology of a host as data: its GPUs, how they are linked, its NICs and versions,
and the one-line summary a run's header prints.

Nothing here probes anything: ncclbench.topology.probe fills these records. Missing facts
are ``None`` and the reason goes to ``Topology.notes``.

Units: GB/s means 1e9 bytes per second, like nccl-tests. NVLink speeds are per link and
per direction, as ``nvidia-smi nvlink --status`` prints them.
"""

from __future__ import annotations

import dataclasses
import platform
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

SCHEMA = "ncclbench.topo/1"

_NV_CODE = re.compile(r"^NV(\d+)$")

# The short codes of `nvidia-smi topo -p2p` (ncclbench.topology.nvml reads them from NVML).
P2P_STATUS_LEGEND = {
    "X": "self",
    "OK": "supported",
    "CNS": "chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "topology not supported",
    "DRK": "disabled by registry key",
    "NS": "not supported",
    "U": "unknown",
}


@dataclass
class NvLinkInfo:
    """The NVLinks of one GPU."""

    active_links: int
    version: str | None  # "4.0" for Hopper
    link_gbps: list[float | None]  # per active link, GB/s per direction
    peak_gbps: float | None  # sum over active links, GB/s per direction
    remote: str | None  # "nvswitch", "gpu", "mixed" or None when unknown
    source: str  # where the speeds came from


@dataclass
class GpuInfo:
    cuda_index: int | None  # CUDA device index (None when CUDA cannot be used)
    nvml_index: int | None  # NVML / nvidia-smi index
    name: str
    pci_bus_id: str | None  # "0000:18:00.0"
    uuid: str | None
    memory_bytes: int | None
    cpu_affinity: str | None  # "0-31,64-95"
    numa_affinity: str | None  # NUMA nodes near the GPU, "0"
    gpu_numa_id: int | None  # NUMA node of the GPU memory itself (Grace Hopper); usually None
    nvlink: NvLinkInfo | None

    @property
    def label(self) -> str:
        if self.cuda_index is not None:
            return f"GPU{self.cuda_index}"
        return f"nvml{self.nvml_index}"


@dataclass
class NicPort:
    port: int
    state: str | None  # "ACTIVE"
    rate: str | None  # "400 Gb/sec (4X NDR)"
    link_layer: str | None  # "InfiniBand" or "Ethernet"


@dataclass
class NicInfo:
    name: str  # "mlx5_0"
    pci_bus_id: str | None
    numa_node: int | None
    netdevs: list[str]
    ports: list[NicPort]


@dataclass
class HostInfo:
    hostname: str
    os: str
    cpu_count: int | None
    usable_cpus: int | None  # what this process may run on (taskset, cgroups)
    numa_nodes: dict[str, str]  # node -> its CPUs, "0" -> "0-63"


@dataclass
class Versions:
    driver: str | None = None
    cuda_driver: str | None = None  # highest CUDA version the driver supports
    cuda_runtime: str | None = None  # the CUDA torch was built with
    nccl: str | None = None
    torch: str | None = None
    python: str = platform.python_version()
    nvml: str | None = None
    pynvml: str | None = None


@dataclass
class Topology:
    host: HostInfo
    versions: Versions
    gpus: list[GpuInfo]
    # GPU x GPU in `gpus` order: "X", "NV18", "PIX" ... None when unknown
    link_matrix: list[list[str | None]]
    # CUDA peer access (cudaDeviceCanAccessPeer); None on the diagonal or when unknown
    peer_access: list[list[bool | None]] | None
    # NVML P2P status per capability ("read", "write", "nvlink"): "X", "OK", "NS" ...
    nvml_p2p: dict[str, list[list[str | None]]]
    nvswitch: bool | None
    nvswitch_evidence: str
    nics: list[NicInfo]
    nic_links: list[list[str | None]]  # GPU x NIC codes
    gpu_order: str  # "cuda" when the GPUs are in torch.cuda order, else "nvml"
    join: str  # how CUDA devices were matched to NVML devices
    sources: dict[str, str]
    notes: list[str]
    env: dict[str, str]
    probe_seconds: float = 0.0
    schema: str = SCHEMA

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["summary"] = summary_line(self)
        data["nvlink_peak_gbps"] = link_peak_gbps(self)
        return data


@dataclass
class LinkEnd:
    """The far end of one active NVLink, as NVML describes it."""

    remote_type: str | None  # "gpu", "nvswitch", "ibmnpu" or None when NVML cannot say
    remote_bus_id: str | None


def nvlink_count(code: str | None) -> int:
    """'NV18' -> 18; any PCIe code or None -> 0."""
    match = _NV_CODE.match(code or "")
    return int(match.group(1)) if match else 0


def link_peak_gbps(topo: Topology | None) -> float | None:
    """Per-GPU, per-direction NVLink peak in GB/s: active links x per-link speed.

    The smallest over the GPUs (the slowest GPU bounds a collective); None when
    any GPU has no known NVLink peak, because traffic then crosses PCIe.
    """
    try:
        if topo is None or not topo.gpus:
            return None
        peaks = [g.nvlink.peak_gbps if g.nvlink else None for g in topo.gpus]
        if any(not peak for peak in peaks):
            return None
        return min(peaks)  # type: ignore[type-var]
    except Exception:
        return None


def summary_line(topo: Topology | None) -> str | None:
    """'4 x NVIDIA H200, all pairs NV18 (NVSwitch), NVLink peak 478.1 GB/s per GPU
    per direction'; None without GPUs."""
    try:
        if topo is None or not topo.gpus:
            return None
        names = Counter(g.name for g in topo.gpus)
        parts = [", ".join(f"{count} x {name}" for name, count in names.items())]
        pair_codes = [
            topo.link_matrix[i][j]
            for i in range(len(topo.gpus))
            for j in range(i + 1, len(topo.gpus))
            if i < len(topo.link_matrix) and j < len(topo.link_matrix[i])
        ]
        if pair_codes:
            counted = Counter(code or "?" for code in pair_codes)
            if len(counted) == 1:
                pairs = f"all pairs {next(iter(counted))}"
            else:
                # Most common first; ties: more NVLinks first, then by name.
                ordered = sorted(counted.items(), key=lambda item: (-item[1], -nvlink_count(item[0]), item[0]))
                pairs = "pairs " + " ".join(f"{n}x{code}" for code, n in ordered)
            if topo.nvswitch and any(nvlink_count(c) for c in pair_codes):
                pairs += " (NVSwitch)"
            parts.append(pairs)
        peak = link_peak_gbps(topo)
        if peak:
            parts.append(f"NVLink peak {peak:.1f} GB/s per GPU per direction")
        return ", ".join(parts)
    except Exception:
        return None
