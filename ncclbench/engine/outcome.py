"""How a run ends: rank 0's verdict on a finished sweep, the line a failed check says,
and the exit code of each status (the most serious one of a suite's plans wins)."""

from __future__ import annotations

from ncclbench.engine.hooks import RankHooks
from ncclbench.errors import ExitCode
from ncclbench.results.records import RunSummary


def severity(code: int) -> int:
    # a lost peer or timeout outranks wrong numbers, which outrank success
    order = [ExitCode.OK, ExitCode.OUTPUT_ERROR, ExitCode.WRONG_RESULTS, ExitCode.INTERRUPTED, ExitCode.TIMEOUT,
             ExitCode.NCCL_ERROR]
    return order.index(code) if code in order else len(order)


def exit_code_for(summary: RunSummary) -> int:
    return {
        "ok": ExitCode.OK,
        "wrong_results": ExitCode.WRONG_RESULTS,
        "bandwidth_low": ExitCode.WRONG_RESULTS,
        "output_error": ExitCode.OUTPUT_ERROR,
        "interrupted": ExitCode.INTERRUPTED,
        "timeout": ExitCode.TIMEOUT,
        "error": ExitCode.NCCL_ERROR,
    }[summary.status]


def failed_verdict(summary: RunSummary, plan) -> str | None:
    """One line for a run that measured everything but failed its checks (exit 7)."""
    if summary.status == "wrong_results":
        sizes = ", ".join(map(str, summary.failing_sizes()))
        return f"wrong results in {summary.wrong_cells} cell(s) ({summary.wrong} wrong element(s)) at sizes {sizes} B"
    if summary.status == "bandwidth_low":
        parts = []
        if summary.average_ok(plan.min_bw) is False:
            parts.append(f"average busbw {summary.average_busbw:g} GB/s < 0.9 x {plan.min_bw:g}")
        if summary.peak_ok(plan.min_peak_bw) is False:
            parts.append(f"peak busbw {summary.peak_busbw:g} GB/s < {plan.min_peak_bw:g}")
        return "bandwidth below the floor: " + "; ".join(parts)
    return None


def judge(summary: RunSummary, plan, report, hooks: RankHooks, said: bool = False) -> None:
    """Rank 0's verdict on a finished sweep, its trailer, and the reason on stderr.

    Only rank 0 holds the rows, so only rank 0 judges them; the other ranks exit 0 and
    rank 0's code is the run's (an early non-zero exit elsewhere would make the launcher
    kill rank 0 while it is still writing)."""
    if summary.complete and summary.wrong:
        summary.status = "wrong_results"
    elif summary.complete and summary.bandwidth_ok(plan.min_bw, plan.min_peak_bw) is False:
        summary.status = "bandwidth_low"
    report.finish(summary)
    for err in [] if said else summary.errors:  # said: by the rank that failed first
        hooks.say(err)
    verdict = failed_verdict(summary, plan)
    if verdict:  # exit 7 says why on stderr too, for logs that keep only stderr (CI)
        hooks.say(verdict)
