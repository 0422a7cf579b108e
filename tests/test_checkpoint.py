"""Checkpoints: self-describing, loadable with weights_only, atomic, and refused with one line when bad."""

import os

import pytest
import torch

import stability
from stability.errors import CheckpointError
from stability import checkpoint as ckpt


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
    from stability.train import train

    out = tmp_path_factory.mktemp("ck") / "run.pt"
    cfg = RunConfig(model=ModelConfig(width=16, heads=2),
                    task=TaskConfig(train_size=40, val_size=8, hard_size=8, train_length=8, hard_length=12),
                    train=TrainConfig(epochs=2, batch_size=20, iterations=4, test_iterations=6, device="cpu"))
    train(cfg, out, progress=False)
    return out


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


def _as_schema_1(obj: dict) -> dict:
    """A checkpoint as the schema-1 writer saved it: every method's options flat in ``train`` (the others at their
    defaults), the model's release-semantics fields absent (a file older than them), and the never-enabled
    GradScaler's state."""
    from stability.config import flat_train, flat_train_defaults

    old = dict(obj)
    config = {k: dict(v) for k, v in obj["config"].items()}
    config["train"] = {**flat_train_defaults(), **flat_train(obj["config"]["train"])}
    for name in ("norm_eps", "window_edges", "rope_precision"):
        del config["model"][name]
    old.update(schema_version=1, config=config, scaler=torch.amp.GradScaler("cpu", enabled=False).state_dict())
    return old


def test_a_schema_1_checkpoint_loads_migrated_and_resumes(trained, tmp_path):
    """The flat method options move into the method block (the other methods' are dropped); the fields it predates
    take their legacy values; its ``scaler`` entry is ignored; extending it writes schema 2."""
    from stability.config import ModelConfig
    from stability.train import train

    obj = torch.load(trained, weights_only=True)
    old = tmp_path / "old.pt"
    ckpt.atomic_save(_as_schema_1(obj), old)
    old_cfg = torch.load(old, weights_only=True)["config"]
    assert "solver_tol" in old_cfg["train"]
    loaded = stability.load(old)
    assert loaded.config.train.method.name == "progressive" and loaded.config.train.method.alpha == 1.0
    assert ckpt.run_config({"config": {**old_cfg, "train": {k: v for k, v in old_cfg["train"].items()
                                                          if k != "decay_exempt"}}}).train.decay_exempt == "norms"
    for name, value in ModelConfig.LEGACY_MODEL_VALUES.items():
        assert getattr(loaded.config.model, name) == value
    extended = loaded.config.replace(train=loaded.config.train.replace(epochs=3))
    train(extended, old, resume=True, progress=False)
    new = torch.load(old, weights_only=True)
    assert new["schema_version"] == 2 and new["epoch"] == 3 and "scaler" not in new
    assert new["config"]["train"]["method"] == {"name": "progressive", "alpha": 1.0}
    assert new["config"]["model"]["window_edges"] == "cut"  # the legacy semantics it was loaded with


def test_a_schema_1_config_of_another_method_keeps_only_its_own_options():
    from stability.config import TrainConfig, flat_train, flat_train_defaults, from_dict, migrate_v1, RunConfig

    flat = {**flat_train_defaults(), **flat_train(TrainConfig(method="implicit", solver_tol=1e-4))}
    migrated = migrate_v1({"model": {}, "task": {}, "train": flat})
    assert migrated["train"]["method"] == {"name": "implicit", **TrainConfig(method="implicit", solver_tol=1e-4)
                                           .to_dict()["method"]}
    assert "alpha" not in migrated["train"] and "bptt_steps" not in migrated["train"]
    assert from_dict(RunConfig, migrated).train.method.solver_tol == 1e-4
