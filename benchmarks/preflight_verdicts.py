"""Preflight's verdicts on a real host, in one job: how often a healthy run fails (false
alarms, with the margins each check measured) and whether a planted slow rank is named
alone, in one group and in a 2x2 mesh, planted in ncclbench (`slow` fault) and below it
(torch.distributed itself made to wait before each call).

    torchrun --standalone --nproc-per-node N benchmarks/preflight_verdicts.py --out DIR [--healthy 10]

Every rank runs every case; rank 0 writes DIR/preflight_verdicts.jsonl (one line per run)
and prints a markdown table. NCCL on GPUs when there are enough of them, else gloo."""

from __future__ import annotations

import argparse
import json
import os
import time


def slow_in_torch(dist, seconds: float) -> dict:
    """Make this process wait `seconds` before each collective and batched point-to-point call
    of torch.distributed; returns the originals to put back."""
    saved = {}
    for name in ("all_reduce", "all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor",
                 "reduce_scatter_single", "batch_isend_irecv"):
        if hasattr(dist, name):
            saved[name] = fn = getattr(dist, name)

            def call(*args, _fn=fn, **kwargs):
                time.sleep(seconds)
                return _fn(*args, **kwargs)
            setattr(dist, name, call)
    return saved


def cases(world: int, slow_rank: int, delay_us: int) -> list[tuple[str, str, str | None]]:
    """(case, groups, planted) for the planted runs."""
    fault = f"slow:rank={slow_rank},us={delay_us}"
    out = [("one group, slow fault", "world", fault), ("one group, slowed in torch.distributed", "world", "torch")]
    if world == 4:
        out.append(("mesh dp=2,tp=2, slow fault", "mesh", fault))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--healthy", type=int, default=10, help="unplanted runs (false-alarm count)")
    parser.add_argument("--budget", type=float, default=3.0)
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--delay-us", type=int, default=2000)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist

    import ncclbench
    from ncclbench import failpoints

    gpu = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if gpu:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    tp = [dist.new_group([0, 1]), dist.new_group([2, 3])] if world == 4 else None
    dp = [dist.new_group([0, 2]), dist.new_group([1, 3])] if world == 4 else None
    mesh = {"dp": dp[rank % 2], "tp": tp[rank // 2]} if world == 4 else None
    os.makedirs(args.out, exist_ok=True)
    lines = []

    def run(case: str, groups, planted: str | None):
        saved = {}
        if planted == "torch" and rank == args.slow_rank:
            saved = slow_in_torch(dist, args.delay_us / 1e6)
        elif planted and planted != "torch":
            os.environ["NCCLBENCH_FAULT"] = planted
        failpoints.reset()  # what is planted is read once per process: read it again
        start = time.time()
        try:
            report = ncclbench.preflight(groups, budget_s=args.budget)
        finally:
            os.environ.pop("NCCLBENCH_FAULT", None)
            failpoints.reset()
            for name, fn in saved.items():
                setattr(dist, name, fn)
        lines.append({"case": case, "planted": planted, "passed": report.passed, "bad_ranks": report.bad_ranks,
                      "links": [link["ranks"] for link in report.links], "drain": report.drain, "margins": report.margins,
                      "band": report.plan.get("band"), "failures": report.failures, "seconds": round(time.time() - start, 2),
                      "backend": "nccl" if gpu else "gloo", "world": world})

    for _ in range(args.healthy):
        run("healthy, one group", None, None)
    if mesh:
        run("healthy, mesh dp=2,tp=2", mesh, None)
    for case, which, planted in cases(world, args.slow_rank, args.delay_us):
        run(case, mesh if which == "mesh" else {"all": None}, planted)
    if rank == 0:
        with open(os.path.join(args.out, "preflight_verdicts.jsonl"), "w") as f:
            f.writelines(json.dumps(line) + "\n" for line in lines)
        print(table(lines, args.slow_rank))
    dist.destroy_process_group()


def table(lines: list[dict], slow_rank: int) -> str:
    out = ["| case | runs | verdicts as expected | ranks named | worst margins (alone / pairs) | band | s per run |",
           "| --- | ---: | ---: | --- | --- | ---: | ---: |"]
    by_case: dict = {}
    for line in lines:
        by_case.setdefault(line["case"], []).append(line)
    for case, runs in by_case.items():
        want = (lambda r: r["passed"]) if runs[0]["planted"] is None else (
            lambda r: not r["passed"] and r["bad_ranks"] == [slow_rank] and not r["links"])
        named = sorted({b for r in runs for b in r["bad_ranks"]})
        alone = max((r["margins"].get("alone", 0.0) for r in runs), default=0.0)
        pairs = max((v for r in runs for k, v in r["margins"].items() if k.startswith("pairs")), default=0.0)
        secs = sum(r["seconds"] for r in runs) / len(runs)
        out.append(f"| {case} | {len(runs)} | {sum(map(want, runs))} | {named or '-'} | {100 * alone:.0f}% / "
                   f"{100 * pairs:.0f}% | {100 * (runs[0]['band'] or 0):.0f}% | {secs:.1f} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
