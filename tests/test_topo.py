"""Tests of ncclbench.topology and the `topo` command, without a GPU.

Real nvidia-smi output from two H200 hosts (tests/fixtures/topology) checks the
parsers; a fake NVML module with pynvml's shape checks the NVML path, the join
of CUDA and NVML numbering, the NVLink peak and the summary line.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import click
import pytest
from click.testing import CliRunner

from ncclbench.topology import nvml as topo_nvml
from ncclbench.topology import pci as topo_pci
from ncclbench.topology import probe as topo_probe
from ncclbench.topology import smi as topo_smi
from ncclbench.topology.header import peak_percent_line
from ncclbench.topology.model import LinkEnd, link_peak_gbps, nvlink_count, summary_line
from ncclbench.topology.nvlink import infer_nvswitch, nvlink_pair_counts
from ncclbench.topology.pci import format_cpu_list, normalize_pci_bus_id, parse_index_ranges
from ncclbench.topology.probe import probe
from ncclbench.topology.smi import compare_with_smi, parse_nvlink_status, parse_smi_gpu_query, parse_topo_matrix
from ncclbench.topology.sysfs import pcie_code_from_paths
from ncclbench.topology.visible import cuda_order_from_env
from ncclbench.cli.topo import topo_command

FIXTURES = Path(__file__).parent / "fixtures" / "topology"
H200_4 = FIXTURES / "h200-4gpu-nvswitch"
H200_2 = FIXTURES / "h200-2gpu-nvswitch"
H200_LINK_GBPS = 26.562
H200_PEAK = 18 * H200_LINK_GBPS  # 478.116


def gpu_visible() -> bool:
    try:
        import torch

        return torch.cuda.is_available() and torch.cuda.device_count() > 0
    except Exception:
        return False


def fixture_text(host: Path, name: str) -> str:
    return (host / name).read_text()


# ------------------------------------------------------------------ fake NVML


class FakeNvmlError(Exception):
    """Stands for pynvml.NVMLError."""


@dataclass
class FakeLink:
    active: bool = True
    remote_type: int | None = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH; None: NVML cannot say
    remote_bus: tuple[int, int, int] | None = (0, 0xFF, 0)  # far end's (domain, bus, device)


@dataclass
class FakeGpu:
    bus: tuple[int, int, int]
    links: list[FakeLink]
    name: str = "NVIDIA H200"
    memory: int = 150_754_820_096
    cpu_mask: tuple[int, ...] = (0xFFFFFFFFFFFFFFFF,)
    uuid: str = ""


class FakeNvml:
    """The pynvml functions ncclbench.topology.nvml calls, answering for a made-up board."""

    NVML_AFFINITY_SCOPE_NODE = 0
    # Like nvidia-ml-py 13: the P2P caps constants are tuples by mistake.
    NVML_P2P_CAPS_INDEX_READ = (0,)

    def __init__(self, gpus, link_mbps=26562, nvlink_version=6, scoped_speed=True, common_speed=True,
                 p2p_status=0, ancestor_level=50):  # fmt: skip
        self.gpus = gpus
        self.link_mbps = link_mbps
        self.nvlink_version = nvlink_version
        self.scoped_speed = scoped_speed
        self.common_speed = common_speed
        self.p2p_status = p2p_status
        self.ancestor_level = ancestor_level
        self.p2p_indices: set = set()
        self.initialized = self.shut_down = False
        for k, gpu in enumerate(gpus):
            gpu.uuid = gpu.uuid or f"GPU-0000000{k}-aaaa-bbbb-cccc-dddddddddddd"

    def _gpu(self, handle):
        return self.gpus[handle[1]]

    def _link(self, handle, link):
        links = self._gpu(handle).links
        if link >= len(links):
            raise FakeNvmlError("Invalid Argument")
        return links[link]

    def nvmlInit(self):
        self.initialized = True

    def nvmlShutdown(self):
        self.shut_down = True

    def nvmlSystemGetDriverVersion(self):
        return "570.124.06"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12080

    def nvmlSystemGetNVMLVersion(self):
        return "12.570.124.06"

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return ("handle", index)

    def nvmlDeviceGetName(self, handle):
        return self._gpu(handle).name

    def nvmlDeviceGetUUID(self, handle):
        return self._gpu(handle).uuid

    def nvmlDeviceGetPciInfo(self, handle):
        domain, bus, device = self._gpu(handle).bus
        return SimpleNamespace(domain=domain, bus=bus, device=device, busId=f"{domain:08X}:{bus:02X}:{device:02X}.0")

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(total=self._gpu(handle).memory)

    def nvmlDeviceGetCpuAffinity(self, handle, words):
        return list(self._gpu(handle).cpu_mask) + [0] * (words - len(self._gpu(handle).cpu_mask))

    def nvmlDeviceGetMemoryAffinity(self, handle, words, scope):
        return [0b1]

    def nvmlDeviceGetNumaNodeId(self, handle):
        raise FakeNvmlError("Not Supported")

    def nvmlDeviceGetFieldValues(self, handle, field_ids):
        values = []
        for field_id in field_ids:
            fid, scope = field_id if isinstance(field_id, tuple) else (field_id, 0)
            number, ok = None, True
            if fid == 91:  # link count
                number = len(self._gpu(handle).links)
            elif fid == 164:  # per-link speed
                ok = self.scoped_speed
                number = self.link_mbps
            elif fid == 90:  # common speed
                ok = self.common_speed
                number = self.link_mbps
            else:
                ok = False
            values.append(
                SimpleNamespace(nvmlReturn=0 if ok else 3, valueType=1, value=SimpleNamespace(uiVal=number or 0))
            )
        return values

    def nvmlDeviceGetNvLinkState(self, handle, link):
        return 1 if self._link(handle, link).active else 0

    def nvmlDeviceGetNvLinkVersion(self, handle, link):
        self._link(handle, link)
        return self.nvlink_version

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link):
        kind = self._link(handle, link).remote_type
        if kind is None:
            raise FakeNvmlError("Not Supported")
        return kind

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle, link):
        far = self._link(handle, link).remote_bus
        if far is None:
            raise FakeNvmlError("Not Supported")
        return SimpleNamespace(domain=far[0], bus=far[1], device=far[2], busId=b"")

    def nvmlDeviceGetP2PStatus(self, first, second, index):
        if not isinstance(index, int):  # what ctypes does with the tuple constant
            raise TypeError("Don't know how to convert parameter 3")
        self.p2p_indices.add(index)
        return self.p2p_status

    def nvmlDeviceGetTopologyCommonAncestor(self, first, second):
        return self.ancestor_level


class FailingNvml:
    """pynvml on a machine without the NVIDIA driver."""

    def nvmlInit(self):
        raise FakeNvmlError("NVML Shared Library Not Found")


def h200_vm_gpus(count=4):
    """Like the fixture hosts: H200s at 0000:00:06.0 ..., 18 links each to NVSwitches."""
    return [FakeGpu(bus=(0, 0, 6 + k), links=[FakeLink() for _ in range(18)]) for k in range(count)]


def direct_mesh_gpus():
    """4 GPUs with 6 direct links to each peer (an HGX 4-GPU board): no switch."""
    buses = [(0, 0x18 + 0x20 * k, 0) for k in range(4)]
    return [
        FakeGpu(bus=buses[k], name="NVIDIA H100 80GB HBM3",
                links=[FakeLink(remote_type=0, remote_bus=buses[peer])
                       for peer in range(4) if peer != k for _ in range(6)])
        for k in range(4)
    ]  # fmt: skip


class FakeCuda:
    """torch.cuda's device_count / get_device_properties / can_device_access_peer."""

    def __init__(self, props, peer=lambda i, j: True):
        self.props = props
        self.peer = peer

    def device_count(self):
        return len(self.props)

    def get_device_properties(self, index):
        return self.props[index]

    def can_device_access_peer(self, i, j):
        return self.peer(i, j)


