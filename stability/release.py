"""The paper's release checkpoints as first-class inputs (issue 14; docs/release-differences.md).

A release run directory holds ``model_best.pth`` (``torch.save({"net": state_dict, "epoch", "optimizer"})``; keys
of the looped block possibly prefixed ``recur_blocks.0._orig_mod.`` by torch.compile) and its composed Hydra config
``.hydra/config.yaml``. :func:`load_release` maps both into this toolkit's :class:`~stability.model.LoopedTransformer`
(or :class:`~stability.model.FixedDepthTransformer` for the 15-block baseline) with the release's semantics
(``window_edges="shift"``, ``norm_eps=None``, ``rope_precision="float32"``), which then computes the release's
function: the same logits at every iteration, to float64 rounding (tests/model/test_release.py, against outputs the
release's own code recorded).

* Config mapping (``problem.model``): norm_type/residual_method peri/add → peri, pre/add → pre, post/add → post,
  peri/gru → gru; injection_type linear + recall_inner true/false → internal/external, none → none, and none with
  num_blocks > 1 and max_iters 1 → the fixed-depth baseline of num_blocks blocks; attn_type full, or local with
  kernel_size → attention_window. Options the toolkit cannot represent are refused by name (:data:`REFUSED`).
* Layout: the model takes (B, *spatial, C) and returns (T, B, *spatial, C); :func:`to_stability_layout` and
  :func:`to_release_layout` convert the release's (B, C, *spatial) inputs and (B, T, C, *spatial) logits.
* Chess: the release stores boards with row 0 = rank 8, this toolkit with row 0 = rank 1; an imported chess model
  has ``flip_rows`` set, so it reads this toolkit's boards (and answers) in this toolkit's layout.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Optional

import torch

from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from stability.errors import CheckpointError, ConfigError, first_line
from stability.model import build_model
from stability.stored import Loaded, read_torch
from stability.tasks import make_task

#: the release's semantics of the three places where the toolkit's earlier model differed
RELEASE_SEMANTICS = {"window_edges": "shift", "norm_eps": None, "rope_precision": "float32"}
HEADS = 8  # the release's attention always has 8 heads
PROBLEMS = {"prefix_sums": "prefix-sums", "sudoku": "sudoku", "chess": "chess"}

#: release option -> the values this toolkit can represent (anything else is refused by name). A key missing from
#: the config takes the release's default (the first value).
SUPPORTED = {
    "model": ("DTTransformer",),
    "injection_type": ("linear", "none"),
    "norm_type": ("post", "pre", "peri"),
    "residual_method": ("add", "gru"),
    "attn_type": ("full", "local"),
    "norm_before_head": (True,),
    "init_norm": (False,),
    "local_attn_pad": (False,),
    "ccot": ("none",),
    "num_sinks": (0,),
    "lanes": (1,),
    "velocity": (0,),
    "noise_prob": (0,),
    "hidden_dropout": (0,),
    "post_relu": (False,),
    "ema_act": (False, None),
    "monotone_lambda": (0,),
    "monotone_margin": (0,),
}
#: options that do not change the function of a trained model (initialisation, paths, unused sizes)
IGNORED = {"model_path", "init_method", "noise_scale", "num_ccot_tokens", "test_iterations", "max_iters"}
#: options read for the mapping
READ = {"hidden_dim", "num_blocks", "recall_inner", "kernel_size", "qk_normalization", "in_channels",
        "out_channels", "spatial_dims"}
REFUSED = sorted(SUPPORTED)

_BLOCK_PARTS = [  # (release name inside a block, toolkit name inside a Block)
    ("pre_norm_func.", "pre_norm.0."), ("peri_norm_func.", "peri_norm.0."), ("post_norm_func.", "post_norm.0."),
    ("attn.qkv.", "attn.qkv."), ("attn.out_proj.", "attn.out."), ("attn.q_norm.", "attn.q_norm."),
    ("attn.k_norm.", "attn.k_norm."), ("mlp.0.", "mlp.fc."), ("mlp.2.", "mlp.proj."), ("gru.", "gru.0."),
]
_RECALL_PARTS = [("Wx.", "recall_map.x."), ("Wh.", "recall_map.x0.")]
_TOP_PARTS = [("projection.", "input."), ("head.0.", "head.norm."), ("head.1.", "head.fc."), ("head.3.", "head.out.")]


# ---- files ----------------------------------------------------------------------------------------------------
def is_release_checkpoint(obj: Any) -> bool:
    """A release ``.pth``: a dict with a ``net`` state dict and no toolkit ``format`` marker."""
    return isinstance(obj, dict) and isinstance(obj.get("net"), dict) and "format" not in obj


def config_path(checkpoint: Path | str, release_config: Optional[Path | str] = None) -> Path:
    """The Hydra config of a release checkpoint: ``release_config`` if given, else ``RUN_DIR/.hydra/config.yaml``
    beside ``RUN_DIR/model_best.pth``. Refuses, with one line, a config that is not there."""
    if release_config is not None:
        path = Path(release_config)
        if not path.is_file():
            raise CheckpointError(f"--release-config {path}: no such file")
        return path
    path = Path(checkpoint).parent / ".hydra" / "config.yaml"
    if not path.is_file():
        raise CheckpointError(f"{checkpoint}: a release checkpoint, but its Hydra config {path} is missing; "
                              "pass --release-config PATH (release_config= in Python)")
    return path


def read_config(path: Path | str) -> dict:
    """The composed Hydra config (YAML) as a dict, with a ``problem.model`` table."""
    import yaml

    path = Path(path)
    try:
        cfg = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: cannot read the release config ({exc})") from None
    except yaml.YAMLError as exc:
        head = first_line(exc, "YAML error")
        raise CheckpointError(f"{path}: not a YAML file ({head})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("problem"), dict) \
            or not isinstance(cfg["problem"].get("model"), dict):
        raise CheckpointError(f"{path}: not a release Hydra config (no problem.model table)")
    return cfg


# ---- config ---------------------------------------------------------------------------------------------------
def model_config(release: dict, problem: str = "prefix_sums", where: str = "release config") -> ModelConfig:
    """The ModelConfig of a release ``problem.model`` table, or a one-line ConfigError naming the option that
    cannot be represented."""
    m = release
    unknown = sorted(set(m) - set(SUPPORTED) - IGNORED - READ)
    if unknown:
        raise ConfigError(f"{where}: release option {unknown[0]} is not known to this toolkit (cannot import it)")
    for name, ok in SUPPORTED.items():
        value = m.get(name, ok[0])
        if value not in ok:
            raise ConfigError(f"{where}: release option {name}={value!r} cannot be represented by this toolkit "
                              f"(supported: {', '.join(map(repr, ok))})")
    norm, residual = m.get("norm_type", "post"), m.get("residual_method", "add")
    if residual == "gru" and norm != "peri":
        raise ConfigError(f"{where}: release option residual_method=gru with norm_type={norm} cannot be represented "
                          "(the toolkit's gru variant is norm_type peri with the GRU residual)")
    norm = "gru" if residual == "gru" else norm
    blocks = int(m.get("num_blocks", 1))
    injection, inner = m.get("injection_type", "none"), bool(m.get("recall_inner", False))
    if blocks > 1:
        if injection != "none" or int(m.get("max_iters", 1)) != 1:
            raise ConfigError(f"{where}: release option num_blocks={blocks} is only representable as the fixed-depth "
                              "baseline (injection_type none, max_iters 1)")
        recall = "fixed"
    elif injection == "none":
        recall = "none"
    else:
        recall = "internal" if inner else "external"
    width = int(m["hidden_dim"]) if "hidden_dim" in m else None
    if width is None or width % HEADS:
        raise ConfigError(f"{where}: release option hidden_dim={m.get('hidden_dim')!r}: expected a multiple of {HEADS}")
    window = None
    if m.get("attn_type", "full") == "local":
        window = int(m.get("kernel_size", 5))
        if window % 2 == 0:
            raise ConfigError(f"{where}: release option kernel_size={window}: expected an odd window")
    spatial = int(m.get("spatial_dims", 1))
    depth = {"depth": blocks} if recall == "fixed" else {}
    return ModelConfig(recall=recall, norm=norm, width=width, heads=HEADS, mlp_ratio=4, **depth,
                       in_channels=int(m.get("in_channels", 1)),
                       out_channels=int(m.get("out_channels", 2)), spatial_ndim=spatial, attention_window=window,
                       qk_norm=bool(m.get("qk_normalization", False)), share_norms=True,
                       flip_rows=problem == "chess", **RELEASE_SEMANTICS)


def run_config(release: dict, where: str = "release config") -> RunConfig:
    """The RunConfig of a whole release Hydra config: model (:func:`model_config`), task, and the training
    options that have a counterpart here (the rest of ``problem.hyp`` is kept only in the imported file's
    ``source``)."""
    problem = release["problem"]
    name = problem.get("name")
    if name not in PROBLEMS:
        raise ConfigError(f"{where}: release problem.name={name!r} is not one of {', '.join(PROBLEMS)}")
    model = model_config(problem["model"], name, where)
    task = {"name": PROBLEMS[name]}
    if name == "prefix_sums":
        for key, field in (("train_data", "train_length"), ("test_data", "hard_length")):
            if isinstance(problem.get(key), int):
                task[field] = problem[key]
    hyp = problem.get("hyp") or {}
    train: dict = {}
    for key, field, kind in (("lr", "lr", float), ("epochs", "epochs", int), ("seed", "seed", int),
                             ("alpha", "alpha", float), ("weight_decay", "weight_decay", float),
                             ("eps", "adam_eps", float), ("clip", "grad_clip", float),
                             ("train_batch_size", "batch_size", int), ("use_amp", "bf16", bool)):
        if key in hyp and hyp[key] is not None:
            train[field] = kind(hyp[key])
    if model.recall != "fixed" and "max_iters" in problem["model"]:
        train["iterations"] = int(problem["model"]["max_iters"])
    high = (problem["model"].get("test_iterations") or {}).get("high")
    if isinstance(high, int) and high >= 1:
        train["test_iterations"] = high
    if "alpha" in train:  # the progressive loss's weight: an option of the method
        train["method"] = {"name": "progressive", "alpha": train.pop("alpha")}
    try:
        return RunConfig(model=model, task=TaskConfig(**task), train=TrainConfig(**train))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


# ---- weights --------------------------------------------------------------------------------------------------
def _strip(key: str) -> str:
    return key.replace("._orig_mod.", ".").replace("_orig_mod.", "")


def _rename(key: str, parts) -> Optional[str]:
    for theirs, ours in parts:
        if key.startswith(theirs):
            return ours + key[len(theirs):]
    return None


def state_dict_from_release(net: dict, cfg: ModelConfig, where: str = "release checkpoint") -> dict:
    """The release's ``net`` state dict under this toolkit's parameter names (values unchanged)."""
    out = {}
    for key, value in net.items():
        k = _strip(key)
        if k == "ccot_tokens":
            if value.numel():
                raise ConfigError(f"{where}: release option ccot: the checkpoint carries ccot tokens")
            continue
        new = _rename(k, _TOP_PARTS)
        match = re.match(r"recur_blocks\.(\d+)\.(.*)", k)
        if new is None and match:
            i, rest = int(match.group(1)), match.group(2)
            if cfg.recall == "fixed":
                inner = _rename(rest, _BLOCK_PARTS)
                new = None if inner is None else f"blocks.{i}.{inner}"
            elif i == 0:
                new = _rename(rest, _RECALL_PARTS)
                if new is None:
                    inner = _rename(rest, _BLOCK_PARTS)
                    new = None if inner is None else f"block.{inner}"
        if new is None:
            raise CheckpointError(f"{where}: weight {key} has no counterpart in this toolkit's model")
        out[new] = value
    return out


def state_dict_to_release(model: torch.nn.Module, compiled: bool = True) -> dict:
    """This toolkit's weights under the release's names (``recur_blocks.i._orig_mod.`` with ``compiled``), with
    the empty ``ccot_tokens`` buffer: the inverse of :func:`state_dict_from_release` (for round trips)."""
    cfg = model.config
    mid = "._orig_mod." if compiled else "."
    out = {"ccot_tokens": torch.zeros(0, cfg.width)}
    for key, value in model.state_dict().items():
        new = _rename(key, [(o, t) for t, o in _TOP_PARTS])
        if new is None and key.startswith("recall_map."):
            new = "recur_blocks.0" + mid + _rename(key, [(o, t) for t, o in _RECALL_PARTS])
        if new is None:
            match = re.match(r"(?:block|blocks\.(\d+))\.(.*)", key)
            i = match.group(1) or "0"
            inner = _rename(match.group(2), [(o, t) for t, o in _BLOCK_PARTS])
            if inner is None:
                raise ValueError(f"{key}: no counterpart in the release's model")
            new = f"recur_blocks.{i}{mid}{inner}"
        out[new] = value.detach().clone()
    return out


def release_model_table(cfg: ModelConfig, max_iters: int = 30) -> dict:
    """A release ``problem.model`` table describing ``cfg`` (the inverse of :func:`model_config`)."""
    norm_type, residual = ("peri", "gru") if cfg.norm == "gru" else (cfg.norm, "add")
    if cfg.norm == "none":
        raise ConfigError("the release has no norm 'none'")
    fixed = cfg.recall == "fixed"
    return {"model": "DTTransformer", "hidden_dim": cfg.width, "num_blocks": cfg.depth if fixed else 1,
            "injection_type": "linear" if cfg.recall in ("internal", "external") else "none",
            "norm_type": norm_type, "norm_before_head": True, "recall_inner": cfg.recall == "internal",
            "attn_type": "full" if cfg.attention_window is None else "local",
            "kernel_size": cfg.attention_window or 5, "init_norm": False, "num_sinks": 0, "local_attn_pad": False,
            "hidden_dropout": 0, "max_iters": 1 if fixed else max_iters, "noise_prob": 0.0, "velocity": 0,
            "residual_method": residual, "ccot": "none", "in_channels": cfg.in_channels,
            "out_channels": cfg.out_channels, "spatial_dims": cfg.spatial_ndim, "qk_normalization": cfg.qk_norm}


# ---- layouts --------------------------------------------------------------------------------------------------
def to_stability_layout(inputs: torch.Tensor) -> torch.Tensor:
    """(B, C, *spatial) release-layout inputs -> (B, *spatial, C)."""
    return inputs.movedim(1, -1)


def to_release_layout(logits: torch.Tensor) -> torch.Tensor:
    """(T, B, *spatial, C) logits of ``model(inputs, T)`` -> the release's (B, T, C, *spatial)."""
    return logits.movedim(-1, 2).movedim(0, 1)


