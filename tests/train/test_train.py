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
from stability.train.loop import csv_path, accuracy_csv_path, schedule_peak, schedule_warning
from tests.conftest import ROOT

SMALL = ["--task", "prefix-sums", "--width", "16", "--heads", "2", "--train-size", "200", "--val-size", "20",
         "--hard-size", "20", "--train-length", "8", "--hard-length", "12", "--batch-size", "50",
         "--iterations", "6", "--test-iterations", "8", "--quiet"]


def small_model():
    torch.manual_seed(0)
    return build_model(ModelConfig(width=16, heads=2, attention_window=5)).double()


def test_progressive_loss_backpropagates_through_the_last_k_iterations_only():
    model = small_model()
    task = make_task(TaskConfig(train_size=8, val_size=8, train_length=8))
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
    task = make_task(TaskConfig(train_size=8, val_size=8, train_length=8))
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


@pytest.mark.slow
def test_resume_after_a_real_kill_is_bitwise_identical(tmp_path, cli):
    args = SMALL + ["--epochs", "12", "--train-size", "400", "--train-length", "10"]  # 420 distinct strings
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
    from stability.train.loop import EXIT_DIVERGED

    proc = cli("train", *SMALL, "--epochs", "1", "--norm", "none", "--lr", "1e30", "--warmup-epochs", "0",
               "--cooldown-at", "1", "--out", tmp_path / "boom.pt", check=False)
    assert proc.returncode == EXIT_DIVERGED, proc.stderr  # its own status: a result of the run, not bad usage (2)
    assert "non-finite" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "boom.pt").exists()


@pytest.mark.parametrize("argv,needle", [
    (["--norm", "layer"], "invalid choice: 'layer'"),
    (["--recall", "sideways"], "choose from"),
    (["--lr", "-1"], "lr"),
    (["--width", "30", "--heads", "4"], "divisible"),
    (["--task", "mnist"], "invalid choice"),
    (["--alpha", "2"], "alpha"),
    (["--epochs", "many"], "argument --epochs: expected a positive integer, got 'many'"),
    (["--epochs", "0"], "argument --epochs: expected a positive integer, got '0'"),
])
def test_cli_rejects_bad_options_naming_the_allowed_ones(argv, needle, tmp_path, cli):
    proc = cli("train", *SMALL, *argv, "--out", tmp_path / "x.pt", check=False)
    assert proc.returncode == 2
    assert needle in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "x.pt").exists()


@pytest.mark.slow
def test_demo_run_learns_prefix_sums_and_reports_accuracy_against_iterations(tmp_path, cli):
    """The README's main job: a real CPU run inside the CI budget reaching ≥ 95 % whole-string val accuracy."""
    proc = cli("demo", "--out", tmp_path, "--quiet")
    ckpt = torch.load(tmp_path / "prefix-sums.pt", weights_only=True)
    final = ckpt["final"]
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
    # … and prints the README's sample (generated by docs/readme_sample.py from a stored run): row for row always,
    # number for number where the stored run's hardware signature says the same bits are possible here (the same
    # kernel paths; another CPU moves the last digits, which training amplifies: README, "Reproducibility")
    import re
    from pathlib import Path

    from stability import hardware
    from stability.demo import SAMPLE_RECORD, readme_block, readme_sample, sample_record

    root = ROOT
    readme = readme_block((root / "README.md").read_text(encoding="utf-8"))
    fresh = readme_sample(sample_record(final, report, ckpt.get("hardware")))

    def rows(text):  # each line's label: its columns before the first number or verdict word
        out = []
        for line in text.splitlines():
            indent = len(line) - len(line.lstrip())
            if indent >= 20 or (indent >= 9 and not re.match(r"\s+\d+\s", line)):
                continue  # a reason or meaning wrapped at 100 columns: where it breaks moves with the numbers' widths
            if line and set(line) == {"-"}:  # a table's rule, as wide as its widest row
                out.append("-")
                continue
            label = []
            for column in re.split(r"\s{2,}", line.strip()):
                if re.search(r"\d", column) or column.split(" ")[0] in ("YES", "PARTLY", "NO", "NOT"):
                    break
                label.append(column)
            out.append(" ".join(label))
        return out

    assert rows(fresh) == rows(readme), "the demo no longer prints the README's sample: rerun docs/readme_sample.py"
    stored = json.loads((root / SAMPLE_RECORD).read_text())
    possible, why = hardware.same_bits_possible(stored.get("hardware"), ckpt.get("hardware"))
    if not possible:
        pytest.skip(f"the README's numbers come from another machine's kernels ({why}); rows checked, not numbers")
    assert fresh == readme, "the demo no longer prints the README's sample: rerun python docs/readme_sample.py"


