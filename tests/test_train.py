"""The trainer: progressive loss, schedule, determinism, resume after a real kill, divergence, CLI errors."""

import math
import signal
import subprocess
import sys
import time

import pytest
import torch

import stability
from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from stability.model import build_model
from stability.tasks import make_task
from stability.train.loop import lr_factor, make_optimizer, metrics_path, progressive_loss

SMALL = ["--task", "prefix-sums", "--width", "16", "--heads", "2", "--train-size", "200", "--val-size", "20",
         "--hard-size", "20", "--train-length", "8", "--hard-length", "12", "--batch-size", "50",
         "--iterations", "6", "--test-iterations", "8", "--quiet"]


def small_model():
    torch.manual_seed(0)
    return build_model(ModelConfig(width=16, heads=2, attention_window=5)).double()


def test_progressive_loss_backpropagates_through_the_last_k_iterations_only():
    model = small_model()
    task = make_task(TaskConfig(train_size=8, train_length=8))
    x, y = task.dataset("train")
    x = x.double()
    calls = []
    step = model.step
    model.step = lambda a, b: (calls.append(torch.is_grad_enabled()), step(a, b))[1]
    loss = progressive_loss(model, task, x, y, n=5, k=3, alpha=1.0, iterations=10)
    assert calls == [False] * 5 + [True] * 3
    model.step = step
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    # reference: start the k differentiable iterations from the detached state after n
    model.zero_grad()
    x0 = model.embed(x)
    with torch.no_grad():
        s = x0
        for _ in range(5):
            s = model.step(s, x0)
    s = s.detach()
    for _ in range(3):
        s = model.step(s, x0)
    task.loss(model.readout(s), y).backward()
    for g, p in zip(grads, model.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-12)
    # and full backpropagation through all 8 iterations gives a different gradient
    model.zero_grad()
    x0 = model.embed(x)
    s = x0
    for _ in range(8):
        s = model.step(s, x0)
    task.loss(model.readout(s), y).backward()
    assert not torch.allclose(grads[0], next(model.parameters()).grad)


def test_progressive_loss_with_alpha_below_one_adds_the_full_depth_term():
    model = small_model()
    task = make_task(TaskConfig(train_size=8, train_length=8))
    x, y = task.dataset("train")
    x = x.double()
    a = progressive_loss(model, task, x, y, n=2, k=2, alpha=1.0, iterations=6)
    full = progressive_loss(model, task, x, y, n=0, k=6, alpha=1.0, iterations=6)
    mixed = progressive_loss(model, task, x, y, n=2, k=2, alpha=0.25, iterations=6)
    assert torch.allclose(mixed, 0.75 * full + 0.25 * a)


def test_lr_schedule_is_the_release_warmup_and_cooldown():
    cfg = TrainConfig(epochs=100)
    assert lr_factor(0, cfg) == pytest.approx(1 - math.exp(-0.1))
    assert lr_factor(8, cfg) == pytest.approx(1 - math.exp(-0.9))
    assert lr_factor(9, cfg) == 1.0 and lr_factor(59, cfg) == 1.0
    assert lr_factor(60, cfg) == pytest.approx(0.1) and lr_factor(99, cfg) == pytest.approx(0.1)


