"""``stability import CKPT --out ours.pt``: a release checkpoint as a toolkit checkpoint (stability/release.py)."""

from __future__ import annotations

import argparse

HELP = "import one of the paper's release checkpoints (model_best.pth + .hydra/config.yaml) as a toolkit checkpoint"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="CKPT", help="a release checkpoint: RUN_DIR/model_best.pth (or any .pth "
                   "written by the release's train_model.py)")
    p.add_argument("--out", required=True, metavar="PATH", help="where to write the toolkit checkpoint")
    p.add_argument("--release-config", metavar="PATH",
                   help="the run's Hydra config (default: RUN_DIR/.hydra/config.yaml beside CKPT)")


def run(args: argparse.Namespace) -> int:
    from stability.train.release_import import import_checkpoint

    out = import_checkpoint(args.checkpoint, args.out, release_config=args.release_config)
    print(f"checkpoint: {out}")
    return 0
