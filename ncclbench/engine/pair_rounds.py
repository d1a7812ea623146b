"""Rounds of pair exchanges on a job's own default group (preflight's known-good partners and
its sweeps inside groups), with the one pair exchange (engine.pair_exchange), guarded as the API guards a
collective: the ops' own timeout, a progress board, and a watchdog that names the ranks that
never reached the end."""

from __future__ import annotations

from ncclbench.errors import BenchError, CollectiveError, first_line

PAIR_ITERS = 20


def guarded_rounds(call, rounds: list, nbytes: int, limit: float, own_stream,
                   cap_s: float | None = None) -> tuple[dict, list]:
    """One pass of `rounds` on the default group under `call`'s guard (an api GroupCall) for
    `limit` seconds, the ops on the stream `own_stream(backend, stream_null)` gives; this
    rank's ({peer: seconds per exchange}, [peers whose data arrived wrong]). `cap_s`: the
    seconds one pair may take per round (engine.pair_exchange.pair_effort)."""
    from ncclbench.backends.torch_dist import TorchBackend
    from ncclbench.engine.pair_exchange import ExchangePlan, measure_rounds
    from ncclbench.engine.watchdog import SizeWatchdog

    backend = TorchBackend.adopt(None)
    plan = ExchangePlan(nbytes, PAIR_ITERS, 2, cap_s)
    board = call.board("e")
    what = f"{len(rounds)} round(s) of pair exchanges"
    board.reach(1, what)
    dog = SizeWatchdog(limit, lambda _what: call.timed_out(what, call.census(board, 1, what), limit, call.rank))
    dog.arm(what)
    try:
        with call.op_timeout(limit), own_stream(backend, False):
            times, wrong = measure_rounds(backend, plan, rounds)
    except BenchError:
        call.raise_if_timed_out()
        raise
    except Exception as exc:  # noqa: BLE001 - one line
        call.raise_if_timed_out()
        raise CollectiveError(f"preflight pair exchange failed: {type(exc).__name__}: {first_line(exc)}") from exc
    finally:
        dog.stop()
        backend.close()
    call.raise_if_timed_out()
    return times, wrong
