"""Stored models, below both kinds of checkpoint (stability/checkpoint.py, stability/release.py): reading a torch
file without executing code, writing one atomically, and :class:`Loaded`, what loading either kind gives."""

from __future__ import annotations

import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from stability.atomic import atomic_path
from stability.config import RunConfig
from stability.errors import CheckpointError, first_line


def atomic_save(obj: Any, path: Path) -> None:
    """torch.save to a temporary file beside ``path``, then rename over it.

    torch.save writes through a Python file here, so that a failing write (a full disk) is the OSError it is,
    reported by :func:`~stability.atomic.atomic_path` in one line, rather than torch's "enforce fail" RuntimeError."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            try:
                torch.save(obj, fh)
            except RuntimeError as exc:
                cause = exc.__context__
                while cause is not None and not isinstance(cause, OSError):
                    cause = cause.__context__
                if cause is None:
                    raise
                raise cause from None


def first_sentence(text: str) -> str:
    """The first sentence of an error message (whole words: never cut mid-word); its first line if it has none."""
    line = first_line(text)
    m = re.match(r"(.+?[.!?])(?=\s|$)", line)
    return m.group(1) if m else line


def executes_code(exc: BaseException) -> bool:
    """Whether a ``torch.load(weights_only=True)`` failure is the refusal of a pickle that needs a global — what
    a code-executing file needs. (torch's own message then advises ``weights_only=False``; never pass that on.)"""
    return isinstance(exc, pickle.UnpicklingError) and ("Unsupported global" in str(exc) or "GLOBAL" in str(exc))


def load_plain(path: Path, what: str, noun: str = "torch file", foreign: str = "not a file written by torch.save"
               ) -> Any:
    """``torch.load(path, weights_only=True)`` of a file that exists, with one :class:`CheckpointError` line
    starting with ``what`` for a code-executing file ("refused: loading it would execute code (not a plain
    NOUN)"), a truncated or corrupt one (with the first sentence of torch's reason) and a foreign one
    (``foreign``)."""
    with open(path, "rb") as fh:
        is_zip = fh.read(4) == b"PK\x03\x04"  # torch.save writes a zip archive
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises UnpicklingError, RuntimeError, EOFError, KeyError, ... on bad bytes
        if executes_code(exc):
            raise CheckpointError(f"{what}: refused: loading it would execute code (not a plain {noun})") from None
        if is_zip and not isinstance(exc, pickle.UnpicklingError):
            head = first_sentence(str(exc)) or type(exc).__name__
            raise CheckpointError(f"{what}: truncated or corrupt {noun} ({head})") from None
        raise CheckpointError(f"{what}: {foreign}") from None


def read_torch(path: Path | str) -> Any:
    """What ``torch.load(weights_only=True)`` gives for ``path``: one clear CheckpointError for a missing,
    unreadable, truncated or code-executing file."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file")
    if path.is_dir():
        raise CheckpointError(f"{path}: is a directory, not a checkpoint file")
    return load_plain(path, str(path), "checkpoint", "not a stability checkpoint (not a torch file)")


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
