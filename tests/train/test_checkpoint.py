"""Checkpoints: self-describing, loadable with weights_only, atomic, and refused with one line when bad."""

import os

import pytest
import torch

import stability
from stability.errors import CheckpointError
from stability import checkpoint as ckpt


def test_checkpoint_holds_everything_needed_to_rebuild_the_run(trained):
    obj = torch.load(trained, weights_only=True)
    for key in ("format", "schema_version", "package_version", "config", "model", "optimizer", "schedule",
                "rng", "epoch", "step", "history", "final"):
        assert key in obj, key
    assert "scaler" not in obj  # the never-enabled GradScaler is no longer saved
    assert obj["format"] == "stability-checkpoint" and obj["schema_version"] == 2
    assert set(obj["config"]) == {"model", "task", "train"}
    assert obj["config"]["train"]["method"] == {"name": "progressive", "alpha": 1.0}
    assert obj["epoch"] == 2 and len(obj["history"]) == 2
    assert len(obj["final"]["hard"]["accuracy"]) == 6
    # metrics JSONL beside it: one line per epoch plus the final evaluation
    lines = ckpt_metrics(trained)
    assert len(lines) == 3


def ckpt_metrics(path):
    from stability.train.loop import metrics_path

    return metrics_path(path).read_text().splitlines()


def test_load_returns_model_config_and_task(trained):
    loaded = stability.load(trained)
    assert loaded.config.model.width == 16
    inputs, targets = loaded.task.dataset("val")
    assert inputs.shape == (8, 8, 1) and targets.shape == (8, 8)
    logits = loaded.model(inputs, 3)
    assert logits.shape == (3, 8, 8, 2)
    assert not loaded.model.training


def test_not_a_checkpoint_is_refused(tmp_path):
    p = tmp_path / "notes.txt"
    p.write_text("hello, this is not a checkpoint\n")
    with pytest.raises(CheckpointError, match="not a stability checkpoint"):
        stability.load(p)


def test_foreign_torch_file_is_refused(tmp_path):
    p = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, p)
    with pytest.raises(CheckpointError, match="foreign"):
        stability.load(p)


def test_truncated_checkpoint_is_refused(trained, tmp_path):
    data = trained.read_bytes()
    p = tmp_path / "truncated.pt"
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        stability.load(p)


def test_unknown_schema_version_is_refused(trained, tmp_path):
    obj = torch.load(trained, weights_only=True)
    obj["schema_version"] = 99
    p = tmp_path / "future.pt"
    torch.save(obj, p)
    with pytest.raises(CheckpointError, match="schema version 99"):
        stability.load(p)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_pickle_that_would_execute_code_is_refused(tmp_path):
    p = tmp_path / "evil.pt"
    torch.save({"format": "stability-checkpoint", "payload": _Exploit()}, p)
    with pytest.raises(CheckpointError, match="execute code"):
        stability.load(p)


def test_missing_file_is_refused(tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        stability.load(tmp_path / "nope.pt")


def test_atomic_save_never_leaves_a_half_written_file(tmp_path):
    p = tmp_path / "a.pt"
    ckpt.atomic_save({"x": 1}, p)

    class Boom:
        def __reduce__(self):
            raise RuntimeError("boom while writing")

    with pytest.raises(RuntimeError):
        ckpt.atomic_save({"x": Boom()}, p)
    assert torch.load(p, weights_only=True) == {"x": 1}
    assert [f.name for f in tmp_path.iterdir()] == ["a.pt"]


@pytest.mark.parametrize("bad", ["text", "truncated", "foreign", "evil"])
def test_cli_refuses_bad_checkpoints_with_one_line(bad, trained, tmp_path, cli):
    p = tmp_path / f"{bad}.pt"
    if bad == "text":
        p.write_text("not a checkpoint")
    elif bad == "truncated":
        p.write_bytes(trained.read_bytes()[:1000])
    elif bad == "foreign":
        torch.save([1, 2, 3], p)
    elif bad == "evil":
        torch.save(_Exploit(), p)
    proc = cli("train", "--out", p, "--resume", "--epochs", "1", check=False)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert str(p) in proc.stderr
