"""``stability demo``: the main job on the embedded default, no download.

Trains a small prefix-sums looped transformer on the CPU (:data:`DEMO_CONFIG`), prints its accuracy against
iteration count on the easy (val) and hard (longer) splits, then analyses its fixed points (the library calls
behind ``stability train`` and ``stability analyze``). Rerunning it with the same ``--out`` resumes the run.
"""

from __future__ import annotations

import argparse

HELP = "train a small prefix-sums model on the CPU, print accuracy against iterations, and analyse it"


def demo_config():
    """The demo's run: external recall, pre-norm, width 32, 45 epochs of 1,000 8-bit strings at LR 3e-3 (no warm-up,
    cooldown at 80 %), hard split of 16-bit strings, final evaluation to 60 iterations, on the CPU."""
    from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig

    return RunConfig(
        model=ModelConfig(recall="external", norm="pre", width=32, heads=4),
        task=TaskConfig(name="prefix-sums", train_size=1000, val_size=200, hard_size=200, train_length=8,
                        hard_length=16),
        train=TrainConfig(lr=3e-3, epochs=45, warmup_epochs=0, cooldown_at=0.8, batch_size=50, iterations=8,
                          test_iterations=60, device="cpu"))


#: samples per split the demo analyses
ANALYSIS_SAMPLES = 32


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo", metavar="DIR", help="folder for the checkpoint and reports")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    import sys

    from stability.atomic import check_writable, output_dir
    from stability.train.loop import train
    from stability.train.report import accuracy_table

    with output_dir(args.out, "--out") as out:
        ckpt = check_writable(out / "prefix-sums.pt", "file", "--out")
        json_path = check_writable(out / "analysis.json", "file", "--out")
        plots = check_writable(out / "plots", "dir", "--out")
        result = train(demo_config(), ckpt, resume=ckpt.exists(), progress=not args.quiet)
        print(f"checkpoint: {result.path}")
        print(accuracy_table(result.final))

        from stability.analysis.pipeline import AnalysisOptions, analyze_checkpoint
        from stability.analysis.report import text_report, write_json, write_plots

        log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
        report = analyze_checkpoint(ckpt, splits=("val", "hard"), options=AnalysisOptions(samples=ANALYSIS_SAMPLES),
                                    log=log)
        print(text_report(report), end="")
        write_json(report, json_path)
        print(f"json: {json_path}")
        for path in write_plots(report, plots):
            print(f"plot: {path}")
    return 0
