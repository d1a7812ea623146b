"""`ncclbench suite FILE.yaml`: many runs (collectives x dtypes x ops x env settings) in
as few launches as the environment allows: one launch per distinct `env` block."""

from __future__ import annotations

from dataclasses import dataclass, field

from ncclbench.errors import PlanError

# option names a suite entry may set (the long names of the collective options)
RUN_KEYS = {
    "minbytes", "maxbytes", "stepbytes", "stepfactor", "op", "datatype", "root", "iters", "warmup_iters",
    "agg_iters", "run_cycles", "check", "blocking", "average", "timeout", "report_timestamps", "cudagraph",
    "report_cputime", "per_iter_timing", "per_iter_skip", "min_bw", "min_peak_bw", "unalign", "memory_report",
    "local_register", "stream_null",
}
ENTRY_KEYS = RUN_KEYS | {"collective", "label", "env", "tune"}


@dataclass(frozen=True)
class SuiteRun:
    index: int
    label: str
    collective: str
    options: dict               # RUN_KEYS values (raw, validated later by build_plan)
    env: tuple = field(default=())  # sorted (name, value) pairs
    tune: dict | None = None        # `tune:` settings: run `ncclbench tune` on this entry (ncclbench.tune.suite)


def parse_overrides(items) -> dict:
    """`--set KEY=VALUE` items -> {key: value}, values read as YAML scalars (`1` an int,
    `4G` a string), keys among RUN_KEYS."""
    import yaml

    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise PlanError(f"--set {item!r}: expected KEY=VALUE, e.g. --set cudagraph=1")
        if key not in RUN_KEYS:
            raise PlanError(f"--set: unknown key {key!r} (allowed: {', '.join(sorted(RUN_KEYS))})")
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = None
        if value is None or isinstance(value, (list, dict)):
            raise PlanError(f"--set {key}: {text!r} is not a single value")
        out[key] = value
    return out


def load_suite(path: str, overrides: dict | None = None) -> list[SuiteRun]:
    """Parse and check a suite file; every problem names the file, the entry and the key.
    `overrides` (parse_overrides) replace those options in every entry."""
    import yaml

    from ncclbench.engine.collectives import lookup

    try:
        with open(path, encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    except OSError as exc:
        raise PlanError(f"cannot read suite {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise PlanError(f"suite {path}: not a text file (cannot decode as UTF-8)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise PlanError(f"suite {path}: not valid YAML{where}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("runs"), list) or not doc["runs"]:
        raise PlanError(f"suite {path}: expected a mapping with a non-empty list 'runs'")
    defaults = doc.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise PlanError(f"suite {path}: 'defaults' must be a mapping")
    _check_keys(path, "defaults", defaults, RUN_KEYS | {"env"})
    runs = []
    for i, entry in enumerate(doc["runs"]):
        where = f"runs[{i}]"
        if isinstance(entry, str):
            entry = {"collective": entry}
        if not isinstance(entry, dict):
            raise PlanError(f"suite {path}: {where} must be a mapping or a collective name")
        _check_keys(path, where, entry, ENTRY_KEYS)
        if "collective" not in entry:
            raise PlanError(f"suite {path}: {where} has no 'collective'")
        try:
            coll = lookup(str(entry["collective"]))
        except KeyError:
            raise PlanError(f"suite {path}: {where}: unknown collective {entry['collective']!r}") from None
        for scope in (defaults, entry):
            if not isinstance(scope.get("env") or {}, dict):
                raise PlanError(f"suite {path}: {where}: env must be a mapping of NAME: value")
        env = dict(defaults.get("env") or {})
        env.update(entry.get("env") or {})
        if not all(isinstance(k, str) for k in env):
            raise PlanError(f"suite {path}: {where}: env names must be strings")
        options = {k: v for k, v in defaults.items() if k != "env"}
        options.update({k: v for k, v in entry.items() if k in RUN_KEYS})
        options.update(overrides or {})
        label = str(entry.get("label") or _default_label(coll.command, options, env))
        tune = entry.get("tune") or None
        if tune is not None and tune is not True and not isinstance(tune, dict):
            raise PlanError(f"suite {path}: {where}: tune must be true or a mapping of tune settings")
        runs.append(SuiteRun(i, label, coll.name, options, tuple(sorted((k, str(v)) for k, v in env.items())),
                             {} if tune is True else tune))
    return runs


def _check_keys(path, where, mapping, allowed):
    unknown = sorted(set(mapping) - allowed)
    if unknown:
        raise PlanError(f"suite {path}: {where}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})")


def _default_label(command, options, env) -> str:
    parts = [command] + [str(options[k]) for k in ("datatype", "op") if k in options]
    parts += [f"{k}={v}" for k, v in sorted(env.items())]
    return "-".join(parts)


def env_groups(runs: list[SuiteRun]) -> list[tuple[tuple, list[SuiteRun]]]:
    """Runs sharing an environment, in file order of first appearance."""
    groups: dict[tuple, list[SuiteRun]] = {}
    for r in runs:
        groups.setdefault(r.env, []).append(r)
    return list(groups.items())
