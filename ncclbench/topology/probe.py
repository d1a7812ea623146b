"""GPU topology of this host: what is connected to what, and how fast.

``probe()`` gathers what NVML (ncclbench.topology.nvml), CUDA (cuda_driver), sysfs and,
only as a fallback, nvidia-smi (smi) can tell into one ``Topology`` (model). Each source
can be injected, so that most of it can be tested without a GPU.

Nothing here raises on a machine without GPUs or NVML: missing facts are ``None`` and the
reason goes to ``Topology.notes``.
"""

from __future__ import annotations

import os
import platform
import socket
import time
import types
from typing import Any, Callable, Mapping, Sequence

from ncclbench.topology.cuda_driver import CudaGpu, default_cuda, probe_cuda
from ncclbench.topology.model import GpuInfo, HostInfo, NicInfo, NvLinkInfo, Topology, Versions
from ncclbench.topology.nvlink import infer_nvswitch, nvlink_pair_counts
from ncclbench.topology.nvml import P2P_CAPS_INDEX, NvmlGpu, probe_nvml
from ncclbench.topology.smi import (
    SMI_GPU_QUERY,
    SMI_NVLINK_STATUS,
    SMI_TOPO,
    GpuLinkStatus,
    SmiText,
    parse_nvlink_status,
    parse_smi_gpu_query,
    parse_topo_matrix,
    run_nvidia_smi,
)
from ncclbench.topology.sysfs import gpu_sysfs, pcie_code_from_paths, probe_host, probe_nics
from ncclbench.topology.versions import module_version, torch_versions
from ncclbench.topology.visible import cuda_order_from_env, uuid_key


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
    snapshot = probe_nvml(nvml, host.cpu_count, notes) if nvml else None
    cuda = default_cuda() if cuda is _DEFAULT else cuda
    cuda_gpus, peer = probe_cuda(cuda, notes) if cuda else ([], None)
    torch_versions(versions)
    smi_text = SmiText(run_nvidia_smi if smi is _DEFAULT else (smi or None))

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
        versions.pynvml = module_version("nvidia-ml-py")
    return nvml


def _nvml_records(snapshot, smi_text: SmiText, versions: Versions, sources: dict) -> list[NvmlGpu]:
    """NVML-shaped records for every GPU, from NVML or from nvidia-smi text."""
    nvml_gpus: list[NvmlGpu] = snapshot.gpus if snapshot else []
    if snapshot:
        versions.driver, versions.cuda_driver = snapshot.driver, snapshot.cuda_driver
        versions.nvml = snapshot.nvml_version
        sources["gpus"] = "nvml"
    elif smi_text.run is not None:
        query = smi_text(SMI_GPU_QUERY)
        for row in parse_smi_gpu_query(query or ""):
            nvml_gpus.append(
                NvmlGpu(row["index"], None, row["name"], row["pci_bus_id"], row["uuid"], row["memory_bytes"],
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
    records: list[NvmlGpu | None] = []
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


def _join_cuda_nvml(
    cuda_gpus: Sequence[CudaGpu], nvml_gpus: Sequence[NvmlGpu], env: Mapping[str, str]
) -> tuple[list[int | None], str]:
    """For each CUDA index, the NVML index of the same GPU: by PCI bus id, then UUID,
    then by CUDA_VISIBLE_DEVICES / CUDA_DEVICE_ORDER."""
    by_bus = {g.pci_bus_id: g.index for g in nvml_gpus if g.pci_bus_id}
    by_uuid = {uuid_key(g.uuid): g.index for g in nvml_gpus if g.uuid}
    mapping: list[int | None] = []
    methods = set()
    for gpu in cuda_gpus:
        if gpu.pci_bus_id in by_bus:
            mapping.append(by_bus[gpu.pci_bus_id])
            methods.add("PCI bus id")
        elif uuid_key(gpu.uuid) in by_uuid:
            mapping.append(by_uuid[uuid_key(gpu.uuid)])
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


def _links(snapshot, gpus: list[GpuInfo], records, smi_text: SmiText, sources: dict):
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


def _fill_from_smi_matrix(link_matrix, gpus: list[GpuInfo], smi_text: SmiText, sources: dict, had_nvml: bool) -> None:
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


def _attach_nvlinks(gpus: list[GpuInfo], records, snapshot, smi_text: SmiText, sources: dict) -> None:
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
                gpu_path, gpu_numa = gpu_sysfs(sysfs, gpu.pci_bus_id)
                nic_links[i] = [
                    pcie_code_from_paths(gpu_path, nic_paths.get(nic.name), gpu_numa, nic.numa_node) for nic in nics
                ]
    return nics, nic_links


def _interesting_env(env: Mapping[str, str]) -> dict[str, str]:
    keep = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
    return {k: v for k, v in sorted(env.items()) if k in keep or k.startswith("NCCL_")}
