"""GPU topology of this host: what is connected to what, and how fast.

Three layers, so that most of it can be tested without a GPU:

* pure parsers and calculators (``parse_topo_matrix``, ``parse_nvlink_status``,
  ``format_cpu_list``, ``nvlink_pair_counts``, ``infer_nvswitch`` ...);
* probes that ask NVML (through a pynvml-shaped module), torch.cuda, sysfs and,
  only as a fallback, ``nvidia-smi``; each source can be injected for tests;
* the summary used in the header of every collective run (``summary_line``,
  ``link_peak_gbps``, ``peak_percent_line``).

Nothing public here raises on a machine without GPUs or NVML: missing facts are
``None`` and the reason goes to ``Topology.notes``.

Units: GB/s means 1e9 bytes per second, like nccl-tests. NVLink speeds are per
link and per direction, as ``nvidia-smi nvlink --status`` prints them.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
import types
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

SCHEMA = "ncclbench.topo/1"

# nvidia-smi colours the header of `topo -m` (underline); strip that before parsing.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DEVICE_NAME = re.compile(r"(GPU|NIC)\d+")
_ROW_START = re.compile(r"^(GPU|NIC)\d+\s")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")
_NV_CODE = re.compile(r"^NV(\d+)$")

# The codes of `nvidia-smi topo -m`, nearest first. "SOC" is what old drivers called SYS.
PCIE_CODES = ("PIX", "PXB", "PHB", "NODE", "SYS")

# nvmlGpuTopologyLevel_t -> nvidia-smi code. INTERNAL means two GPUs on one board,
# which nvidia-smi shows as a single bridge.
NVML_TOPOLOGY_LEVEL_CODES = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

# nvmlDeviceGetNvLinkVersion returns the nvmlNvlinkVersion_t enum, not the NVLink
# version itself (an H100 returns 6, an A100 5): translate it.
NVLINK_VERSION_NAMES = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}

# nvmlGpuP2PStatus_t -> the short codes of `nvidia-smi topo -p2p` (DRK: disabled by regkey).
P2P_STATUS_CODES = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DRK", 5: "NS", 6: "U"}
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
# nvmlGpuP2PCapsIndex_t values. Written out because some pynvml releases define
# NVML_P2P_CAPS_INDEX_READ as the tuple ``(0,)`` (a stray comma), which ctypes rejects.
P2P_CAPS_INDEX = {"read": 0, "write": 1, "nvlink": 2}

# NVML field ids (nvml.h); used with getattr so that older pynvml releases still work.
_FI_NVLINK_SPEED_COMMON = 90  # NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON
_FI_NVLINK_LINK_COUNT = 91  # NVML_FI_DEV_NVLINK_LINK_COUNT
_FI_NVLINK_GET_SPEED = 164  # NVML_FI_DEV_NVLINK_GET_SPEED, scoped by link
_NVLINK_DEVICE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "nvswitch", 255: None}
# nvmlValueType_t -> member of the c_nvmlValue_t union
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

SMI_TIMEOUT_S = 5.0


# --------------------------------------------------------------------------- data


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


# ----------------------------------------------------------------- pure helpers


def normalize_pci_bus_id(text: str | None) -> str | None:
    """'00000000:1B:00.0' (NVML), '0000:1b:00.0' (sysfs) or '1b:00' -> '0000:1b:00.0'."""
    if not text:
        return None
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    match = re.fullmatch(
        r"\s*(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})(?:\.([0-7]))?\s*", text
    )
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return pci_bus_id_from_parts(int(domain or "0", 16), int(bus, 16), int(device, 16), int(function or "0"))


def pci_bus_id_from_parts(domain: int, bus: int, device: int, function: int = 0) -> str:
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


def format_cpu_list(masks: Sequence[int], word_bits: int = 64) -> str:
    """CPU bitmask words (NVML affinity, lowest CPU first) -> '0-31,64-95'."""
    cpus = [
        word_index * word_bits + bit
        for word_index, word in enumerate(masks)
        for bit in range(word_bits)
        if (int(word) >> bit) & 1
    ]
    return format_index_ranges(cpus)


def format_index_ranges(indices: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    ranges: list[str] = []
    ordered = sorted(set(indices))
    start = previous = None
    for index in ordered + [None]:
        if start is not None and index == previous + 1:
            previous = index
            continue
        if start is not None:
            ranges.append(str(start) if start == previous else f"{start}-{previous}")
        start = previous = index
    return ",".join(ranges)


def parse_index_ranges(text: str) -> list[int]:
    """'0-2,5' -> [0, 1, 2, 5] (the format of sysfs cpulist files)."""
    indices: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        indices.extend(range(int(low), int(high or low) + 1))
    return indices


def nvlink_count(code: str | None) -> int:
    """'NV18' -> 18; any PCIe code or None -> 0."""
    match = _NV_CODE.match(code or "")
    return int(match.group(1)) if match else 0


def nvlink_version_name(raw: int | None) -> str | None:
    if raw is None:
        return None
    return NVLINK_VERSION_NAMES.get(int(raw), f"enum {raw}")


def cuda_version_name(raw: int | None) -> str | None:
    """12080 (NVML / cudaDriverGetVersion) -> '12.8'."""
    if not raw:
        return None
    return f"{raw // 1000}.{(raw % 1000) // 10}"


# ------------------------------------------------------- parsing nvidia-smi text


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


# --------------------------------------------------- NVLink pairing and NVSwitch


@dataclass
class LinkEnd:
    """The far end of one active NVLink, as NVML describes it."""

    remote_type: str | None  # "gpu", "nvswitch", "ibmnpu" or None when NVML cannot say
    remote_bus_id: str | None


def nvlink_pair_counts(
    link_ends: Sequence[Sequence[LinkEnd]],
    bus_ids: Sequence[str | None],
    nvlink_p2p_ok: Sequence[Sequence[bool | None]] | None = None,
) -> list[list[int]]:
    """How many NVLinks join each pair of GPUs, like the number in nvidia-smi's NV#.

    A link that ends at GPU j counts for (i, j). Links that end at an NVSwitch
    reach every GPU on the switch, so a pair whose GPUs both have switch links gets
    the smaller of their switch-link counts (nvidia-smi shows NV18 for every pair
    of an 8 x H100 board). Links whose far end NVML cannot name (in some VMs) are
    treated like switch links, but only for pairs that NVML's P2P status says talk
    over NVLink. Links to a GPU outside this list (hidden by CUDA_VISIBLE_DEVICES)
    count for no pair.
    """
    n = len(link_ends)
    index_of_bus = {bus: i for i, bus in enumerate(bus_ids) if bus}
    direct = [[0] * n for _ in range(n)]
    switch_links = [0] * n
    unresolved = [0] * n
    for i, ends in enumerate(link_ends):
        for end in ends:
            j = index_of_bus.get(end.remote_bus_id or "")
            if end.remote_type == "nvswitch":
                switch_links[i] += 1
            elif j is not None and j != i:
                direct[i][j] += 1
            elif end.remote_type is None:
                unresolved[i] += 1
    counts = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            nvlink_ok = nvlink_p2p_ok[i][j] if nvlink_p2p_ok is not None else None
            if direct[i][j]:
                counts[i][j] = direct[i][j]
            elif switch_links[i] and switch_links[j] and nvlink_ok is not False:
                counts[i][j] = min(switch_links[i], switch_links[j])
            elif unresolved[i] and unresolved[j] and nvlink_ok is True:
                counts[i][j] = min(unresolved[i], unresolved[j])
    return counts


def infer_nvswitch(
    link_matrix: Sequence[Sequence[str | None]], active_links: Sequence[int | None]
) -> tuple[bool | None, str]:
    """Decide from NV# codes and link counts whether the NVLinks go through a switch.

    Direct links are split between peers, so a GPU's NV# towards all its peers add
    up to at most its active links. If they add up to more, the same links reach
    several peers: they end at an NVSwitch. If they add up to exactly the links
    and there are two or more peers, the links are direct (a mesh). With a single
    peer that gets every link, both are possible and we cannot tell.
    """
    n = len(link_matrix)
    if n < 2:
        return None, "fewer than 2 GPUs"
    verdicts = []
    for i in range(n):
        links = active_links[i] if i < len(active_links) else None
        if not links:
            continue
        towards_peers = [nvlink_count(link_matrix[i][j]) for j in range(n) if j != i]
        if sum(towards_peers) > links:
            return True, (
                f"inferred: GPU {i} has {links} active NVLinks but NV# towards its peers add up "
                f"to {sum(towards_peers)}, so the links are shared through a switch"
            )
        if sum(towards_peers) == links and sum(1 for c in towards_peers if c) >= 2:
            verdicts.append(False)
    if verdicts and all(v is False for v in verdicts):
        return False, "inferred: each GPU's NVLinks are split between its peers (direct mesh)"
    return None, "cannot tell from NV# and link counts (a single peer gets all links, or no NVLink)"


# -------------------------------------------------------------- PCIe from sysfs


def pcie_code_from_paths(
    path_a: str | None, path_b: str | None, numa_a: int | None = None, numa_b: int | None = None
) -> str | None:
    """nvidia-smi style code for two PCI devices from their resolved sysfs paths
    (/sys/devices/pci0000:00/0000:00:01.0/.../0000:3b:00.0).

    An approximation of what nvidia-smi computes: PHB when the paths meet only at
    the host bridge; PIX when each device sits at most one bridge below the
    deepest common bridge (two ports of one PCIe switch); PXB when deeper;
    NODE/SYS for different host bridges on the same/different NUMA nodes.
    """
    if not path_a or not path_b:
        return None
    parts_a, parts_b = Path(path_a).parts, Path(path_b).parts
    root_a = next((k for k, p in enumerate(parts_a) if p.startswith("pci")), None)
    root_b = next((k for k, p in enumerate(parts_b) if p.startswith("pci")), None)
    if root_a is None or root_b is None:
        return None
    if parts_a[root_a] != parts_b[root_b]:
        if numa_a is not None and numa_b is not None and numa_a != numa_b:
            return "SYS"
        return "NODE"
    below_a, below_b = parts_a[root_a + 1 :], parts_b[root_b + 1 :]
    if below_a == below_b:
        return "X"
    common = 0
    while common < min(len(below_a), len(below_b)) and below_a[common] == below_b[common]:
        common += 1
    if common == 0:
        return "PHB"
    bridges_a = len(below_a) - common - 1
    bridges_b = len(below_b) - common - 1
    return "PIX" if bridges_a <= 1 and bridges_b <= 1 else "PXB"


# ---------------------------------------------------------- summary for headers


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


def peak_percent_line(best_busbw_gbps: float, peak_gbps: float | None) -> str:
    """'# Best busbw 359.54 GB/s = 75.2 % of NVLink peak 478.1 GB/s per GPU per direction'."""
    try:
        best = float(best_busbw_gbps)
        if not peak_gbps or peak_gbps <= 0:
            return f"# Best busbw {best:.2f} GB/s (NVLink peak unknown)"
        return (
            f"# Best busbw {best:.2f} GB/s = {100.0 * best / peak_gbps:.1f} % of NVLink peak "
            f"{peak_gbps:.1f} GB/s per GPU per direction"
        )
    except (TypeError, ValueError):
        return f"# Best busbw {best_busbw_gbps} GB/s"


# ----------------------------------------------------------------------- probes


class _Nvml:
    """Calls into a pynvml-shaped module where every failure becomes a default."""

    def __init__(self, module: Any):
        self.module = module

    def const(self, name: str, default: Any) -> Any:
        value = getattr(self.module, name, default)
        if isinstance(value, tuple):  # see P2P_CAPS_INDEX
            value = value[0]
        return value

    def call(self, name: str, *args: Any, default: Any = None) -> Any:
        function = getattr(self.module, name, None)
        if function is None:
            return default
        try:
            return function(*args)
        except Exception:
            return default

    def field_numbers(self, handle: Any, field_ids: list[Any]) -> list[float | None]:
        """nvmlDeviceGetFieldValues -> plain numbers, None where NVML failed."""
        values = self.call("nvmlDeviceGetFieldValues", handle, field_ids)
        if values is None:
            return [None] * len(field_ids)
        numbers: list[float | None] = []
        for value in list(values)[: len(field_ids)]:
            if getattr(value, "nvmlReturn", 0) != 0:
                numbers.append(None)
                continue
            member = _VALUE_MEMBERS.get(getattr(value, "valueType", 1), "uiVal")
            numbers.append(getattr(value.value, member, None))
        return numbers + [None] * (len(field_ids) - len(numbers))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


@dataclass
class _NvmlGpu:
    index: int
    handle: Any
    name: str
    pci_bus_id: str | None
    uuid: str | None
    memory_bytes: int | None
    cpu_affinity: str | None
    numa_affinity: str | None
    gpu_numa_id: int | None
    link_ends: list[LinkEnd]
    link_gbps: list[float | None]
    link_speed_source: str | None
    nvlink_version: str | None


@dataclass
class _NvmlSnapshot:
    gpus: list[_NvmlGpu]
    p2p: dict[str, list[list[str | None]]]  # by NVML index
    pcie: list[list[str | None]]  # by NVML index
    driver: str | None
    cuda_driver: str | None
    nvml_version: str | None


def _nvml_pci_bus_id(info: Any) -> str | None:
    if info is None:
        return None
    try:
        return pci_bus_id_from_parts(int(info.domain), int(info.bus), int(info.device))
    except (AttributeError, TypeError, ValueError):
        return normalize_pci_bus_id(_text(getattr(info, "busId", None)))


def _nvml_links(nvml: _Nvml, handle: Any) -> tuple[list[LinkEnd], list[float | None], str | None, str | None]:
    """Active NVLinks of one GPU: far ends, per-link GB/s, where speeds came from, version."""
    count = nvml.field_numbers(handle, [nvml.const("NVML_FI_DEV_NVLINK_LINK_COUNT", _FI_NVLINK_LINK_COUNT)])[0]
    max_links = int(count) if count else int(nvml.const("NVML_NVLINK_MAX_LINKS", 18))
    active = []
    for link in range(max_links):
        # Links past the GPU's own count answer INVALID_ARGUMENT: skip, do not stop.
        if nvml.call("nvmlDeviceGetNvLinkState", handle, link) == 1:
            active.append(link)
    if not active:
        return [], [], None, None
    version = nvlink_version_name(nvml.call("nvmlDeviceGetNvLinkVersion", handle, active[0]))
    ends = []
    for link in active:
        raw_type = nvml.call("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        remote_type = _NVLINK_DEVICE_TYPES.get(raw_type) if raw_type is not None else None
        remote_bus = _nvml_pci_bus_id(nvml.call("nvmlDeviceGetNvLinkRemotePciInfo", handle, link))
        ends.append(LinkEnd(remote_type, remote_bus))

    # Speeds are in MBps (1e6 bytes/s); nvidia-smi prints MBps / 1000 as GB/s (26.562).
    def plausible(mbps: float | None) -> float | None:
        return mbps / 1000.0 if mbps and 100 <= mbps <= 1_000_000 else None

    speed_field = nvml.const("NVML_FI_DEV_NVLINK_GET_SPEED", _FI_NVLINK_GET_SPEED)
    per_link = [plausible(v) for v in nvml.field_numbers(handle, [(speed_field, link) for link in active])]
    if all(per_link):
        return ends, per_link, "nvml NVLINK_GET_SPEED", version
    common_field = nvml.const("NVML_FI_DEV_NVLINK_SPEED_MBPS_COMMON", _FI_NVLINK_SPEED_COMMON)
    common = plausible(nvml.field_numbers(handle, [common_field])[0])
    if common:
        return ends, [common] * len(active), "nvml NVLINK_SPEED_MBPS_COMMON", version
    return ends, [None] * len(active), None, version


def _probe_nvml(module: Any, cpu_count: int | None, notes: list[str]) -> _NvmlSnapshot | None:
    nvml = _Nvml(module)
    try:
        module.nvmlInit()
    except Exception as error:  # no driver, no library, no permission
        notes.append(f"NVML unavailable: {type(error).__name__}: {error}".strip().rstrip(":"))
        return None
    try:
        count = int(nvml.call("nvmlDeviceGetCount", default=0) or 0)
        cpu_words = max(1, -(-(cpu_count or 64) // 64))
        scope_node = nvml.const("NVML_AFFINITY_SCOPE_NODE", 0)
        gpus = []
        for index in range(count):
            handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                notes.append(f"NVML could not open GPU {index}")
                continue
            memory = nvml.call("nvmlDeviceGetMemoryInfo", handle)
            cpu_mask = nvml.call("nvmlDeviceGetCpuAffinity", handle, cpu_words)
            node_mask = nvml.call("nvmlDeviceGetMemoryAffinity", handle, 1, scope_node)
            numa_id = nvml.call("nvmlDeviceGetNumaNodeId", handle)
            ends, speeds, speed_source, version = _nvml_links(nvml, handle)
            gpus.append(
                _NvmlGpu(
                    index=index,
                    handle=handle,
                    name=_text(nvml.call("nvmlDeviceGetName", handle)) or "unknown GPU",
                    pci_bus_id=_nvml_pci_bus_id(nvml.call("nvmlDeviceGetPciInfo", handle)),
                    uuid=_text(nvml.call("nvmlDeviceGetUUID", handle)),
                    memory_bytes=int(memory.total) if memory is not None else None,
                    cpu_affinity=format_cpu_list(list(cpu_mask)) or None if cpu_mask is not None else None,
                    numa_affinity=format_cpu_list(list(node_mask)) or None if node_mask is not None else None,
                    gpu_numa_id=numa_id if isinstance(numa_id, int) and numa_id >= 0 else None,
                    link_ends=ends,
                    link_gbps=speeds,
                    link_speed_source=speed_source,
                    nvlink_version=version,
                )
            )
        n = len(gpus)
        p2p: dict[str, list[list[str | None]]] = {}
        for capability, caps_index in P2P_CAPS_INDEX.items():
            matrix: list[list[str | None]] = [["X" if i == j else None for j in range(n)] for i in range(n)]
            for i in range(n):
                for j in range(n):
                    if i != j:
                        status = nvml.call("nvmlDeviceGetP2PStatus", gpus[i].handle, gpus[j].handle, caps_index)
                        matrix[i][j] = P2P_STATUS_CODES.get(status, "U") if status is not None else None
            p2p[capability] = matrix
        pcie: list[list[str | None]] = [["X" if i == j else None for j in range(n)] for i in range(n)]
        for i in range(n):
            for j in range(n):
                if i != j:
                    level = nvml.call("nvmlDeviceGetTopologyCommonAncestor", gpus[i].handle, gpus[j].handle)
                    pcie[i][j] = NVML_TOPOLOGY_LEVEL_CODES.get(level) if level is not None else None
        cuda_driver = nvml.call("nvmlSystemGetCudaDriverVersion")
        return _NvmlSnapshot(
            gpus=gpus,
            p2p=p2p,
            pcie=pcie,
            driver=_text(nvml.call("nvmlSystemGetDriverVersion")),
            cuda_driver=cuda_version_name(cuda_driver) if isinstance(cuda_driver, int) else None,
            nvml_version=_text(nvml.call("nvmlSystemGetNVMLVersion")),
        )
    finally:
        nvml.call("nvmlShutdown")


@dataclass
class _CudaGpu:
    index: int
    name: str
    pci_bus_id: str | None
    uuid: str | None
    memory_bytes: int | None


def _probe_cuda(cuda: Any, notes: list[str]) -> tuple[list[_CudaGpu], list[list[bool | None]] | None]:
    try:
        count = int(cuda.device_count())
    except Exception as error:
        notes.append(f"torch.cuda.device_count failed: {type(error).__name__}: {error}")
        return [], None
    gpus = []
    for index in range(count):
        try:
            props = cuda.get_device_properties(index)
        except Exception as error:
            notes.append(f"torch.cuda.get_device_properties({index}) failed: {error}")
            return [], None
        bus_id = None
        if all(hasattr(props, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
            bus_id = pci_bus_id_from_parts(int(props.pci_domain_id), int(props.pci_bus_id), int(props.pci_device_id))
        uuid = getattr(props, "uuid", None)
        gpus.append(
            _CudaGpu(
                index=index,
                name=str(getattr(props, "name", "unknown GPU")),
                pci_bus_id=bus_id,
                uuid=str(uuid) if uuid is not None else None,
                memory_bytes=getattr(props, "total_memory", None),
            )
        )
    peer: list[list[bool | None]] = [[None] * count for _ in range(count)]
    for i in range(count):
        for j in range(count):
            if i != j:
                try:
                    peer[i][j] = bool(cuda.can_device_access_peer(i, j))
                except Exception:
                    peer[i][j] = None
    return gpus, peer


def _uuid_key(uuid: str | None) -> str | None:
    """NVML says 'GPU-8f1e...', torch says '8f1e...': compare without the prefix."""
    if not uuid:
        return None
    return uuid.lower().removeprefix("gpu-")


def cuda_order_from_env(
    cuda_count: int, nvml_gpus: Sequence[tuple[int, str | None, str | None]], env: Mapping[str, str]
) -> tuple[list[int | None], str]:
    """Guess which NVML index each CUDA index is when the properties give no bus id.

    nvml_gpus: (nvml index, pci bus id, uuid). CUDA numbers GPUs fastest first
    unless CUDA_DEVICE_ORDER=PCI_BUS_ID; for identical GPUs both give PCI order,
    which is what we assume. CUDA_VISIBLE_DEVICES then picks (and reorders) GPUs
    by that index or by UUID; CUDA ignores everything after an entry it cannot use.
    """
    ordered = sorted(nvml_gpus, key=lambda g: (g[1] or "", g[0]))
    how = "PCI bus order" if env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID" else "assumed PCI bus order"
    visible_setting = env.get("CUDA_VISIBLE_DEVICES")
    if visible_setting is None:
        visible = list(ordered)
    else:
        visible = []
        how += " + CUDA_VISIBLE_DEVICES"
        for entry in (e.strip() for e in visible_setting.split(",")):
            if entry.isdigit() and int(entry) < len(ordered):
                visible.append(ordered[int(entry)])
            elif entry.upper().startswith("GPU-"):
                matches = [g for g in ordered if (_uuid_key(g[2]) or "").startswith(_uuid_key(entry) or "")]
                if len(matches) != 1:
                    break
                visible.append(matches[0])
            else:
                break
    return [visible[k][0] if k < len(visible) else None for k in range(cuda_count)], how


def visible_entries(setting: str | None, uuids: Sequence[str | None]) -> list[int] | None:
    """The devices (positions in `uuids`, NVML's list) CUDA makes visible under
    CUDA_VISIBLE_DEVICES=`setting`, read as CUDA reads it: indices (a leading number,
    "1gpu" is 1) or unique prefixes of "GPU-" UUIDs, up to the first entry it cannot use;
    a repeated entry hides every device. None: MIG entries, which NVML's GPU list cannot
    resolve."""
    if setting is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for entry in (e.strip() for e in setting.split(",")):
        if entry.upper().startswith("MIG-"):
            return None
        if entry.upper().startswith("GPU-"):
            matches = [k for k, u in enumerate(uuids) if (_uuid_key(u) or "").startswith(_uuid_key(entry) or "-")]
            position = matches[0] if len(matches) == 1 else -1
        else:
            digits = re.match(r"\+?(\d+)", entry)
            position = int(digits.group(1)) if digits else -1
        if not 0 <= position < len(uuids):
            break
        if position in chosen:
            return []
        chosen.append(position)
    return chosen


def visible_cuda_count(nvml: Any = None, env: Mapping[str, str] | None = None) -> int | None:
    """How many GPUs CUDA will show this process, from NVML and CUDA_VISIBLE_DEVICES,
    without the CUDA driver or torch. None when NVML cannot say (no NVML library, MIG).
    nvml: a pynvml-shaped module (default: pynvml)."""
    env = os.environ if env is None else env
    if env.get("CUDA_VISIBLE_DEVICES") is not None and not env["CUDA_VISIBLE_DEVICES"].strip():
        return 0
    if nvml is None:
        try:
            import pynvml as nvml  # noqa: PLC0415
        except Exception:  # noqa: BLE001
            return None
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no driver, or no NVML library
        return None
    try:
        count = int(nvml.nvmlDeviceGetCount())
        uuids = [None] * count
        if any(e.strip().upper().startswith("GPU-") for e in env.get("CUDA_VISIBLE_DEVICES", "").split(",")):
            uuids = [_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(k))) for k in range(count)]
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    visible = visible_entries(env.get("CUDA_VISIBLE_DEVICES"), uuids)
    return None if visible is None else len(visible)


def nvidia_driver_loaded() -> bool:
    """Whether this machine runs the NVIDIA kernel driver (no driver: no CUDA GPU)."""
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")


def _join_cuda_nvml(
    cuda_gpus: Sequence[_CudaGpu], nvml_gpus: Sequence[_NvmlGpu], env: Mapping[str, str]
) -> tuple[list[int | None], str]:
    """For each CUDA index, the NVML index of the same GPU: by PCI bus id, then UUID,
    then by CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER."""
    by_bus = {g.pci_bus_id: g.index for g in nvml_gpus if g.pci_bus_id}
    by_uuid = {_uuid_key(g.uuid): g.index for g in nvml_gpus if g.uuid}
    mapping: list[int | None] = []
    methods = set()
    for gpu in cuda_gpus:
        if gpu.pci_bus_id in by_bus:
            mapping.append(by_bus[gpu.pci_bus_id])
            methods.add("PCI bus id")
        elif _uuid_key(gpu.uuid) in by_uuid:
            mapping.append(by_uuid[_uuid_key(gpu.uuid)])
            methods.add("UUID")
        else:
            mapping.append(None)
    if None in mapping:
        guessed, how = cuda_order_from_env(
            len(cuda_gpus), [(g.index, g.pci_bus_id, g.uuid) for g in nvml_gpus], env
        )
        mapping = [m if m is not None else guessed[k] for k, m in enumerate(mapping)]
        methods.add(how)
    return mapping, " + ".join(sorted(methods)) or "none"


def _run_nvidia_smi(args: Sequence[str], timeout: float = SMI_TIMEOUT_S) -> str | None:
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


SMI_GPU_QUERY = ["--query-gpu=index,name,pci.bus_id,memory.total,uuid", "--format=csv,noheader,nounits"]
SMI_TOPO = ["topo", "-m"]
SMI_NVLINK_STATUS = ["nvlink", "--status"]


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def probe_host(sysfs: str | os.PathLike = "/sys") -> HostInfo:
    nodes: dict[str, str] = {}
    node_root = Path(sysfs) / "devices/system/node"
    try:
        for node in sorted(node_root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
            nodes[node.name[4:]] = _read_text(node / "cpulist") or ""
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    return HostInfo(
        hostname=socket.gethostname(),
        os=f"{platform.system()} {platform.release()} {platform.machine()}",
        cpu_count=os.cpu_count(),
        usable_cpus=usable,
        numa_nodes=nodes,
    )


def probe_nics(sysfs: str | os.PathLike = "/sys") -> tuple[list[NicInfo], dict[str, str]]:
    """RDMA NICs from /sys/class/infiniband (what NCCL's IB transport uses), and the
    resolved sysfs path of each, for PCIe distances."""
    nics: list[NicInfo] = []
    paths: dict[str, str] = {}
    root = Path(sysfs) / "class/infiniband"
    try:
        devices = sorted(root.iterdir())
    except OSError:
        return [], {}
    for device in devices:
        try:
            pci_path = (device / "device").resolve()
            ports = []
            for port in sorted((device / "ports").glob("[0-9]*"), key=lambda p: int(p.name)):
                state = _read_text(port / "state")
                ports.append(
                    NicPort(
                        port=int(port.name),
                        state=state.split(":", 1)[-1].strip() if state else None,
                        rate=_read_text(port / "rate"),
                        link_layer=_read_text(port / "link_layer"),
                    )
                )
            netdev_dir = device / "device/net"
            netdevs = sorted(p.name for p in netdev_dir.iterdir()) if netdev_dir.is_dir() else []
            numa = _read_int(device / "device/numa_node")
            nics.append(
                NicInfo(
                    name=device.name,
                    pci_bus_id=normalize_pci_bus_id(pci_path.name),
                    numa_node=numa if numa is not None and numa >= 0 else None,
                    netdevs=netdevs,
                    ports=ports,
                )
            )
            paths[device.name] = str(pci_path)
        except (OSError, ValueError):
            continue
    return nics, paths


def _gpu_sysfs(sysfs: str | os.PathLike, bus_id: str | None) -> tuple[str | None, int | None]:
    if not bus_id:
        return None, None
    device = Path(sysfs) / "bus/pci/devices" / bus_id
    if not device.exists():
        return None, None
    numa = _read_int(device / "numa_node")
    return str(device.resolve()), (numa if numa is not None and numa >= 0 else None)


class CudaDriver:
    """The torch.cuda calls the probe makes (device_count, get_device_properties,
    can_device_access_peer), answered by the CUDA driver API through ctypes: CUDA's own
    device order and peer access without importing torch (seconds) in `ncclbench topo`."""

    _ATTRIBUTES = {"pci_bus_id": 33, "pci_device_id": 34, "pci_domain_id": 50}  # CUdevice_attribute

    def __init__(self, library: str = "libcuda.so.1"):
        import ctypes

        self._ctypes = ctypes
        self._lib = ctypes.CDLL(library)
        self._check(self._lib.cuInit(0), "cuInit")

    def _check(self, status: int, call: str) -> None:
        if status != 0:
            raise RuntimeError(f"{call} failed: CUresult {status}")

    def _device(self, index: int):
        handle = self._ctypes.c_int()
        self._check(self._lib.cuDeviceGet(self._ctypes.byref(handle), index), "cuDeviceGet")
        return handle.value

    def device_count(self) -> int:
        count = self._ctypes.c_int()
        self._check(self._lib.cuDeviceGetCount(self._ctypes.byref(count)), "cuDeviceGetCount")
        return count.value

    def get_device_properties(self, index: int) -> types.SimpleNamespace:
        ctypes, dev = self._ctypes, self._device(index)
        name = ctypes.create_string_buffer(256)
        self._check(self._lib.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
        props = types.SimpleNamespace(name=name.value.decode(errors="replace"))
        for key, attribute in self._ATTRIBUTES.items():
            value = ctypes.c_int()
            self._check(self._lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, dev), "cuDeviceGetAttribute")
            setattr(props, key, value.value)
        memory = ctypes.c_size_t()
        if self._lib.cuDeviceTotalMem_v2(ctypes.byref(memory), dev) == 0:
            props.total_memory = memory.value
        raw = ctypes.create_string_buffer(16)
        if self._lib.cuDeviceGetUuid(raw, dev) == 0:
            text = raw.raw.hex()
            props.uuid = f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
        return props

    def can_device_access_peer(self, first: int, second: int) -> bool:
        answer = self._ctypes.c_int()
        self._check(self._lib.cuDeviceCanAccessPeer(self._ctypes.byref(answer), self._device(first),
                                                     self._device(second)), "cuDeviceCanAccessPeer")
        return bool(answer.value)


def _default_cuda() -> Any:
    """torch.cuda where torch is loaded already (a rank), else the CUDA driver through
    ctypes; None without a usable CUDA driver."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.cuda
    try:
        return CudaDriver()
    except Exception:  # noqa: BLE001 - no libcuda, no device, a driver too old
        return None


def _torch_versions(versions: Versions) -> None:
    """torch's version, the CUDA it was built with and its NCCL: from torch where it is
    loaded, else from the installed packages' metadata (no import)."""
    torch = sys.modules.get("torch")
    if torch is None:
        _installed_torch_versions(versions)
        return
    versions.torch = getattr(torch, "__version__", None)
    versions.cuda_runtime = getattr(getattr(torch, "version", None), "cuda", None)
    try:
        nccl = torch.cuda.nccl.version()
        versions.nccl = ".".join(str(p) for p in nccl) if isinstance(nccl, tuple) else str(nccl)
    except Exception:
        versions.nccl = None  # CPU build, or torch built without NCCL


def _installed_torch_versions(versions: Versions) -> None:
    import importlib.util

    versions.torch = _module_version("torch")
    if versions.torch is None:
        return
    try:
        spec = importlib.util.find_spec("torch")
        text = (Path(spec.origin).parent / "version.py").read_text() if spec and spec.origin else ""
    except (ImportError, OSError, ValueError):
        text = ""
    built = re.search(r"^cuda\b[^=]*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    versions.cuda_runtime = built.group(1) if built else None
    if versions.cuda_runtime:  # torch's NCCL comes as a wheel of its own (nvidia-nccl-cuXX)
        major = versions.cuda_runtime.split(".")[0]
        versions.nccl = _module_version(f"nvidia-nccl-cu{major}")


def _interesting_env(env: Mapping[str, str]) -> dict[str, str]:
    keep = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
    return {k: v for k, v in sorted(env.items()) if k in keep or k.startswith("NCCL_")}


_DEFAULT = object()


def probe(
    include_nics: bool = True,
    *,
    nvml: Any = _DEFAULT,
    cuda: Any = _DEFAULT,
    smi: Callable[[Sequence[str]], str | None] | None | Any = _DEFAULT,
    sysfs: str | os.PathLike = "/sys",
    env: Mapping[str, str] | None = None,
) -> Topology:
    """Everything this host can tell about its GPUs, quickly, without raising.

    nvml: a pynvml-shaped module (default: import pynvml; False: skip NVML).
    cuda: a torch.cuda-shaped object with device_count, get_device_properties and
          can_device_access_peer (default: torch.cuda; False: skip).
    smi:  callable(args) -> stdout of nvidia-smi or None (default: run it with a
          timeout; None/False: never). Only used for what NVML could not answer.
    """
    started = time.perf_counter()
    env = os.environ if env is None else env
    notes: list[str] = []
    try:
        topo = _probe(include_nics, nvml, cuda, smi, sysfs, env, notes)
    except Exception as error:  # a bug here must not break a benchmark run
        notes.append(f"topology probe failed: {type(error).__name__}: {error}")
        topo = Topology(
            host=HostInfo(socket.gethostname(), platform.system(), os.cpu_count(), None, {}),
            versions=Versions(),
            gpus=[],
            link_matrix=[],
            peer_access=None,
            nvml_p2p={},
            nvswitch=None,
            nvswitch_evidence="probe failed",
            nics=[],
            nic_links=[],
            gpu_order="none",
            join="none",
            sources={},
            notes=notes,
            env=_interesting_env(env),
        )
    topo.probe_seconds = round(time.perf_counter() - started, 3)
    return topo


def _probe(include_nics, nvml, cuda, smi, sysfs, env, notes) -> Topology:
    host = probe_host(sysfs)
    versions = Versions()
    sources: dict[str, str] = {}
    nvml = _nvml_module(nvml, versions, notes)
    snapshot = _probe_nvml(nvml, host.cpu_count, notes) if nvml else None
    cuda = _default_cuda() if cuda is _DEFAULT else cuda
    cuda_gpus, peer = _probe_cuda(cuda, notes) if cuda else ([], None)
    _torch_versions(versions)
    smi_text = _SmiText(_run_nvidia_smi if smi is _DEFAULT else (smi or None))

    nvml_gpus = _nvml_records(snapshot, smi_text, versions, sources)
    gpus, records, join, gpu_order = _ordered_gpus(cuda_gpus, nvml_gpus, env, notes)
    nvml_p2p, link_ends, link_matrix = _links(snapshot, gpus, records, smi_text, sources)
    _attach_nvlinks(gpus, records, snapshot, smi_text, sources)
    nvswitch, evidence = _nvswitch_of(link_ends, gpus, link_matrix)
    nics, nic_links = _nics_near(include_nics, sysfs, gpus, sources)
    return Topology(
        host=host,
        versions=versions,
        gpus=gpus,
        link_matrix=link_matrix,
        peer_access=peer if cuda_gpus else None,
        nvml_p2p=nvml_p2p,
        nvswitch=nvswitch,
        nvswitch_evidence=evidence,
        nics=nics,
        nic_links=nic_links,
        gpu_order=gpu_order,
        join=join,
        sources=sources,
        notes=notes,
        env=_interesting_env(env),
    )


def _nvml_module(nvml, versions: Versions, notes: list[str]):
    if nvml is _DEFAULT:
        try:
            import pynvml as nvml  # noqa: PLC0415 (optional dependency, slow-ish import)
        except Exception as error:
            notes.append(f"pynvml not importable: {error}")
            nvml = None
    if isinstance(nvml, types.ModuleType):
        versions.pynvml = _module_version("nvidia-ml-py")
    return nvml


class _SmiText:
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


def _nvml_records(snapshot, smi_text: _SmiText, versions: Versions, sources: dict) -> list[_NvmlGpu]:
    """NVML-shaped records for every GPU, from NVML or from nvidia-smi text."""
    nvml_gpus: list[_NvmlGpu] = snapshot.gpus if snapshot else []
    if snapshot:
        versions.driver, versions.cuda_driver = snapshot.driver, snapshot.cuda_driver
        versions.nvml = snapshot.nvml_version
        sources["gpus"] = "nvml"
    elif smi_text.run is not None:
        query = smi_text(SMI_GPU_QUERY)
        for row in parse_smi_gpu_query(query or ""):
            nvml_gpus.append(
                _NvmlGpu(row["index"], None, row["name"], row["pci_bus_id"], row["uuid"], row["memory_bytes"],
                         None, None, None, [], [], None, None)
            )
        if nvml_gpus:
            sources["gpus"] = "nvidia-smi --query-gpu"
            driver = smi_text(["--query-gpu=driver_version", "--format=csv,noheader"])
            versions.driver = driver.splitlines()[0].strip() if driver else None
    return nvml_gpus


def _ordered_gpus(cuda_gpus, nvml_gpus, env, notes: list[str]):
    """(gpus, their NVML records, how the two were joined, whose order): torch.cuda's order
    when torch can use CUDA."""
    if cuda_gpus:
        mapping, join = _join_cuda_nvml(cuda_gpus, nvml_gpus, env) if nvml_gpus else ([None] * len(cuda_gpus), "none")
        gpu_order = "cuda"
    else:
        mapping, join, gpu_order = [g.index for g in nvml_gpus], "none (CUDA sees no GPU)", "nvml"
        if nvml_gpus:
            notes.append("CUDA cannot be used here: GPUs are listed in NVML order without CUDA indices")
    by_nvml_index = {g.index: g for g in nvml_gpus}
    gpus: list[GpuInfo] = []
    records: list[_NvmlGpu | None] = []
    for position, nvml_index in enumerate(mapping):
        record = by_nvml_index.get(nvml_index) if nvml_index is not None else None
        cuda_gpu = cuda_gpus[position] if cuda_gpus else None
        records.append(record)
        gpus.append(
            GpuInfo(
                cuda_index=cuda_gpu.index if cuda_gpu else None,
                nvml_index=record.index if record else None,
                name=(record.name if record else None) or (cuda_gpu.name if cuda_gpu else "unknown GPU"),
                pci_bus_id=(record.pci_bus_id if record else None) or (cuda_gpu.pci_bus_id if cuda_gpu else None),
                uuid=(record.uuid if record else None) or (cuda_gpu.uuid if cuda_gpu else None),
                memory_bytes=(record.memory_bytes if record else None) or (cuda_gpu.memory_bytes if cuda_gpu else None),
                cpu_affinity=record.cpu_affinity if record else None,
                numa_affinity=record.numa_affinity if record else None,
                gpu_numa_id=record.gpu_numa_id if record else None,
                nvlink=None,
            )
        )
    if not gpus:
        notes.append("no GPU visible")
    return gpus, records, join, gpu_order


def _links(snapshot, gpus: list[GpuInfo], records, smi_text: _SmiText, sources: dict):
    """(NVML's P2P matrices, each GPU's NVLink ends, the link matrix) in our GPU order;
    what NVML could not answer is read from `nvidia-smi topo -m`."""
    n = len(gpus)
    # NVML matrices are by position in snapshot.gpus; put them in our GPU order.
    position = {g.index: k for k, g in enumerate(snapshot.gpus)} if snapshot else {}

    def reindex(matrix: list[list[Any]] | None) -> list[list[Any]]:
        out = [["X" if i == j else None for j in range(n)] for i in range(n)]
        for i, a in enumerate(records):
            for j, b in enumerate(records):
                if i != j and a is not None and b is not None and matrix is not None:
                    if a.index in position and b.index in position:
                        out[i][j] = matrix[position[a.index]][position[b.index]]
        return out

    nvml_p2p = {cap: reindex(snapshot.p2p[cap] if snapshot else None) for cap in P2P_CAPS_INDEX}
    link_ends = [r.link_ends if r else [] for r in records]
    nvlink_ok = [[(code == "OK") if code not in (None, "X") else None for code in row] for row in nvml_p2p["nvlink"]]
    counts = [[0] * n for _ in range(n)]
    if snapshot:
        counts = nvlink_pair_counts(link_ends, [g.pci_bus_id for g in gpus], nvlink_ok)
    pcie = reindex(snapshot.pcie if snapshot else None)
    link_matrix: list[list[str | None]] = [
        ["X" if i == j else (f"NV{counts[i][j]}" if counts[i][j] else pcie[i][j]) for j in range(n)] for i in range(n)
    ]
    if snapshot:
        sources["link_matrix"] = "nvml"
    _fill_from_smi_matrix(link_matrix, gpus, smi_text, sources, snapshot is not None)
    return nvml_p2p, link_ends, link_matrix


def _fill_from_smi_matrix(link_matrix, gpus: list[GpuInfo], smi_text: _SmiText, sources: dict, had_nvml: bool) -> None:
    n = len(gpus)
    if not n or not any(link_matrix[i][j] is None for i in range(n) for j in range(n)):
        return
    topo_text = smi_text(SMI_TOPO)
    if not topo_text:
        return
    try:
        smi_matrix = parse_topo_matrix(topo_text)
    except ValueError:
        return
    for i, a in enumerate(gpus):
        for j, b in enumerate(gpus):
            if link_matrix[i][j] is None and a.nvml_index is not None and b.nvml_index is not None:
                link_matrix[i][j] = smi_matrix.code(f"GPU{a.nvml_index}", f"GPU{b.nvml_index}")
    for gpu in gpus:
        row = f"GPU{gpu.nvml_index}"
        gpu.cpu_affinity = gpu.cpu_affinity or smi_matrix.affinity_of(row, "CPU Affinity")
        gpu.numa_affinity = gpu.numa_affinity or smi_matrix.affinity_of(row, "NUMA Affinity")
    sources["link_matrix"] = "nvml + nvidia-smi topo -m" if had_nvml else "nvidia-smi topo -m"


def _attach_nvlinks(gpus: list[GpuInfo], records, snapshot, smi_text: _SmiText, sources: dict) -> None:
    """Each GPU's NVLinks and their speeds: NVML's, or `nvidia-smi nvlink --status` where
    NVML has no speed (without NVML nothing is known about NVLinks)."""
    smi_links: dict[int, GpuLinkStatus] = {}
    needs_speeds = snapshot is None or any(r is None or (r.link_ends and not all(r.link_gbps)) for r in records)
    if gpus and needs_speeds:
        status_text = smi_text(SMI_NVLINK_STATUS)
        smi_links = {g.index: g for g in parse_nvlink_status(status_text or "")}
    for gpu, record in zip(gpus, records):
        if record and record.link_ends and all(record.link_gbps):
            speeds: list[float | None] = list(record.link_gbps)
            source = record.link_speed_source or "nvml"
        elif gpu.nvml_index in smi_links and smi_links[gpu.nvml_index].active_speeds:
            speeds = list(smi_links[gpu.nvml_index].active_speeds)
            source = "nvidia-smi nvlink --status"
        elif record and record.link_ends:
            speeds, source = list(record.link_gbps), "nvml (speed unknown)"
        else:
            continue
        remote_types = {end.remote_type for end in (record.link_ends if record else [])}
        remote = next(iter(remote_types)) if len(remote_types) == 1 else ("mixed" if remote_types else None)
        known = [s for s in speeds if s]
        gpu.nvlink = NvLinkInfo(
            active_links=len(speeds),
            version=record.nvlink_version if record else None,
            link_gbps=speeds,
            peak_gbps=round(sum(known), 3) if known and len(known) == len(speeds) else None,
            remote=remote,
            source=source,
        )
        sources.setdefault("nvlink", source)


def _nvswitch_of(link_ends, gpus: list[GpuInfo], link_matrix):
    """NVSwitch or not, and why: NVML names the far end when it can; otherwise inferred."""
    if any(end.remote_type == "nvswitch" for ends in link_ends for end in ends):
        return True, "NVML: the NVLinks end at an NVSwitch (nvmlDeviceGetNvLinkRemoteDeviceType)"
    if link_ends and all(ends and all(end.remote_type == "gpu" for end in ends) for ends in link_ends):
        return False, "NVML: every NVLink ends at a GPU"
    active = [g.nvlink.active_links if g.nvlink else None for g in gpus]
    return infer_nvswitch(link_matrix, active)


def _nics_near(include_nics: bool, sysfs, gpus: list[GpuInfo], sources: dict):
    """The host's NICs and each GPU's PCIe distance code to each."""
    nics: list[NicInfo] = []
    nic_links: list[list[str | None]] = [[] for _ in gpus]
    if include_nics:
        nics, nic_paths = probe_nics(sysfs)
        if nics:
            sources["nics"] = "sysfs /sys/class/infiniband; GPU-NIC codes from sysfs PCI paths"
            for i, gpu in enumerate(gpus):
                gpu_path, gpu_numa = _gpu_sysfs(sysfs, gpu.pci_bus_id)
                nic_links[i] = [
                    pcie_code_from_paths(gpu_path, nic_paths.get(nic.name), gpu_numa, nic.numa_node) for nic in nics
                ]
    return nics, nic_links


def _module_version(distribution: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(distribution)
    except Exception:
        return None


# ------------------------------------------------------------- nvidia-smi check


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


def header_context(backend: str) -> tuple[str | None, float | None, Callable | None]:
    """(summary line, NVLink peak GB/s, trailer-line maker) for a run's header and trailer on
    `backend`; all None for gloo (CPU) runs or when the probe fails: topology is context,
    never a reason to fail a run."""
    if backend == "gloo":
        return None, None, None
    try:
        t = probe(include_nics=False)
        summary, peak = summary_line(t), link_peak_gbps(t)
    except Exception:  # noqa: BLE001
        return None, None, None
    if not peak:
        return summary, None, None
    return summary, peak, lambda s: peak_percent_line(s.peak_busbw, peak)


def visible_gpu_count() -> int:
    """CUDA GPUs this process may use, counted through NVML (no torch import and no CUDA
    driver call, which would make a later fork unusable for CUDA); torch is asked only
    where NVML cannot tell (MIG devices in CUDA_VISIBLE_DEVICES, a broken NVML)."""
    count = visible_cuda_count()
    if count is not None:
        return count
    if not nvidia_driver_loaded():
        return 0
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001 - a broken CUDA install means no GPU for us
        return 0
