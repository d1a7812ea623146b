"""NVML through a pynvml-shaped module: every GPU's identity, affinity, NVLinks and
their speeds, and the P2P status and PCIe distance of every pair. Each call that fails
becomes a default, so that a partial answer is still an answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ncclbench.topology.model import LinkEnd
from ncclbench.topology.pci import format_cpu_list, normalize_pci_bus_id, pci_bus_id_from_parts

# nvmlGpuTopologyLevel_t -> nvidia-smi code. INTERNAL means two GPUs on one board,
# which nvidia-smi shows as a single bridge.
NVML_TOPOLOGY_LEVEL_CODES = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

# nvmlDeviceGetNvLinkVersion returns the nvmlNvlinkVersion_t enum, not the NVLink
# version itself (an H100 returns 6, an A100 5): translate it.
NVLINK_VERSION_NAMES = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}

# nvmlGpuP2PStatus_t -> the short codes of `nvidia-smi topo -p2p` (DRK: disabled by regkey).
P2P_STATUS_CODES = {0: "OK", 1: "CNS", 2: "GNS", 3: "TNS", 4: "DRK", 5: "NS", 6: "U"}
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


def nvlink_version_name(raw: int | None) -> str | None:
    if raw is None:
        return None
    return NVLINK_VERSION_NAMES.get(int(raw), f"enum {raw}")


def cuda_version_name(raw: int | None) -> str | None:
    """12080 (NVML / cudaDriverGetVersion) -> '12.8'."""
    if not raw:
        return None
    return f"{raw // 1000}.{(raw % 1000) // 10}"


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


def as_text(value: Any) -> str | None:
    """NVML's strings as str: older pynvml releases answer bytes."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


@dataclass
class NvmlGpu:
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
class NvmlSnapshot:
    gpus: list[NvmlGpu]
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
        return normalize_pci_bus_id(as_text(getattr(info, "busId", None)))


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


