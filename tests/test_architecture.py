"""The package tree draws the architecture: imports run one way, from the command line
down to the backends, and the leaves (results, topology, the shared vocabulary) import
nothing above them. Read from the source, so a new import that breaks the picture fails
here, not in a review."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ncclbench"
SHARED = {"errors", "sizes", "dtypes", "lazy", "startup", "procs", "failpoints", "inputs"}  # vocabulary every layer uses

# layer -> the layers it may import (besides itself and the shared modules)
CAPABILITY = {"api", "engine", "backends", "results", "topology", "launch", "locate"}  # what a capability may use
ALLOWED = {
    "entry": {"cli", "launch", "api", "faults"},  # ncclbench/__init__.py hands out the API's names
    "cli": {"api", "tune", "faults", "explain", "suite", "engine", "backends", "results", "topology", "launch", "locate"},
    "tune": CAPABILITY,
    "faults": CAPABILITY,  # pairs, preflight, fleet: a package each
    "explain": CAPABILITY,
    "suite": CAPABILITY,
    "api": {"engine", "backends", "results", "topology", "launch", "locate"},
    "engine": {"backends", "results", "topology", "launch", "locate"},
    "locate": set(),  # the localisation core: pure statistics and records
    "backends": {"launch", "topology"},
    "launch": {"topology"},
    "results": set(),
    "topology": set(),
    "shared": set(),
}
# the one import a leaf makes upwards, and why
EXCEPTIONS = {
    ("ncclbench.results.readers", "ncclbench.engine.collectives"):
        "reading nccl-tests files, names such as all_reduce_perf are mapped through the registry's names",
    ("ncclbench.api.explain", "ncclbench.explain.here"):
        "explain moved to its own package; ncclbench.api.explain stays importable as a re-export of its names",
    ("ncclbench.api.explain", "ncclbench.explain.report"):
        "explain moved to its own package; ncclbench.api.explain stays importable as a re-export of its names",
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__main__", "entry"):
        return "entry"
    return "shared" if parts[1] in SHARED else parts[1]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    name = ".".join(rel.parts)
    return name.removesuffix(".__init__")


def _absolute(path: Path, node: ast.ImportFrom) -> str:
    """The module a `from ... import` names, relative forms resolved against `path`."""
    if not node.level:
        return node.module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel).is_dir()


def _string_imports(node: ast.Call) -> list[str]:
    """importlib.import_module("ncclbench.x"), lazy_import("ncclbench.x") and the like."""
    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    if name not in ("import_module", "lazy_import", "__import__") or not node.args:
        return []
    arg = node.args[0]
    return [arg.value] if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else []


def imports_of(path: Path) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            module = _absolute(path, node)
            if module == "ncclbench":  # a submodule, or a name the package root hands out (the API's)
                found += [(f"ncclbench.{a.name}" if _is_module(f"ncclbench.{a.name}") else "ncclbench", node.lineno)
                          for a in node.names if a.name != "__version__"]
            elif module.startswith("ncclbench."):
                found.append((module, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith("ncclbench")]
        elif isinstance(node, ast.Call):
            found += [(s, node.lineno) for s in _string_imports(node) if s.startswith("ncclbench")]
        elif isinstance(node, ast.Dict) and module_name(path) == "ncclbench":  # the root's lazy name table
            found += [(v.value, node.lineno) for v in node.values
                      if isinstance(v, ast.Constant) and isinstance(v.value, str) and v.value.startswith("ncclbench.")]
    return found


def violations() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = module_name(path)
        src = layer_of(source)
        for target, line in imports_of(path):
            dst = layer_of(target)
            if dst == src or (dst == "shared" and src != "shared") or src == "entry" and dst in ALLOWED["entry"]:
                continue
            if dst in ALLOWED[src] or (source, target) in EXCEPTIONS:
                continue
            bad.append(f"{source} ({src}) imports {target} ({dst}), line {line}")
    return bad


def test_imports_run_one_way():
    assert violations() == []


def test_every_module_belongs_to_a_known_layer():
    layers = {layer_of(module_name(p)) for p in PACKAGE.rglob("*.py")}
    assert layers <= set(ALLOWED), layers - set(ALLOWED)


def test_the_layers_form_no_cycle():
    seen, done = set(), set()

    def visit(layer, trail):
        assert layer not in seen or layer in done, f"cycle: {' -> '.join(trail + [layer])}"
        if layer in done:
            return
        seen.add(layer)
        for below in ALLOWED[layer]:
            visit(below, trail + [layer])
        done.add(layer)

    for layer in ALLOWED:
        visit(layer, [])


@pytest.mark.parametrize("line", [
    "from ncclbench.cli.main import main",
    "from ..cli import main",
    "from ..cli.main import main",
    "import ncclbench.cli.main as m",
    "def f():\n    from ncclbench.cli import main",
    "import importlib\nimportlib.import_module('ncclbench.cli.main')",
    "from ncclbench.lazy import lazy_import\nm = lazy_import('ncclbench.cli.main')",
    "from ncclbench import measure",  # a name the package root hands out: above every layer
])
def test_the_check_sees_a_planted_upward_import(tmp_path, monkeypatch, line):
    """The rule is live: a results module that imports upwards, in any spelling, is reported."""
    fake = tmp_path / "ncclbench"
    for folder in ("results", "cli"):
        (fake / folder).mkdir(parents=True)
        (fake / folder / "__init__.py").write_text("")
    (fake / "cli" / "main.py").write_text("")
    (fake / "__init__.py").write_text("")
    (fake / "lazy.py").write_text("")
    (fake / "results" / "bad.py").write_text(line + "\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    found = violations()
    assert len(found) == 1 and found[0].startswith("ncclbench.results.bad (results) imports ncclbench"), found


def test_commands_live_in_the_cli_package():
    """Click commands are defined under cli/ only (tune's and every tool's included), so
    the layers below can be used from Python without the command line. (api.options builds
    a Click command of the option table for itself: the API reads options as the CLI does.)"""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if layer_of(module_name(path)) in ("cli", "entry"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                call = deco.func if isinstance(deco, ast.Call) else deco
                if isinstance(call, ast.Attribute) and call.attr in ("command", "group"):
                    offenders.append(f"{module_name(path)}.{node.name}")
    assert offenders == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_functions_stay_short(path):
    """No function over 80 lines: a longer one hides its steps."""
    long = [(n.name, n.end_lineno - n.lineno + 1) for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 80]
    assert long == []


FAILPOINT_SETTINGS = ("NCCLBENCH_FAULT", "NCCLBENCH_FAULT_ITEM", "NCCLBENCH_PAIRS_SLOW")


def test_only_the_failpoints_module_reads_the_fault_settings():
    """Production code reaches failpoints by name; what is planted there, and how it is
    spelled in the environment, is the failpoints module's alone."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = module_name(path)
        if source == "ncclbench.failpoints":
            continue
        text = path.read_text()
        offenders += [f"{source} names {name}" for name in FAILPOINT_SETTINGS if name in text]
        offenders += [f"{source} imports {target}" for target, _ in imports_of(path)
                      if target.startswith("ncclbench.testing")]
    assert offenders == []
    assert not list((PACKAGE / "testing").glob("*.py"))  # test hooks no longer ship in the package


