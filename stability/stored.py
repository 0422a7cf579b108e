"""Stored models, below both kinds of checkpoint (stability/checkpoint.py, stability/release.py): reading a torch
file without executing code, writing one atomically, and :class:`Loaded`, what loading either kind gives."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from stability.atomic import atomic_path
from stability.config import RunConfig
from stability.errors import CheckpointError


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temporary file beside ``path``, then rename over it."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


def read_torch(path: Path | str) -> Any:
    """What ``torch.load(weights_only=True)`` gives for ``path``: one clear CheckpointError for a missing,
    unreadable, truncated or code-executing file."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    with open(path, "rb") as fh:
        is_zip = fh.read(4) == b"PK\x03\x04"  # torch.save writes a zip archive
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        # weights_only refuses any global it does not know: that is what a code-executing pickle needs
        if "Unsupported global" in str(exc) or "GLOBAL" in str(exc):
            raise CheckpointError(f"{path}: refused: loading it would execute code (not a plain checkpoint)") from None
        raise CheckpointError(f"{path}: not a stability checkpoint (not a torch file)") from None
    except Exception as exc:  # torch raises RuntimeError, EOFError, KeyError, ... on bad bytes
        head = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        if is_zip:
            raise CheckpointError(f"{path}: truncated or corrupt checkpoint ({head})") from None
        raise CheckpointError(f"{path}: not a stability checkpoint (not a torch file)") from None
    return obj



@dataclass
class Loaded:
    """What ``stability.load`` returns: the model (eval mode, math attention), its config and task."""

    model: torch.nn.Module
    config: RunConfig
    task: Any
    path: Path
    epoch: int
    history: list = field(default_factory=list)
    final: Optional[dict] = None
    package_version: str = ""
