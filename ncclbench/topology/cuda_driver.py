"""CUDA's own view of the GPUs (its device order, PCI bus ids, peer access): from torch.cuda
where torch is loaded, else from the CUDA driver API through ctypes."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any

from ncclbench.topology.pci import pci_bus_id_from_parts


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


def default_cuda() -> Any:
    """torch.cuda where torch is loaded already (a rank), else the CUDA driver through
    ctypes; None without a usable CUDA driver."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch.cuda
    try:
        return CudaDriver()
    except Exception:  # noqa: BLE001 - no libcuda, no device, a driver too old
        return None


@dataclass
class CudaGpu:
    index: int
    name: str
    pci_bus_id: str | None
    uuid: str | None
    memory_bytes: int | None


def probe_cuda(cuda: Any, notes: list[str]) -> tuple[list[CudaGpu], list[list[bool | None]] | None]:
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
            CudaGpu(
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