MAX_MODULE_LINES = 600


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (at any depth of the file: a function-level
    import ties two modules as firmly as a top-level one). `from pkg import mod` names the
    submodule; `from pkg.mod import name` names pkg.mod."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        targets = {target for target, _line in imports_of(path)}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(path, node)
                targets |= {f"{base}.{a.name}" for a in node.names
                            if base.startswith("ncclbench") and _is_module(f"{base}.{a.name}")}
        resolved = set()
        for target in targets:
            while target.count(".") > 1 and not _is_module(target):
                target = target.rsplit(".", 1)[0]
            resolved.add(target)
        graph[module_name(path)] = resolved - {module_name(path)}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in graph:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        circles.append(sorted(group))
    return circles


def test_no_import_circles():
    """Inside a layer, imports still run one way: two modules that import each other (even
    through a package's __init__ or a function-level import) are one module in two files."""
    assert import_circles(import_graph()) == []


def test_the_circle_check_sees_a_planted_circle():
    graph = {"ncclbench.a.x": {"ncclbench.a.y"}, "ncclbench.a.y": {"ncclbench.a.z"},
             "ncclbench.a.z": {"ncclbench.a.x"}, "ncclbench.a.w": {"ncclbench.a.x"}}
    assert import_circles(graph) == [["ncclbench.a.x", "ncclbench.a.y", "ncclbench.a.z"]]
    assert import_circles({"m.a": {"m.b"}, "m.b": set()}) == []


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_stay_readable(path):
    """No module over 600 lines: past that a module holds several concerns; split it along
    its seams."""
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{lines} lines"


