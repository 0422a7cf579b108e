"""The public API: ``import stability`` gives load, analyze, Analysis, AnalysisOptions, solve, LoopedModel and
check_model, the same objects as their home modules', without importing torch until one is used; ``analyze`` takes a
model with inputs, a loaded checkpoint or a checkpoint's path and gives the numbers ``stability analyze`` writes,
a checkpoint scored by its task's own scorer; its result builds its JSON once."""

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import stability
from tests.conftest import FIXTURES, run_cli
from stability.analysis.options import AnalysisOptions
from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from stability.errors import StabilityError

#: the options of every run below, as flags and as AnalysisOptions (workers=None: the command's default)
FLAGS = ["--samples", "3", "--max-iter", "40", "--iterations", "6", "--probes", "2", "--only", "rho,a8,accuracy"]
OPTIONS = AnalysisOptions(samples=3, max_iter=40, iterations=6, probes=2, stages=("rho", "a8", "accuracy"),
                          workers=None)


def test_the_public_names_are_the_home_modules_objects():
    from stability.analysis.results import Analysis
    from stability.protocols import LoopedModel, check_model
    from stability.solvers import solve

    assert stability.AnalysisOptions is AnalysisOptions and stability.solve is solve and stability.Analysis is Analysis
    assert stability.LoopedModel is LoopedModel and stability.check_model is check_model
    assert set(stability.__all__) == {"__version__", "load", "analyze", "Analysis", "AnalysisOptions", "solve",
                                      "LoopedModel", "check_model"}


def test_import_stability_stays_light_until_a_lazy_name_is_used():
    code = ("import sys, stability; light = 'torch' not in sys.modules; stability.solve; "
            "print(light, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True"]


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        stability.nope  # noqa: B018


# ---- the three ways in give the command's numbers ------------------------------------------------------------

def _train(path: Path, task: TaskConfig, width: int = 16) -> Path:
    from stability.train import train

    cfg = RunConfig(model=ModelConfig(width=width, heads=2, recall="external", norm="pre"), task=task,
                    train=TrainConfig(epochs=1, batch_size=20, iterations=4, test_iterations=6, device="cpu"))
    train(cfg, path, progress=False)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _train(tmp_path_factory.mktemp("api") / "tiny.pt",
                  TaskConfig(train_size=40, val_size=8, hard_size=8, train_length=8, hard_length=12))


def _command(ckpt: Path, tmp: Path, *flags) -> dict:
    run_cli("analyze", ckpt, "--split", "val", *flags, "--json", tmp / "cmd.json", "--quiet")
    return json.loads((tmp / "cmd.json").read_text())


def _numbers(report: dict) -> dict:
    """The report without what differs from run to run (timings, the hardware signature)."""
    out = copy.deepcopy(report)
    out.pop("hardware", None)
    for split in out["splits"]:
        out[split].pop("timings")
    return out


def test_a_path_a_loaded_checkpoint_and_its_model_on_its_inputs_give_the_commands_numbers(tiny, tmp_path):
    command = _command(tiny, tmp_path, *FLAGS)
    by_path = stability.analyze(tiny, options=OPTIONS, splits=("val",))
    loaded = stability.load(tiny)
    by_loaded = stability.analyze(loaded, options=OPTIONS, splits=("val",))
    assert _numbers(by_path.to_json()) == _numbers(command)
    assert _numbers(by_loaded.to_json()) == _numbers(command)
    # the model on the split's first samples: the same block (prefix sums are scored by argmax, as a model of one's
    # own is), with the run's A.8 noise std given as the checkpoint form takes it
    x, y = loaded.task.dataset("val")
    options = AnalysisOptions(**{**OPTIONS.to_dict(), "noise_std": loaded.config.model.noise_std})
    by_model = stability.analyze(loaded.model, x[:3], y[:3], options)
    assert by_model["splits"] == ["inputs"] and by_model["source"] == {"model": type(loaded.model).__name__}
    block, want = dict(by_model["inputs"]), dict(command["val"])
    for b in (block, want):
        b.pop("timings"), b.pop("split")
    assert block == want


