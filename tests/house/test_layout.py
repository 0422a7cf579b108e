"""The package's layout (docs/design.md, "Design"): commands in one room, libraries without argparse, no import cycle
between rooms.

The import graph is read from the source with :mod:`ast` (every ``import``, the function-local ones included), so
a cycle cannot hide behind a deferred import. A room is a top-level module (``stability/solvers.py``) or a
subpackage (``stability/analysis/``); ``stability/cli.py`` belongs to the commands room.
"""

import ast
import importlib
from pathlib import Path

import stability

ROOT = Path(stability.__file__).resolve().parent

#: the room-level imports that point back up, each with its reason (none left: the graph is acyclic as it is)
KNOWN_BACK_EDGES: dict = {}


def _modules() -> dict:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _owner(name: str):
    """The module a dotted name lives in (``stability.analysis.pipeline.analyze`` -> ``...pipeline``)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path):
    """(imported module, imported name or None, line) for every import of ``stability`` in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("stability", "argparse"):
                    yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield (full, None, node.lineno) if full in MODULES else (base, alias.name, node.lineno)


def room(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "stability"  # the package itself: stability.load, stability.analyze, __version__
    return "commands" if parts[1] == "cli" else parts[1]


def room_edges() -> dict:
    """{(room, room it imports): [(module, imported module, line), ...]}; the package's ``__version__`` (a
    constant that imports nothing) is no edge."""
    edges = {}
    for module, path in MODULES.items():
        for name, attr, line in _imports(module, path):
            target = _owner(name) if name.startswith("stability") else None
            if target is None or (target == "stability" and attr == "__version__"):
                continue
            a, b = room(module), room(target)
            if a != b:
                edges.setdefault((a, b), []).append((module, target, line))
    return edges


def _cycle(edges) -> list:
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        state[node] = 2
        stack.pop()
        return []

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return []


def test_the_import_graph_sees_function_local_imports():
    edges = room_edges()
    # stability.load is imported inside a function of the package's __init__, and found
    assert ("stability", "checkpoint") in edges
    assert any(m == "stability.commands.halt" and t == "stability.analysis.halting"
               for m, t, _ in edges[("commands", "analysis")])


def test_the_cycle_check_finds_a_cycle_that_an_added_back_edge_closes():
    edges = dict(room_edges())
    assert _cycle(edges) == []
    assert ("analysis", "solvers") in edges
    edges[("solvers", "analysis")] = [("stability.solvers", "stability.analysis.recall", 1)]
    cycle = _cycle(edges)
    assert "solvers" in cycle and "analysis" in cycle


def test_no_import_cycle_between_rooms():
    edges = room_edges()
    remaining = {e: where for e, where in edges.items() if e not in KNOWN_BACK_EDGES}
    assert _cycle(remaining) == [], {e: remaining[e] for e in zip(_cycle(remaining), _cycle(remaining)[1:])}
    assert set(KNOWN_BACK_EDGES) <= set(edges), "a known back edge is gone: drop it from KNOWN_BACK_EDGES"


def test_analysis_never_imports_train_and_only_the_command_line_imports_commands():
    edges = room_edges()
    assert ("analysis", "train") not in edges, edges.get(("analysis", "train"))
    assert ("analysis", "commands") not in edges
    users = sorted(a for a, b in edges if b == "commands")
    assert users in ([], ["__main__"]), {a: edges[(a, "commands")] for a in users}


def test_no_module_outside_commands_imports_argparse():
    users = sorted(m for m, p in MODULES.items() for name, _, _ in _imports(m, p) if name == "argparse")
    outside = [m for m in users if room(m) != "commands"]
    assert outside == []
    assert "stability.cli" in users and "stability.commands.train" in users


def test_every_command_is_a_module_of_commands_with_help_arguments_and_run():
    from stability.cli import COMMANDS

    for name, module_name in COMMANDS.items():
        assert module_name.startswith("stability.commands."), name
        module = importlib.import_module(module_name)
        assert isinstance(module.HELP, str) and module.HELP.strip(), name
        assert callable(module.add_arguments) and callable(module.run), name
    files = {p.stem for p in (ROOT / "commands").glob("*.py")} - {"__init__", "_types"}
    assert files == {m.rpartition(".")[2] for m in COMMANDS.values()}


def module_edges() -> dict:
    """{(module, module it imports): [line, ...]} between the package's files, function-local imports included."""
    edges = {}
    for module, path in MODULES.items():
        for name, attr, line in _imports(module, path):
            target = _owner(name) if name.startswith("stability") else None
            if target is None or target == module or (target == "stability" and attr == "__version__"):
                continue
            if module.startswith(target + ".") and path.name != "__init__.py":
                continue  # a module importing its own package's __init__ (``from stability import x``)
            edges.setdefault((module, target), []).append(line)
    return edges


def test_the_file_level_cycle_check_finds_a_cycle_between_two_files_of_one_room():
    edges = dict(module_edges())
    assert ("stability.sweep.figures", "stability.sweep.correlations") in edges
    edges[("stability.sweep.correlations", "stability.sweep.figures")] = [1]
    cycle = _cycle(edges)
    assert "stability.sweep.figures" in cycle and "stability.sweep.correlations" in cycle


def test_no_import_cycle_between_files_inside_a_room():
    inside = {(a, b): lines for (a, b), lines in module_edges().items()
              if room(a) == room(b) and room(a) != "stability"}
    cycle = _cycle(inside)
    assert cycle == [], cycle


def test_every_module_of_the_analysis_is_at_most_400_lines():
    """The analysis is read one file at a time (issue 23): no module under stability/analysis/ grows past 400 lines."""
    lengths = {str(p.relative_to(ROOT)): len(p.read_text(encoding="utf-8").splitlines())
               for p in (ROOT / "analysis").rglob("*.py")}
    assert len(lengths) > 10
    assert {name: n for name, n in lengths.items() if n > 400} == {}


# ---- tests use the package's public names -------------------------------------------------------------------------

def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_imports(source: str) -> list:
    """(line, what) for every import in ``source`` of an underscore name of the package: a private module
    (``stability.commands._types``) or a private name of a module (``from stability.solvers import _Broyden``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names
                      if a.name.split(".")[0] == "stability" and any(map(_private, a.name.split(".")))]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "stability":
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                      if any(map(_private, node.module.split("."))) or _private(a.name)]
    return found


def test_the_private_import_check_finds_private_names_and_modules():
    source = ("import json as _json\nfrom stability import __version__\nfrom stability.solvers import SOLVERS\n"
              "from stability.solvers import _Broyden\nfrom stability.commands import _types\n"
              "import stability.commands._types\nfrom stability.commands._types import finite_float\n"
              "def f():\n    from stability.train.loop import make_optimizer, _set_rng_state\n")
    assert private_imports(source) == [
        (4, "stability.solvers._Broyden"), (5, "stability.commands._types"), (6, "stability.commands._types"),
        (7, "stability.commands._types.finite_float"), (9, "stability.train.loop._set_rng_state")]


def test_no_test_imports_an_underscore_name_of_the_package():
    """Tests pin behaviour, not implementation (issue 23): they reach the package through its public names only."""
    tests = Path(__file__).resolve().parents[1]  # tests/, above this file's layer
    files = sorted(tests.rglob("*.py"))
    assert len(files) > 30
    found = {str(p.relative_to(tests)): hits for p in files
             if (hits := private_imports(p.read_text(encoding="utf-8")))}
    assert found == {}