def probe_nvml(module: Any, cpu_count: int | None, notes: list[str]) -> NvmlSnapshot | None:
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
                NvmlGpu(
                    index=index,
                    handle=handle,
                    name=as_text(nvml.call("nvmlDeviceGetName", handle)) or "unknown GPU",
                    pci_bus_id=_nvml_pci_bus_id(nvml.call("nvmlDeviceGetPciInfo", handle)),
                    uuid=as_text(nvml.call("nvmlDeviceGetUUID", handle)),
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
        return NvmlSnapshot(
            gpus=gpus,
            p2p=p2p,
            pcie=pcie,
            driver=as_text(nvml.call("nvmlSystemGetDriverVersion")),
            cuda_driver=cuda_version_name(cuda_driver) if isinstance(cuda_driver, int) else None,
            nvml_version=as_text(nvml.call("nvmlSystemGetNVMLVersion")),
        )
    finally:
        nvml.call("nvmlShutdown")


# ---------------------------------------------------------------- health of one GPU

# nvmlClocksEventReasons bits that slow a GPU down. Left out: GpuIdle (0x1), application or
# user clock settings (0x2), sync boost (0x10) and display clocks (0x100), which are not faults.
CLOCK_EVENT_REASONS = {
    0x4: "power cap",
    0x8: "hardware slowdown",
    0x20: "thermal",
    0x40: "hardware thermal slowdown",
    0x80: "power brake",
    0x200: "board limit",
    0x400: "reliability",
}
CLOCK_EVENT_IDLE = 0x1
_MEMORY_ERROR_UNCORRECTED = 1  # nvmlMemoryErrorType_t
_VOLATILE_ECC, _AGGREGATE_ECC = 0, 1  # nvmlEccCounterType_t


def clock_event_names(mask: int | None) -> list[str]:
    """The slowing reasons in an nvmlClocksEventReasons mask, in bit order."""
    if not mask:
        return []
    return [name for bit, name in sorted(CLOCK_EVENT_REASONS.items()) if mask & bit]


def nvlink_states(nvml: _Nvml, handle: Any) -> list[int] | None:
    """Each NVLink's state (1 up, 0 down) for the links the GPU has; None where NVML answers
    for no link (no NVLink, or NVML too old to say)."""
    count = nvml.field_numbers(handle, [nvml.const("NVML_FI_DEV_NVLINK_LINK_COUNT", _FI_NVLINK_LINK_COUNT)])[0]
    links = int(count) if count else int(nvml.const("NVML_NVLINK_MAX_LINKS", 18))
    states = []
    for link in range(links):
        state = nvml.call("nvmlDeviceGetNvLinkState", handle, link)
        if state is not None:  # links past the GPU's own count fail: not links
            states.append(1 if state == 1 else 0)
    return states or None


def gpu_health(module: Any, handle: Any) -> dict:
    """What NVML says of one GPU's health, as plain values (None where NVML cannot say):
    PCIe link now and at most, NVLink states, uncorrectable ECC errors, row remapping, and
    the reasons its clocks are held down. NVML must be initialised by the caller."""
    nvml = _Nvml(module)
    ecc_mode = nvml.call("nvmlDeviceGetEccMode", handle)
    remap = nvml.call("nvmlDeviceGetRemappedRows", handle)
    reasons = nvml.call("nvmlDeviceGetCurrentClocksEventReasons", handle)
    if reasons is None:  # drivers before 535 name it ClocksThrottleReasons
        reasons = nvml.call("nvmlDeviceGetCurrentClocksThrottleReasons", handle)

    def ecc_count(counter: int) -> int | None:
        value = nvml.call("nvmlDeviceGetTotalEccErrors", handle, _MEMORY_ERROR_UNCORRECTED, counter)
        return int(value) if value is not None else None

    return {
        "pcie": {
            "gen": nvml.call("nvmlDeviceGetCurrPcieLinkGeneration", handle),
            "width": nvml.call("nvmlDeviceGetCurrPcieLinkWidth", handle),
            "max_gen": nvml.call("nvmlDeviceGetMaxPcieLinkGeneration", handle),  # of this GPU in this slot
            "max_width": nvml.call("nvmlDeviceGetMaxPcieLinkWidth", handle),
            "gpu_max_gen": nvml.call("nvmlDeviceGetGpuMaxPcieLinkGeneration", handle),  # of the GPU alone
        },
        "nvlink_states": nvlink_states(nvml, handle),
        "ecc": {
            "enabled": bool(ecc_mode[0]) if ecc_mode is not None else None,
            "volatile_uncorrected": ecc_count(_VOLATILE_ECC) if ecc_mode is None or ecc_mode[0] else None,
            "aggregate_uncorrected": ecc_count(_AGGREGATE_ECC) if ecc_mode is None or ecc_mode[0] else None,
        },
        "row_remap": None if remap is None else {
            "corrected_rows": int(remap[0]), "uncorrected_rows": int(remap[1]),
            "pending": bool(remap[2]), "failed": bool(remap[3]),
        },
        "clocks": None if reasons is None else {
            "reasons_mask": int(reasons), "idle": bool(reasons & CLOCK_EVENT_IDLE),
            "slowdown": clock_event_names(int(reasons)),
        },
    }


def gpu_identities(module: Any) -> list[tuple[int, Any, str | None, str | None, str]]:
    """(NVML index, handle, PCI bus id, UUID, name) of every GPU NVML lists; NVML must be
    initialised by the caller."""
    nvml = _Nvml(module)
    out = []
    for index in range(int(nvml.call("nvmlDeviceGetCount", default=0) or 0)):
        handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
        if handle is None:
            continue
        out.append((index, handle, _nvml_pci_bus_id(nvml.call("nvmlDeviceGetPciInfo", handle)),
                    as_text(nvml.call("nvmlDeviceGetUUID", handle)),
                    as_text(nvml.call("nvmlDeviceGetName", handle)) or "unknown GPU"))
    return out


def driver_versions(module: Any) -> tuple[str | None, str | None]:
    """(driver version, highest CUDA version the driver supports) from initialised NVML."""
    nvml = _Nvml(module)
    cuda = nvml.call("nvmlSystemGetCudaDriverVersion")
    return as_text(nvml.call("nvmlSystemGetDriverVersion")), cuda_version_name(cuda) if isinstance(cuda, int) else None