def cuda_props(gpu: FakeGpu, with_pci=True, with_uuid=True):
    props = SimpleNamespace(name=gpu.name, total_memory=gpu.memory)
    if with_pci:
        props.pci_domain_id, props.pci_bus_id, props.pci_device_id = gpu.bus
    if with_uuid:
        props.uuid = gpu.uuid.removeprefix("GPU-")
    return props


def nvml_only(fake, **kwargs):
    return probe(nvml=fake, cuda=False, smi=None, sysfs="/nonexistent", env={}, **kwargs)


# ---------------------------------------------------------- nvidia-smi parsing


def test_parse_topo_matrix_4gpu_fixture():
    matrix = parse_topo_matrix(fixture_text(H200_4, "nvidia-smi_topo_-m.txt"))
    assert matrix.devices == ["GPU0", "GPU1", "GPU2", "GPU3"]
    assert matrix.nics == []
    for i, row in enumerate(matrix.gpu_matrix()):
        assert row == ["X" if i == j else "NV18" for j in range(4)]
    assert matrix.affinity_of("GPU2", "CPU Affinity") == "0-63"
    assert matrix.affinity_of("GPU2", "NUMA Affinity") == "0"
    assert matrix.affinity_of("GPU2", "GPU NUMA ID") is None  # "N/A"


def test_parse_topo_matrix_2gpu_fixture():
    matrix = parse_topo_matrix(fixture_text(H200_2, "nvidia-smi_topo_-m.txt"))
    assert matrix.gpu_matrix() == [["X", "NV18"], ["NV18", "X"]]
    assert matrix.affinity_of("GPU1", "CPU Affinity") == "0-31"


