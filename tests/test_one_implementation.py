"""One implementation per concept, checked on the source (issue 23): JSON is serialised only by the output module
(``stability.atomic``: one NaN policy, null), and no module takes a median other than the middle two's mean
(``stability.stats.median``, or numpy's, which agrees; torch's ``median`` returns the lower middle element)."""

import ast
from pathlib import Path

import stability

ROOT = Path(stability.__file__).resolve().parent

#: ``json.dumps`` used as a key or a comparison, never written or printed: module -> why
JSON_KEYS = {
    "stability/tasks/cache.py": "the cache key of a dataset file, and an old signature compared with a new one",
    "stability/sweep/executors.py": "a dict of SLURM resources as a grouping key",
    "stability/sweep/export.py": "the deterministic view normalised through a JSON round trip",
    "stability/sweep/grid.py": "the config hash of a cell id, and axis values made hashable",
}


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            yield node


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT.parent))


def test_json_is_serialised_only_by_the_output_module():
    writers = sorted({_rel(p) for p in ROOT.rglob("*.py") for c in _calls(p)
                      if c.func.attr in ("dump", "dumps") and isinstance(c.func.value, ast.Name)
                      and c.func.value.id == "json"})
    assert set(writers) - set(JSON_KEYS) == {"stability/atomic.py"}, writers
    assert set(JSON_KEYS) <= set(writers), "an allowed key use is gone: drop it from JSON_KEYS"


def test_the_output_module_writes_non_finite_numbers_as_null(tmp_path):
    import json

    import torch

    from stability.atomic import json_text, write_json

    obj = {"a": float("nan"), "b": [1.0, float("inf")], "c": (torch.tensor(2.5), -float("inf"))}
    assert json.loads(json_text(obj)) == {"a": None, "b": [1.0, None], "c": [2.5, None]}
    write_json(tmp_path / "x.json", obj)
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": None, "b": [1.0, None], "c": [2.5, None]}


def test_no_module_takes_a_lower_or_upper_middle_median():
    allowed = {"np", "numpy", "statistics", "stats"}
    found = sorted(f"{_rel(p)}:{c.lineno}" for p in ROOT.rglob("*.py") for c in _calls(p)
                   if c.func.attr in ("median", "nanmedian")
                   and not (isinstance(c.func.value, ast.Name) and c.func.value.id in allowed))
    assert found == []


def _strict(text: str):
    """JSON as a strict reader takes it: a bare NaN / Infinity token is an error (Python's json accepts them)."""
    import json

    def refuse(token):
        raise AssertionError(f"a bare {token} in the JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_nan_in_a_metrics_line_and_in_a_halt_json_is_written_as_null(tmp_path, monkeypatch, cli):
    import math

    import stability.analysis.halting as halting
    from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
    from stability.train import train
    from stability.train.loop import metrics_path

    def nan_metric(model, task, record):  # an epoch callback's metric that came out NaN (e.g. a failed estimate)
        record["probe"] = float("nan")
        record["probe_list"] = [1.5, float("inf")]

    cfg = RunConfig(model=ModelConfig(width=16, heads=2),
                    task=TaskConfig(train_size=20, val_size=6, hard_size=6, train_length=6, hard_length=8),
                    train=TrainConfig(epochs=1, batch_size=20, iterations=3, test_iterations=4, device="cpu"))
    out = tmp_path / "h.pt"
    res = train(cfg, out, progress=False, callbacks=(nan_metric,))
    assert math.isnan(res.history[0]["probe"])
    lines = metrics_path(out).read_text().splitlines()
    epoch = _strict(lines[0])
    assert epoch["probe"] is None and epoch["probe_list"] == [1.5, None]
    assert epoch["loss"] == res.history[0]["loss"]  # finite numbers as they were
    assert "final" in _strict(lines[-1])

    real = halting.halting_report

    def with_a_nan(*args, **kwargs):  # a row whose accuracy came out NaN
        report = real(*args, **kwargs)
        report["rows"][1]["accuracy_halted"] = float("nan")
        return report

    monkeypatch.setattr(halting, "halting_report", with_a_nan)
    cli("halt", out, "--tol", "0.1", "--quiet", "--json", tmp_path / "h.json")
    report = _strict((tmp_path / "h.json").read_text())
    assert report["rows"][1]["tau"] == 0.1 and report["rows"][1]["accuracy_halted"] is None
    assert report["samples"] == 6
