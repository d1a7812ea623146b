"""torch's version, the CUDA it was built with and its NCCL, without importing torch
where it is not loaded yet."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from ncclbench.topology.model import Versions


def torch_versions(versions: Versions) -> None:
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

    versions.torch = module_version("torch")
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
        versions.nccl = module_version(f"nvidia-nccl-cu{major}")


def module_version(distribution: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(distribution)
    except Exception:
        return None
