"""Splits analysed side by side (one spawned process per split, ``AnalysisOptions.workers``): the same numbers as
one split after the other, and a failure in a split's process reaches the caller as one line."""

import json

import pytest
import torch

from stability.analysis.fixed_point import analysis_model
from stability.analysis.options import AnalysisOptions
from stability.analysis.pipeline import analyze_checkpoint, analyze_split
from stability.analysis.pool import parallel_splits
from stability.errors import StabilityError

OPTIONS = AnalysisOptions(samples=3, max_iter=40, iterations=40, probes=2)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
    from stability.train import train

    out = tmp_path_factory.mktemp("par") / "tiny.pt"
    cfg = RunConfig(model=ModelConfig(width=16, heads=2, recall="external", norm="pre"),
                    task=TaskConfig(train_size=40, val_size=8, hard_size=8, train_length=8, hard_length=12),
                    train=TrainConfig(epochs=2, batch_size=20, iterations=4, test_iterations=6, device="cpu"))
    train(cfg, out, progress=False)
    return out


def _numbers(report: dict) -> dict:
    """The report without what may differ between runs: stage timings, the workers option and the hardware
    signature (it records the calling process's thread count, set differently below)."""
    out = json.loads(json.dumps(report))
    out["options"].pop("workers")
    out.pop("hardware")
    for split in out["splits"]:
        out[split].pop("timings")
    return out


def test_parallel_splits_give_the_numbers_of_one_split_after_the_other(tiny):
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # the processes get 1 thread each below; compare like with like
    try:
        lines: list = []
        one = analyze_checkpoint(tiny, options=OPTIONS).to_json()
        torch.set_num_threads(2)
        two = analyze_checkpoint(tiny, options=OPTIONS.replace(workers=2), log=lines.append).to_json()
    finally:
        torch.set_num_threads(old)
    assert two["splits"] == ["val", "hard"] and list(two["verdict"]) == ["val", "hard"]
    assert _numbers(two) == _numbers(one)
    # every stage ran in both splits, and the spawned split's log lines reached the caller
    for split in ("val", "hard"):
        assert set(two[split]["timings"]) == set(OPTIONS.stages)
        assert any(line.startswith(f"{split}: ") and "converged" in line for line in lines)
        # and the numbers compared are there: a ρ(J*) and a residual per sample
        assert len(two[split]["jacobian"]["spectral_radius"]) == 3
        assert all(r > 0 for r in two[split]["jacobian"]["spectral_radius"])
        assert len(two[split]["fixed_point"]["residual"]) == 3


def test_a_split_that_fails_in_its_process_raises_one_line(tiny, tmp_path):
    from stability.checkpoint import load

    loaded = load(tiny)
    model = analysis_model(loaded.model, torch.float64, "cpu")
    missing = tmp_path / "gone.pt"  # the spawned process loads the checkpoint again: here it is not there
    with pytest.raises(StabilityError) as info:
        parallel_splits(analyze_split, missing, None, model, loaded.task, ("val", "hard"), OPTIONS, 2, 1, None)
    message = str(info.value)
    assert message.startswith("val: ") and "gone.pt" in message and "\n" not in message
    assert torch.get_num_threads() >= 1


def test_workers_below_one_is_refused():
    with pytest.raises(StabilityError, match=r"AnalysisOptions.workers: 0 is outside \[1, 1024\]"):
        AnalysisOptions(workers=0)
