"""``stability import CKPT --out ours.pt``: a release checkpoint as a toolkit checkpoint (stability/release.py)."""

from __future__ import annotations

import argparse

from stability.config import ModelConfig, TrainConfig

HELP = "import one of the paper's release checkpoints (model_best.pth + .hydra/config.yaml) as a toolkit checkpoint"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="CKPT", help="a release checkpoint: RUN_DIR/model_best.pth (or any .pth "
                   "written by the release's train_model.py)")
    p.add_argument("--out", required=True, metavar="PATH", help="where to write the toolkit checkpoint")
    p.add_argument("--release-config", metavar="PATH",
                   help="the run's Hydra config (default: RUN_DIR/.hydra/config.yaml beside CKPT)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists (refused without)")
    p.add_argument("--quiet", action="store_true", help="print only the written checkpoint's path, not its summary")


def summary(path) -> str:
    """What an imported checkpoint holds, in a few lines: where it came from, the task, the model, the epochs
    trained, and the semantics (the ModelConfig / TrainConfig values where the toolkit and the release differ)."""
    # lazy: torch; `stability --help` imports this module without it
    from stability import checkpoint as ckpt

    obj = ckpt.read(path)
    cfg = ckpt.run_config(obj, path)
    m, t, tr = cfg.model, cfg.task, cfg.train
    source = obj.get("source") or {}
    task = f"{t.name}"
    if t.name == "prefix-sums":
        task += f" ({t.train_length}-bit strings to train on, {t.hard_length}-bit hard split)"
    eps = "the dtype's machine epsilon" if m.norm_eps is None else f"{m.norm_eps:g}"
    release = ModelConfig(), TrainConfig()  # a new run's values are the release's
    same = all(getattr(m, k) == getattr(release[0], k) for k in ("window_edges", "norm_eps", "rope_precision")) \
        and tr.decay_exempt == release[1].decay_exempt
    whose = "the release's" if same else "mixed"
    lines = [f"imported {source.get('checkpoint', '?')}",
             f"  release config: {source.get('config', '?')}",
             f"  task:           {task}",
             f"  model:          recall {m.recall}, norm {m.norm}, width {m.width}, {m.heads} heads",
             f"  trained:        {obj.get('epoch')} epoch(s) by the release (its config: {tr.epochs}); imported as "
             "a finished model, ready to analyse",
             f"  semantics:      {whose}: window_edges {m.window_edges}, norm_eps {eps}, rope_precision "
             f"{m.rope_precision}, decay_exempt {tr.decay_exempt} (docs/release-differences.md)"]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    # lazy: torch; `stability --help` imports this module without it
    from stability.train.release_import import import_checkpoint

    out = import_checkpoint(args.checkpoint, args.out, release_config=args.release_config, force=args.force)
    if not args.quiet:  # the import itself takes seconds (no evaluation): nothing to show progress of
        print(summary(out))
    print(f"checkpoint: {out}")
    return 0