@pytest.fixture(scope="module")
def chess_run(tmp_path_factory):
    pytest.importorskip("chess")
    tmp = tmp_path_factory.mktemp("chess")
    task = TaskConfig(name="chess", train_size=6, val_size=2, hard_size=3, data_path=str(FIXTURES / "lichess-db.csv"),
                      cache_dir=str(tmp))
    return _train(tmp / "chess.pt", task, width=8)


def test_a_loaded_chess_checkpoint_is_scored_by_the_tasks_top_two_squares_not_by_argmax(chess_run, tmp_path):
    """Chess predicts the two squares with the highest class-1 logit (docs/data.md); argmax per square predicts
    another map. The loaded checkpoint's curve is the task's, by hand and as the command writes it."""
    flags = ["--samples", "2", "--max-iter", "8", "--iterations", "4", "--only", "accuracy"]
    options = AnalysisOptions(samples=2, max_iter=8, iterations=4, stages=("accuracy",), workers=None)
    loaded = stability.load(chess_run)
    got = stability.analyze(loaded, options=options, splits=("val",))["val"]["accuracy"]
    x, y = loaded.task.dataset("val")
    with torch.no_grad():
        logits = copy.deepcopy(loaded.model).double()(x[:2].double(), 4)  # (T, B, 8, 8, classes)
    by_task = [float(loaded.task.score(logits[t], y[:2])[1].mean()) for t in range(4)]
    by_argmax = [float((logits[t].argmax(-1) == y[:2]).double().mean()) for t in range(4)]
    assert got["position_accuracy"] == pytest.approx(by_task, abs=1e-12)
    assert by_task != pytest.approx(by_argmax, abs=1e-6)  # the two scorers differ on this model
    assert got == _command(chess_run, tmp_path, *flags)["val"]["accuracy"]
    # the model alone, on the same inputs, has no task: argmax
    alone = stability.analyze(loaded.model, x[:2], y[:2], options)["inputs"]["accuracy"]
    assert alone["position_accuracy"] == pytest.approx(by_argmax, abs=1e-12)


def test_inputs_go_with_a_model_and_splits_with_a_checkpoint(tiny):
    with pytest.raises(StabilityError, match="inputs and targets go with a model"):
        stability.analyze(tiny, torch.zeros(1, 8, 1))
    with pytest.raises(StabilityError, match="splits and release_config go with a checkpoint"):
        stability.analyze(stability.load(tiny).model, torch.zeros(1, 8, 1), splits=("val",))
    with pytest.raises(StabilityError, match="needs its inputs"):
        stability.analyze(stability.load(tiny).model)


# ---- one result type, its JSON built once ----------------------------------------------------------------

def test_the_json_is_built_once_however_often_the_analysis_is_read(tiny, tmp_path, monkeypatch, capsys):
    from stability.analysis.report import publish
    from stability.analysis.stages.rho import JacobianSpectra

    made = []
    to_dict = JacobianSpectra.to_dict
    monkeypatch.setattr(JacobianSpectra, "to_dict", lambda self: made.append(1) or to_dict(self))
    a = stability.analyze(tiny, options=AnalysisOptions(samples=2, max_iter=20, iterations=3, stages=("rho",)))
    assert isinstance(a, stability.Analysis) and made == []
    first = a.to_json()
    assert a["val"]["jacobian"] is first["val"]["jacobian"] and list(a) == list(first) and len(a) == len(first)
    publish(a, json_path=tmp_path / "a.json", plots=tmp_path / "plots")  # what `analyze` and `demo` give
    a.write_json(tmp_path / "b.json")
    assert a.summary() in capsys.readouterr().out
    assert made == [1, 1]  # one block per split (val, hard), made once
    assert json.loads((tmp_path / "a.json").read_text()) == json.loads(json.dumps(first))
