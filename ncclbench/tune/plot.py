"""busbw against size, one line per combination, NCCL's default bold: one PNG per
collective. matplotlib is imported here only, when a plot is drawn."""

from __future__ import annotations

import math
import os
import statistics


def plot_outcomes(folder: str, outcomes, nccl_text: str) -> list[str]:
    """Draw each collective's plot into `folder`; returns one line per file written or failed."""
    messages = []
    for outcome in outcomes:
        if not outcome.measured:
            continue
        path = os.path.join(folder, f"busbw_{outcome.collective}.png")
        try:
            draw(outcome, path, nccl_text)
            messages.append(f"plot written to {path}")
        except (OSError, ImportError, ValueError) as exc:  # no matplotlib, a full disk: the files above stand
            messages.append(f"warning: no plot {path}: {exc}")
    return messages


def draw(outcome, path: str, nccl_text: str) -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    from ncclbench.sizes import format_size

    fig = Figure(figsize=(10, 5.5), dpi=100)
    ax = fig.add_subplot(1, 1, 1)
    labels = ["default"] + [c.label for c in outcome.combos]
    for label in labels:
        m = outcome.measured.get(label)
        if m is None:
            continue
        sizes = sorted(s for s in m.busbw if s > 0)
        if not sizes:
            continue
        values = [statistics.median(m.busbw[s]) for s in sizes]
        if all(math.isnan(v) for v in values):  # N/A everywhere (one rank on torch's backends)
            continue
        if label == "default":
            ax.plot(sizes, values, color="black", linewidth=3.0, label="NCCL default", zorder=10)
        else:
            ax.plot(sizes, values, linewidth=1.0, marker=".", label=label)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: format_size(int(x)) if x >= 1 else ""))
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s), median of repeats")
    ax.set_title(f"{outcome.collective}: NCCL's default and forced algorithm/protocol ({nccl_text or 'NCCL ?'})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
