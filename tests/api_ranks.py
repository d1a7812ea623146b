"""Rank side of tests/test_api.py and tests/test_preflight.py: started by torchrun, one
scenario per run; each rank writes what it saw to <outdir>/rank<N>.json for pytest to check.

    python -m torch.distributed.run --standalone --nproc-per-node N tests/api_ranks.py SCENARIO OUTDIR
"""

import json
import os
import signal
import sys
import time
import traceback

from ncclbench import failpoints


def sum_check(dist, torch, group=None) -> float:
    """A collective after ncclbench: the group still works and gives the right answer."""
    x = torch.tensor([float(dist.get_rank() + 1)], device=_device(torch, dist, group))
    dist.all_reduce(x, group=group)
    return float(x.item())


def _device(torch, dist, group):
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"


def caught(fn):
    """(error type, message) of what fn() raised, or (None, repr of its value)."""
    try:
        return None, repr(fn())
    except BaseException as exc:  # noqa: BLE001 - recorded for the test
        return type(exc).__name__, str(exc)


def scenario_measure(out, dist, torch, ncclbench, outdir):
    r = dist.get_rank()
    handlers = [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)]
    rows = ncclbench.measure("all_reduce", "1K:16K:x4", iters=2)
    out["default"] = {"len": len(rows), "status": rows.status, "has_rows": rows.has_rows, "ranks": rows.ranks}
    if rows.has_rows:
        rows.to_pandas().to_csv(os.path.join(outdir, "api.csv"), index=False)
        out["table"] = rows.table()
        rows.to_json(os.path.join(outdir, "api.json"))
        out["per_rank"] = rows.per_rank().to_dict("list")
    out["sum_default"] = sum_check(dist, torch)

    tp = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    alone = dist.new_group([0])
    groups_before = dist.get_pg_count()
    mine_tp, mine_dp = tp[r // 2], dp[r % 2]
    rows_tp = ncclbench.measure("all_gather", "1K:4K", group=mine_tp, iters=2, all_ranks=True)
    out["tp"] = {"len": len(rows_tp), "ranks": rows_tp.ranks, "sizes": [row.size for row in rows_tp]}
    out["sum_tp"] = sum_check(dist, torch, mine_tp)
    rows_dp = ncclbench.measure("reduce_scatter", "1K:4K", group=mine_dp, iters=2)
    out["dp"] = {"len": len(rows_dp), "ranks": rows_dp.ranks, "status": rows_dp.status}
    out["sum_dp"] = sum_check(dist, torch, mine_dp)
    # one tp group after the other, the other group's ranks not taking part
    if r in (0, 1):
        out["first_alone"] = len(ncclbench.measure("all_reduce", "1K", group=tp[0], iters=2))
    dist.barrier()
    if r in (2, 3):
        out["second_alone"] = len(ncclbench.measure("all_reduce", "1K", group=tp[1], iters=2))
    out["sum_after_alone"] = sum_check(dist, torch)
    out["groups_created_by_measure"] = dist.get_pg_count() - groups_before

    bad = {
        "unknown": lambda: ncclbench.measure("all_foo", "1K"),
        "sizes_on_rank1": lambda: ncclbench.measure("all_reduce", "1K:junk" if r == 1 else "1K", iters=2),
        "plan_on_rank1": lambda: ncclbench.measure("all_reduce", "1K", iters=3 if r == 1 else 2),
        "cli_only_option": lambda: ncclbench.measure("all_reduce", "1K", csv_path="x.csv"),
        "out_of_range": lambda: ncclbench.measure("all_reduce", "1K", iters=0),
        "not_member": (lambda: ncclbench.measure("all_reduce", "1K", group=alone, iters=2)) if r else (lambda: 0),
    }
    out["bad"] = {}
    for name, call in bad.items():
        out["bad"][name] = caught(call)
        out["bad"][name + "_then_sum"] = sum_check(dist, torch)
    if r == 0:
        out["alone_len"] = len(ncclbench.measure("all_reduce", "1K", group=alone, iters=2))
    out["handlers_kept"] = handlers == [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)]
    out["sum_end"] = sum_check(dist, torch)


