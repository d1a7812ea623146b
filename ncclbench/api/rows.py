"""What one measure() call returns: the rows on group rank 0, the verdict on every rank."""

from __future__ import annotations

from collections.abc import Sequence

from ncclbench.errors import BenchError, ExitCode, PlanError


class Rows(Sequence):
    """What one measure() call found: the result rows (what the command line prints, and its
    JSON and CSV hold) on group rank 0, the verdict on every rank.

    status: ok | wrong_results | bandwidth_low (the command line's exit 7); `verdict`: the
    one line saying why, or None."""

    def __init__(self, plan, status: str, verdict: str | None, info, summary, ranks: list[int], rank: int):
        self.plan, self.status, self.verdict, self.rank = plan, status, verdict, rank
        self.info, self.summary = info, summary
        self.ranks = list(ranks)  # global ranks of the group, in group rank order
        self.rows = list(summary.rows) if summary is not None else []

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]

    def __repr__(self) -> str:
        return f"<Rows {self.plan.coll.name}: {len(self.rows)} rows, status {self.status}>"

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def has_rows(self) -> bool:
        """False on the ranks that only got the verdict."""
        return self.summary is not None

    def raise_if_failed(self) -> None:
        """BenchError with the command line's exit code 7 for wrong results or a missed floor."""
        if not self.ok:
            raise BenchError(self.verdict or self.status, ExitCode.WRONG_RESULTS)

    def to_pandas(self):
        """The rows as a DataFrame with the columns of --csv (one row per size and placement)."""
        import pandas as pd

        from ncclbench.results.output import CSV_COLUMNS, csv_records

        records = [rec for row in self.rows for rec in csv_records(self.info, row)] if self.info else []
        frame = pd.DataFrame(records, columns=CSV_COLUMNS)
        frame["nwrong"] = frame["nwrong"].astype("Int64")
        return frame

    def per_rank(self):
        """Each rank's own timed duration per op (the rows' bandwidths combine them across ranks
        as `average` says): one row per size, placement and rank, with its global rank and host."""
        import pandas as pd

        hosts = {d.rank: d.hostname for d in self.info.devices} if self.info else {}
        records = []
        for row in self.rows:
            for placement, cell in row.placements():
                for r, t in enumerate(cell.rank_us):
                    records.append({"collective": row.collective, "size_bytes": row.size, "dtype": row.dtype,
                                    "op": row.op, "root": row.root, "placement": placement,
                                    "rank": self.ranks[r], "host": hosts.get(r, ""), "time_us": t})
        return pd.DataFrame(records, columns=["collective", "size_bytes", "dtype", "op", "root", "placement",
                                              "rank", "host", "time_us"])

    def table(self) -> str:
        """The nccl-tests layout the command line prints (header, rows, trailer); '' on
        ranks without rows."""
        if self.summary is None:
            return ""
        from ncclbench.results import report
        from ncclbench.topology.header import path_trailer, peak_percent_line

        p, info = self.plan, self.info
        lines = report.header_lines(info, p.per_iter, p.per_iter_skip, p.report_timestamps)
        for row in self.rows:
            lines.append(report.row_line(row, p.per_iter, p.report_timestamps))
            lines.extend(row.notes)
        trailer = path_trailer(info.nccl_path, info.link_peak_gbps)  # the peak of the path NCCL used, where read
        peak = trailer(self.summary) if trailer else (
            peak_percent_line(self.summary.peak_busbw, info.link_peak_gbps) if info.link_peak_gbps else None)
        lines += report.trailer_lines(info, self.summary, peak)
        return "\n".join(lines) + "\n"

    def to_json(self, path) -> None:
        """The rows as the command line's -J document (nccl-tests schema 3 + "ncclbench")."""
        if self.summary is None:
            raise PlanError(f"rank {self.rank} has no rows to write: only group rank 0 gets them "
                            "(or pass all_ranks=True)")
        import datetime as _dt

        from ncclbench.results.output import run_json, write_json_atomic

        write_json_atomic(str(path), run_json(self.info, self.summary, _dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")))

    def to_metrics(self, path, command: str = "measure") -> None:
        """The rows as the command line's --metrics file (Prometheus text, docs/monitoring.md)."""
        if self.summary is None:
            raise PlanError(f"rank {self.rank} has no rows to write: only group rank 0 gets them "
                            "(or pass all_ranks=True)")
        from ncclbench.results import metrics
        from ncclbench.results.output import run_json

        metrics.write_textfile(str(path), metrics.sweeps_text(command, [run_json(self.info, self.summary, None)]))
