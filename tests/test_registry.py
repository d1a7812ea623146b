"""One place per collective: no module but the registry spells a collective's name, and
the backend contract (ncclbench/backends/protocol.py) is what both backends implement and
what the registry's entries call. Read from the source and the classes: no GPU needed."""

import ast
import inspect
import textwrap
from pathlib import Path

import pytest

from ncclbench.backends.cupy_nccl import CupyBackend, _BoundCalls
from ncclbench.backends.protocol import Backend
from ncclbench.backends.torch_dist import TorchBackend
from ncclbench.engine.collectives import REGISTRY

PACKAGE = Path(__file__).resolve().parent.parent / "ncclbench"
REGISTRY_MODULE = Path("engine") / "collectives.py"
NAMES = {c.name for c in REGISTRY.values()} | {c.command for c in REGISTRY.values()}


def name_literals(package: Path = PACKAGE) -> list[str]:
    """`path:line 'name'` for each string constant outside the registry that is a collective's
    name (all_reduce) or command (allreduce)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if path.relative_to(package) == REGISTRY_MODULE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in NAMES:
                found.append(f"{path.relative_to(package)}:{node.lineno} {node.value!r}")
    return found


def test_no_collective_name_is_spelled_outside_the_registry():
    assert name_literals() == []


@pytest.mark.parametrize("line", [
    'ONE_RANK = frozenset({"all_reduce"})',
    "if coll.name == 'sendrecv':\n    pass",
    'PLUGIN = ("allreduce",)',
    'def f(name="hypercube"):\n    return name',
])
def test_the_check_sees_a_planted_name(tmp_path, line):
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "collectives.py").write_text('NAME = "all_reduce"\n')  # the registry may
    (tmp_path / "engine" / "planted.py").write_text(line + "\n")
    (tmp_path / "engine" / "prose.py").write_text('"""all_reduce and reduce, in a sentence."""\n')
    found = name_literals(tmp_path)
    assert len(found) == 1 and found[0].startswith("engine/planted.py:"), found


# ---- the backend protocol -------------------------------------------------------------------
def _members(cls) -> dict:
    """name -> the attribute as the class body defines it (staticmethod, property, function)."""
    out = {}
    for klass in reversed(cls.__mro__):
        out.update({k: v for k, v in vars(klass).items() if not k.startswith("_")})
    return out


PROTOCOL = {k: v for k, v in vars(Backend).items()
            if not k.startswith("_") and (isinstance(v, (staticmethod, property)) or inspect.isfunction(v))}


def _shape(member):
    """What must match: the kind of member, and each parameter's name, kind and default."""
    if isinstance(member, property):
        return "property"
    kind = "staticmethod" if isinstance(member, staticmethod) else "method"
    fn = member.__func__ if isinstance(member, staticmethod) else member
    params = [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]
    return kind, params


# What the CuPy backend takes from the torch backend on purpose: it keeps torch's device,
# memory, streams, events and process group (the rendezvous, barrier and object exchange),
# and runs only the collectives through its own NCCL communicator.
CUPY_FROM_TORCH = {
    "is_gpu": "the same device set-up", "device_info": "the same device",
    "alloc_bytes": "torch's caching allocator", "free_memory": "torch's allocator",
    "memory_usage": "torch's allocator", "synchronize": "torch's stream", "hold": "torch's stream",
    "release_graphs": "CUDA graphs through torch", "timing_name": "CUDA events on torch's stream",
    "barrier": "torch's process group", "all_gather_object": "torch's process group",
    "register_buffers": "-R is answered with a note before (no CuPy binding): mode 0",
    "deregister_buffers": "nothing registered",
}


def test_cupy_writes_its_own_collectives_and_inherits_only_what_it_shares():
    """A protocol member CuPy does not define itself falls back to torch.distributed's: only
    the named ones may (deleting CupyBackend.all_reduce must fail here)."""
    inherited = {name for name in PROTOCOL if name not in vars(CupyBackend)}
    assert inherited == set(CUPY_FROM_TORCH)


@pytest.mark.parametrize("cls", [TorchBackend, CupyBackend], ids=lambda c: c.__name__)
def test_backend_has_every_protocol_method_with_its_signature(cls):
    assert {"prepare_device", "is_gpu", "all_reduce", "bind", "all_gather_object"} <= set(PROTOCOL)
    members = _members(cls)
    missing = sorted(set(PROTOCOL) - set(members))
    assert missing == []
    differ = {name: (_shape(members[name]), _shape(want)) for name, want in PROTOCOL.items()
              if _shape(members[name]) != _shape(want)}
    assert differ == {}


def _assigned_attributes(cls) -> set[str]:
    """Attributes set on `self` anywhere in the class bodies (and its bases'), or on the class."""
    names = set()
    for klass in cls.__mro__[:-1]:
        names |= set(vars(klass))
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
    return names


@pytest.mark.parametrize("cls", [TorchBackend, CupyBackend], ids=lambda c: c.__name__)
def test_backend_sets_every_protocol_attribute(cls):
    wanted = set(Backend.__annotations__)
    assert wanted - _assigned_attributes(cls) == set()


def test_both_backends_are_made_the_same_way():
    """create_backend builds either class with the same arguments."""
    assert inspect.signature(TorchBackend.__init__) == inspect.signature(CupyBackend.__init__)


class Recorder:
    """Takes any protocol collective call and remembers its name and argument count."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return lambda *args: self.calls.append((name, len(args)))


@pytest.mark.parametrize("coll", list(REGISTRY.values()), ids=lambda c: c.name)
def test_each_entry_calls_one_protocol_collective_with_its_parameters(coll):
    rec = Recorder()
    coll.call(rec, "send", "recv", "sum", 0, "layout")
    ((method, nargs),) = rec.calls
    assert method in PROTOCOL
    params = list(inspect.signature(PROTOCOL[method]).parameters)[1:]
    assert nargs == len(params)
    for cls in (TorchBackend, CupyBackend, _BoundCalls):  # CuPy's bind runs the entry's call on the bound forms
        assert list(inspect.signature(getattr(cls, method)).parameters)[1:] == params


def test_capabilities_name_known_backends_only():
    from ncclbench.backends.capabilities import BACKENDS, GAPS

    for coll in REGISTRY.values():
        declared = [coll.backends, coll.in_place_only, coll.one_rank_noop] + [g.backends for g in coll.gaps]
        assert all(set(d) <= set(BACKENDS) for d in declared), coll.name
    assert all(g.backends <= set(BACKENDS) for g in GAPS)