def test_no_weight_decay_on_biases_and_norm_gains():
    model = build_model(ModelConfig(width=16, heads=2, norm="gru"))
    opt = make_optimizer(model, TrainConfig(decay_exempt="norms"))  # the legacy rule; the release's: test_release
    decayed, free = opt.param_groups
    assert decayed["weight_decay"] == 0.01 and free["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decayed["params"])
    names = {id(p): n for n, p in model.named_parameters()}
    assert any("weight" in names[id(p)] and "norm" in names[id(p)] for p in free["params"])


def test_training_is_deterministic_on_the_cpu(tmp_path):
    from stability.train import train

    cfg = RunConfig(model=ModelConfig(width=16, heads=2),
                    task=TaskConfig(train_size=60, val_size=8, hard_size=8, train_length=8, hard_length=10),
                    train=TrainConfig(epochs=2, batch_size=20, iterations=4, test_iterations=4, device="cpu"))
    train(cfg, tmp_path / "a.pt", progress=False)
    train(cfg, tmp_path / "b.pt", progress=False)
    a, b = stability.load(tmp_path / "a.pt").model, stability.load(tmp_path / "b.pt").model
    for (n, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), n


def test_resume_after_a_real_kill_is_bitwise_identical(tmp_path, cli):
    args = SMALL + ["--epochs", "12", "--train-size", "400"]
    cli("train", *args, "--out", tmp_path / "whole.pt")
    killed = tmp_path / "killed.pt"
    proc = subprocess.Popen([sys.executable, "-m", "stability", "train", *args, "--out", str(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    metrics = metrics_path(killed)
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    epoch = torch.load(killed, weights_only=True)["epoch"]
    assert 3 <= epoch < 12
    cli("train", "--out", killed, "--resume", "--quiet")
    a = torch.load(tmp_path / "whole.pt", weights_only=True)
    b = torch.load(killed, weights_only=True)
    assert b["epoch"] == 12
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    for k in ("val", "hard"):
        assert a["final"][k]["accuracy"] == b["final"][k]["accuracy"]
    assert [r["loss"] for r in a["history"]] == [r["loss"] for r in b["history"]]
    assert len(metrics.read_text().splitlines()) == 13


def test_resume_with_a_different_config_is_refused(tmp_path, cli):
    out = tmp_path / "r.pt"
    cli("train", *SMALL, "--epochs", "1", "--out", out)
    proc = cli("train", *SMALL, "--epochs", "1", "--lr", "0.5", "--out", out, "--resume", check=False)
    assert proc.returncode == 2 and "different config" in proc.stderr and "lr" in proc.stderr


def test_existing_output_is_not_overwritten_without_resume(tmp_path, cli):
    out = tmp_path / "r.pt"
    cli("train", *SMALL, "--epochs", "1", "--out", out)
    before = out.read_bytes()
    proc = cli("train", *SMALL, "--epochs", "1", "--out", out, check=False)
    assert proc.returncode == 2 and "exists" in proc.stderr
    assert out.read_bytes() == before


def test_diverging_run_stops_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    from stability.errors import DivergenceError
    from stability.train import loop

    calls = {"n": 0}
    real = loop.METHODS["progressive"]

    def poisoned(ctx, inputs, targets):  # the loss turns non-finite in the second epoch
        calls["n"] += 1
        if calls["n"] > 4:
            ctx.optimize(torch.tensor(float("nan"), requires_grad=True))
        return real(ctx, inputs, targets)

    monkeypatch.setitem(loop.METHODS, "progressive", poisoned)
    cfg = RunConfig(model=ModelConfig(width=16, heads=2),
                    task=TaskConfig(train_size=200, val_size=8, hard_size=8, train_length=8, hard_length=10),
                    train=TrainConfig(epochs=3, batch_size=50, iterations=4, test_iterations=4, device="cpu"))
    out = tmp_path / "d.pt"
    with pytest.raises(DivergenceError, match="non-finite loss at epoch 2.*last good checkpoint"):
        loop.train(cfg, out, progress=False)
    kept = stability.load(out)
    assert kept.epoch == 1
    assert all(torch.isfinite(p).all() for p in kept.model.parameters())


def test_cli_reports_divergence_in_one_line(tmp_path, cli):
    proc = cli("train", *SMALL, "--epochs", "1", "--norm", "none", "--lr", "1e30", "--warmup-epochs", "0",
               "--out", tmp_path / "boom.pt", check=False)
    assert proc.returncode == 2, proc.stderr
    assert "non-finite" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "boom.pt").exists()


@pytest.mark.parametrize("argv,needle", [
    (["--norm", "layer"], "invalid choice: 'layer'"),
    (["--recall", "sideways"], "choose from"),
    (["--lr", "-1"], "lr"),
    (["--width", "30", "--heads", "4"], "divisible"),
    (["--task", "mnist"], "invalid choice"),
    (["--alpha", "2"], "alpha"),
    (["--epochs", "many"], "invalid int value"),
])
def test_cli_rejects_bad_options_naming_the_allowed_ones(argv, needle, tmp_path, cli):
    proc = cli("train", *SMALL, *argv, "--out", tmp_path / "x.pt", check=False)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "x.pt").exists()


def test_demo_run_learns_prefix_sums_and_reports_accuracy_against_iterations(tmp_path, cli):
    """The README's main job: a real CPU run inside the CI budget reaching ≥ 95 % whole-string val accuracy."""
    proc = cli("demo", "--out", tmp_path, "--quiet")
    final = torch.load(tmp_path / "prefix-sums.pt", weights_only=True)["final"]
    assert max(final["val"]["accuracy"]) >= 0.95, final["val"]["accuracy"]
    assert "accuracy (%) against iteration count" in proc.stdout
    # … and then analyses it: the report, its JSON and plots
    import json

    report = json.loads((tmp_path / "analysis.json").read_text())
    assert set(report["splits"]) == {"val", "hard"}
    assert report["val"]["fixed_point"]["converged_fraction"] > 0
    assert "ρ(J*) median" in proc.stdout
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == [
        "accuracy.png", "eigenvalues.png", "prop5.png", "residuals.png"]


def test_task_options_a_task_does_not_use_are_refused(tmp_path, cli):
    proc = cli("train", *SMALL, "--epochs", "1", "--engine", "/usr/games/stockfish", "--out", tmp_path / "x.pt",
               check=False)
    assert proc.returncode == 2 and "prefix-sums task does not use engine" in proc.stderr
    from stability.errors import ConfigError

    with pytest.raises(ConfigError, match="sudoku task does not use train_length"):
        make_task(TaskConfig(name="sudoku", train_length=9))
