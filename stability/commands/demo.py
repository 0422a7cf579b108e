"""``stability demo``: the main job on the embedded default, no download.

Trains a small prefix-sums looped transformer on the CPU, prints its accuracy against
iteration count on the easy (val) and hard (longer) splits, then analyses its fixed points (the library calls
behind ``stability train`` and ``stability analyze``). Rerunning it with the same ``--out`` resumes the run.
The run's configuration is :func:`stability.demo.demo_config`.
"""

from __future__ import annotations

import argparse

from stability.atomic import check_writable, output_dir
from stability.demo import ANALYSIS_SAMPLES, demo_config
from stability.train.report import accuracy_table

HELP = "train a small prefix-sums model on the CPU, print accuracy against iterations, and analyse it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/demo", metavar="DIR", help="folder for the checkpoint and reports")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    # lazy: torch; `stability --help` imports this module without it
    import sys

    from stability.train.loop import train

    with output_dir(args.out, "--out") as out:
        ckpt = check_writable(out / "prefix-sums.pt", "file", "--out")
        json_path = check_writable(out / "analysis.json", "file", "--out")
        plots = check_writable(out / "plots", "dir", "--out")
        result = train(demo_config(), ckpt, resume=ckpt.exists(), progress=not args.quiet)
        print(f"checkpoint: {result.path}")
        print(accuracy_table(result.final))

        # lazy: torch; `stability --help` imports this module without it
        from stability.analysis.options import ANALYZE_STAGES, AnalysisOptions
        from stability.analysis.pipeline import analyze_checkpoint
        from stability.analysis.pool import keep_freed_memory
        from stability.analysis.publish import publish

        log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
        # workers=None: the two splits side by side, one process each, on a machine with two threads or more
        # stages=ANALYZE_STAGES: every stage as `stability analyze` runs them (the geometry stage included, the
        # opt-in ones not)
        options = AnalysisOptions(samples=ANALYSIS_SAMPLES, workers=None, stages=ANALYZE_STAGES)
        keep_freed_memory()  # training is over: from here on the process only analyses
        publish(analyze_checkpoint(ckpt, splits=("val", "hard"), options=options, log=log), json_path=json_path,
                plots=plots)
    return 0