# ---- one localisation core ------------------------------------------------------------------------
# the names of localisation rules: defined in ncclbench/locate only (a second copy would disagree)
CORE_FUNCTIONS = {"reference", "healthy_spread", "slow_outliers", "worst_below", "best_of", "best_time",
                  "aligned_best_time", "repeats_needed", "reference_of", "rail_reference", "judge_pairs",
                  "judge_group_pairs", "judge_solo", "slow_alone", "judge_alone", "judge_inventory", "pair_kind",
                  "tournament_rounds", "repair_round", "known_good_rounds", "group_pair_rounds", "over_sockets"}


def parsed_modules(package: Path):
    """(path inside `package`, as text, its syntax tree) of every module, in order."""
    for path in sorted(package.rglob("*.py")):
        yield path.relative_to(package).as_posix(), ast.parse(path.read_text())


def core_twins(package: Path) -> list[str]:
    """Functions with a core rule's name, and band tables (module-level names ending in BAND or
    BANDS), outside the locate package."""
    out = []
    for rel, tree in parsed_modules(package):
        if rel.startswith("locate/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in CORE_FUNCTIONS:
                out.append(f"{rel}: def {node.name}")
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for t in targets:
                if isinstance(t, ast.Name) and t.id.upper().endswith(("BAND", "BANDS")):
                    out.append(f"{rel}: {t.id}")
    return out


def test_localisation_rules_live_in_one_package():
    assert core_twins(PACKAGE) == []


def test_the_core_check_sees_a_planted_twin(tmp_path):
    fake = tmp_path / "ncclbench"
    (fake / "faults").mkdir(parents=True)
    (fake / "locate").mkdir()
    (fake / "locate" / "stats.py").write_text("def reference(v):\n    return v\n")
    (fake / "faults" / "x.py").write_text("SOCKET_BAND = 0.5\n\ndef f():\n    def best_of(r):\n        return r\n")
    assert core_twins(fake) == ["faults/x.py: def best_of", "faults/x.py: SOCKET_BAND"]


# ---- one pair exchange ----------------------------------------------------------------------------
# a pair's both-ways exchange and its sizing by measured time: engine/pair_exchange.py only
# (the backend's sendrecv/alltoall collectives call batch_isend_irecv for themselves)
EXCHANGE_HOMES = {"engine/pair_exchange.py", "backends/torch_dist.py"}
SIZING_FUNCTIONS = {"pair_effort", "probe_size", "probe_bytes", "second_probe_bytes", "probe_pair", "pair_rate",
                    "pair_busbw"}


POINT_TO_POINT = {"batch_isend_irecv", "P2POp", "isend", "irecv", "send", "recv"}


def exchange_twins(package: Path) -> list[str]:
    """torch.distributed point-to-point calls (dist.isend, dist.P2POp, ...) outside
    EXCHANGE_HOMES, and sizing functions defined outside engine/pair_exchange.py."""
    out = []
    for rel, tree in parsed_modules(package):
        for node in ast.walk(tree):
            func = node.func if isinstance(node, ast.Call) else None
            if (isinstance(func, ast.Attribute) and func.attr in POINT_TO_POINT
                    and ast.unparse(func.value).endswith(("dist", "distributed")) and rel not in EXCHANGE_HOMES):
                out.append(f"{rel}: {func.attr}")
            if isinstance(node, ast.FunctionDef) and node.name in SIZING_FUNCTIONS and rel != "engine/pair_exchange.py":
                out.append(f"{rel}: def {node.name}")
    return out


def test_one_pair_exchange_with_one_sizing_rule():
    assert exchange_twins(PACKAGE) == []


def test_the_exchange_check_sees_a_planted_second_exchange(tmp_path):
    fake = tmp_path / "ncclbench"
    (fake / "engine").mkdir(parents=True)
    (fake / "engine" / "pair_exchange.py").write_text("def pair_effort():\n    dist.batch_isend_irecv([])\n")
    (fake / "engine" / "fleet_exchange.py").write_text(
        "def probe_size(a):\n    return a\n\ndef x(dist):\n    for w in dist.batch_isend_irecv([]):\n        w.wait()\n"
        "    self.dist.isend(t, 1)\n    sock.send(b'x')\n")
    assert exchange_twins(fake) == ["engine/fleet_exchange.py: def probe_size",
                                    "engine/fleet_exchange.py: batch_isend_irecv", "engine/fleet_exchange.py: isend"]
