"""SLURM's compressed lists: host lists ("gpu[01-04,07]") and tasks-per-node lists ("8(x2)")."""

from __future__ import annotations

import re

from ncclbench.launch.variables import LaunchEnvError

__all__ = ["parse_nodelist", "parse_tasks_per_node"]

# Host and task lists longer than this are refused (a typo like n[1-100000000] would
# otherwise eat the memory of every rank at once); python-hostlist has the same bound.
MAX_NODELIST_HOSTS = 100_000


def parse_nodelist(text: str) -> list[str]:
    """Expand a SLURM host list, e.g. "gpu[01-04,07]", "a[1-2],b3", "rack1-n[001-003]",
    "r[1-2]-n[1-2]" (several brackets expand like nested loops, the first outermost), with
    python-hostlist, as `scontrol show hostnames` would. Zero padding follows the lower bound
    ("[08-10]" -> 08 09 10). ValueError if malformed."""
    if text is None or not text.strip():
        raise ValueError("empty node list")
    text = text.strip()
    if any(ch.isspace() for ch in text):
        raise ValueError(f"whitespace in {text!r}")
    if ",," in text or text.startswith(",") or text.endswith(","):  # hostlist would skip the gap
        raise ValueError(f"empty entry in {text!r}")
    try:
        import hostlist  # python-hostlist; imported here so that only SLURM launches need it
    except ImportError:
        raise LaunchEnvError("reading a SLURM node list needs the python-hostlist package "
                             "(pip install python-hostlist)") from None
    try:
        hosts = hostlist.expand_hostlist(text, allow_duplicates=True)
    except hostlist.BadHostlist as exc:
        raise ValueError(f"{exc} in {text!r}") from None
    if len(hosts) > MAX_NODELIST_HOSTS:
        raise ValueError(f"{text!r} expands to more than {MAX_NODELIST_HOSTS} hosts")
    return hosts


def parse_tasks_per_node(text: str) -> list[int]:
    """Expand SLURM's tasks-per-node list: "8(x2)" -> [8, 8], "4,3" -> [4, 3],
    "2(x3),1" -> [2, 2, 2, 1]. ValueError if malformed."""
    if text is None or not text.strip():
        raise ValueError("empty tasks-per-node list")
    counts: list[int] = []
    for part in text.strip().split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ValueError(f"bad entry {part!r} (expected N or N(xM))")
        repeat = int(match.group(2) or 1)
        if repeat < 1:
            raise ValueError(f"bad repeat count in {part!r}")
        if len(counts) + repeat > MAX_NODELIST_HOSTS:
            raise ValueError(f"{text!r} lists more than {MAX_NODELIST_HOSTS} nodes")
        counts.extend([int(match.group(1))] * repeat)
    return counts
