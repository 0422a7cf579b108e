"""Hugging Face models: a local ``save_pretrained`` directory loaded and adapted to the model contract.

* :func:`is_pretrained_dir`: a directory with a ``config.json`` (what ``save_pretrained`` writes);
* :func:`load_pretrained`: that directory's model, loaded from the local files only (never a download), adapted
  (:func:`adapt`), in a :class:`PretrainedLoaded` (``stability.load(HF_DIR)`` returns it);
* :func:`adapt`: the adapter of a loaded model, by ``config.model_type`` (:data:`ADAPTERS`);
* :func:`register_adapter`: an adapter of one's own for another architecture, a remote-code one included
  (docs/language-models.md, "Writing an adapter").

A remote-code architecture (``auto_map`` in config.json: the modelling code ships with the weights) runs that code
only when ``trust_remote_code=True`` is passed explicitly, and is adapted only when an adapter is registered for
its ``model_type``: the toolkit cannot know what a pass of an unknown loop is.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from stability.errors import CheckpointError, StabilityError
from stability.extras import require
from stability.lm.hrm import HrmTextAdapter
from stability.lm.inkling import InklingLoopAdapter
from stability.lm.storage import mixed_storage
from stability.stored import Loaded


def _inkling(model):
    return InklingLoopAdapter(model)


def _hrm(model):
    return HrmTextAdapter(model)


#: config.model_type -> a function of the loaded model returning its adapter
ADAPTERS: dict[str, Callable] = {"inkling2_loop": _inkling, "inkling2_loop_text": _inkling, "hrm_text": _hrm}


def register_adapter(model_type: str, factory: Callable) -> None:
    """Adapt models of ``model_type`` with ``factory(model) -> LMAdapter`` (an :class:`~stability.lm.LMAdapter`
    subclass, or any module satisfying the contract) from now on, in :func:`adapt` and :func:`load_pretrained`."""
    ADAPTERS[str(model_type)] = factory


def adapt(model):
    """The adapter of a Hugging Face model (adapted in place: eager attention, and for MoE models experts that
    torch.func can batch), chosen by its ``config.model_type``; one line naming the known types otherwise."""
    kind = getattr(getattr(model, "config", None), "model_type", None)
    factory = ADAPTERS.get(kind)
    if factory is None:
        raise StabilityError(f"no adapter for model_type {kind!r} (known: {', '.join(sorted(ADAPTERS))}); write one "
                             "(docs/language-models.md, 'Writing an adapter') and register it with "
                             "stability.lm.register_adapter")
    return factory(model)


def is_pretrained_dir(path) -> bool:
    """A directory holding a ``config.json``: what ``save_pretrained`` writes."""
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


@dataclass
class PretrainedLoaded(Loaded):
    """What ``stability.load(HF_DIR)`` gives: ``model`` the adapter (``.hf`` the Hugging Face model), ``config`` and
    ``task`` None (a language model has no task of this toolkit: it is analysed on token ids,
    :func:`stability.lm.analyze_lm`), ``hf_config`` the directory's config.json and ``model_type``."""

    hf_config: dict = field(default_factory=dict)
    model_type: str = ""


def read_config(path: Path) -> dict:
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}/config.json: not a readable JSON config ({exc})") from None
    if not isinstance(cfg, dict) or "model_type" not in cfg:
        raise CheckpointError(f"{path}/config.json: no model_type (not a Hugging Face config)")
    return cfg


def _auto_classes(cfg: dict):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return (AutoModelForImageTextToText, AutoModelForCausalLM) if "text_config" in cfg else \
        (AutoModelForCausalLM, AutoModelForImageTextToText)


def load_hf_model(path, *, dtype: torch.dtype = torch.float32, trust_remote_code: bool = False):
    """The Hugging Face model of a local ``save_pretrained`` directory, in ``dtype``, eval mode; from the local
    files only. One :class:`CheckpointError` line for what cannot be loaded."""
    path = Path(path)
    if not is_pretrained_dir(path):
        raise CheckpointError(f"{path}: not a save_pretrained directory (no config.json)")
    cfg = read_config(path)
    if cfg.get("auto_map") and not trust_remote_code:
        raise CheckpointError(f"{path}: a remote-code architecture ({cfg['model_type']}: its modelling code ships "
                              "with the weights); load it with trust_remote_code=True once you trust that code, "
                              "and register an adapter for it (docs/language-models.md)")
    require("transformers", "loading a Hugging Face model")
    last: Optional[Exception] = None
    for auto in _auto_classes(cfg):
        try:
            with _quiet():
                model = auto.from_pretrained(path, local_files_only=True, dtype=dtype, attn_implementation="eager",
                                             trust_remote_code=trust_remote_code)
            # the modules a model keeps in float32 whatever the dtype asked for: in dtype too (float64 throughout)
            return model.to(dtype=dtype).eval()
        except ValueError as exc:  # not this auto class's architecture: try the next
            last = exc
        except OSError as exc:
            raise CheckpointError(f"{path}: cannot load the model ({str(exc).splitlines()[0]})") from None
    raise CheckpointError(f"{path}: transformers cannot load model_type {cfg['model_type']!r} "
                          f"({str(last).splitlines()[0] if last else 'unknown architecture'})")


@contextlib.contextmanager
def _quiet():
    """transformers' progress bars off while loading (restored after)."""
    from transformers.utils import logging as hf_logging

    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def stored_dtype(cfg: dict) -> torch.dtype:
    """float64 for a directory whose config says its weights are float64, else float32 (float32, bfloat16 and
    float16 weights are all float32 numbers)."""
    name = str(cfg.get("dtype") or cfg.get("torch_dtype") or "float32").replace("torch.", "")
    return torch.float64 if name in ("float64", "double") else torch.float32


def load_pretrained(path, *, device: str = "cpu", dtype: torch.dtype = torch.float32,
                    trust_remote_code: bool = False) -> PretrainedLoaded:
    """``stability.load(HF_DIR)``: the directory's model (:func:`load_hf_model`), adapted (:func:`adapt`), on
    ``device``. ``dtype`` float64 makes the analysis copy as it loads (one copy of the model in memory): the
    weights loaded in their stored precision (float64 if stored so, else float32) and then cast in place,
    the vocabulary tables kept in float32 (:func:`~stability.lm.storage.mixed_storage`)."""
    cfg = read_config(Path(path))
    mixed = dtype == torch.float64
    load_dtype = stored_dtype(cfg) if mixed else dtype
    model = load_hf_model(path, dtype=load_dtype, trust_remote_code=trust_remote_code)
    adapter = adapt(model)
    if mixed:
        mixed_storage(adapter)
    adapter = adapter.to(device).eval()
    for p in adapter.parameters():
        p.requires_grad_(False)
    return PretrainedLoaded(model=adapter, config=None, task=None, path=Path(path), epoch=0, hf_config=cfg,
                            model_type=str(cfg["model_type"]),
                            package_version=str(cfg.get("transformers_version", "")))