def test_task_options_a_task_does_not_use_are_refused(tmp_path, cli):
    proc = cli("train", *SMALL, "--epochs", "1", "--engine", "/usr/games/stockfish", "--out", tmp_path / "x.pt",
               check=False)
    assert proc.returncode == 2 and "prefix-sums task does not use engine" in proc.stderr
    from stability.errors import ConfigError

    with pytest.raises(ConfigError, match="sudoku task does not use train_length"):
        make_task(TaskConfig(name="sudoku", train_length=9))


# ---- schedules a user can steer --------------------------------------------------------------------------------
def test_warning_when_the_requested_learning_rate_is_never_reached():
    """--lr 3e-3 --epochs 6: the 9-epoch warm-up meets the cooldown at epoch ⌊0.6·6⌋ = 3, so the LR peaks at
    3e-3·(1 − e^−0.3) = 7.78e-4 in epoch 3."""
    cfg = TrainConfig(lr=3e-3, epochs=6)
    peak, at = schedule_peak(cfg)
    assert peak == pytest.approx(1 - math.exp(-0.3)) and at == 2
    assert 3e-3 * peak == pytest.approx(7.78e-4, rel=1e-3)
    msg = schedule_warning(cfg)
    assert "never reached" in msg and "0.00078" in msg and "epoch 3" in msg and "--warmup-epochs" in msg
    assert schedule_warning(TrainConfig(epochs=100)) is None  # the paper's schedule reaches its LR in epoch 10
    assert schedule_warning(TrainConfig(lr=3e-3, epochs=6, warmup_epochs=0, cooldown_at=1.0)) is None
    assert schedule_peak(TrainConfig(epochs=6, warmup_epochs=2, cooldown_at=0.5)) == (1.0, 2)


def test_train_cli_prints_the_schedule_warning_once(tmp_path, capsys):
    from stability.cli import main

    assert main(["train", *SMALL, "--epochs", "2", "--lr", "3e-3", "--out", str(tmp_path / "w.pt")]) == 0
    err = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(err) == 1 and "never reached" in err[0]


def _extend_cfg(epochs: int, **train) -> RunConfig:
    return RunConfig(model=ModelConfig(width=16, heads=2),
                     task=TaskConfig(train_size=60, val_size=8, hard_size=8, train_length=8, hard_length=10),
                     train=TrainConfig(epochs=epochs, batch_size=20, iterations=4, test_iterations=4, device="cpu",
                                       lr=1e-3, **train))


def test_extending_a_run_without_cooldown_is_bitwise_the_longer_run(tmp_path):
    """With cooldown_at = 1 the 3- and 5-epoch schedules agree on epochs 1-3, so 3 epochs extended to 5 equal 5
    epochs in one go bitwise (data order and (n, k) draws continue from the checkpointed generator)."""
    from stability.train import train

    train(_extend_cfg(5, cooldown_at=1.0), tmp_path / "whole.pt", progress=False)
    short = train(_extend_cfg(3, cooldown_at=1.0), tmp_path / "ext.pt", progress=False)
    assert short.final is not None and short.epochs == 3
    longer = train(_extend_cfg(5, cooldown_at=1.0), tmp_path / "ext.pt", resume=True, progress=False)
    a = torch.load(tmp_path / "whole.pt", weights_only=True)
    b = torch.load(tmp_path / "ext.pt", weights_only=True)
    assert b["epoch"] == 5 and b["config"]["train"]["epochs"] == 5
    for key in a["model"]:
        assert torch.equal(a["model"][key], b["model"][key]), key
    assert [r["loss"] for r in a["history"]] == [r["loss"] for r in b["history"]]
    assert a["final"]["val"]["accuracy"] == longer.final["val"]["accuracy"]


