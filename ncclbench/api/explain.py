"""`ncclbench explain` lives in ncclbench.explain; this module keeps the names code imported
from here."""

from ncclbench.explain.here import CPU_SWEEP, SWEEP, explain_here, host_facts  # noqa: F401
from ncclbench.explain.report import explain_logs, read_path, report_lines  # noqa: F401