def test_parse_topo_matrix_with_nics_and_pasted_spaces():
    # A made-up host with two NICs, as copied from a terminal (spaces, not tabs).
    text = """        GPU0    GPU1    NIC0    NIC1    CPU Affinity    NUMA Affinity   GPU NUMA ID
GPU0     X      SYS     PIX     SYS     0-15,32-47      0               N/A
GPU1    SYS      X      SYS     PXB     16-31,48-63     1               N/A
NIC0    PIX     SYS      X      SYS
NIC1    SYS     PXB     SYS      X

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_3
"""
    matrix = parse_topo_matrix(text)
    assert matrix.gpus == ["GPU0", "GPU1"] and matrix.nics == ["NIC0", "NIC1"]
    assert matrix.code("GPU1", "NIC1") == "PXB"
    assert matrix.code("NIC0", "GPU0") == "PIX"
    assert matrix.affinity_of("GPU1", "CPU Affinity") == "16-31,48-63"
    assert matrix.affinity_of("NIC0", "CPU Affinity") is None
    assert matrix.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_3"}


def test_parse_topo_matrix_rejects_text_without_header():
    with pytest.raises(ValueError):
        parse_topo_matrix("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")


def test_parse_nvlink_status_4gpu_fixture():
    gpus = parse_nvlink_status(fixture_text(H200_4, "nvidia-smi_nvlink_--status.txt"))
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[3].name == "NVIDIA H200"
    assert gpus[0].uuid.startswith("GPU-")
    for gpu in gpus:
        assert sorted(gpu.links) == list(range(18))
        assert set(gpu.active_speeds) == {H200_LINK_GBPS}
        assert gpu.peak_gbps == pytest.approx(H200_PEAK)
        assert f"{gpu.peak_gbps:.1f}" == "478.1"


def test_parse_nvlink_status_inactive_links():
    text = "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-x)\n\t Link 0: 25 GB/s\n\t Link 1: <inactive>\n\t Link 2: 25 GB/s\n"
    (gpu,) = parse_nvlink_status(text)
    assert gpu.links == {0: 25.0, 1: None, 2: 25.0}
    assert gpu.peak_gbps == 50.0


def test_parse_smi_gpu_query():
    rows = parse_smi_gpu_query(
        "0, NVIDIA H200, 00000000:00:06.0, 143771, GPU-abc\n1, NVIDIA H200, 00000000:00:07.0, 143771, GPU-def\n"
    )
    assert rows[1] == {"index": 1, "name": "NVIDIA H200", "pci_bus_id": "0000:00:07.0",
                       "memory_bytes": 143771 * 2**20, "uuid": "GPU-def"}  # fmt: skip


# ------------------------------------------------------------- small helpers


@pytest.mark.parametrize(
    ("masks", "expected"),
    [([0xFFFFFFFFFFFFFFFF], "0-63"), ([0x0F], "0-3"), ([0b101], "0,2"),
     ([0xFFFFFFFF, 0xFFFFFFFF], "0-31,64-95"), ([0], "")],
)  # fmt: skip
def test_format_cpu_list(masks, expected):
    assert format_cpu_list(masks) == expected


def test_index_ranges_round_trip():
    assert parse_index_ranges("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert topo_pci.format_index_ranges([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("00000000:1B:00.0", "0000:1b:00.0"), ("0000:1b:00.0", "0000:1b:00.0"), ("1b:00", "0000:1b:00.0"),
     ("00000001:00:06.0", "0001:00:06.0"), ("not a bus id", None), (None, None)],
)  # fmt: skip
def test_normalize_pci_bus_id(text, expected):
    assert normalize_pci_bus_id(text) == expected


def test_nvlink_version_enum_is_translated():
    assert topo_nvml.nvlink_version_name(6) == "4.0"  # what an H100/H200 returns
    assert topo_nvml.nvlink_version_name(5) == "3.1"  # A100
    assert topo_nvml.nvlink_version_name(42) == "enum 42"


def test_infer_nvswitch():
    nv18_4 = [["X" if i == j else "NV18" for j in range(4)] for i in range(4)]
    verdict, why = infer_nvswitch(nv18_4, [18] * 4)
    assert verdict is True and "54" in why  # 3 peers x 18 > 18 links
    nv6_mesh = [["X" if i == j else "NV6" for j in range(4)] for i in range(4)]
    assert infer_nvswitch(nv6_mesh, [18] * 4)[0] is False
    assert infer_nvswitch([["X", "NV18"], ["NV18", "X"]], [18, 18])[0] is None  # one peer: cannot tell
    assert infer_nvswitch([["X", "SYS"], ["SYS", "X"]], [None, None])[0] is None


