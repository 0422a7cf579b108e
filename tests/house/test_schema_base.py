"""One schema base and functions a reader can hold (issue 34), checked on the source: every pydantic model of the
package derives from stability.config's one config base, whose translator alone turns pydantic's errors into one
line; and no function of the package (but the sudoku solver's search), of its benchmarks, its tests and the docs'
scripts is over 80 lines."""

import ast
from pathlib import Path

import stability

ROOT = Path(stability.__file__).resolve().parent
#: the modules held to functions of at most MAX_LINES lines (issue 34: the sweep, its record and claims, their
#: commands, the migration and the config schema)
HELD = sorted([*ROOT.glob("sweep/*.py"), *ROOT.glob("sweep/claims/*.py"), ROOT / "commands" / "sweep.py",
               ROOT / "commands" / "claims.py", ROOT / "commands" / "migrate.py", ROOT / "migrate.py",
               *ROOT.glob("config/*.py")])
MAX_LINES = 80


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT.parent))


def _long_functions(paths) -> list[str]:
    """``path:line name (N lines)`` of every function or method of ``paths`` over MAX_LINES lines (decorators not
    counted, its docstring counted)."""
    return [f"{_rel(p)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for p in paths for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_LINES]


def test_no_function_of_the_sweep_the_claims_and_the_schema_is_over_80_lines():
    assert _long_functions(HELD) == []
    assert ROOT / "sweep" / "claims" / "evaluation.py" in HELD  # the claims package is held
    assert ROOT / "config" / "messages.py" in HELD  # and the config package


def test_only_the_config_module_touches_pydantic_models_and_their_errors():
    """A schema elsewhere (the claims file, the sweep record) subclasses stability.config's base; nothing but
    the config package imports BaseModel or ValidationError, so there is one error translator."""
    found = sorted(f"{_rel(p)}:{node.lineno}" for p in ROOT.rglob("*.py")
                   for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                   if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pydantic")
                   and any(a.name in ("BaseModel", "ValidationError", "ConfigDict") for a in node.names))
    assert [f for f in found if not f.startswith("stability/config/")] == []
    from stability.config import RunConfig
    from stability.sweep.claims import ClaimsFile
    from stability.sweep.record import SweepRecord

    base = RunConfig.__bases__[0]  # the one config base
    assert issubclass(ClaimsFile, base) and issubclass(SweepRecord, base)


def test_no_function_of_the_package_is_over_80_lines_but_the_sudoku_solver_s_search():
    """Issue 34's "functions a reader can hold", package-wide: the numba sudoku search is the one exception."""
    long = _long_functions(sorted(ROOT.rglob("*.py")))
    assert [f for f in long if not f.startswith("stability/tasks/sudoku_solver.py:")] == []
    assert any(" _search (" in f for f in long)  # the exception is still there, so the check reads the files


def test_no_function_of_the_benchmarks_the_tests_and_the_docs_scripts_is_over_80_lines():
    """The same hold on the project's other Python: benchmarks/*.py, tests/**/*.py and docs/*.py (a benchmark's
    main is split into its arguments, its measurement and its table, as the package's commands are)."""
    repo = ROOT.parent
    paths = sorted([*repo.glob("benchmarks/*.py"), *repo.glob("tests/**/*.py"), *repo.glob("docs/*.py")])
    assert repo / "benchmarks" / "busy_machine.py" in paths and repo / "docs" / "readme_sample.py" in paths
    assert Path(__file__).resolve() in paths  # tests/**, this file among them
    assert _long_functions(paths) == []
