"""Heavy libraries named at module level but imported on first use.

`compare`, `show` and `plot` are registered as subcommands whenever the CLI starts, so
their modules are imported by `ncclbench --help` and by every launcher and rank. pandas
(~0.5 s) and matplotlib (~0.5 s) must not come with them: a module writes
`pd = lazy_import("pandas")` and pandas is imported the first time `pd.<name>` is used,
which is when results are actually read. Unlike importlib's LazyLoader, nothing is put in
sys.modules before the real import, so `"pandas" in sys.modules` stays a true answer."""

from __future__ import annotations

import importlib
from types import ModuleType


class LazyModule:
    """Stands for a module until an attribute is asked for, then is that module's attribute."""

    def __init__(self, name: str):
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attr: str):
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attr)

    def __repr__(self) -> str:
        state = "imported" if self._module is not None else "not imported yet"
        return f"<lazy module {self._name!r} ({state})>"


def lazy_import(name: str) -> LazyModule:
    return LazyModule(name)
