"""What this host's sysfs says about the path NCCL could have taken: InfiniBand/RoCE devices,
a NIC's rate, whether the GPUDirect RDMA module is loaded. Every reader takes the sysfs root,
so tests point it at a folder of their own; unreadable facts are None, never a guess."""

from __future__ import annotations

import re
from pathlib import Path


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def ib_devices(sysfs: str = "/sys") -> list[str]:
    """The RDMA devices the kernel lists (/sys/class/infiniband), IB and RoCE alike."""
    try:
        return sorted(p.name for p in (Path(sysfs) / "class/infiniband").iterdir())
    except OSError:
        return []


def ib_rate_gbps(device: str, port: int = 1, sysfs: str = "/sys") -> float | None:
    """An RDMA port's rate in GB/s ('400 Gb/sec (4X NDR)' -> 50.0)."""
    m = re.match(r"\s*([0-9.]+)\s*Gb/sec", _text(Path(sysfs) / f"class/infiniband/{device}/ports/{port}/rate") or "")
    return float(m.group(1)) / 8 if m else None


def net_rate_gbps(interface: str, sysfs: str = "/sys") -> float | None:
    """A network interface's link speed in GB/s (/sys/class/net/IF/speed is in Mb/s; a
    virtual interface reports -1 or nothing: None)."""
    try:
        speed = int(_text(Path(sysfs) / f"class/net/{interface}/speed") or "")
    except ValueError:
        return None
    return speed / 8000 if speed > 0 else None


def nic_rate_gbps(name: str, detail: str = "", sysfs: str = "/sys") -> float | None:
    """The rate of a NIC as NCCL's `NET/... : Using [i]name:detail` names it: an RDMA device
    (`mlx5_0` with detail `1/IB`: port 1) or a network interface (`eth0`)."""
    port = re.match(r"(\d+)", detail or "")
    if name in ib_devices(sysfs):
        return ib_rate_gbps(name, int(port.group(1)) if port else 1, sysfs)
    return net_rate_gbps(name, sysfs)


def pcie_link(address: str, sysfs: str = "/sys") -> dict | None:
    """A PCI device's current link: {"gen_gts", "width", "gbps" (per direction, after the
    line code: 8b/10b up to 5 GT/s, 128b/130b above)}; None when sysfs does not say."""
    root = Path(sysfs) / "bus/pci/devices" / address.lower()
    speed = re.match(r"\s*([0-9.]+)\s*GT/s", _text(root / "current_link_speed") or "")
    try:
        width = int(_text(root / "current_link_width") or "")
    except ValueError:
        return None
    if not speed or width <= 0:
        return None
    gts = float(speed.group(1))
    code = 0.8 if gts <= 5 else 128 / 130
    return {"gen_gts": gts, "width": width, "gbps": gts * width * code / 8}


def peermem_loaded(sysfs: str = "/sys") -> bool | None:
    """Whether the GPUDirect RDMA kernel module (nvidia_peermem, or the older nv_peer_mem) is
    loaded; None when /sys/module cannot be listed."""
    try:
        names = {p.name for p in (Path(sysfs) / "module").iterdir()}
    except OSError:
        return None
    return bool(names & {"nvidia_peermem", "nv_peer_mem"})
