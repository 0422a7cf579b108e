"""The model's and the task's tables of a run (App. B.1.1; docs/configuration.md): :class:`ModelConfig`,
:class:`TaskConfig` and the names their options take."""

from __future__ import annotations

import typing
from typing import Any, Literal, Optional

from pydantic import model_validator

from stability.config.base import _Config
from stability.config.fields import MAX_BITS, MAX_PROBES, MAX_SAMPLES, MAX_SEED, MAX_WIDTH, _f
from stability.errors import ConfigError

Recall = Literal["none", "external", "internal", "fixed"]
Norm = Literal["none", "pre", "post", "peri", "gru"]
InitialState = Literal["x0", "zeros", "noise"]
WindowEdges = Literal["shift", "cut"]
RopePrecision = Literal["float32", "float64"]
TaskName = Literal["prefix-sums", "sudoku", "chess"]

RECALLS = typing.get_args(Recall)
NORMS = typing.get_args(Norm)


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

    recall: Recall = _f("external", "none | external | internal | fixed (the fixed-depth baseline)")
    norm: Norm = _f("post", "outer/inner normalisation variant")
    width: int = _f(256, "model width d", metavar="D", ge=1, le=MAX_WIDTH)
    heads: int = _f(8, "attention heads", metavar="H", ge=1, le=MAX_PROBES)
    mlp_ratio: int = _f(4, "MLP hidden width as a multiple of d", metavar="R", ge=1, le=64)
    depth: int = _f(15, "blocks of the fixed-depth baseline", metavar="N", ge=1, le=10_000)
    in_channels: int = _f(1, "input channels (set by the task)", derived=True, ge=1, le=MAX_WIDTH)
    out_channels: int = _f(2, "output classes (set by the task)", derived=True, ge=2, le=MAX_WIDTH)
    spatial_ndim: int = _f(1, "spatial axes (set by the task)", derived=True, ge=1, le=3)
    attention_window: Optional[int] = _f(None, "local attention window (set by the task)", derived=True,
                                        ge=1, le=MAX_SAMPLES)
    rope_base: float = _f(10000.0, "RoPE frequency base", metavar="B")
    qk_norm: bool = _f(True, "RMSNorm on queries and keys")
    share_norms: bool = _f(True, "one Pre/Peri/Post instance for both sublayers, as the release")
    initial_state: InitialState = _f("x0", "first iterate e")
    noise_std: float = _f(1.0, "std of the Gaussian first iterate (initial_state noise)", metavar="S", ge=0.0)
    norm_eps: Optional[float] = _f(None, "ε of every RMSNorm (none: the dtype's machine epsilon; legacy 1e-6)",
                                   metavar="EPS", ge=0.0, le=1.0)
    window_edges: WindowEdges = _f("shift", "local window at the ends of a sequence: shift (release) or cut "
                                   "(legacy)")
    rope_precision: RopePrecision = _f("float32", "precision of the RoPE angles (legacy float64)")
    flip_rows: bool = _f(False, "the model's boards have the first spatial axis reversed (set by the release "
                         "import of a chess checkpoint; off for every model trained here)", derived=True)
    damping: float = _f(1.0, "damped loop map (1 − η)·x + η·f(x, x0), in training and at inference (1: off)",
                        metavar="ETA", ge=0.0, le=1.0)
    residual_scale: Optional[float] = _f(None, "sublayer residual (1 − β)·u + β·v, FPRM's pre-norm with residual "
                                         "scaling (none: off)", metavar="BETA", ge=0.0, le=1.0)
    conv: Optional[int] = _f(None, "depth-wise convolution of odd kernel K on the latent at the start of each loop "
                             "(none: off)", metavar="K", ge=1, le=31)

    #: values of the release-semantics fields for a config written before they existed (run_config fills them in)
    LEGACY_MODEL_VALUES: typing.ClassVar[dict[str, Any]] = {
        "norm_eps": 1e-6, "window_edges": "cut", "rope_precision": "float64"}

    @model_validator(mode="after")
    def _check(self):
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
            defaults = {n: f.default for n, f in ModelConfig.model_fields.items()}
            extra = [n for n in ("damping", "residual_scale", "conv") if getattr(self, n) != defaults[n]]
            if extra:
                raise ConfigError(f"ModelConfig: {', '.join(extra)}: options of the loop map; the fixed-depth "
                                  "baseline (recall fixed) has none")
        return self


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

    name: TaskName = _f("prefix-sums", "the task", flag="task")
    train_size: int = _f(8000, "training samples", metavar="N", ge=1, le=MAX_SAMPLES)
    val_size: int = _f(2000, "validation samples", metavar="N", ge=1, le=MAX_SAMPLES)
    hard_size: int = _f(10000, "hard samples", metavar="N", ge=1, le=MAX_SAMPLES)
    train_length: int = _f(32, "prefix sums: train/val length in bits", metavar="BITS", ge=1,
                           le=MAX_BITS)
    hard_length: int = _f(512, "prefix sums: hard length in bits", metavar="BITS", ge=1,
                          le=MAX_BITS)
    seed: int = _f(0, "seed of the generated data", metavar="S", flag="data-seed", ge=0, le=MAX_SEED)
    data_path: Optional[str] = _f(None, "a real dataset file (sudoku-extreme CSVs, Lichess CSV)", metavar="PATH")
    cache_dir: Optional[str] = _f(None, "where datasets are cached", metavar="DIR")
    engine: Optional[str] = _f(None, "UCI chess engine for the chess generator", metavar="PATH")
    sudoku_cut: Optional[float] = _f(None, "sudoku: the rating splitting easy from hard (none: the paper's rule)",
                                     metavar="R", ge=0.0)
    chess_easy_max: int = _f(1600, "chess: train/val puzzles rated at most this", metavar="R")
    chess_hard_min: int = _f(1601, "chess: hard puzzles rated at least this", metavar="R")
    chess_hard_max: int = _f(2000, "chess: hard puzzles rated at most this", metavar="R")

    @model_validator(mode="after")
    def _check(self):
        if not self.chess_easy_max < self.chess_hard_min <= self.chess_hard_max:
            raise ConfigError(
                f"TaskConfig: chess ratings need chess_easy_max < chess_hard_min <= chess_hard_max, got "
                f"{self.chess_easy_max}, {self.chess_hard_min}, {self.chess_hard_max}")
        return self
