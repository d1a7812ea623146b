"""How tune times every combination, and when a win stands. Pure: no torch, no files.

Timing. Eager timing of small and medium sizes measures the host's cost per call (about
20 us in PyTorch) and its jitter, not NCCL, so below ~16 MB no forced combination could be
told from NCCL's default that way (see docs/design/tune-graph-timing.md). Replaying the timed ops as a CUDA graph (-G) takes the host out of the timed region
at every size, so on GPUs every combination, NCCL's default included, is timed that way, in
the same launch, repeats interleaved. Large sizes lose nothing by it: one replay of
`-n` ops costs the same device time as the ops issued one by one. `NCCL_GRAPH_REGISTER=0`
is set for the timed launches: NCCL would otherwise register the captured buffers and hand
a tuner plugin `regBuff 1`, while tune's rows (and the calls it stands for) are single
calls on unregistered buffers (`regBuff 0`). On gloo there are no CUDA graphs: timing stays
eager, and the header says so.

A forced combination NCCL cannot capture into a graph (the capture raises) is measured
again eagerly in the same item: the table says so, its noise is its own and never widens
the noise of the configurations timed by replay, and a gain it shows must clear its own
spread as well.

Wins that stand. A win seen in one launch is a candidate: tune measures NCCL's default and
each candidate again in a second, independent launch (fresh processes and communicators,
repeats interleaved) and keeps the win only at sizes where that launch calls it a win by
the same rule, beyond that launch's own noise. The row then says how it was confirmed:
`confirmed: launch 2, +7.1 % ± 0.8 %` (launch 2's gain over the default, and its noise)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ncclbench.sizes import format_size
from ncclbench.tune.paired import judge_by_rule
from ncclbench.tune.ranges import Series, Verdict

TIMINGS = ("auto", "graph", "eager")
DEFAULT_GRAPH_REPLAYS = 20  # enough for every size within the 3 % target; see docs/design/tune-graph-timing.md
GRAPH_ENV = {"NCCL_GRAPH_REGISTER": "0"}
CAPTURE_FAILED = "CUDA graph capture failed: "   # engine.timing's GraphCaptureError text
CONFIRM_LAUNCH = 2
QUEUE_AHEAD_S = 0.002   # longer than the barrier's release spread (~300 us) plus queuing the replays


@dataclass(frozen=True)
class Timing:
    mode: str       # graph | eager
    replays: int    # -G: graph replays per measurement (0 eager)
    text: str       # the header's words

    @property
    def queue_ahead_s(self) -> float:
        """How long the device is held before the timed replays (engine.timing): the host
        queues them meanwhile, so neither its lateness nor a launch gap is timed."""
        return QUEUE_AHEAD_S if self.mode == "graph" else 0.0

    @property
    def env(self) -> dict:
        return dict(GRAPH_ENV) if self.mode == "graph" else {}


def choose_timing(backend: str, requested: str, replays: int, iters: int, cycles: int = 1) -> Timing:
    """How every combination is timed; ValueError for a request that cannot be honoured.
    `cycles` > 1 (-N): each size is measured in that many sweeps per repeat and their median
    kept (read_rows), which the header says."""
    if requested not in TIMINGS:
        raise ValueError(f"--timing {requested!r}: choose from {', '.join(TIMINGS)}")
    if replays < 1:
        raise ValueError(f"-G must be at least 1 replay (got {replays}); --timing eager times without graphs")
    over = (f"; each size measured in {cycles} sweeps per repeat (-N), their median kept" if cycles > 1 else "")
    if backend != "nccl":
        if requested == "graph":
            raise ValueError("--timing graph needs NCCL on GPUs: gloo has no CUDA graphs")
        return Timing("eager", 0, "eager: gloo (CPU) has no CUDA graphs, so every number includes the host's "
                                  "cost per call" + over)
    if requested == "eager":
        return Timing("eager", 0, "eager (--timing eager): below ~16 MB the host's cost per call and its jitter "
                                  "dominate the numbers and the noise" + over)
    return Timing("graph", replays, f"CUDA-graph replay at every size ({replays} replays of {iters} ops, queued "
                                    f"while the GPU is held {QUEUE_AHEAD_S * 1e3:g} ms, so no host time is timed; "
                                    "NCCL_GRAPH_REGISTER=0: unregistered buffers, as the tuner rows say)" + over)


def capture_failure(errors) -> str | None:
    """What a graph capture failure said, if one of an item's errors is one; else None."""
    for text in errors or ():
        where = str(text).find(CAPTURE_FAILED)
        if where >= 0:
            return str(text)[where + len(CAPTURE_FAILED):].strip()[:200] or "no message"
    return None