# ---- loading --------------------------------------------------------------------------------------------------
def model_from_release(obj: dict, cfg: RunConfig, where: str = "release checkpoint") -> torch.nn.Module:
    """Build the toolkit model of ``cfg`` and load the release weights into it (eval mode)."""
    model = build_model(cfg.model)
    state = state_dict_from_release(obj["net"], cfg.model, where)
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        raise CheckpointError(f"{where}: weights do not match its config ({' '.join(lines[1:3])[:200]})") from None
    return model.eval()


def load_release(path: Path | str, obj: Optional[dict] = None, *, release_config: Optional[Path | str] = None,
                 device: str = "cpu"):
    """Load a release checkpoint (and its Hydra config) as a :class:`stability.stored.Loaded`."""
    path = Path(path)
    if obj is None:
        obj = read_torch(path)
    if not is_release_checkpoint(obj):
        raise CheckpointError(f"{path}: not a release checkpoint (no 'net' state dict)")
    cfg_path = config_path(path, release_config)
    cfg = run_config(read_config(cfg_path), where=str(cfg_path))
    model = model_from_release(obj, cfg, str(path)).to(device)
    return Loaded(model=model, config=cfg, task=make_task(cfg.task, check=False), path=path,
                  epoch=completed_epochs(obj), history=[], final=None, package_version="release")


def completed_epochs(obj: dict) -> int:
    """Epochs completed when the release saved ``obj``: its ``epoch`` is the 0-based index of the last one."""
    epoch = obj.get("epoch")
    if isinstance(epoch, bool) or not isinstance(epoch, (int, float)) or not math.isfinite(epoch) or epoch < 0:
        return 0
    return int(epoch) + 1