def test_nvlink_pair_counts_switch_direct_and_hidden_peer():
    buses = ["0000:00:06.0", "0000:00:07.0"]
    switch = [[LinkEnd("nvswitch", "0000:ff:00.0")] * 18, [LinkEnd("nvswitch", "0000:fe:00.0")] * 18]
    assert nvlink_pair_counts(switch, buses) == [[0, 18], [18, 0]]
    direct = [[LinkEnd("gpu", buses[1])] * 4 + [LinkEnd("gpu", "0000:00:08.0")] * 4, [LinkEnd("gpu", buses[0])] * 4]
    assert nvlink_pair_counts(direct, buses) == [[0, 4], [4, 0]]
    unknown = [[LinkEnd(None, None)] * 12, [LinkEnd(None, None)] * 12]
    assert nvlink_pair_counts(unknown, buses, [[None, True], [True, None]]) == [[0, 12], [12, 0]]
    assert nvlink_pair_counts(unknown, buses, [[None, False], [False, None]]) == [[0, 0], [0, 0]]


def test_pcie_code_from_paths():
    root = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"  # root port, then switch upstream port
    gpu = f"{root}/0000:02:00.0/0000:03:00.0"
    nic_same_switch = f"{root}/0000:02:01.0/0000:04:00.0"
    nic_deeper = f"{root}/0000:02:02.0/0000:05:00.0/0000:06:00.0/0000:07:00.0"
    other_root_port = "/sys/devices/pci0000:00/0000:00:02.0/0000:08:00.0"
    other_host_bridge = "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0"
    assert pcie_code_from_paths(gpu, nic_same_switch) == "PIX"
    assert pcie_code_from_paths(gpu, nic_deeper) == "PXB"
    assert pcie_code_from_paths(gpu, other_root_port) == "PHB"
    assert pcie_code_from_paths(gpu, other_host_bridge, 0, 0) == "NODE"
    assert pcie_code_from_paths(gpu, other_host_bridge, 0, 1) == "SYS"
    assert pcie_code_from_paths(gpu, None) is None


