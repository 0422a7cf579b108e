"""A K-seed ensemble (`stability train --seeds`) against the K solo runs in sequence, side by side in one run.

    python benchmarks/ensemble_benchmark.py [--seeds 5] [--epochs 45] [--threads 2] [--out DIR]

The demo's architecture (`--preset cpu`, stability/config.py PRESETS). Prints and writes ``DIR/ensemble.json``:
wall seconds of both (whole runs, and the training epochs alone), their ratio, each member's first-epoch loss
against its solo run's (relative difference), and its final val / hard accuracy (last iteration) against the solo
run's (points).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--epochs", type=int, default=None, help="default: the preset's (45)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/out")
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from stability.commands.train import config_from_args
    from stability.train.ensemble import train_ensemble
    from stability.train.loop import train

    config = config_from_args(argparse.Namespace(preset="cpu", config=None))
    if args.epochs is not None:
        config = config.replace(train=config.train.replace(epochs=args.epochs))
    seeds = list(range(args.seeds))
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        solo = [train(config.replace(train=config.train.replace(seed=s)), Path(tmp) / f"solo{s}.pt", progress=False)
                for s in seeds]
        solo_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ens = train_ensemble(config, Path(tmp) / "ens", seeds, progress=False)
        ens_s = time.perf_counter() - t0
    solo_train = sum(h["seconds"] for r in solo for h in r.history)
    ens_train = sum(h["seconds"] for h in ens[0].history)
    members = []
    for s, a, b in zip(seeds, ens, solo):
        members.append({
            "seed": s,
            "first_epoch_loss": [a.history[0]["loss"], b.history[0]["loss"]],
            "first_epoch_rel_diff": abs(a.history[0]["loss"] - b.history[0]["loss"]) / b.history[0]["loss"],
            "max_rel_loss_diff_all_epochs": max(abs(x["loss"] - y["loss"]) / y["loss"]
                                                for x, y in zip(a.history, b.history)),
            **{f"{split}_accuracy": [a.final[split]["accuracy"][-1], b.final[split]["accuracy"][-1]]
               for split in ("val", "hard")},
            **{f"{split}_points": 100 * (a.final[split]["accuracy"][-1] - b.final[split]["accuracy"][-1])
               for split in ("val", "hard")},
        })
    result = {"seeds": args.seeds, "epochs": config.train.epochs, "threads": args.threads,
              "torch": torch.__version__, "solo_wall_s": solo_s, "ensemble_wall_s": ens_s,
              "speedup_wall": solo_s / ens_s, "solo_train_s": solo_train, "ensemble_train_s": ens_train,
              "speedup_train": solo_train / ens_train, "members": members}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ensemble.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"{args.seeds} solo runs: {solo_s:.1f} s (training epochs {solo_train:.1f} s); ensemble: {ens_s:.1f} s "
          f"(training epochs {ens_train:.1f} s); speed-up {solo_s / ens_s:.2f}x whole, {solo_train / ens_train:.2f}x "
          "training")
    for m in members:
        print(f"seed {m['seed']}: first-epoch loss rel diff {m['first_epoch_rel_diff']:.1e} (all epochs max "
              f"{m['max_rel_loss_diff_all_epochs']:.1e}); val {m['val_accuracy'][0]:.3f} vs "
              f"{m['val_accuracy'][1]:.3f}, "
              f"hard {m['hard_accuracy'][0]:.3f} vs {m['hard_accuracy'][1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