def scenario_timeout(out, dist, torch, ncclbench, outdir):
    """NCCLBENCH_FAULT stalls rank 1 before 4096 B (set by the test)."""
    start = time.time()
    out["error"] = caught(lambda: ncclbench.measure("all_reduce", "1K:16K:x4", iters=2, timeout=2))
    out["elapsed"], out["returned_at"] = time.time() - start, time.time()
    # the group is not usable after a timeout: leave without a collective
    _write(out, outdir, dist.get_rank())
    os._exit(0)


def scenario_sweep_error(out, dist, torch, ncclbench, outdir):
    """NCCLBENCH_FAULT makes rank 1's collective fail at 4096 B (set by the test)."""
    out["error"] = caught(lambda: ncclbench.measure("all_reduce", "1K:16K:x4", iters=2, timeout=30))
    _write(out, outdir, dist.get_rank())
    os._exit(0)  # the group lost a peer: leave without a collective


def scenario_preflight_absent(out, dist, torch, ncclbench, outdir):
    """Rank 1 never calls preflight: rank 0's own timeout (3 s) applies from its first step."""
    if dist.get_rank() == 1:
        time.sleep(15)
        _write(out, outdir, 1)
        os._exit(0)
    start = time.time()
    report = ncclbench.preflight(None, budget_s=1, timeout=3)
    out["elapsed"] = time.time() - start
    out["report"] = {"passed": report.passed, "timed_out": report.timed_out, "failures": report.failures,
                     "exit_code": int(report.exit_code)}
    _write(out, outdir, 0)
    os._exit(0)


