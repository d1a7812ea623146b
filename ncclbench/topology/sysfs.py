"""What sysfs tells about the host: NUMA nodes, RDMA NICs and the PCIe paths between
devices (nvidia-smi-style distance codes between a GPU and a NIC)."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path

from ncclbench.topology.model import HostInfo, NicInfo, NicPort
from ncclbench.topology.pci import normalize_pci_bus_id


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


def gpu_sysfs(sysfs: str | os.PathLike, bus_id: str | None) -> tuple[str | None, int | None]:
    """A GPU's resolved sysfs path and NUMA node (None, None when sysfs does not list it)."""
    if not bus_id:
        return None, None
    device = Path(sysfs) / "bus/pci/devices" / bus_id
    if not device.exists():
        return None, None
    numa = _read_int(device / "numa_node")
    return str(device.resolve()), (numa if numa is not None and numa >= 0 else None)
