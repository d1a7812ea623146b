"""Which GPU a launched rank uses, from its local rank and the GPUs it can see."""

from __future__ import annotations

import os
from typing import Mapping

from ncclbench.launch.env import LaunchInfo
from ncclbench.launch.variables import LaunchEnvError

__all__ = ["check_gpu_for_local_rank", "gpu_index_for_local_rank"]


def gpu_index_for_local_rank(info: LaunchInfo, visible_gpu_count: int,
                             environ: Mapping[str, str] | None = None) -> int:
    """The CUDA device index this rank should use: its local rank -- or 0 when the
    launcher bound one GPU to each task (srun --gpus-per-task=1, --gpu-bind=single:1,
    torchrun's virtual local ranks), which leaves exactly that GPU visible through a
    one-entry CUDA_VISIBLE_DEVICES. Raises LaunchEnvError when neither fits."""
    if visible_gpu_count < 0:
        raise ValueError(f"visible_gpu_count must be >= 0, got {visible_gpu_count}")
    env = os.environ if environ is None else environ
    if info.local_rank < visible_gpu_count:
        return info.local_rank
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible_gpu_count == 1 and visible is not None and visible.strip() and "," not in visible:
        return 0
    shown = "unset" if visible is None else visible
    raise LaunchEnvError(
        f"local rank {info.local_rank} has no GPU: only {visible_gpu_count} visible "
        f"(CUDA_VISIBLE_DEVICES={shown}); {info.launcher} started {info.local_world_size} ranks "
        f"on {info.hostname}: start at most {visible_gpu_count} per node")


def check_gpu_for_local_rank(info: LaunchInfo, visible_gpu_count: int,
                             environ: Mapping[str, str] | None = None) -> None:
    """Raise LaunchEnvError when this rank has no GPU of its own (see gpu_index_for_local_rank)."""
    gpu_index_for_local_rank(info, visible_gpu_count, environ)