def scenario_preflight(out, dist, torch, ncclbench, outdir):
    r = dist.get_rank()
    tp = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    dp = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    groups = {"dp": dp[r % 2], "tp": tp[r // 2]}
    # the default band: gloo's, chosen for 4 ranks sharing 2 cores (NCCL's is 20%)
    report = ncclbench.preflight(groups, budget_s=3)
    out["healthy"] = {"passed": report.passed, "failures": report.failures, "groups": len(report.groups)}
    out["sum_after_healthy"] = sum_check(dist, torch)
    os.environ[failpoints.ENV] = "slow:rank=1,us=20000"
    failpoints.reset()  # read once per process: read again
    report = ncclbench.preflight(groups, budget_s=3, collectives=["all_reduce"],  # 20 ms an op: keep it short
                                 json_path=os.path.join(outdir, "report.json"))
    os.environ.pop(failpoints.ENV)
    failpoints.reset()
    out["slow"] = {"passed": report.passed, "failures": report.failures, "bad_ranks": report.bad_ranks,
                   "drain": report.drain, "exit_code": int(report.exit_code),
                   "raised": caught(report.raise_if_failed)}
    out["sum_after_slow"] = sum_check(dist, torch)
    missing = os.path.join(outdir, "no-such-baseline.json")
    garbage = os.path.join(outdir, f"garbage{r}.txt")
    with open(garbage, "w") as f:
        f.write("not a results file\n")
    out["bad_baseline"] = caught(lambda: ncclbench.preflight(groups, min_peak_busbw=missing, budget_s=1))
    out["sum_after_bad_baseline"] = sum_check(dist, torch)
    path = garbage if r == 1 else "300"  # a floor only rank 1 cannot read
    out["rank1_baseline"] = caught(lambda: ncclbench.preflight(groups, min_peak_busbw=path, budget_s=1))
    out["sum_end"] = sum_check(dist, torch)


def slow_in_torch(dist, seconds: float) -> None:
    """This process waits `seconds` in every collective and point-to-point call of
    torch.distributed before it makes it: a slow node planted below ncclbench."""
    def slowed(fn):
        def call(*args, **kwargs):
            time.sleep(seconds)
            return fn(*args, **kwargs)
        return call

    for name in ("all_reduce", "all_gather_into_tensor", "all_gather_single", "reduce_scatter_tensor",
                 "reduce_scatter_single", "batch_isend_irecv"):
        if hasattr(dist, name):
            setattr(dist, name, slowed(getattr(dist, name)))


def scenario_preflight_one_group(out, dist, torch, ncclbench, outdir):
    """One group, no floor, no mesh: healthy, then rank 2 slowed inside torch.distributed."""
    report = ncclbench.preflight(groups={"all": None}, budget_s=2)
    out["healthy"] = {"passed": report.passed, "failures": report.failures, "margins": report.margins}
    if dist.get_rank() == 2:
        slow_in_torch(dist, 0.02)
    report = ncclbench.preflight(groups={"all": None}, budget_s=2, collectives=["all_reduce"])
    out["slow"] = {"passed": report.passed, "failures": report.failures, "bad_ranks": report.bad_ranks,
                   "drain": report.drain, "exit_code": int(report.exit_code), "hosts": report.hosts}


def scenario_preflight_loaded(out, dist, torch, ncclbench, outdir):
    """One group while the test loads the CPU: three healthy runs, then rank 2 late 20 ms per
    call (the `slow` failpoint)."""
    out["healthy"] = []
    for _ in range(3):
        report = ncclbench.preflight(groups={"all": None}, budget_s=2)
        out["healthy"].append({"passed": report.passed, "failures": report.failures, "margins": report.margins})
    os.environ[failpoints.ENV] = "slow:rank=2,us=20000"
    failpoints.reset()
    report = ncclbench.preflight(groups={"all": None}, budget_s=2)
    os.environ.pop(failpoints.ENV)
    failpoints.reset()
    out["slow"] = {"passed": report.passed, "failures": report.failures, "bad_ranks": report.bad_ranks,
                   "margins": report.margins, "cost": report.cost_s}


def scenario_fleet(out, dist, torch, ncclbench, outdir):
    """Every rank calls ncclbench.fleet() on the job's own default group (each rank a node of
    its own): the same report on every rank, rank 0 writes the JSON; the group still works."""
    report = ncclbench.fleet(backend="gloo", sim_node_size=1, timeout=20, budget=4,
                             json_path=os.path.join(outdir, "fleet.json") if dist.get_rank() == 0 else None)
    out["fleet"] = {"drain": report.drain, "links": report.links, "exit_code": report.exit_code,
                    "hosts": [h["host"] for h in report.hosts]}
    out["unknown"] = caught(lambda: ncclbench.fleet(bogus=1))
    out["sum_after"] = sum_check(dist, torch)


def scenario_gpu(out, dist, torch, ncclbench, outdir):
    """One GPU, NCCL: measure like the command line, leave device and stream alone, preflight
    refused (one rank: nothing to judge), and a timeout on a one-rank group (stall fault set
    by the test for the last call)."""
    stream = torch.cuda.current_stream()
    device = torch.cuda.current_device()
    rows = ncclbench.measure("all_gather", "1M:64M:x8", iters=20)  # one rank: out-of-place is a copy
    rows.to_pandas().to_csv(os.path.join(outdir, "api.csv"), index=False)
    out["status"] = rows.status
    out["stream_kept"] = torch.cuda.current_stream() == stream
    out["device_kept"] = torch.cuda.current_device() == device
    out["sum_after"] = sum_check(dist, torch)
    out["preflight"] = caught(lambda: ncclbench.preflight(budget_s=3))  # one rank: nothing to judge
    out["sum_after_preflight"] = sum_check(dist, torch)
    os.environ[failpoints.ENV] = "stall:rank=0,size=4096,seconds=8"
    failpoints.reset()
    start = time.time()
    out["timeout"] = caught(lambda: ncclbench.measure("all_reduce", "1K:16K:x4", iters=2, timeout=2))
    out["timeout_elapsed"] = time.time() - start
    _write(out, outdir, dist.get_rank())
    os._exit(0)


def _write(out, outdir, rank):
    with open(os.path.join(outdir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f, indent=1)


def main():
    scenario, outdir = sys.argv[1], sys.argv[2]
    import torch
    import torch.distributed as dist

    import ncclbench

    if scenario == "gpu":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl", device_id=torch.device("cuda", torch.cuda.current_device()))
    else:
        dist.init_process_group("gloo")
    out = {"rank": dist.get_rank()}
    try:
        globals()[f"scenario_{scenario}"](out, dist, torch, ncclbench, outdir)
    except BaseException:  # noqa: BLE001 - the test reads it
        out["crash"] = traceback.format_exc()
    _write(out, outdir, dist.get_rank())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
