"""The forecast ``stability train`` prints before it starts (issue 33, A): the whole run, training and the final
evaluation, before the first epoch; a paper-size run on a CPU comes with how to shrink it (checked on the forecast's
arithmetic with a fake per-batch time, without training); the forecast changes no number of the run; and
``--preset cpu`` is the demo's size, under the flags. How close the forecast comes to the real time is a benchmark
note (benchmarks/RESULTS.md, "Train forecast"), not a timed test."""

import torch

from stability.config import RunConfig, TaskConfig, TrainConfig, ModelConfig
from stability.train.forecast import LONG_RUN_S, Forecast

TINY = ["--task", "prefix-sums", "--width", "16", "--heads", "2", "--train-size", "100", "--val-size", "20",
        "--hard-size", "20", "--train-length", "8", "--hard-length", "12", "--batch-size", "50", "--iterations", "4",
        "--test-iterations", "6", "--warmup-epochs", "0"]


def test_the_forecast_line_is_printed_before_the_first_epoch_line(tmp_path, capsys):
    from stability.cli import main

    assert main(["train", *TINY, "--epochs", "2", "--out", str(tmp_path / "t.pt")]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("forecast:")]
    # the epochs' progress is the train bar (2 epochs × 2 batches): the forecast comes before its first render
    assert len(lines) == 1 and "4/4" in err
    assert err.index("forecast:") < err.index("train:") < err.index("0/4") < err.index("4/4")
    line = lines[0]
    assert "2 epochs × 2 batches at" in line and "final evaluation (20 val + 20 hard samples × 6 iterations)" in line
    assert "in all on cpu" in line and "long run" not in err


def test_a_paper_size_run_on_a_cpu_gets_the_shrink_hint_without_training():
    """The paper's configuration (the defaults: 8,000 samples in batches of 500, 100 epochs; val 2,000 and hard
    10,000 at T = 500) at a fake 14 s a batch: 100 × 16 × 14 s of training plus the evaluation, by hand."""
    cfg = RunConfig(train=TrainConfig(device="cpu")).train
    f = Forecast.of(cfg, train_samples=8000, batch_s=14.0, eval_sizes={"val": 2000, "hard": 10000},
                    eval_step_s={"val": 0.2, "hard": 1.0})
    assert (f.epochs, f.batches) == (100, 16)
    assert f.training_s == 100 * 16 * 14.0 and f.total_s == 100 * 16 * 14.0 + (0.2 + 1.0) * 500
    assert "100 epochs × 16 batches at 14 s a batch" in f.line() and "2,000 val + 10,000 hard" in f.line()
    hint = f.hint()
    assert hint is not None and "--preset cpu" in hint and "--epochs" in hint and "--test-iterations" in hint
    # the same run on CUDA, or one forecast under the limit, has no hint
    assert Forecast.of(cfg, train_samples=8000, batch_s=14.0, eval_sizes={}, eval_step_s={}, final=False,
                       device="cuda").hint() is None
    short = Forecast.of(cfg, train_samples=8000, batch_s=LONG_RUN_S / 1600 - 0.01, eval_sizes={}, eval_step_s={},
                        final=False)
    assert short.total_s < LONG_RUN_S and short.hint() is None


def test_the_forecast_counts_the_epochs_left_and_the_periodic_evaluations():
    cfg = TrainConfig(epochs=10, batch_size=50, eval_every=3, eval_iterations=20, test_iterations=60)
    f = Forecast.of(cfg, train_samples=120, batch_s=0.5, eval_sizes={"val": 10, "hard": 10},
                    eval_step_s={"val": 0.01, "hard": 0.02}, start_epoch=4)
    # epochs 5..10 left, 3 batches each; periodic evaluations after epochs 6 and 9 (not 10: the final one)
    assert (f.epochs, f.batches) == (6, 3)
    assert abs(f.periodic_s - 2 * 0.03 * 20) < 1e-12
    assert abs(f.total_s - (6 * 3 * 0.5 + 2 * 0.03 * 20 + 0.03 * 60)) < 1e-12


def test_the_forecast_changes_no_number_of_the_run(tmp_path):
    from stability.train.loop import train

    cfg = RunConfig(model=ModelConfig(width=16, heads=2, initial_state="noise"),
                    task=TaskConfig(train_size=60, val_size=8, hard_size=8, train_length=8, hard_length=10),
                    train=TrainConfig(epochs=2, batch_size=20, iterations=4, test_iterations=4, device="cpu"))
    loud = train(cfg, tmp_path / "loud.pt", progress=True)  # forecasts (times a batch on copies)
    quiet = train(cfg, tmp_path / "quiet.pt", progress=False)  # does not
    a, b = (torch.load(p, weights_only=False) for p in (tmp_path / "loud.pt", tmp_path / "quiet.pt"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert loud.final == quiet.final and [h["loss"] for h in loud.history] == [h["loss"] for h in quiet.history]


def test_the_cpu_preset_is_the_demos_size_under_the_flags(tmp_path):
    from stability.cli import build_parser
    from stability.commands.train import config_from_args
    from stability.demo import demo_config

    args = ["train", "--preset", "cpu", "--task", "prefix-sums", "--recall", "external", "--norm", "post",
            "--out", str(tmp_path / "x.pt")]
    cfg = config_from_args(build_parser("train").parse_args(args))
    demo = demo_config()
    assert cfg.task == demo.task and cfg.train == demo.train
    assert cfg.model == demo.model.replace(norm="post")
    # a flag overrides the preset; another task keeps its own defaults for prefix sums' options
    assert config_from_args(build_parser("train").parse_args([*args, "--epochs", "3"])).train.epochs == 3
    sudoku = config_from_args(build_parser("train").parse_args(["train", "--preset", "cpu", "--task", "sudoku",
                                                                "--out", str(tmp_path / "s.pt")]))
    assert sudoku.task.train_size == 1000 and sudoku.task.train_length == TaskConfig().train_length
