"""PCI bus ids and CPU lists in the forms NVML, CUDA, sysfs and nvidia-smi write them."""

from __future__ import annotations

import re
from typing import Sequence


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