def fallback_text(timing: str, fallback: str | None) -> str:
    """The combination line's words on how it was timed ('' for the common case)."""
    if fallback:
        return f"timed EAGER (graph capture failed: {fallback}): its noise is its own"
    return "" if timing != "eager" else "timed eager"


# ---- wins that stand ---------------------------------------------------------------------
def confirm(v: Verdict, default2: Series | None, best2: Series | None, repeats: int, min_gain: float,
            paired: int = 0) -> Verdict:
    """Keep `v`'s win only if launch 2 (default2 against best2, the same combination) calls
    it a win by the same rule (paired.py's with `paired` sets); say how in v.confirmation or
    v.why. Not a win: unchanged."""
    if not v.win:
        return v
    label = f"launch {CONFIRM_LAUNCH}"
    if default2 is None or not default2.busbw or best2 is None or not best2.busbw:
        v.win, v.why = False, f"not confirmed: {label} did not measure it cleanly"
        return v
    best2.setting, default2.setting = v.best_series.setting, v.default.setting
    second = judge_by_rule(v.size, default2, {v.best: best2}, repeats, min_gain, paired)
    gain = f"{second.gain_pct:+.1f} %" if second.gain_pct is not None else "not compared"
    if second.win:
        if second.interval:  # paired: the ratio's own interval, not the widest of the size
            v.confirmation = (f"confirmed: {label}, {gain}, 95 % interval of the ratio "
                              f"{second.interval[0]:.3f}-{second.interval[1]:.3f}")
            return v
        noise = f"{second.noise_pct:.1f} %" if second.noise_pct is not None else "N/A"
        v.confirmation = f"confirmed: {label}, {gain} ± {noise}"
        return v
    v.win, v.why = False, f"not reproduced in {label} ({gain}: {second.why})"
    v.confirmation = f"refuted: {label}, {gain}"
    return v


def candidates_to_confirm(verdicts: list[Verdict]) -> list[str]:
    """The combinations (labels) that won at some size in launch 1, in first-win order."""
    return list(dict.fromkeys(v.best for v in verdicts if v.win and v.best))


def precision_line(verdicts: list[Verdict]) -> str:
    """When nothing won: that NCCL's choice was within noise of the best at every judged
    size, and how precise that statement is (the noise over those sizes)."""
    judged = [v for v in verdicts if v.win is not None]
    if not judged or any(v.win for v in judged):
        return ""
    noises = [v.noise_pct for v in judged if v.noise_pct is not None]
    left = len(verdicts) - len(judged)
    text = (f"no win: NCCL's choice was within noise of the best forced combination at every size judged "
            f"({len(judged)} size(s))")
    if noises:
        worst = max(judged, key=lambda v: v.noise_pct if v.noise_pct is not None else -1)
        text += (f"; precision: noise at most {max(noises):.1f} % (at {format_size(worst.size)}), median "
                 f"{statistics.median(noises):.1f} %")
    refuted = sum(1 for v in judged if v.confirmation.startswith("refuted"))
    if refuted:
        text += f"; {refuted} size(s) won in launch 1 but were not reproduced in launch {CONFIRM_LAUNCH}"
    if left:
        text += f"; {left} size(s) not judged"
    return text
