"""Drain lists: the hosts a report says to take out of service, as a file an operator runs
with `sh` (SLURM's scontrol, Kubernetes' kubectl) or feeds to other tools (a plain host list).

Host names and reasons come from the ranks (a rank's host name is whatever its kernel was
given), so they are input, not trusted text: in the command formats every field is one
shell-quoted word, and a name that the scheduler would read as something else (a SLURM host
list such as `n[1-9]`, a Kubernetes `type/name`), or that holds a control character (a
newline would start a line of its own), is left out of the commands and named, escaped, in a
comment line; the plain host list holds only names made of letters, digits, '.', '-' and '_'
(see docs/monitoring.md). Reasons are flattened to one line of printable text."""

from __future__ import annotations

import re
import shlex
import sys
import unicodedata

FORMATS = ("scontrol", "kubectl", "hosts")
REASON_CHARS = 200          # scontrol's Reason= is one short line; the whole evidence is in the JSON
TAINT_KEY = "ncclbench/drain"
TAINT_EFFECT = "NoSchedule"
ANNOTATION_KEY = "ncclbench/drain-reason"
TAINT_VALUE_CHARS = 63      # Kubernetes: at most 63 of [A-Za-z0-9._-], starting and ending alphanumeric
PLAIN_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


def _is_control(ch: str) -> bool:
    """Characters that break or hide a line: C0/C1 controls, format characters, line and
    paragraph separators."""
    return unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def one_line(text: str) -> str:
    """Free text as one line of printable characters (controls become spaces, runs of
    spaces one space)."""
    return " ".join("".join(" " if _is_control(c) else c for c in str(text)).split())


def checked_format(name) -> str:
    """A drain format given by name (None: scontrol), refused before anything runs when unknown."""
    from ncclbench.errors import PlanError

    name = name or "scontrol"
    if name not in FORMATS:
        raise PlanError(f"drain format {name!r}: use one of {', '.join(FORMATS)}")
    return name


def refusal(host: str, fmt: str) -> str | None:
    """Why `host` cannot stand in a drain list of format `fmt`, or None when it can."""
    if not host:
        return "an empty host name"
    if any(_is_control(c) for c in host):
        return "a control character in the name"
    if fmt == "scontrol" and re.search(r"[\s,\[\]]", host):
        return "space, ',' or '[]' in the name: scontrol would read a list of nodes"
    if fmt == "kubectl" and "/" in host:
        return "'/' in the name: kubectl would read TYPE/NAME"
    if fmt == "hosts" and not PLAIN_HOST.fullmatch(host):
        return "not a plain host name (letters, digits, '.', '-', '_')"
    return None


def taint_value(reason: str) -> str:
    """The reason as a Kubernetes taint value: runs of other characters become '-', cut to
    63 characters, starting and ending with a letter or digit (may be empty)."""
    ascii_text = unicodedata.normalize("NFKD", reason).encode("ascii", "ignore").decode()
    value = re.sub(r"[^A-Za-z0-9._-]+", "-", ascii_text)[:TAINT_VALUE_CHARS]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def entries_of(source) -> list[tuple[str, str]]:
    """[(host, reason)] from a list of pairs, or from a report dict: its "drain" list (host
    names; or fleet's older {host, reason} items) with each host's evidence ("hosts", or the
    older "nodes" with "reasons") joined as the reason."""
    if not isinstance(source, dict):
        return [(str(host), str(reason)) for host, reason in source]
    evidence = {}
    for h in source.get("hosts") or source.get("nodes") or []:
        lines = h.get("evidence", h.get("reasons")) or []
        evidence[str(h.get("host"))] = "; ".join(str(x) for x in lines) if isinstance(lines, list) else str(lines)
    out = []
    for item in source.get("drain") or []:
        if isinstance(item, dict):
            host = str(item.get("host"))
            out.append((host, str(item.get("reason") or evidence.get(host, ""))))
        else:
            out.append((str(item), evidence.get(str(item), "")))
    return out


def render(source, fmt: str = "scontrol", command: str = "") -> tuple[list[str], list[tuple[str, str]]]:
    """(the file's lines, [(host, why left out)]) for the drain list of `source` (see
    entries_of) in format `fmt`; `command` names the ncclbench command in each reason."""
    if fmt not in FORMATS:
        raise ValueError(f"drain format {fmt!r}: use one of {', '.join(FORMATS)}")
    if isinstance(source, dict):
        command = command or str(source.get("command") or "")
    lines, left_out = [], []
    for host, reason in entries_of(source):
        why = refusal(host, fmt)
        if why:
            left_out.append((host, why))
            if fmt != "hosts":  # a plain list has no comments: its readers take every line as a host
                lines.append(f"# left out: host {ascii(host)}: {why}")
            continue
        lines.extend(_lines(host, f"ncclbench {command}:" if command else "ncclbench:", one_line(reason), fmt))
    return lines, left_out


def _lines(host: str, prefix: str, short: str, fmt: str) -> list[str]:
    """The commands for one host; the reason is `prefix short` (the taint value gets `short` alone)."""
    q = shlex.quote
    reason = f"{prefix} {short}".strip()
    if fmt == "scontrol":
        return [f"scontrol update NodeName={q(host)} State=DRAIN Reason={q(reason[:REASON_CHARS])}"]
    if fmt == "kubectl":
        # `--` ends kubectl's options: a name starting with '-' stays a name
        return [f"kubectl cordon -- {q(host)}",
                f"kubectl taint nodes --overwrite -- {q(host)} "
                f"{q(f'{TAINT_KEY}={taint_value(short)}:{TAINT_EFFECT}')}",
                f"kubectl annotate nodes --overwrite -- {q(host)} {q(f'{ANNOTATION_KEY}={reason}')}"]
    return [host]


def write(path: str, source, fmt: str = "scontrol", command: str = "") -> list[tuple[str, str]]:
    """Write the drain list to `path` (replacing it whole); the hosts left out, for a warning."""
    lines, left_out = render(source, fmt, command)
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return left_out


def warning_lines(left_out) -> list[str]:
    return [f"ncclbench: warning: host {ascii(host)} left out of the drain file: {why}" for host, why in left_out]


def write_or_warn(path: str, source, fmt: str = "scontrol", command: str = "") -> bool:
    """write(), saying on stderr which hosts were left out, or why the file could not be written."""
    try:
        left_out = write(path, source, fmt, command)
    except OSError as exc:
        print(f"ncclbench: warning: cannot write drain file {path}: {exc.strerror or exc}", file=sys.stderr, flush=True)
        return False
    for line in warning_lines(left_out):
        print(line, file=sys.stderr, flush=True)
    return True
