"""Message sizes: parsing `8`, `64K`, `1G` and the -b/-e/-i/-f sweep, as nccl-tests does."""

from __future__ import annotations

import math
import re

MAX_SIZE = 1 << 50   # 1 PiB: far past any GPU's memory, far below what overflows a C size_t
MAX_SWEEP_SIZES = 100_000  # more would only fill the host's memory before the first size runs
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*((?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes for a size such as `8`, `64K`, `8M`, `1G`, `0.5K` (K/M/G are powers of 1024; a
    fraction is allowed and the bytes are rounded down, both as nccl-tests reads sizes).

    Raises ValueError with a message fit for the user."""
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"cannot parse size {text!r} (use a number of bytes with an optional K, M or G suffix, e.g. 8, 64K, 1G)")
    from fractions import Fraction

    if float(m.group(1)) * _SUFFIX[m.group(2).upper()] > MAX_SIZE:  # checked as a float first: 1e999999 is instant
        raise ValueError(f"size {text!r} is larger than the largest size ncclbench takes ({MAX_SIZE >> 50} PiB)")
    return int(Fraction(m.group(1)) * _SUFFIX[m.group(2).upper()])  # exact, then rounded down


def format_size(nbytes: int) -> str:
    """Shortest exact human form: 8 -> '8B', 65536 -> '64K', 1<<30 -> '1G'."""
    for suffix in ("T", "G", "M", "K"):
        unit = _SUFFIX[suffix]
        if nbytes >= unit and nbytes % unit == 0:
            return f"{nbytes // unit}{suffix}"
    return f"{nbytes}B"


def size_sweep(min_bytes: int, max_bytes: int, step_bytes: int = 0, step_factor: float = 1.0) -> list[int]:
    """Sizes from min to max inclusive: multiply by step_factor when it is > 1, else add step_bytes.

    Same rule as nccl-tests (`-f` wins over `-i` when given)."""
    if min_bytes < 0 or max_bytes < 0:
        raise ValueError("sizes must not be negative")
    if min_bytes > max_bytes:
        raise ValueError(f"minimum size {min_bytes} is larger than maximum size {max_bytes}")
    if max_bytes > MAX_SIZE:
        raise ValueError(f"maximum size {max_bytes} is larger than the largest size ncclbench takes ({MAX_SIZE >> 50} PiB)")
    if step_factor is not None and not math.isfinite(step_factor):
        raise ValueError(f"step factor must be a finite number (got {step_factor})")
    use_factor = step_factor is not None and step_factor != 1.0
    if use_factor:
        if step_factor <= 1.0:
            raise ValueError(f"step factor must be > 1 (got {step_factor})")
        if min_bytes == 0:
            raise ValueError("a step factor needs a minimum size > 0 (0 times any factor stays 0)")
    elif step_bytes <= 0:
        if min_bytes == max_bytes:
            return [min_bytes]
        raise ValueError("step must be > 0 bytes when no step factor is given (the sweep would never end)")
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        if len(sizes) == MAX_SWEEP_SIZES:
            raise ValueError(f"the sweep from {min_bytes} to {max_bytes} B would have more than {MAX_SWEEP_SIZES} sizes; "
                             "use a larger step (-i) or a step factor (-f)")
        sizes.append(size)
        nxt = int(size * step_factor) if use_factor else size + step_bytes
        if nxt <= size:  # a factor like 1.01 on a tiny size would stall
            nxt = size + 1
        size = nxt
    return sizes
