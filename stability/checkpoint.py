"""Self-describing checkpoints: one file with the full config, weights, optimizer, schedule, RNG and history.

Format (schema 2), a dict that ``torch.load(weights_only=True)`` reads (tensors, numbers, strings, lists, dicts):

=================  ==========================================================================================
``format``         ``"stability-checkpoint"``
``schema_version`` 2 (1: the same, but the method options flat in ``train``; ``stability migrate`` converts it)
``package_version`` the ``stability`` version that wrote it; ``torch_version`` likewise
``hardware``       what computed the weights (:func:`stability.hardware.signature`: versions, BLAS, CPU,
                   threads, kernel pins; absent in files written before it existed)
``config``         RunConfig as a plain dict: ``model``, ``task``, ``train`` (with its ``method`` block,
                   ``{"name": ..., <that method's options>}``; docs/configuration.md)
``model``          the model's state_dict
``optimizer``      AdamW state_dict
``schedule``       {``base_lr``, ``epoch``, ``lr``}: the LR schedule is a pure function of the epoch
``rng``            {``torch``: CPU RNG state, ``cuda``: list of CUDA RNG states, ``data``: the trainer's
                   data-order / progressive-loss generator state}
``epoch``/``step`` completed epochs and optimizer steps
``history``        one dict per completed epoch (loss, lr, time, and evaluation results when run)
``final``          final evaluation (accuracy against iteration on val and hard) or None
=================  ==========================================================================================

Writes are atomic (temporary file in the same folder, fsync, rename): a killed writer never leaves a
half-written checkpoint. Loading refuses, with one line, anything that is not such a file, except one of the
paper's release checkpoints (``{"net": state_dict, "epoch", "optimizer"}`` with its Hydra config), which
:func:`load` imports (stability/release.py; docs/release-differences.md).

A config written before an option existed loads with that option's legacy value (:func:`with_legacy_defaults`):
old checkpoints keep the semantics they were trained with. A schema-1 file (written before the method block) is
refused with one line naming ``stability migrate``, which rewrites it once as schema 2 (:mod:`stability.migrate`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from stability.config import ModelConfig, RunConfig, from_dict
from stability.errors import CheckpointError, ConfigError, first_line
from stability.stored import Loaded, atomic_save, read_torch  # noqa: F401 - re-exported: ckpt.read_torch, ...
from stability import release
from stability.model import build_model
from stability.tasks import make_task

FORMAT = "stability-checkpoint"
SCHEMA_VERSION = 2
#: the schema versions this toolkit reads (1, the method options flat in ``train``: ``stability migrate`` first)
READABLE_VERSIONS = (2,)
#: TrainConfig values for a checkpoint written before the option existed (``with_legacy_defaults``)
LEGACY_TRAIN_VALUES = {"decay_exempt": "norms"}


def read(path: Path | str, obj: Any = None) -> dict:
    """The raw checkpoint dict, validated: one clear CheckpointError for every kind of bad file (``obj``: what
    :func:`read_torch` already gave for ``path``)."""
    path = Path(path)
    if obj is None:
        obj = read_torch(path)
    if not isinstance(obj, dict) or obj.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a stability checkpoint (a foreign file: no '{FORMAT}' marker)")
    version = obj.get("schema_version")
    if version == 1:
        raise CheckpointError(f"{path}: checkpoint schema 1 (written before the method block) is no longer read; "
                              f"convert it once with `stability migrate {path}`")
    if version not in READABLE_VERSIONS:
        raise CheckpointError(
            f"{path}: checkpoint schema version {version!r} is not supported (this toolkit reads "
            f"{', '.join(map(str, READABLE_VERSIONS))})"
        )
    missing = [k for k in ("config", "model", "epoch", "history") if k not in obj]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {', '.join(missing)}")
    return obj


def with_legacy_defaults(config: dict) -> dict:
    """A stored RunConfig dict with the fields it predates filled in with their legacy values.

    The release-semantics fields of ModelConfig (``window_edges``, ``norm_eps``, ``rope_precision``;
    docs/release-differences.md) and TrainConfig's ``decay_exempt`` default to the release's behaviour for
    new runs; a checkpoint written before they existed was trained with this toolkit's earlier behaviour, so it gets
    ``ModelConfig.LEGACY_MODEL_VALUES`` and ``LEGACY_TRAIN_VALUES``: it computes exactly what it computed when it
    was written, and resumes training as it was trained.
    """
    if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
        return config
    model = dict(config["model"])
    for name, value in ModelConfig.LEGACY_MODEL_VALUES.items():
        model.setdefault(name, value)
    out = {**config, "model": model}
    if isinstance(config.get("train"), dict):
        out["train"] = {**LEGACY_TRAIN_VALUES, **config["train"]}
    return out


def run_config(obj: dict, path: Path | str = "checkpoint") -> RunConfig:
    """The checkpoint's RunConfig (fields it predates take their legacy values: ``with_legacy_defaults``)."""
    try:
        return from_dict(RunConfig, with_legacy_defaults(obj["config"]))
    except ConfigError as exc:
        raise CheckpointError(f"{path}: invalid config in checkpoint: {exc}") from None


def load(path: Path | str, *, device: str = "cpu", release_config: Optional[Path | str] = None) -> Loaded:
    """Load a checkpoint written by the trainer (see the module docstring for the format), or one of the paper's
    release checkpoints (a ``{"net": state_dict, ...}`` ``.pth``), whose Hydra config is ``release_config`` or
    ``RUN_DIR/.hydra/config.yaml`` beside ``RUN_DIR/model_best.pth`` (stability/release.py)."""
    raw = read_torch(path)

    if release.is_release_checkpoint(raw):
        return release.load_release(path, raw, release_config=release_config, device=device)
    obj = read(path, raw)
    if release_config is not None:
        raise CheckpointError(f"--release-config {release_config}: {path} is a stability checkpoint, not a release "
                              "checkpoint (it carries its own config)")
    cfg = run_config(obj, path)
    model = build_model(cfg.model)
    try:
        model.load_state_dict(obj["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: weights do not match the config ({first_line(exc)})") from None
    model.to(device).eval()
    return Loaded(model=model, config=cfg, task=make_task(cfg.task, check=False), path=Path(path),
                  epoch=int(obj["epoch"]), history=list(obj["history"]), final=obj.get("final"),
                  package_version=str(obj.get("package_version", "")))
