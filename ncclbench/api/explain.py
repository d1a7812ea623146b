"""`ncclbench explain` lives in ncclbench.explain; this module keeps the names code imported
from here."""

from ncclbench.explain.here import CPU_SWEEP, SWEEP, explain_here, host_facts
from ncclbench.explain.report import explain_logs, read_path, report_lines

__all__ = ["CPU_SWEEP", "SWEEP", "explain_here", "host_facts", "explain_logs", "read_path", "report_lines"]
