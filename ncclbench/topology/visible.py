"""Which GPUs CUDA shows this process, read from NVML and CUDA_VISIBLE_DEVICES as CUDA
reads them, without the CUDA driver or torch (a CUDA call before a fork would make the
forked ranks unusable for CUDA)."""

from __future__ import annotations

import os
import re
from typing import Any, Mapping, Sequence

from ncclbench.topology.nvml import as_text


def uuid_key(uuid: str | None) -> str | None:
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
                matches = [g for g in ordered if (uuid_key(g[2]) or "").startswith(uuid_key(entry) or "")]
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
            matches = [k for k, u in enumerate(uuids) if (uuid_key(u) or "").startswith(uuid_key(entry) or "-")]
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
            uuids = [as_text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(k))) for k in range(count)]
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
