"""A stage lives in one module and one registry line (issue 34; docs/architecture.md, "Adding a stage"): the names
``stability.config`` lists are the registry's, each stage module declares its name, key and record once, a stage's
name is spelled out nowhere else, the JSON side of the house (the registry, the verdict, compare, the headline, the
sweep's record) imports without torch, and no result of the analysis is typed ``Any``."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import stability
from stability import config
from stability.analysis.stages.base import UNITS, Stage
from stability.analysis.stages.registry import FEW_SAMPLE_STAGES, NAMES, REGISTRY, STAGE_KEYS

ROOT = Path(stability.__file__).resolve().parent
STAGES_DIR = ROOT / "analysis" / "stages"

#: the same spelling for something else, outside the stage's files: file -> what it is there
SAME_SPELLING = {
    "repelling": {"stability/stats.py": "the solver's status of a root with ρ(J) > 1, among FIXED_POINT_STATUSES "
                                        "(stability.solvers.REPELLING names it from there)"},
}


def test_the_config_lists_the_registrys_stage_names_in_run_order():
    assert config.STAGES == NAMES
    assert set(config.DEFAULT_STAGES) < set(config.STAGES) and config.GEOMETRY_STAGE in config.STAGES
    assert config.ANALYZE_STAGES == tuple(s for s in config.STAGES if s not in config.OPT_IN_STAGES)
    assert config.DEFAULT_STAGES == tuple(s for s in config.ANALYZE_STAGES if s != config.GEOMETRY_STAGE)


def test_every_stage_is_one_module_named_after_it_that_declares_its_name_key_and_record_once():
    modules = {p.stem for p in STAGES_DIR.glob("*.py")} - {"__init__", "base", "registry"}
    assert modules == set(NAMES)
    for stage in REGISTRY:
        module = importlib.import_module(f"stability.analysis.stages.{stage.name}")
        assert isinstance(stage, Stage) and module.STAGE is stage
        assert (module.NAME, module.KEY) == (stage.name, stage.key)
        assert stage.run is module.run and stage.rows is module.rows and stage.headline is module.headline
        assert stage.cost.unit in UNITS and stage.what
    assert len(set(STAGE_KEYS.values())) == len(REGISTRY)  # one JSON block per stage
    assert FEW_SAMPLE_STAGES == ("rho", "prop4", "input", "a8", "repelling")


def _files_quoting(name: str) -> set:
    return {str(p.relative_to(ROOT.parent)) for p in ROOT.rglob("*.py")
            if f'"{name}"' in p.read_text(encoding="utf-8")}


#: the stages whose name is a word of their own (the others' — rho, input, accuracy, reachability — are also the
#: keys of other things: a root's "rho", a block's "accuracy" curve, a scored_in value)
DISTINCT_NAMES = ("prop4", "prop5", "a8", "repelling", "rho_wx", "geometry", "path_independence")


def test_a_stages_quoted_name_is_in_its_module_and_the_configs_name_list_only():
    """Renaming a stage is its module, the config's list (and its key where the key is the name): a reader that
    spelled the name out elsewhere would miss the rename and report the stage as not measured."""
    assert set(DISTINCT_NAMES) <= set(NAMES)
    for name in DISTINCT_NAMES:
        own = {f"stability/analysis/stages/{name}.py", "stability/config/analysis.py"}
        found = _files_quoting(name) - set(SAME_SPELLING.get(name, {}))
        assert found <= own, (name, sorted(found - own))
    for name, where in SAME_SPELLING.items():
        assert set(where) <= _files_quoting(name), "a same-spelling use is gone: drop it from SAME_SPELLING"


def test_the_stage_registry_the_verdict_compare_and_the_headline_import_without_torch():
    code = ("import sys\nimport stability.analysis.stages.registry, stability.analysis.verdict, stability.compare\n"
            "import stability.analysis.headline, stability.analysis.text, stability.sweep.runner\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT.parent)
    assert out.stdout.strip() == "False", out.stderr


def _any_fields(source: str) -> list:
    """``name: Any`` fields (``Optional[Any]`` too) of the dataclasses and annotated class attributes of a module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if (isinstance(item, ast.AnnAssign) and "Any" in ast.unparse(item.annotation)
                        and isinstance(item.target, ast.Name)):
                    found.append(f"{node.name}.{item.target.id}")
    return found


def test_the_any_check_finds_a_field_typed_any():
    source = "class R:\n    a: int\n    b: Any = None\n    c: Optional[Any] = None\n    def f(self, x: Any): ...\n"
    assert _any_fields(source) == ["R.b", "R.c"]


def test_no_result_of_the_analysis_is_typed_any():
    found = {str(p.relative_to(ROOT)): f for p in (ROOT / "analysis").rglob("*.py")
             if (f := _any_fields(p.read_text(encoding="utf-8")))}
    assert found == {}