def test_cuda_order_from_env():
    nvml = [(0, "0000:00:06.0", "GPU-aaaa"), (1, "0000:00:07.0", "GPU-bbbb"), (2, "0000:00:08.0", "GPU-cccc")]
    assert cuda_order_from_env(3, nvml, {})[0] == [0, 1, 2]
    mapping, how = cuda_order_from_env(2, nvml, {"CUDA_VISIBLE_DEVICES": "2,0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    assert mapping == [2, 0] and "CUDA_VISIBLE_DEVICES" in how and "assumed" not in how
    assert cuda_order_from_env(2, nvml, {"CUDA_VISIBLE_DEVICES": "GPU-bbbb,1"})[0] == [1, 1]
    assert cuda_order_from_env(2, nvml, {"CUDA_VISIBLE_DEVICES": "1,foo,2"})[0] == [1, None]  # CUDA stops at foo


# ------------------------------------------------------------- NVML probing


def test_probe_nvml_h200_nvswitch_board():
    fake = FakeNvml(h200_vm_gpus(4))
    topo = nvml_only(fake)
    assert fake.initialized and fake.shut_down
    assert [g.pci_bus_id for g in topo.gpus] == ["0000:00:06.0", "0000:00:07.0", "0000:00:08.0", "0000:00:09.0"]
    assert [g.nvml_index for g in topo.gpus] == [0, 1, 2, 3]
    assert all(g.cuda_index is None for g in topo.gpus) and topo.gpu_order == "nvml"
    assert topo.link_matrix == [["X" if i == j else "NV18" for j in range(4)] for i in range(4)]
    gpu = topo.gpus[2]
    assert gpu.cpu_affinity == "0-63" and gpu.numa_affinity == "0" and gpu.gpu_numa_id is None
    assert gpu.memory_bytes == 150_754_820_096
    assert gpu.nvlink.active_links == 18 and gpu.nvlink.version == "4.0" and gpu.nvlink.remote == "nvswitch"
    assert gpu.nvlink.link_gbps == [H200_LINK_GBPS] * 18
    assert gpu.nvlink.peak_gbps == pytest.approx(H200_PEAK)
    assert topo.nvswitch is True and "NVML" in topo.nvswitch_evidence
    # P2P indices go to NVML as plain ints even though pynvml's constant is a tuple.
    assert fake.p2p_indices == {0, 1, 2}
    assert topo.nvml_p2p["nvlink"][0] == ["X", "OK", "OK", "OK"]
    assert topo.versions.driver == "570.124.06" and topo.versions.cuda_driver == "12.8"
    assert link_peak_gbps(topo) == pytest.approx(478.116)
    assert summary_line(topo) == (
        "4 x NVIDIA H200, all pairs NV18 (NVSwitch), NVLink peak 478.1 GB/s per GPU per direction"
    )
    json.dumps(topo.to_dict())  # JSON-able
    assert topo.to_dict()["summary"] == summary_line(topo)


def test_probe_nvml_one_link_down_lowers_the_peak():
    gpus = h200_vm_gpus(4)
    gpus[1].links[5].active = False  # GPU 1 runs on 17 links
    topo = nvml_only(FakeNvml(gpus))
    assert topo.gpus[1].nvlink.active_links == 17
    assert topo.link_matrix[0][1] == "NV17" and topo.link_matrix[0][2] == "NV18"
    # The slowest GPU bounds a collective: the peak is GPU 1's.
    assert link_peak_gbps(topo) == pytest.approx(17 * H200_LINK_GBPS)
    assert summary_line(topo) == (
        "4 x NVIDIA H200, pairs 3xNV18 3xNV17 (NVSwitch), NVLink peak 451.6 GB/s per GPU per direction"
    )


def test_probe_nvml_far_end_unknown_infers_nvswitch():
    # Inside some VMs NVML cannot name what the links end at; P2P over NVLink still works.
    gpus = h200_vm_gpus(4)
    for gpu in gpus:
        gpu.links = [FakeLink(remote_type=None, remote_bus=None) for _ in range(18)]
    topo = nvml_only(FakeNvml(gpus))
    assert topo.link_matrix[0][3] == "NV18" and topo.link_matrix[3][0] == "NV18"
    assert topo.nvswitch is True and topo.nvswitch_evidence.startswith("inferred")
    assert summary_line(topo).startswith("4 x NVIDIA H200, all pairs NV18 (NVSwitch), NVLink peak 478.1")


def test_probe_nvml_direct_mesh_is_not_nvswitch():
    topo = nvml_only(FakeNvml(direct_mesh_gpus(), ancestor_level=40))
    assert topo.link_matrix[1] == ["NV6", "X", "NV6", "NV6"]
    assert topo.nvswitch is False
    assert summary_line(topo) == (
        "4 x NVIDIA H100 80GB HBM3, all pairs NV6, NVLink peak 478.1 GB/s per GPU per direction"
    )


def test_probe_nvml_pcie_only_pairs_use_common_ancestor():
    gpus = [FakeGpu(bus=(0, 0x3B + k, 0), links=[], name="NVIDIA L40S") for k in range(2)]
    topo = nvml_only(FakeNvml(gpus, ancestor_level=30, p2p_status=5))
    assert topo.link_matrix == [["X", "PHB"], ["PHB", "X"]]
    assert topo.gpus[0].nvlink is None
    assert link_peak_gbps(topo) is None
    assert topo.nvml_p2p["read"][0][1] == "NS"
    assert summary_line(topo) == "2 x NVIDIA L40S, all pairs PHB"


def test_probe_link_speed_falls_back_to_common_field_then_nvidia_smi():
    topo = nvml_only(FakeNvml(h200_vm_gpus(2), scoped_speed=False))
    assert topo.gpus[0].nvlink.source == "nvml NVLINK_SPEED_MBPS_COMMON"
    assert topo.gpus[0].nvlink.peak_gbps == pytest.approx(H200_PEAK)

    asked = []

    def smi(args):
        asked.append(list(args))
        return fixture_text(H200_2, "nvidia-smi_nvlink_--status.txt") if args == topo_smi.SMI_NVLINK_STATUS else None

    fake = FakeNvml(h200_vm_gpus(2), scoped_speed=False, common_speed=False)
    topo = probe(nvml=fake, cuda=False, smi=smi, sysfs="/nonexistent", env={})
    assert asked == [topo_smi.SMI_NVLINK_STATUS]
    assert topo.gpus[1].nvlink.source == "nvidia-smi nvlink --status"
    assert topo.gpus[1].nvlink.peak_gbps == pytest.approx(H200_PEAK)


def test_probe_joins_cuda_and_nvml_by_pci_bus_id():
    gpus = h200_vm_gpus(4)
    fake = FakeNvml(gpus)
    # CUDA enumerates the GPUs in reverse, and GPU 3 cannot reach GPU 0.
    cuda = FakeCuda([cuda_props(g) for g in reversed(gpus)], peer=lambda i, j: {i, j} != {0, 3})
    topo = probe(nvml=fake, cuda=cuda, smi=None, sysfs="/nonexistent", env={})
    assert topo.gpu_order == "cuda" and topo.join == "PCI bus id"
    assert [g.cuda_index for g in topo.gpus] == [0, 1, 2, 3]
    assert [g.nvml_index for g in topo.gpus] == [3, 2, 1, 0]
    assert topo.gpus[0].pci_bus_id == "0000:00:09.0"
    assert topo.peer_access[0] == [None, True, True, False]
    assert topo.gpus[0].label == "GPU0"


def test_probe_joins_by_uuid_then_by_environment():
    gpus = h200_vm_gpus(4)
    fake = FakeNvml(gpus)  # gives the GPUs their UUIDs
    by_uuid = FakeCuda([cuda_props(gpus[2], with_pci=False), cuda_props(gpus[0], with_pci=False)])
    topo = probe(nvml=fake, cuda=by_uuid, smi=None, sysfs="/nonexistent", env={})
    assert [g.nvml_index for g in topo.gpus] == [2, 0] and topo.join == "UUID"

    gpus = h200_vm_gpus(4)
    bare = FakeCuda([cuda_props(g, with_pci=False, with_uuid=False) for g in gpus[2:]])
    env = {"CUDA_VISIBLE_DEVICES": "2,3"}
    topo = probe(nvml=FakeNvml(gpus), cuda=bare, smi=None, sysfs="/nonexistent", env=env)
    assert [g.nvml_index for g in topo.gpus] == [2, 3]
    assert "CUDA_VISIBLE_DEVICES" in topo.join
    assert topo.env == {"CUDA_VISIBLE_DEVICES": "2,3"}
    # Only 2 of the 4 GPUs are visible: the matrix is 2 x 2, links still NV18.
    assert topo.link_matrix == [["X", "NV18"], ["NV18", "X"]]


def test_probe_from_nvidia_smi_text_when_nvml_is_missing():
    def smi_for(host, count):
        query = "".join(f"{k}, NVIDIA H200, 00000000:00:{6 + k:02X}.0, 143771, GPU-{k}\n" for k in range(count))
        texts = {
            tuple(topo_smi.SMI_GPU_QUERY): query,
            tuple(topo_smi.SMI_TOPO): fixture_text(host, "nvidia-smi_topo_-m.txt"),
            tuple(topo_smi.SMI_NVLINK_STATUS): fixture_text(host, "nvidia-smi_nvlink_--status.txt"),
        }
        return lambda args: texts.get(tuple(args))

    topo = probe(nvml=FailingNvml(), cuda=False, smi=smi_for(H200_4, 4), sysfs="/nonexistent", env={})
    assert len(topo.gpus) == 4 and topo.sources["gpus"] == "nvidia-smi --query-gpu"
    assert topo.link_matrix[2] == ["NV18", "NV18", "X", "NV18"]
    assert topo.gpus[0].cpu_affinity == "0-63"
    assert topo.gpus[3].nvlink.peak_gbps == pytest.approx(H200_PEAK)
    assert topo.nvswitch is True  # inferred: 3 x 18 > 18
    assert summary_line(topo) == (
        "4 x NVIDIA H200, all pairs NV18 (NVSwitch), NVLink peak 478.1 GB/s per GPU per direction"
    )
    assert any("NVML unavailable" in note for note in topo.notes)

    topo = probe(nvml=FailingNvml(), cuda=False, smi=smi_for(H200_2, 2), sysfs="/nonexistent", env={})
    assert topo.nvswitch is None  # two GPUs, all 18 links to the one peer: cannot tell
    assert summary_line(topo) == "2 x NVIDIA H200, all pairs NV18, NVLink peak 478.1 GB/s per GPU per direction"


def test_probe_without_gpus_never_raises():
    class BrokenCuda:
        def device_count(self):
            raise RuntimeError("CUDA driver initialization failed")

    for cuda in (False, FakeCuda([]), BrokenCuda()):
        topo = probe(nvml=FailingNvml(), cuda=cuda, smi=None, sysfs="/nonexistent", env={})
        assert topo.gpus == [] and topo.link_matrix == []
        assert summary_line(topo) is None and link_peak_gbps(topo) is None
        json.dumps(topo.to_dict())
    assert summary_line(None) is None and link_peak_gbps(None) is None


def test_default_probe_is_fast_and_safe_here():
    import torch  # noqa: F401  (collective runs have torch imported already)

    started = time.perf_counter()
    topo = probe()
    assert time.perf_counter() - started < 2.0
    assert topo.host.cpu_count == os.cpu_count()
    json.dumps(topo.to_dict())


def test_peak_percent_line():
    assert peak_percent_line(359.54, 478.116) == (
        "# Best busbw 359.54 GB/s = 75.2 % of NVLink peak 478.1 GB/s per GPU per direction"
    )
    assert peak_percent_line(20.0, None) == "# Best busbw 20.00 GB/s (NVLink peak unknown)"


def test_probe_nics_and_gpu_nic_distance(tmp_path):
    sysfs = tmp_path / "sys"
    switch = sysfs / "devices/pci0000:00/0000:00:01.0/0000:01:00.0"
    gpu_dir = switch / "0000:02:00.0/0000:03:00.0"
    nic_dir = switch / "0000:02:01.0/0000:04:00.0"
    for directory in (gpu_dir, nic_dir / "net/ib0"):
        directory.mkdir(parents=True)
    (nic_dir / "numa_node").write_text("0\n")
    (gpu_dir / "numa_node").write_text("0\n")
    (sysfs / "bus/pci/devices").mkdir(parents=True)
    (sysfs / "bus/pci/devices/0000:03:00.0").symlink_to(gpu_dir)
    ib = sysfs / "class/infiniband/mlx5_0"
    (ib / "ports/1").mkdir(parents=True)
    (ib / "device").symlink_to(nic_dir)
    (ib / "ports/1/state").write_text("4: ACTIVE\n")
    (ib / "ports/1/rate").write_text("400 Gb/sec (4X NDR)\n")
    (ib / "ports/1/link_layer").write_text("InfiniBand\n")

    gpu = FakeGpu(bus=(0, 3, 0), links=[])
    topo = probe(nvml=FakeNvml([gpu]), cuda=False, smi=None, sysfs=sysfs, env={})
    (nic,) = topo.nics
    assert (nic.name, nic.pci_bus_id, nic.numa_node, nic.netdevs) == ("mlx5_0", "0000:04:00.0", 0, ["ib0"])
    assert nic.ports[0].state == "ACTIVE" and nic.ports[0].rate == "400 Gb/sec (4X NDR)"
    assert topo.nic_links == [["PIX"]]
    assert probe(False, nvml=FakeNvml([gpu]), cuda=False, smi=None, sysfs=sysfs, env={}).nics == []


def test_compare_with_smi_agrees_with_fixtures_and_spots_differences():
    topo = nvml_only(FakeNvml(h200_vm_gpus(4)))
    topo_text = fixture_text(H200_4, "nvidia-smi_topo_-m.txt")
    nvlink_text = fixture_text(H200_4, "nvidia-smi_nvlink_--status.txt")
    assert compare_with_smi(topo, topo_text, nvlink_text) == []

    doctored_topo = topo_text.replace("GPU1\tNV18\t X \tNV18", "GPU1\tNV12\t X \tNV18")
    problems = compare_with_smi(topo, doctored_topo, None)
    assert problems == ["link nvml1-nvml0: ncclbench NV18, nvidia-smi NV12"]

    doctored_affinity = topo_text.replace("GPU3\tNV18\tNV18\tNV18\t X \t0-63", "GPU3\tNV18\tNV18\tNV18\t X \t0-31")
    assert compare_with_smi(topo, doctored_affinity, None) == [
        "nvml3 CPU Affinity: ncclbench 0-63, nvidia-smi 0-31"
    ]

    lines = nvlink_text.splitlines()
    lines[1] = "\t Link 0: <inactive>"  # GPU 0 loses a link
    problems = compare_with_smi(topo, None, "\n".join(lines))
    assert len(problems) == 2 and "18 active NVLinks, nvidia-smi 17" in problems[0]


# ------------------------------------------------------------------- the CLI


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture
def no_gpu_probe(monkeypatch):
    """What probe() finds on a machine without the NVIDIA driver, on any machine."""
    real_probe = topo_probe.probe
    monkeypatch.setattr(
        topo_probe, "probe", lambda include_nics=True: real_probe(include_nics, nvml=FailingNvml(), cuda=False, smi=None)
    )


def test_topo_command_without_gpu(no_gpu_probe):
    result = CliRunner().invoke(topo_command, [])
    assert result.exit_code == 0, result.output
    assert one_line(result.stderr) == "ncclbench: no GPU visible: reporting host and versions only"
    assert "| torch " in result.stdout and f"{os.cpu_count()} CPUs" in result.stdout
    assert "NVML unavailable: FakeNvmlError: NVML Shared Library Not Found" in result.stdout


def test_topo_command_json_without_gpu(no_gpu_probe):
    import torch

    result = CliRunner().invoke(topo_command, ["--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["gpus"] == [] and data["summary"] is None and data["nvlink_peak_gbps"] is None
    assert data["host"]["cpu_count"] == os.cpu_count()
    assert data["versions"]["torch"] == torch.__version__
    assert data["schema"] == "ncclbench.topo/1"


def test_topo_command_compare_smi_disagreement_is_one_error_line_exit_1(monkeypatch):
    """--compare-smi on a (fake) 4x H200 host whose nvidia-smi reports a narrower link: the
    report still prints, then one error line naming the link, exit 1."""
    topo = nvml_only(FakeNvml(h200_vm_gpus(4)))
    texts = {
        tuple(topo_smi.SMI_TOPO): fixture_text(H200_4, "nvidia-smi_topo_-m.txt").replace(
            "GPU1\tNV18\t X \tNV18", "GPU1\tNV12\t X \tNV18"),
        tuple(topo_smi.SMI_NVLINK_STATUS): fixture_text(H200_4, "nvidia-smi_nvlink_--status.txt"),
    }
    monkeypatch.setattr(topo_probe, "probe", lambda include_nics=True: topo)
    monkeypatch.setattr(topo_smi, "run_nvidia_smi", lambda args: texts[tuple(args)])
    result = CliRunner().invoke(topo_command, ["--compare-smi", "--no-nics"])
    assert result.exit_code == 1
    assert "Link matrix" in result.stdout
    assert one_line(result.stderr) == (
        "ncclbench: error: nvidia-smi check failed: link nvml1-nvml0: ncclbench NV18, nvidia-smi NV12")


@pytest.mark.skipif(gpu_visible(), reason="this machine has a GPU")
def test_topo_command_on_this_machine_without_gpu():
    result = CliRunner().invoke(topo_command, ["--json"])
    assert result.exit_code == 0
    assert one_line(result.stderr) == "ncclbench: no GPU visible: reporting host and versions only"
    assert json.loads(result.stdout)["gpus"] == []


@pytest.mark.parametrize("args", [["--bogus"], ["--json", "extra-argument"]])
def test_topo_command_bad_input_is_one_line_exit_2(args):
    group = click.Group("ncclbench")
    group.add_command(topo_command)
    for command, argv in ((topo_command, args), (group, ["topo", *args])):
        result = CliRunner().invoke(command, argv)
        assert result.exit_code == 2
        assert one_line(result.stderr).startswith("ncclbench: error: ")
        assert "Traceback" not in result.output and result.stdout == ""


def test_topo_command_with_gpus(monkeypatch):
    gpus = h200_vm_gpus(4)
    fake_topo = probe(nvml=FakeNvml(gpus), cuda=FakeCuda([cuda_props(g) for g in gpus]), smi=None,
                      sysfs="/nonexistent", env={})  # fmt: skip
    monkeypatch.setattr(topo_probe, "probe", lambda include_nics=True: fake_topo)
    result = CliRunner().invoke(topo_command, [])
    assert result.exit_code == 0 and result.stderr == ""
    out = result.stdout
    assert "# 4 x NVIDIA H200, all pairs NV18 (NVSwitch), NVLink peak 478.1 GB/s per GPU per direction" in out
    assert "0000:00:09.0" in out and "NVSwitch: yes" in out and "OK/OK/OK" in out
    link_rows = [line.split() for line in out.splitlines() if line.strip().startswith("GPU1  ")]
    assert ["GPU1", "NV18", "X", "NV18", "NV18"] in link_rows

    data = json.loads(CliRunner().invoke(topo_command, ["--json"]).stdout)
    assert data["nvlink_peak_gbps"] == pytest.approx(478.116)
    assert data["gpus"][1]["nvlink"]["active_links"] == 18


# ----------------------------------------------- on the GPU machine (pytest -m gpu)


@pytest.mark.gpu
def test_real_gpus_probe_agrees_with_torch_and_nvidia_smi():
    import torch

    started = time.perf_counter()
    topo = probe()
    assert time.perf_counter() - started < 2.0, topo.notes
    assert len(topo.gpus) == torch.cuda.device_count()
    assert topo.gpu_order == "cuda" and topo.join == "PCI bus id", topo.notes
    for gpu in topo.gpus:
        assert gpu.nvml_index is not None and gpu.pci_bus_id and gpu.cpu_affinity
        assert gpu.name == torch.cuda.get_device_name(gpu.cuda_index)
    assert summary_line(topo)
    assert topo.versions.driver and topo.versions.nccl and topo.versions.torch == torch.__version__
    topo_text = topo_smi.run_nvidia_smi(topo_smi.SMI_TOPO)
    nvlink_text = topo_smi.run_nvidia_smi(topo_smi.SMI_NVLINK_STATUS)
    if topo_text is None:
        pytest.skip("no nvidia-smi to compare with")
    assert compare_with_smi(topo, topo_text, nvlink_text) == []
    if any(nvlink_count(code) for row in topo.link_matrix for code in row):
        assert link_peak_gbps(topo) and summary_line(topo).endswith("GB/s per GPU per direction")


@pytest.mark.gpu
def test_real_topo_command():
    result = CliRunner().invoke(topo_command, ["--compare-smi"])
    assert result.exit_code == 0, result.output
    assert "Link matrix" in result.stdout
    assert one_line(result.stderr) == "nvidia-smi check: link matrix, NVLink counts and peaks agree"


@pytest.mark.gpu
def test_the_cuda_driver_answers_like_torch():
    """`topo` asks the CUDA driver (ctypes) what torch.cuda would answer: same devices in the
    same order, same PCI bus ids and UUIDs, same peer access."""
    import torch

    from ncclbench.topology.cuda_driver import CudaDriver
    from ncclbench.topology.visible import uuid_key

    driver, cuda = CudaDriver(), torch.cuda
    assert driver.device_count() == cuda.device_count()
    for i in range(cuda.device_count()):
        ours, theirs = driver.get_device_properties(i), cuda.get_device_properties(i)
        assert ours.name == theirs.name and ours.total_memory == theirs.total_memory
        assert (ours.pci_domain_id, ours.pci_bus_id, ours.pci_device_id) == (
            theirs.pci_domain_id, theirs.pci_bus_id, theirs.pci_device_id)
        assert uuid_key(ours.uuid) == uuid_key(str(theirs.uuid))
        for j in range(cuda.device_count()):
            if i != j:
                assert driver.can_device_access_peer(i, j) == cuda.can_device_access_peer(i, j)