def test_extending_a_run_keeps_its_epochs_and_follows_the_new_schedule_after(tmp_path):
    """Default cooldown (60 %): epochs 1-3 keep the 3-epoch run's LRs (cooled from epoch 2), epochs 4-5 take the
    5-epoch schedule's (full LR until its cooldown at epoch 4, i.e. index 3), and the final evaluation is redone."""
    from stability.train import train

    short = train(_extend_cfg(3), tmp_path / "ext.pt", progress=False)
    lrs3 = [r["lr"] for r in short.history]
    assert lrs3 == pytest.approx([1e-3 * lr_factor(e, _extend_cfg(3).train) for e in range(3)])
    longer = train(_extend_cfg(5), tmp_path / "ext.pt", resume=True, progress=False)
    cfg5 = _extend_cfg(5).train
    assert [r["lr"] for r in longer.history] == pytest.approx(lrs3 + [1e-3 * lr_factor(e, cfg5) for e in (3, 4)])
    assert [r["epoch"] for r in longer.history] == [1, 2, 3, 4, 5]
    assert longer.history[:3] == short.history
    reloaded = stability.load(tmp_path / "ext.pt")
    assert reloaded.epoch == 5
    # the final evaluation belongs to the extended weights: recompute it independently
    from stability.train.loop import evaluate

    ev = evaluate(reloaded.model, reloaded.task, "val", 4, device="cpu")
    assert ev["accuracy"] == longer.final["val"]["accuracy"]


