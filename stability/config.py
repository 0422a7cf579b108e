"""Typed, validated configuration.

Every config is a frozen dataclass. ``from_dict`` refuses unknown keys and values outside the allowed ones,
naming what is allowed, so that no key is ever silently ignored (the paper's release did that).
Fields typed ``Literal[...]`` are checked against their literals; numeric fields against the ranges in
``_RANGES``.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

from stability.errors import ConfigError

Recall = Literal["none", "external", "internal", "fixed"]
Norm = Literal["none", "pre", "post", "peri", "gru"]
InitialState = Literal["x0", "zeros", "noise"]
Device = Literal["auto", "cpu", "cuda"]
WindowEdges = Literal["shift", "cut"]
RopePrecision = Literal["float32", "float64"]
DecayExempt = Literal["release", "norms"]
Method = Literal["progressive", "deep-supervision", "implicit"]
ImplicitBackward = Literal["krylov", "neumann", "one-step"]

RECALLS = typing.get_args(Recall)


def is_device_name(name: str) -> bool:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether that device exists is checked where it is used)."""
    return name in typing.get_args(Device) or (name.startswith("cuda:") and name[5:].isdigit())
NORMS = typing.get_args(Norm)


def _check_value(cls_name: str, name: str, tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    where = f"{cls_name}.{name}"
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not allowed; allowed: {', '.join(map(str, args))}")
        return value
    if origin is typing.Union and type(None) in args:  # Optional[X]
        if value is None:
            return None
        inner = [a for a in args if a is not type(None)][0]
        return _check_value(cls_name, name, inner, value)
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        return tuple(_check_value(cls_name, name, inner, v) for v in value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ConfigError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table of options, got {value!r}")
        return from_dict(tp, value)
    return value


class _Config:
    """Mixin: validation after construction, conversion to and from plain dicts."""

    _RANGES: typing.ClassVar[dict[str, tuple[Optional[float], Optional[float]]]] = {}

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = _check_value(type(self).__name__, f.name, hints[f.name], getattr(self, f.name))
            object.__setattr__(self, f.name, value)
            lo, hi = self._RANGES.get(f.name, (None, None))
            if value is not None and ((lo is not None and value < lo) or (hi is not None and value > hi)):
                lo_s = "-inf" if lo is None else lo
                hi_s = "inf" if hi is None else hi
                raise ConfigError(f"{type(self).__name__}.{f.name}: {value!r} is outside [{lo_s}, {hi_s}]")
        self.validate()

    def validate(self) -> None:  # cross-field checks
        pass

    def to_dict(self) -> dict:
        return to_dict(self)

    def replace(self, **changes: Any):
        return from_dict(type(self), {**to_dict(self), **changes})


def to_dict(cfg: Any) -> dict:
    """Plain nested dict (lists, not tuples) that ``torch.load(weights_only=True)`` and JSON accept."""
    out = {}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if dataclasses.is_dataclass(v):
            v = to_dict(v)
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out


def from_dict(cls, data: dict):
    """Build ``cls`` from a dict, refusing unknown keys (the error names the allowed ones)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{cls.__name__}: expected a table of options, got {data!r}")
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise ConfigError(f"{cls.__name__}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(names)}")
    return cls(**data)


@dataclass(frozen=True)
class ModelConfig(_Config):
    """The looped transformer of Section 5 / App. B.1.2 (the map f) and the fixed-depth baseline.

    ``recall``: none (autonomous, Def. 3.2), external (Def. 5.1), internal (Def. 5.2), or fixed (the
    fixed-depth baseline of ``depth`` distinct blocks). ``norm``: where RMSNorm sits (docs/release-differences.md).
    ``share_norms``: the release shares one Pre/Peri/Post instance between the two sublayers; the paper
    writes φ1, φ2 as two functions. We follow the release by default; set False for two.
    ``in_channels``, ``out_channels``, ``spatial_ndim`` and ``attention_window`` come from the task.

    Release semantics (docs/release-differences.md; the defaults are the paper's release, so that an imported
    release checkpoint is the same function; a checkpoint written before these fields existed loads with the
    legacy values in ``LEGACY_MODEL_VALUES``, and behaves as it did):
    ``window_edges``: the local window at the ends of a sequence. shift (release): every query sees exactly
    ``attention_window`` keys, the window shifted inward at the ends, per spatial axis on boards; cut (legacy):
    the band |i − j| ≤ window//2 over the flattened positions, cut at the ends.
    ``norm_eps``: ε of every RMSNorm (norm sites, QK-norm, head). None (release): the machine epsilon of the
    input's dtype (1.19e-7 in float32, 2.2e-16 in float64); a number (legacy 1e-6): that constant.
    ``rope_precision``: RoPE angles and their cos/sin computed in float32 (release) or float64 (legacy), then
    cast to the activations' dtype.
    ``flip_rows``: the model's own board layout has the first spatial axis reversed relative to the task's (an
    imported release chess checkpoint: the release's row 0 is rank 8, this toolkit's rank 1); ``embed`` flips the
    inputs and ``readout`` flips the logits back on that axis, so the model reads and answers in the task's
    layout. False for every model trained here.

    Fixed-Point Reasoner options (all off by default, so the paper's map is unchanged):
    ``damping`` η: the loop map is the damped z ← (1 − η) z + η f(z, x0) (FPRM App. A.3; same fixed points,
    Jacobian (1 − η) I + η J). It is part of the map, so training, evaluation, solvers and analysis all iterate
    the same damped map. ``residual_scale`` β: each sublayer's residual u + v becomes (1 − β)·u + β·v, the
    pre-norm with residual scaling of FPRM Theorem 1 / App. B (not with the GRU residual). ``conv``: kernel size
    of a depth-wise convolution applied to the latent at the start of each loop, x ← x + DWConv(x), 1-D for
    sequences, 2-D for boards (FPRM App. C); None = off.
    """

    recall: Recall = "external"
    norm: Norm = "post"
    width: int = 256
    heads: int = 8
    mlp_ratio: int = 4
    depth: int = 15
    in_channels: int = 1
    out_channels: int = 2
    spatial_ndim: int = 1
    attention_window: Optional[int] = None
    rope_base: float = 10000.0
    qk_norm: bool = True
    share_norms: bool = True
    initial_state: InitialState = "x0"
    noise_std: float = 1.0
    norm_eps: Optional[float] = None
    window_edges: WindowEdges = "shift"
    rope_precision: RopePrecision = "float32"
    flip_rows: bool = False
    damping: float = 1.0
    residual_scale: Optional[float] = None
    conv: Optional[int] = None

    _RANGES = {
        "width": (1, None),
        "heads": (1, None),
        "mlp_ratio": (1, None),
        "depth": (1, None),
        "in_channels": (1, None),
        "out_channels": (2, None),
        "spatial_ndim": (1, 3),
        "attention_window": (1, None),
        "noise_std": (0.0, None),
        "norm_eps": (0.0, 1.0),
        "damping": (0.0, 1.0),
        "residual_scale": (0.0, 1.0),
        "conv": (1, 31),
    }

    #: values of the release-semantics fields for a config written before they existed (run_config fills them in)
    LEGACY_MODEL_VALUES: typing.ClassVar[dict[str, Any]] = {
        "norm_eps": 1e-6, "window_edges": "cut", "rope_precision": "float64"}

    def validate(self) -> None:
        if self.flip_rows and self.spatial_ndim < 2:
            raise ConfigError("ModelConfig.flip_rows: only for boards (spatial_ndim >= 2)")
        if self.norm_eps == 0.0:
            raise ConfigError("ModelConfig.norm_eps: must be positive, or None for the dtype's machine epsilon")
        if self.width % self.heads:
            raise ConfigError(f"ModelConfig.width: {self.width} must be divisible by heads={self.heads}")
        head_dim = self.width // self.heads
        if head_dim % (2 * self.spatial_ndim):
            raise ConfigError(
                f"ModelConfig: head dimension {head_dim} must be divisible by 2*spatial_ndim="
                f"{2 * self.spatial_ndim} for multidimensional RoPE"
            )
        if self.attention_window is not None and self.attention_window % 2 == 0:
            raise ConfigError("ModelConfig.attention_window: must be odd (a symmetric window around each token)")
        if self.damping == 0.0:
            raise ConfigError("ModelConfig.damping: η must be in (0, 1] (η = 0 never moves the state)")
        if self.residual_scale is not None:
            if self.residual_scale == 0.0:
                raise ConfigError("ModelConfig.residual_scale: β must be in (0, 1] (β = 0 ignores every sublayer)")
            if self.norm == "gru":
                raise ConfigError("ModelConfig.residual_scale: the GRU residual has no additive residual to scale; "
                                  "use norm none, pre, peri or post")
        if self.conv is not None and self.conv % 2 == 0:
            raise ConfigError("ModelConfig.conv: the kernel size must be odd (a symmetric neighbourhood)")
        if self.recall == "fixed":
            defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
            extra = [n for n in ("damping", "residual_scale", "conv") if getattr(self, n) != defaults[n]]
            if extra:
                raise ConfigError(f"ModelConfig: {', '.join(extra)}: options of the loop map; the fixed-depth "
                                  "baseline (recall fixed) has none")


@dataclass(frozen=True)
class TaskConfig(_Config):
    """Which task and its sizes. Options a task does not use must stay at their defaults (checked by the task).

    ``name``: prefix-sums, sudoku or chess. ``train_length`` / ``hard_length``: prefix-sums bit lengths.
    ``data_path``: a real dataset file (sudoku-extreme CSV directory or file, Lichess CSV); ``cache_dir``:
    where generated or split data is cached. ``engine``: path of a UCI engine for the chess generator.
    ``sudoku_cut``: the rating that splits easy from hard sudoku; None = the paper's rule (the 80th percentile
    of the real train file's ratings, 38 for sudoku-extreme; 38 for generated data). ``chess_easy_max``,
    ``chess_hard_min``, ``chess_hard_max``: train/val take puzzles rated ≤ chess_easy_max, hard those in
    [chess_hard_min, chess_hard_max] (the paper's 1600 / 1601–2000). Sudoku and chess use train_size, val_size,
    hard_size as given (the paper's are 40000 / 10000 / 10000: ``Task.paper_sizes``).
    """

    name: Literal["prefix-sums", "sudoku", "chess"] = "prefix-sums"
    train_size: int = 8000
    val_size: int = 2000
    hard_size: int = 10000
    train_length: int = 32
    hard_length: int = 512
    seed: int = 0
    data_path: Optional[str] = None
    cache_dir: Optional[str] = None
    engine: Optional[str] = None
    sudoku_cut: Optional[float] = None
    chess_easy_max: int = 1600
    chess_hard_min: int = 1601
    chess_hard_max: int = 2000

    _RANGES = {
        "sudoku_cut": (0.0, None),
        "train_size": (1, None),
        "val_size": (1, None),
        "hard_size": (1, None),
        "train_length": (1, None),
        "hard_length": (1, None),
        "seed": (0, None),
    }

    def validate(self) -> None:
        if not self.chess_easy_max < self.chess_hard_min <= self.chess_hard_max:
            raise ConfigError(
                f"TaskConfig: chess ratings need chess_easy_max < chess_hard_min <= chess_hard_max, got "
                f"{self.chess_easy_max}, {self.chess_hard_min}, {self.chess_hard_max}")


@dataclass(frozen=True)
class TrainConfig(_Config):
    """Training as in App. B.1.2 and docs/release-differences.md: progressive loss (α, T), AdamW, warm-up, cool-down.

    ``warmup_epochs``: the LR factor is 1 − exp(−(e+1)/10) for epochs e < warmup_epochs, then 1.
    ``decay_exempt``: which parameters escape AdamW's weight decay: release (biases and norm gains except the
    output head's RMSNorm gain, which the release decays) or norms (all biases and norm gains; the legacy value
    of checkpoints written before the option existed; docs/release-differences.md).
    ``cooldown_at``: fraction of the epochs after which the LR is multiplied by ``cooldown_factor``.
    ``eval_every``: evaluate on val/hard every this many epochs (0 = only at the end), at iterations
    1..``eval_iterations``; the final evaluation runs to ``test_iterations``. ``monitor_every``: every this
    many epochs (0 = never) log the stability monitor on a fixed probe of ``monitor_samples`` val samples.

    ``method``: progressive (the loss above; ``alpha``), deep-supervision (FPRM App. C: every
    ``supervision_interval`` iterations (None = ``bptt_steps``) decode, take the loss and back-propagate through
    the ``bptt_steps`` latest iterations, one optimizer step per segment, until each sample's relative L∞
    residual is below ``halt_tol`` or ``iterations`` are spent), or implicit (Attractor Models / DEQ: x* by
    Anderson acceleration to ``solver_tol`` within ``iterations`` evaluations, memory ``anderson_memory``;
    gradient by the implicit function theorem, ``implicit_backward`` krylov (GMRES on (I − Jᵀ) u = ∂L/∂x*),
    neumann (u ← Jᵀu + ∂L/∂x*), or one-step (Jacobian-free: through one application of f at x*), solved to
    ``backward_tol`` within ``backward_iterations`` products, or, with ``backward_max_iterations`` > 0 (the
    adaptive budget, the default), until ``backward_tol`` or the larger of the two; Jacobian regularisation
    ``jac_reg`` · ‖J‖_F²/n estimated with ``jac_reg_probes`` Gaussian probes). ``iterations`` is every method's cap on the loop.
    Options of one method must stay at their defaults with the others.
    """

    method: Method = "progressive"
    lr: float = 1e-4
    epochs: int = 100
    batch_size: int = 500
    iterations: int = 30
    alpha: float = 1.0
    weight_decay: float = 0.01
    adam_eps: float = 1e-8
    betas: tuple[float, ...] = (0.9, 0.999)
    decay_exempt: DecayExempt = "release"
    warmup_epochs: int = 9
    cooldown_at: float = 0.6
    cooldown_factor: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "auto"  # auto, cpu, cuda or cuda:N (checked in validate)
    compile: bool = False
    bf16: bool = True
    eval_every: int = 0
    eval_iterations: int = 60
    test_iterations: int = 500
    eval_batch_size: int = 1000
    monitor_every: int = 0
    monitor_samples: int = 16
    bptt_steps: int = 5
    supervision_interval: Optional[int] = None
    halt_tol: float = 0.1
    solver_tol: float = 1e-3
    anderson_memory: int = 5
    implicit_backward: ImplicitBackward = "krylov"
    backward_tol: float = 1e-4
    backward_iterations: int = 30
    backward_max_iterations: int = 150  # measured on sudoku-size maps: benchmarks/RESULTS.md, "Implicit backward"
    jac_reg: float = 0.0
    jac_reg_probes: int = 1

    _RANGES = {
        "lr": (0.0, None),
        "epochs": (1, None),
        "batch_size": (1, None),
        "iterations": (1, None),
        "alpha": (0.0, 1.0),
        "weight_decay": (0.0, None),
        "adam_eps": (0.0, None),
        "warmup_epochs": (0, None),
        "cooldown_at": (0.0, 1.0),
        "cooldown_factor": (0.0, 1.0),
        "grad_clip": (0.0, None),
        "seed": (0, None),
        "eval_every": (0, None),
        "eval_iterations": (1, None),
        "test_iterations": (1, None),
        "eval_batch_size": (1, None),
        "monitor_every": (0, None),
        "monitor_samples": (1, None),
        "bptt_steps": (1, None),
        "supervision_interval": (1, None),
        "halt_tol": (0.0, None),
        "solver_tol": (0.0, None),
        "anderson_memory": (1, None),
        "backward_tol": (0.0, None),
        "backward_iterations": (1, None),
        "backward_max_iterations": (0, None),
        "jac_reg": (0.0, None),
        "jac_reg_probes": (1, None),
    }

    #: the options only one method reads
    METHOD_OPTIONS: typing.ClassVar[dict[str, tuple[str, ...]]] = {
        "progressive": ("alpha",),
        "deep-supervision": ("bptt_steps", "supervision_interval", "halt_tol"),
        "implicit": ("solver_tol", "anderson_memory", "implicit_backward", "backward_tol", "backward_iterations",
                     "backward_max_iterations", "jac_reg", "jac_reg_probes"),
    }

    def validate(self) -> None:
        if not is_device_name(self.device):
            raise ConfigError(f"TrainConfig.device: {self.device!r} is not allowed; allowed: auto, cpu, cuda, cuda:N")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"TrainConfig.betas: expected two numbers in [0, 1), got {list(self.betas)}")
        defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        for method, names in self.METHOD_OPTIONS.items():
            if method == self.method:
                continue
            for name in names:
                if getattr(self, name) != defaults[name]:
                    raise ConfigError(f"TrainConfig.{name}: only the {method} method uses it, not {self.method} "
                                      f"(leave it at {defaults[name]!r} or choose method {method})")
        if self.compile and self.method != "progressive":
            raise ConfigError(f"TrainConfig.compile: not with method {self.method}: its batches shrink as samples "
                              "halt or converge, and a compiled loop map recompiles for every batch size; use "
                              "--no-compile")
        if self.supervision_interval is not None and self.supervision_interval < self.bptt_steps:
            raise ConfigError(f"TrainConfig.supervision_interval: T_sup = {self.supervision_interval} must be at "
                              f"least bptt_steps k = {self.bptt_steps} (gradient flows through the k latest "
                              "iterations of each segment)")
        if self.halt_tol == 0.0 or self.solver_tol == 0.0 or self.backward_tol == 0.0:
            zero = [n for n in ("halt_tol", "solver_tol", "backward_tol") if getattr(self, n) == 0.0][0]
            raise ConfigError(f"TrainConfig.{zero}: a tolerance must be positive")
        if self.implicit_backward == "one-step":
            for name in ("backward_tol", "backward_iterations", "backward_max_iterations"):
                if getattr(self, name) != defaults[name]:
                    raise ConfigError(f"TrainConfig.{name}: the one-step backward solves no linear system; "
                                      "leave it at its default or use implicit_backward krylov or neumann")
        if self.jac_reg == 0.0 and self.jac_reg_probes != defaults["jac_reg_probes"]:
            raise ConfigError("TrainConfig.jac_reg_probes: Jacobian regularisation is off (jac_reg 0); set "
                              "jac_reg > 0 or leave the probes at their default")


@dataclass(frozen=True)
class RunConfig(_Config):
    """Everything a checkpoint needs to rebuild its run: model, task, training."""

    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        if self.model.recall == "fixed" and self.train.method != "progressive":
            raise ConfigError(f"TrainConfig.method: {self.train.method} iterates a loop map; the fixed-depth "
                              "baseline (recall fixed) has none, so it trains with the progressive method only")
