"""The package tree draws the architecture: imports run one way, from the command line
down to the backends, and the leaves (results, topology, the shared vocabulary) import
nothing above them. Read from the source, so a new import that breaks the picture fails
here, not in a review."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "ncclbench"
SHARED = {"errors", "sizes", "dtypes", "lazy", "startup"}  # vocabulary every layer uses

# layer -> the layers it may import (besides itself, the shared modules and `testing`)
ALLOWED = {
    "entry": {"cli", "launch"},
    "cli": {"api", "tune", "engine", "backends", "results", "topology", "launch"},
    "tune": {"api", "engine", "backends", "results", "topology", "launch"},
    "api": {"engine", "backends", "results", "topology", "launch"},
    "engine": {"backends", "results", "topology", "launch"},
    "backends": {"launch", "topology"},
    "launch": {"topology"},
    "results": set(),
    "topology": set(),
    "testing": {"backends"},
    "shared": set(),
}
# the one import a leaf makes upwards, and why
EXCEPTIONS = {
    ("ncclbench.results.readers", "ncclbench.engine.collectives"):
        "reading nccl-tests files, names such as all_reduce_perf are mapped through the registry's names",
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


def imports_of(path: Path) -> list[tuple[str, int]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ncclbench"):
            if node.module == "ncclbench":
                found += [(f"ncclbench.{a.name}", node.lineno) for a in node.names if a.name != "__version__"]
            else:
                found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.startswith("ncclbench")]
    return found


def violations() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        source = module_name(path)
        src = layer_of(source)
        for target, line in imports_of(path):
            dst = layer_of(target)
            if dst == src or dst == "testing" or (dst == "shared" and src != "shared") or src == "entry" and dst in ALLOWED["entry"]:
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


def test_the_check_sees_a_planted_upward_import(tmp_path, monkeypatch):
    """The rule is live: a results module that imports the command line is reported."""
    fake = tmp_path / "ncclbench"
    (fake / "results").mkdir(parents=True)
    (fake / "results" / "bad.py").write_text("from ncclbench.cli.main import main\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", fake)
    assert violations() == ["ncclbench.results.bad (results) imports ncclbench.cli.main (cli), line 1"]


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