def test_extend_cli_and_refusals(tmp_path, capsys):
    from stability.cli import main

    out = tmp_path / "r.pt"
    assert main(["train", *SMALL, "--epochs", "2", "--cooldown-at", "1", "--out", str(out)]) == 0
    assert main(["train", "--out", str(out), "--resume", "--epochs", "3", "--quiet"]) == 0
    assert torch.load(out, weights_only=True)["epoch"] == 3
    assert len(metrics_path(out).read_text().splitlines()) == 4  # 3 epochs + final
    capsys.readouterr()
    before = out.read_bytes()
    assert main(["train", "--out", str(out), "--resume", "--epochs", "2", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already trained 3 epochs" in err[0]
    assert main(["train", "--out", str(out), "--resume", "--epochs", "4", "--width", "32", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.width: checkpoint 16, now 32" in err[0] and "only --epochs" in err[0]
    assert out.read_bytes() == before


# ---- results logs ------------------------------------------------------------------------------------------------
def test_metrics_csv_holds_the_jsonl_records_and_the_final_accuracy(tmp_path):
    import csv
    import json

    from stability.train import train

    cfg = _extend_cfg(3, eval_every=1, eval_iterations=3)
    result = train(cfg, tmp_path / "m.pt", progress=False)
    records = [json.loads(line) for line in metrics_path(tmp_path / "m.pt").read_text().splitlines()]
    rows = list(csv.DictReader(csv_path(tmp_path / "m.pt").open()))
    assert len(rows) == 3 == len(records) - 1
    for rec, row in zip(records, rows):
        assert int(row["epoch"]) == rec["epoch"] and int(row["step"]) == rec["step"]
        assert float(row["loss"]) == rec["loss"] and float(row["lr"]) == rec["lr"]
        if "eval" in rec:
            assert float(row["eval.val.accuracy_last"]) == rec["eval"]["val"]["accuracy_last"]
            assert float(row["eval.hard.accuracy_best"]) == rec["eval"]["hard"]["accuracy_best"]
        else:
            assert row["eval.val.accuracy_last"] == ""  # the last epoch has the final evaluation instead
    assert "eval" in records[0] and "eval" not in records[2]
    acc = list(csv.DictReader(accuracy_csv_path(tmp_path / "m.pt").open()))
    assert [int(r["iteration"]) for r in acc] == [1, 2, 3, 4]
    assert [float(r["val_accuracy"]) for r in acc] == result.final["val"]["accuracy"]
    assert [float(r["hard_position_accuracy"]) for r in acc] == result.final["hard"]["position_accuracy"]


def test_tensorboard_scalars_match_the_metrics(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from stability.cli import main

    out, logdir = tmp_path / "t.pt", tmp_path / "tb"
    assert main(["train", *SMALL, "--epochs", "2", "--cooldown-at", "1", "--out", str(out),
                 "--tensorboard", str(logdir)]) == 0
    events = EventAccumulator(str(logdir))
    events.Reload()
    history = torch.load(out, weights_only=True)["history"]
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == [1, 2]
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in history], rel=1e-6)
    final = torch.load(out, weights_only=True)["final"]
    assert [e.value for e in events.Scalars("final/val_accuracy")] == pytest.approx(final["val"]["accuracy"])


def test_tensorboard_without_the_package_is_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util

    from stability.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    assert main(["train", *SMALL, "--epochs", "1", "--out", str(tmp_path / "x.pt"),
                 "--tensorboard", str(tmp_path / "tb")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tensorboard package is not installed" in err[0]
    assert list(tmp_path.iterdir()) == []


# ---- progress ----------------------------------------------------------------------------------------------------
def test_progress_shows_batches_and_evaluations_and_quiet_silences_it(tmp_path, capsys):
    from stability.cli import main

    loud = [a for a in SMALL if a != "--quiet"]
    assert main(["train", *loud, "--epochs", "2", "--cooldown-at", "1", "--eval-every", "1",
                 "--out", str(tmp_path / "p.pt")]) == 0
    err = capsys.readouterr().err
    assert "train: " in err and "8/8" in err and "batch" in err  # 2 epochs × 4 batches of 50
    assert "epoch 1 eval val" in err and "final eval hard" in err
    assert main(["train", *SMALL, "--epochs", "1", "--cooldown-at", "1", "--warmup-epochs", "0",
                 "--out", str(tmp_path / "q.pt")]) == 0
    assert capsys.readouterr().err == ""


def test_a_long_final_evaluation_is_announced_with_an_estimate(tmp_path, capsys, monkeypatch):
    from stability.train import loop

    monkeypatch.setattr(loop, "LONG_EVALUATION_S", 0.0)
    loop.train(_extend_cfg(1, cooldown_at=1.0), tmp_path / "e.pt", progress=False)
    err = capsys.readouterr().err
    assert "final evaluation: 8 val + 8 hard samples × 4 iterations, about" in err
    assert "--test-iterations" in err and "--hard-size" in err


# ---- devices -----------------------------------------------------------------------------------------------------
def test_device_names_are_checked_before_training(tmp_path, capsys):
    from stability.cli import main

    with pytest.raises(SystemExit) as info:
        main(["train", *SMALL, "--device", "tpu", "--out", str(tmp_path / "x.pt")])
    assert info.value.code == 2 and "expected auto, cpu, cuda or cuda:N" in capsys.readouterr().err
    if torch.cuda.is_available():
        bad, needle = f"cuda:{torch.cuda.device_count()}", "CUDA device(s)"
    else:
        bad, needle = "cuda:1", "no CUDA device is available here"
    assert main(["train", *SMALL, "--device", bad, "--out", str(tmp_path / "x.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
    assert list(tmp_path.iterdir()) == []


def test_train_accuracy_each_epoch_is_the_whole_answer_accuracy_at_the_training_depth(tmp_path):
    """``train_accuracy_samples = N`` logs, after every epoch, the share of the first N training inputs whose every
    position is right after T loop steps — recomputed here from the final weights by hand (embed, T steps from the
    initial iterate, readout, argmax), with no call into the evaluation code."""
    from stability.train import train

    cfg = RunConfig(model=ModelConfig(width=16, heads=2),
                    task=TaskConfig(train_size=10, val_size=4, hard_size=4, train_length=4, hard_length=6),
                    train=TrainConfig(epochs=3, batch_size=5, iterations=3, test_iterations=3, lr=3e-3, device="cpu",
                                      train_accuracy_samples=7))
    result = train(cfg, tmp_path / "a.pt", progress=False)
    assert [("train_accuracy" in r) for r in result.history] == [True] * 3
    loaded = stability.load(tmp_path / "a.pt")
    model, task = loaded.model.eval(), make_task(cfg.task)
    inputs, targets = task.dataset("train")
    with torch.no_grad():
        x0 = model.embed(inputs[:7])
        x = model.initial_state(x0)
        for _ in range(3):
            x = model.step(x, x0)
        right = (model.readout(x).argmax(-1) == targets[:7]).all(dim=1)
    assert result.history[-1]["train_accuracy"] == pytest.approx(right.float().mean().item(), abs=1e-12)
    off = train(cfg.model_copy(update={"train": cfg.train.model_copy(update={"train_accuracy_samples": 0})}),
                tmp_path / "b.pt", progress=False)
    assert all("train_accuracy" not in r for r in off.history)
    b = stability.load(tmp_path / "b.pt").model
    for (n, p), q in zip(loaded.model.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), n    # logging the fit does not change the training


def test_schedule_peak_is_the_epoch_by_epoch_peak_without_a_list_as_long_as_the_epochs():
    """schedule_peak bisects instead of listing every epoch's factor: the same (peak, epoch) as the list, and at
    the largest epoch count it answers at once."""
    import itertools
    import time

    from stability.config import MAX_EPOCHS
    from stability.train.loop import lr_factor

    for epochs, warmup, at, factor in itertools.product([1, 2, 5, 6, 10, 37], [0, 1, 2, 9, 40], [0.0, 0.3, 0.6, 1.0],
                                                        [0.0, 0.1, 1.0]):
        cfg = TrainConfig(epochs=epochs, warmup_epochs=warmup, cooldown_at=at, cooldown_factor=factor)
        factors = [lr_factor(e, cfg) for e in range(epochs)]
        assert schedule_peak(cfg) == (max(factors), factors.index(max(factors))), cfg
    t0 = time.perf_counter()
    schedule_peak(TrainConfig(epochs=MAX_EPOCHS, warmup_epochs=MAX_EPOCHS))
    calls = []
    import stability.train.schedule as schedule
    real = schedule.lr_factor
    try:
        schedule.lr_factor = lambda e, c: calls.append(e) or real(e, c)
        schedule_peak(TrainConfig(epochs=MAX_EPOCHS, warmup_epochs=MAX_EPOCHS // 2))
    finally:
        schedule.lr_factor = real
    assert 0 < len(calls) < 100 and time.perf_counter() - t0 < 1


def test_a_run_ended_by_sigterm_releases_its_lock_and_keeps_its_checkpoint_for_resume(tmp_path, cli):
    """A real process killed by SIGTERM unwinds as Ctrl-C does: exit 143, one line, no lock file and no temporary
    left, the last finished epoch's checkpoint kept; a resume is not refused and finishes the run."""
    from stability.train.loop import lock_path

    args = SMALL + ["--epochs", "30", "--train-size", "400", "--train-length", "10"]
    out = tmp_path / "t.pt"
    proc = subprocess.Popen([sys.executable, "-m", "stability", "train", *args, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline, metrics = time.time() + 300, metrics_path(out)
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be terminated"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.strip().splitlines() == ["stability train: terminated"], err
    assert not lock_path(out).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.metrics.csv", "t.metrics.jsonl", "t.pt"]
    assert 2 <= torch.load(out, weights_only=True)["epoch"] < 30
    resumed = cli("train", "--out", out, "--resume", "--quiet", check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert torch.load(out, weights_only=True)["epoch"] == 30 and not lock_path(out).exists()
