"""Reading launchers' variables: one rule for unset and blank values, one for counts and
ports, and the one error every launch problem is reported with."""

from __future__ import annotations

from typing import Iterable, Mapping

__all__ = ["LaunchEnvError", "read_var", "first_set", "as_count", "as_port"]


class LaunchEnvError(Exception):
    """The environment (or the CLI options) describe an impossible launch. One line that
    names the variables involved."""


def read_var(env: Mapping[str, str], name: str) -> str | None:
    """The variable's value, or None when unset or blank (`export RANK=` in a script
    means "no rank", not a malformed one)."""
    value = env.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


def first_set(env: Mapping[str, str], names: Iterable[str]) -> tuple[str, str] | None:
    for name in names:
        value = read_var(env, name)
        if value is not None:
            return name, value
    return None


def as_count(name: str, raw: str) -> int:
    """A rank, size or id: a non-negative decimal integer."""
    try:
        value = int(raw, 10)
    except ValueError:
        raise LaunchEnvError(f"{name}={raw!r} is not an integer") from None
    if value < 0:
        raise LaunchEnvError(f"{name}={value} is negative")
    return value


def as_port(name: str, raw: str) -> int:
    value = as_count(name, raw)
    if value > 65535:
        raise LaunchEnvError(f"{name}={value} is not a TCP port (0-65535)")
    return value
