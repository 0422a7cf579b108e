"""``stability import``'s library: one of the paper's release checkpoints written as a toolkit checkpoint.

It lives here, not in stability/release.py, because it needs the trainer's optimizer and schedule (a fresh AdamW
state and the LR of the epoch reached), and stability/release.py sits below the checkpoint module, which opens
release checkpoints through it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from stability import __version__, checkpoint as ckpt
from stability import release
from stability.atomic import check_writable
from stability.config import to_dict
from stability.errors import OutputError
from stability.train.loop import lr_factor, make_optimizer


def import_checkpoint(path: Path | str, out: Path | str, *, release_config: Optional[Path | str] = None,
                      force: bool = False) -> Path:
    """Write the imported release checkpoint as a toolkit checkpoint (atomic write) at ``out``; an existing ``out``
    is refused in one line, before anything is read, unless ``force`` (as ``stability train`` refuses it).

    ``stability.load(out)`` gives the same model; ``source`` records where it came from. The release's AdamW state
    is indexed by its own parameter order, so the file carries a fresh optimizer state (and RNG states seeded with
    the run's seed) instead: ``stability train --resume`` continues from the imported weights as a new optimizer
    would."""
    out = check_writable(out, "file", "--out")
    if out.exists() and not force:
        raise OutputError(f"--out {out} exists; pass --force to overwrite it, or choose another --out")
    obj = ckpt.read_torch(path)
    loaded = release.load_release(path, obj, release_config=release_config)
    cfg_path = release.config_path(path, release_config)
    train = loaded.config.train
    torch_rng = torch.random.get_rng_state()
    torch.manual_seed(train.seed)
    rng = {"torch": torch.random.get_rng_state(), "cuda": [],
           "data": torch.Generator().manual_seed(train.seed).get_state()}
    torch.random.set_rng_state(torch_rng)
    epoch = loaded.epoch
    lr = train.lr * lr_factor(min(epoch, train.epochs - 1), train)
    ckpt.atomic_save({
        "format": ckpt.FORMAT,
        "schema_version": ckpt.SCHEMA_VERSION,
        "package_version": __version__,
        "torch_version": str(torch.__version__),
        "config": to_dict(loaded.config),
        "model": loaded.model.state_dict(),
        "optimizer": make_optimizer(loaded.model, train).state_dict(),
        "schedule": {"base_lr": train.lr, "epoch": epoch, "lr": lr},
        "rng": rng,
        "epoch": epoch,
        "step": 0,
        "history": [],
        "final": None,
        "source": {"kind": "release", "checkpoint": str(Path(path).resolve()), "config": str(cfg_path.resolve()),
                   "epoch": obj.get("epoch")},
    }, out)
    return out
