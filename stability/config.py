"""Typed, validated configuration: the one schema from which the CLI flags, the TOML keys, the checkpoint's config
block and the validation derive (docs/configuration.md).

Every config is a frozen pydantic v2 model with ``extra="forbid"``: an unknown key is an error naming the allowed
ones, so that no key is ever silently ignored (the paper's release did that). Each field carries its help text
(``Field(description=...)``) and, where useful, its CLI ``metavar``/``flag`` (``json_schema_extra``); ranges are
``ge``/``le`` bounds; cross-field checks are ``model_validator``\\ s. Any failure is one :class:`ConfigError` line in
the style ``ModelConfig.width: 0 is outside [1, inf]`` (:func:`_message` converts pydantic's ValidationError).

``TrainConfig.method`` is a discriminated union (on ``name``) of :class:`Progressive`, :class:`DeepSupervision` and
:class:`Implicit`: the options of a method live in its block (``{"name": "implicit", "solver_tol": 1e-4}``; in TOML
``[train.method]``), so an explicit value is never an error, and an option of another method, or one given beside
the other train options, is refused naming the method and the table that has it. :func:`dotted` names every option
by its path (``train.method.solver_tol``): the keys of ``--where`` filters, of table columns and of config diffs.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

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
TaskName = Literal["prefix-sums", "sudoku", "chess"]

RECALLS = typing.get_args(Recall)
NORMS = typing.get_args(Norm)
METHODS = typing.get_args(Method)

# The largest value of each kind of count (issue 33): a value past them cannot finish (memory or time) and would
# otherwise fail late, or grow memory without a word; every count of the schema has one of them as its `le` bound,
# so a run file, a grid (its dry run too) and a flag are refused before anything is allocated. Each is far above
# any run this toolkit has made (the paper's: 100 epochs, 40,000 samples, 512 bits, width 512, 500 iterations).
MAX_EPOCHS = 100_000  # epochs, warm-up, evaluation and monitor periods
MAX_SAMPLES = 10_000_000  # dataset sizes, batch sizes, sample counts
MAX_ITERATIONS = 1_000_000  # loop iterations, solver and adjoint budgets
MAX_BITS = 65_536  # prefix-sums string lengths
MAX_WIDTH = 65_536  # model width
MAX_PROBES = 1024  # random probes (Hutchinson's error is ~3 % at 1024), history lengths, heads
MAX_DIRECTIONS = 10_000  # the geometry stage's directions, certified radii, the repelling stage's starts
MAX_SEED = 2**63 - 1  # torch's generators take 64-bit seeds
MAX_WORKERS = 1024  # processes side by side (a sweep's workers or GPUs, the analysis' split processes)


def is_device_name(name: str) -> bool:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether that device exists is checked where it is used)."""
    return name in typing.get_args(Device) or (name.startswith("cuda:") and name[5:].isdigit())


def resolve_device(name: str):
    """The ``torch.device`` a device name means: ``auto`` (cuda when available), ``cpu``, ``cuda`` or ``cuda:N``;
    a CUDA device that is not here is refused with one line naming the ones that are (every command's
    ``--device``)."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not is_device_name(name):
        raise ConfigError(f"device {name!r}: expected auto, cpu, cuda or cuda:N")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"device {name}: no CUDA device is available here; use --device cpu")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"device {name}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return device


def _f(default: Any, help: str, *, metavar: Optional[str] = None, flag: Optional[str] = None, derived: bool = False,
       why: Optional[str] = None, **bounds: Any) -> Any:
    """A schema field: default, help text, CLI metavar / flag name (default: ``--field-name``), bounds (ge, le).
    ``derived``: decided by the task (``Task.model_options``) or the release import, so no flag sets it. ``why``:
    the reason for the upper bound, said when a flag passes it (:func:`stability.commands._types.check_maxima`)."""
    extra = {k: v for k, v in (("metavar", metavar), ("flag", flag), ("derived", derived or None), ("why", why))
             if v is not None}
    return Field(default, description=help, json_schema_extra=extra or None, **bounds)


def _list_to_tuple(value: Any) -> Any:
    """TOML and JSON give lists where a field is a tuple."""
    return tuple(value) if isinstance(value, list) else value


class _Config(BaseModel):
    """Base: frozen, unknown keys refused, strict types (no str → number, no bool → int), finite numbers; one-line
    :class:`ConfigError` on any bad value. ``error_style``: how that line names the place: ``owner``
    (``ModelConfig.width``: the innermost table's class and the field; the run's options) or ``path`` (the keys
    from the root, list items by their ``id`` or index: ``claim 'c'.a.norm[0]``; the claims file, the sweep
    record)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    error_style: typing.ClassVar[Literal["owner", "path"]] = "owner"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_message(type(self), exc, data)) from None

    # pydantic validates a nested table without calling this __init__, so the outermost one translates the error
    # with its whole location (a claim's place in the claims file, a split's in a record)
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def to_dict(self) -> dict:
        return to_dict(self)

    def replace(self, **changes: Any):
        return from_dict(type(self), {**to_dict(self), **changes})


def _plain(v: Any) -> Any:
    if isinstance(v, BaseModel):
        return to_dict(v)
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v


def to_dict(cfg: Any) -> dict:
    """Plain nested dict (lists, not tuples) that ``torch.load(weights_only=True)`` and JSON accept."""
    return {name: _plain(getattr(cfg, name)) for name in type(cfg).model_fields}


def shortest_e(v: float) -> str:
    """v in e-notation with the fewest significant digits that give it back: ``2.5e-03`` (not ``3e-03``)."""
    return next((t for t in (f"{v:.{d}e}" for d in range(17)) if float(t) == v), repr(v))


def short_number(v: float) -> str:
    """A rate as cell ids and file names write it: ``1e-3``, ``2.5e-3`` (not ``3e-3``)."""
    return shortest_e(v).replace("e-0", "e-").replace("e+0", "e")


def from_dict(cls, data: dict):
    """Build ``cls`` from a dict, refusing unknown keys (the error names the allowed ones)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{cls.__name__}: expected a table of options, got {data!r}")
    return cls(**data)


# ---- methods ------------------------------------------------------------------------------------------------
class _MethodConfig(_Config):
    """A training method's options (errors name them ``TrainConfig.<option>``, as their flags ``--<option>``)."""

    owner_name: typing.ClassVar[str] = "TrainConfig"


class Progressive(_MethodConfig):
    """The progressive loss of App. B.1.2: the loss at T plus, with weight α, at a random n + k ≤ T."""

    name: Literal["progressive"] = "progressive"
    alpha: float = _f(1.0, "progressive-loss weight α", ge=0.0, le=1.0)


class DeepSupervision(_MethodConfig):
    """Deep supervision with truncated BPTT (FPRM App. C): every ``supervision_interval`` iterations (None =
    ``bptt_steps``) decode, take the loss and back-propagate through the ``bptt_steps`` latest iterations, one
    optimizer step per segment, until each sample's relative L∞ residual is below ``halt_tol`` or ``iterations``
    are spent."""

    name: Literal["deep-supervision"] = "deep-supervision"
    bptt_steps: int = _f(5, "iterations back-propagated per segment", metavar="K", ge=1,
                         le=MAX_ITERATIONS)
    supervision_interval: Optional[int] = _f(None, "iterations per supervised segment, at least K (default K)",
                                             metavar="T", ge=1, le=MAX_ITERATIONS)
    halt_tol: float = _f(0.1, "a sample stops once its relative L∞ residual is below TAU", metavar="TAU", ge=0.0)

    @model_validator(mode="after")
    def _check(self):
        if self.supervision_interval is not None and self.supervision_interval < self.bptt_steps:
            raise ConfigError(f"TrainConfig.supervision_interval: T_sup = {self.supervision_interval} must be at "
                              f"least bptt_steps k = {self.bptt_steps} (gradient flows through the k latest "
                              "iterations of each segment)")
        if self.halt_tol == 0.0:
            raise ConfigError("TrainConfig.halt_tol: a tolerance must be positive")
        return self


class Implicit(_MethodConfig):
    """Implicit (equilibrium) training, Attractor Models / DEQ: x* by Anderson acceleration to ``solver_tol``
    within ``iterations`` evaluations; the gradient by the implicit function theorem, the adjoint solve
    (I − Jᵀ) u = ∂L/∂x* by GMRES (krylov), the Neumann series u ← Jᵀu + ∂L/∂x*, or one-step (Jacobian-free: through
    one application of f at x*), to ``backward_tol`` within ``backward_iterations`` products, or, with
    ``backward_max_iterations`` > 0 (the adaptive budget, the default), until ``backward_tol`` or the larger of the
    two; Jacobian regularisation ``jac_reg`` · ‖J‖_F²/n estimated with ``jac_reg_probes`` Gaussian probes."""

    name: Literal["implicit"] = "implicit"
    solver_tol: float = _f(1e-3, "Anderson forward-solve tolerance", metavar="TOL", ge=0.0)
    anderson_memory: int = _f(5, "Anderson history length", metavar="M", ge=1, le=MAX_PROBES)
    implicit_backward: ImplicitBackward = _f("krylov", "adjoint solve (I − Jᵀ) u = ∂L/∂x*: GMRES, Neumann series, "
                                             "or one-step")
    backward_tol: float = _f(1e-4, "adjoint-solve relative tolerance", metavar="TOL", ge=0.0)
    backward_iterations: int = _f(30, "adjoint-solve products with Jᵀ when --backward-max-iterations is 0",
                                  metavar="N", ge=1, le=MAX_ITERATIONS)
    # measured on sudoku-size maps: benchmarks/RESULTS.md, "Implicit backward"
    backward_max_iterations: int = _f(150, "adaptive adjoint budget: iterate until --backward-tol or max(N, "
                                      "--backward-iterations) products; 0: the fixed --backward-iterations",
                                      metavar="N", ge=0, le=MAX_ITERATIONS)
    jac_reg: float = _f(0.0, "weight of the ‖J‖_F²/n regulariser at x* (0: off)", metavar="W", ge=0.0)
    jac_reg_probes: int = _f(1, "Hutchinson probes of the regulariser", metavar="N", ge=1,
                            le=MAX_PROBES)

    @model_validator(mode="after")
    def _check(self):
        zero = [n for n in ("solver_tol", "backward_tol") if getattr(self, n) == 0.0]
        if zero:
            raise ConfigError(f"TrainConfig.{zero[0]}: a tolerance must be positive")
        defaults = {n: f.default for n, f in Implicit.model_fields.items()}
        if self.implicit_backward == "one-step":
            for name in ("backward_tol", "backward_iterations", "backward_max_iterations"):
                if getattr(self, name) != defaults[name]:
                    raise ConfigError(f"TrainConfig.{name}: the one-step backward solves no linear system; "
                                      "leave it at its default or use implicit_backward krylov or neumann")
        if self.jac_reg == 0.0 and self.jac_reg_probes != defaults["jac_reg_probes"]:
            raise ConfigError("TrainConfig.jac_reg_probes: Jacobian regularisation is off (jac_reg 0); set "
                              "jac_reg > 0 or leave the probes at their default")
        return self


#: method name -> its options class
METHOD_CLASSES: dict[str, type] = {"progressive": Progressive, "deep-supervision": DeepSupervision,
                                   "implicit": Implicit}
#: the options only one method reads (method name -> option names), derived from the method classes
METHOD_OPTIONS: dict[str, tuple[str, ...]] = {m: tuple(n for n in c.model_fields if n != "name")
                                              for m, c in METHOD_CLASSES.items()}
#: option name -> the method that has it
OPTION_METHOD: dict[str, str] = {o: m for m, opts in METHOD_OPTIONS.items() for o in opts}
MethodConfig = Annotated[Union[Progressive, DeepSupervision, Implicit], Field(discriminator="name")]


# ---- the run ------------------------------------------------------------------------------------------------
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


class TrainConfig(_Config):
    """Training as in App. B.1.2 and docs/release-differences.md: AdamW, warm-up, cool-down, and the ``method``.

    ``warmup_epochs``: the LR factor is 1 − exp(−(e+1)/10) for epochs e < warmup_epochs, then 1.
    ``decay_exempt``: which parameters escape AdamW's weight decay: release (biases and norm gains except the
    output head's RMSNorm gain, which the release decays) or norms (all biases and norm gains; the legacy value
    of checkpoints written before the option existed; docs/release-differences.md).
    ``cooldown_at``: fraction of the epochs after which the LR is multiplied by ``cooldown_factor``.
    ``eval_every``: evaluate on val/hard every this many epochs (0 = only at the end), at iterations
    1..``eval_iterations``; the final evaluation runs to ``test_iterations``. ``monitor_every``: every this
    many epochs (0 = never) log the stability monitor on a fixed probe of ``monitor_samples`` val samples.
    ``method``: the method and its options, :class:`Progressive`, :class:`DeepSupervision` or :class:`Implicit`
    (a block, ``method={"name": "implicit", "solver_tol": 1e-4}``, or ``method=Implicit(solver_tol=1e-4)``).
    ``iterations`` is every method's cap on the loop.
    """

    method: MethodConfig = Field(Progressive(), description="the training method and its options: progressive "
                                 "loss, deep supervision with truncated BPTT (FPRM), or implicit (equilibrium, "
                                 "Anderson forward, implicit-function-theorem backward)")
    lr: float = _f(1e-4, "peak learning rate", gt=0.0)
    epochs: int = _f(100, "epochs", metavar="N", ge=1, le=MAX_EPOCHS)
    batch_size: int = _f(500, "batch size", metavar="N", ge=1, le=MAX_SAMPLES)
    iterations: int = _f(30, "maximum training iterations T of every method", metavar="T", ge=1,
                        le=MAX_ITERATIONS)
    weight_decay: float = _f(0.01, "AdamW weight decay", metavar="W", ge=0.0)
    adam_eps: float = _f(1e-8, "AdamW ε", metavar="EPS", ge=0.0)
    betas: Annotated[tuple[float, ...], BeforeValidator(_list_to_tuple)] = _f((0.9, 0.999), "AdamW β1,β2", metavar="B1,B2")
    decay_exempt: DecayExempt = _f("release", "parameters without weight decay: release (biases, norm gains but "
                                   "the head's) or norms (legacy: all biases and norm gains)")
    warmup_epochs: int = _f(9, "epochs of LR warm-up, factor 1 − exp(−(e+1)/10) in epoch e < N (0: none)",
                            metavar="N", ge=0, le=MAX_EPOCHS)
    cooldown_at: float = _f(0.6, "the LR is multiplied by the cooldown factor from epoch ⌊F · epochs⌋ on (1: never)",
                            metavar="F", ge=0.0, le=1.0)
    cooldown_factor: float = _f(0.1, "LR factor of the cooldown", metavar="C", ge=0.0, le=1.0)
    grad_clip: float = _f(1.0, "gradient-norm clip", metavar="G", ge=0.0)
    seed: int = _f(0, "seed of initialisation and data order", metavar="S", ge=0, le=MAX_SEED)
    device: str = _f("auto", "auto (cuda when available), cpu, cuda or cuda:N", metavar="DEV")
    compile: bool = _f(False, "torch.compile the loop map (progressive only)")
    bf16: bool = _f(True, "bf16 autocast on CUDA (the CPU always trains in float32)")
    eval_every: int = _f(0, "evaluate every N epochs (0: only at the end)", metavar="N", ge=0,
                       le=MAX_EPOCHS)
    eval_iterations: int = _f(60, "iterations of the periodic evaluations", metavar="T", ge=1,
                            le=MAX_ITERATIONS)
    test_iterations: int = _f(500, "iterations of the final evaluation (announced with an estimate when long)",
                              metavar="T", ge=1, le=MAX_ITERATIONS)
    eval_batch_size: int = _f(1000, "evaluation batch size", metavar="N", ge=1, le=MAX_SAMPLES)
    monitor_every: int = _f(0, "log ρ(W_x), median ρ(J*), converged fraction, ‖dx*/dx0‖ every N epochs (0: off)",
                            metavar="N", ge=0, le=MAX_EPOCHS)
    monitor_samples: int = _f(16, "probe size of the stability monitor", metavar="N", ge=1,
                              le=MAX_SAMPLES)
    train_accuracy_samples: int = _f(0, "after every epoch, whole-answer accuracy on the first N training inputs at "
                                     "iteration T, the training depth (0: off)", metavar="N", ge=0,
                                     le=MAX_SAMPLES)

    @model_validator(mode="after")
    def _check(self):
        if not is_device_name(self.device):
            raise ConfigError(f"TrainConfig.device: {self.device!r} is not allowed; allowed: auto, cpu, cuda, cuda:N")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"TrainConfig.betas: expected two numbers in [0, 1), got {list(self.betas)}")
        if self.compile and self.method.name != "progressive":
            raise ConfigError(f"TrainConfig.compile: not with method {self.method.name}: its batches shrink as "
                              "samples halt or converge, and a compiled loop map recompiles for every batch size; "
                              "use --no-compile")
        return self


class EnsembleOptions(_Config):
    """How ``stability train --seeds`` runs its members (issue 37); not a run's option, so never in a checkpoint's
    config. ``processes``: the members split across this many processes, each training its share in one batched
    step with one thread on the CPU (``None``, the flag's ``auto`` and the default: one per core torch may use,
    min(cores, torch's threads, members), on the CPU; 1 on CUDA)."""

    #: the fields with a flag of ``stability train``
    FLAGS: typing.ClassVar[tuple[str, ...]] = ("processes",)

    processes: Optional[int] = _f(None, "with --seeds: split the members across N processes, one thread each on the "
                                  "CPU (auto: one per core torch may use, up to the members; 1 on CUDA)",
                                  metavar="N|auto", ge=1, le=MAX_WORKERS)


class RunConfig(_Config):
    """Everything a checkpoint needs to rebuild its run: model, task, training."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="the looped transformer")
    task: TaskConfig = Field(default_factory=TaskConfig, description="the task and its sizes")
    train: TrainConfig = Field(default_factory=TrainConfig, description="training")

    @model_validator(mode="after")
    def _check(self):
        if self.model.recall == "fixed" and self.train.method.name != "progressive":
            raise ConfigError(f"TrainConfig.method: {self.train.method.name} iterates a loop map; the fixed-depth "
                              "baseline (recall fixed) has none, so it trains with the progressive method only")
        return self


#: named starting points of a run (``stability train --preset NAME``): options applied over the defaults, under a
#: ``--config`` file and the flags, which override them (docs/training.md, "Presets"). ``cpu``: the demo's size
#: (stability/demo.py), so that a run finishes in minutes on a laptop's CPU: width 32 with 4 heads, 45 epochs of
#: 1,000 samples in batches of 50 at LR 3e-3 (no warm-up, cooldown at 80 %), 8 training iterations, val and hard
#: of 200 samples, the final evaluation to 60 iterations, on the CPU; for prefix sums 11-bit train/val strings and
#: 16-bit hard ones (the paper's 32 / 512). Recall and norm, the experiment's axes, are left to the flags.
PRESETS: dict[str, dict[str, dict]] = {
    "cpu": {"model": {"width": 32, "heads": 4},
            "task": {"train_size": 1000, "val_size": 200, "hard_size": 200, "train_length": 11, "hard_length": 16},
            "train": {"lr": 3e-3, "epochs": 45, "warmup_epochs": 0, "cooldown_at": 0.8, "batch_size": 50,
                      "iterations": 8, "test_iterations": 60, "device": "cpu"}},
}
#: the preset options only one task reads (prefix sums' bit lengths): left out for the other tasks
_PRESET_TASK_ONLY = {"train_length": "prefix-sums", "hard_length": "prefix-sums"}


def preset(name: str, task: str = "prefix-sums") -> dict[str, dict]:
    """The options of preset ``name`` for ``task`` as ``{section: {option: value}}`` (a task's own options only for
    that task); an unknown name is one :class:`ConfigError` line naming the presets."""
    if name not in PRESETS:
        raise ConfigError(f"--preset {name!r}: unknown; allowed: {', '.join(PRESETS)}")
    out = {section: dict(options) for section, options in PRESETS[name].items()}
    out["task"] = {k: v for k, v in out["task"].items() if _PRESET_TASK_ONLY.get(k, task) == task}
    return out


class SweepSummary(_Config):
    """How a sweep summarises each cell after training (a grid file's ``[summary]`` table; ``stability sweep``'s
    flags of the same names override it): ``summary`` analyze (the analysis pipeline on the first
    ``analyze_samples`` samples of ``analyze_splits``, its solver budget ``analyze_max_iter``) or monitor (the
    stability monitor's four quantities only); ``reproducible``: every cell with pinned CPU kernels (the global
    ``--reproducible``); ``analyze_geometry``: the analysis adds the geometry stage; ``analyze_path_independence``
    and ``analyze_drift`` (issue 38): the path-independence stage and the drifting status; ``ensemble`` (issue 37):
    ``auto`` trains each group of cells that differ only in seeds and learning rates as one batched ensemble. The
    same options reach the runner, each cell file and each record's ``options`` (:meth:`to_record`,
    :meth:`from_record`: the splits as a list; ``ensemble`` stays out)."""

    owner_name: typing.ClassVar[str] = "summary"
    #: the fields with a flag of ``stability sweep`` (the others: ``--reproducible``, or the grid file only)
    FLAGS: typing.ClassVar[tuple[str, ...]] = ("summary", "analyze_samples", "analyze_splits", "analyze_max_iter",
                                               "ensemble")

    summary: Literal["analyze", "monitor"] = _f("analyze", "after training: the analysis pipeline, or only the "
                                                "monitor's four quantities")
    analyze_samples: int = _f(8, "samples per split of the analysis (0: the monitor summary only)", metavar="N",
                              ge=0, le=MAX_SAMPLES)
    analyze_splits: Literal["val", "hard", "both"] = _f("val", "splits the analysis covers")
    analyze_max_iter: int = _f(500, "fixed-point solver budget of the analysis", metavar="N", ge=1,
                              le=MAX_ITERATIONS)
    reproducible: bool = _f(False, "every cell with pinned CPU kernels (README: Reproducibility)")
    analyze_geometry: bool = _f(False, "the analysis adds the geometry stage (docs/analysis.md)")
    # issue 38, the third edition's grid: off for every grid before it (their records keep their shape and bits)
    analyze_path_independence: bool = _f(False, "the analysis adds the path_independence stage (Anil et al. 2022's "
                                         "asymptotic alignment; docs/analysis.md)")
    analyze_drift: bool = _f(False, "the analysis names drifting states in reachability (AnalysisOptions.drift; "
                             "docs/analysis.md)")
    # issue 37: how cells are trained, not summarised; never in a record's options (a member's record has its own
    # ``ensemble`` note), so records of every other sweep keep their shape and bits
    ensemble: Literal["off", "auto"] = _f("off", "auto: the cells that differ only in seed, learning rate and data "
                                          "seed train as one batched ensemble per group (docs/experiments.md)")

    #: ``analyze_splits`` -> the splits it analyses, in order (the record's form of it)
    SPLITS: typing.ClassVar[dict[str, tuple[str, ...]]] = {"val": ("val",), "hard": ("hard",), "both": ("val", "hard")}

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits the analysis covers, in order."""
        return self.SPLITS[self.analyze_splits]

    def to_record(self) -> dict:
        """The form a sweep record's ``options`` and a cell file hold: ``analyze_splits`` as the list of splits,
        ``reproducible``, ``analyze_geometry`` and issue 38's two only when set (the records of grids that never
        asked for them keep their shape); ``ensemble`` never (how the cells trained, not how they were summarised: an
        ensemble member's record says so in its own ``ensemble`` note)."""
        out = {"summary": self.summary, "analyze_samples": self.analyze_samples,
               "analyze_splits": list(self.splits), "analyze_max_iter": self.analyze_max_iter}
        out.update({k: True for k in ("reproducible", "analyze_geometry", "analyze_path_independence",
                                      "analyze_drift") if getattr(self, k)})
        return out

    @classmethod
    def from_record(cls, data: Any) -> "SweepSummary":
        """The summary a record's ``options`` (or a cell file's) holds, :meth:`to_record`'s inverse."""
        if not isinstance(data, dict):
            raise ConfigError(f"summary: expected a table of options, got {data!r}")
        splits = data.get("analyze_splits")
        if isinstance(splits, list):
            names = [k for k, v in cls.SPLITS.items() if list(v) == splits]
            if not names:
                raise ConfigError(f"summary.analyze_splits: {splits!r} is not allowed; allowed: "
                                  + ", ".join(str(list(v)) for v in cls.SPLITS.values()))
            data = {**data, "analyze_splits": names[0]}
        return cls(**data)


# ---- the analysis ----------------------------------------------------------------------------------------
#: the analysis stages, in the order they run: the names only (this module stays torch-free); each stage is a
#: module of :mod:`stability.analysis.stages`, listed once by its registry, which tests/house/test_stages.py holds
#: this tuple to
STAGES = ("reachability", "rho", "prop4", "rho_wx", "prop5", "input", "a8", "path_independence", "repelling",
          "accuracy", "geometry")
#: the stage run only when asked for (it perturbs the parameters and re-solves): a grid's ``analyze_geometry``, a
#: caller's ``stages``, ``stability figures region``
GEOMETRY_STAGE = "geometry"
#: the asymptotic-alignment stage of Anil et al. 2022 (issue 38): asked for by name (``--only``, ``stages``) or by a
#: grid's ``analyze_path_independence``, so that every analysis and record written before it keeps its shape
PATH_STAGE = "path_independence"
#: the stages run only when asked for by name, by ``stability analyze`` too
OPT_IN_STAGES = (PATH_STAGE,)
#: the stages ``stability analyze`` and ``stability demo`` run without ``--only``: all but the opt-in ones
ANALYZE_STAGES = tuple(s for s in STAGES if s not in OPT_IN_STAGES)
#: the stages of ``AnalysisOptions()`` (the library's and the sweep's default): all but geometry, which a grid or
#: a caller asks for (``stability analyze`` runs :data:`ANALYZE_STAGES`), and the opt-in ones
DEFAULT_STAGES = tuple(s for s in ANALYZE_STAGES if s != GEOMETRY_STAGE)
#: the one route of the ρ(J*) eigensolver (the Krylov–Schur method), under the name it had when it was an option:
#: ``AnalysisOptions.to_dict`` still writes it as ``eig_route`` (the key of every analysis written then), and that
#: key is read back when it holds this value; the value is a file format's word, not the method's name
EIG_ROUTE = "arnoldi"


def parse_stages(text) -> tuple:
    """``"rho,prop5"`` (or a sequence of names) → the stages to run, in run order, ``reachability`` included."""
    names = [s.strip() for s in (text.split(",") if isinstance(text, str) else text) if s.strip()]
    bad = [s for s in names if s not in STAGES]
    if bad or not names:
        what = f"unknown stage {', '.join(map(repr, bad))}" if bad else "no stage given"
        raise ConfigError(f"{what}; allowed: {', '.join(STAGES)}")
    return tuple(s for s in STAGES if s in names or s == "reachability")


def _stages(value: Any) -> Any:
    return parse_stages(value) if isinstance(value, (str, list, tuple)) else value


def _device(value: Any) -> Any:
    if not isinstance(value, str) and hasattr(value, "type"):  # a torch.device
        value = str(value)
    if isinstance(value, str) and not is_device_name(value):
        raise ConfigError(f"device {value!r}: expected auto, cpu, cuda or cuda:N")
    return value


class Flag(typing.NamedTuple):
    """How a field of :class:`AnalysisOptions` is a flag of ``stability analyze`` (:attr:`AnalysisOptions.FLAGS`):
    ``group``, the heading it is listed under (a key of ``FLAG_GROUPS``; None: the main list); ``positive``: the
    flag refuses 0 where the library takes it; ``command_default``: where the command's default differs from the
    library's, what the help says of it (the flag then defaults to None and the command decides)."""

    group: Optional[str] = None
    positive: bool = False
    command_default: Optional[str] = None


class AnalysisOptions(_Config):
    """What the analysis runs and how (:func:`stability.analyze`, ``stability analyze``; reported in the JSON's
    ``options``). The fields of :attr:`FLAGS` are ``stability analyze``'s flags, with the default, help and
    metavar read from here; the others are the numerical settings below them.

    ``noise_std``: std of the Gaussian start of App. A.8 (None: the checkpoint's configured ``noise_std``, 1 for a
    model of one's own). ``stages``: which stages to run (:data:`STAGES`, or ``"rho,prop5"``; ``reachability``
    always runs). ``workers``: 1 in the library, since a spawned process re-imports the caller's main module,
    which a script without ``if __name__ == "__main__":`` cannot survive (``stability analyze`` and ``demo`` use
    None). ``geometry_*``: the geometry stage (stability/analysis/stages/geometry.py); ``repelling_*``: the
    repelling stage (stability/analysis/stages/repelling.py).
    """

    #: ``stability analyze``'s flags of this schema, the one table of them (stability/commands/analyze.py adds a
    #: ``--NAME`` for each, in this order, with its type, choices, metavar and help from the field): the field's
    #: name → its :class:`Flag`. ``--only`` (``stages``) is the command's own; the other fields are the library's.
    FLAGS: typing.ClassVar[dict[str, Flag]] = {
        "samples": Flag(), "solver": Flag(), "tol": Flag(), "max_iter": Flag(), "iterations": Flag(), "probes": Flag(),
        "noise_std": Flag(positive=True), "eig_precision": Flag(), "few_samples": Flag(), "batch": Flag(),
        "device": Flag(), "workers": Flag(command_default="one per split, up to the thread count; 1: one split after "
                                                          "the other; the numbers do not depend on it"),
        "geometry_directions": Flag("geometry"), "geometry_samples": Flag("geometry"),
        "geometry_accuracy": Flag("geometry"), "geometry_group_directions": Flag("geometry"),
        "geometry_certify": Flag("geometry"),
        "geometry_plane": Flag("geometry", command_default="15 with --plots, otherwise none"),
        "repelling_starts": Flag("repelling"), "repelling_scale": Flag("repelling"),
        "repelling_budget": Flag("repelling"), "drift": Flag()}
    #: the headings of the flags' groups in ``stability analyze --help``
    FLAG_GROUPS: typing.ClassVar[dict[str, str]] = {
        "geometry": "geometry (the third axis: radii of stability along random directions in parameter space, "
                    "docs/analysis.md)",
        "repelling": "repelling (the root-finder search for fixed points with ρ(J) > 1, which plain iteration "
                     "cannot reach; docs/analysis.md)"}

    samples: int = _f(32, "analyse the first N samples of each split (or of --inputs), in order", metavar="N",
                      ge=1, le=MAX_SAMPLES)
    solver: Literal["picard", "anderson"] = _f("picard", "fixed-point solver (picard: plain iteration, the "
                                               "reachability the paper means)")
    tol: float = _f(1e-5, "relative L∞ residual τ for convergence", metavar="F", gt=0.0)
    max_iter: int = _f(500, "solver iterations", metavar="N", ge=1, le=MAX_ITERATIONS,
                       why="the solver keeps a residual per sample and iteration")
    iterations: int = _f(500, "accuracy is measured at iterations 1..T", metavar="T", ge=1,
                         le=MAX_ITERATIONS, why="the accuracy curve runs the loop map T times per sample")  # T_max of the curve
    device: Annotated[str, BeforeValidator(_device)] = _f(
        "cpu", "where to compute: cpu, auto (cuda when available), cuda or cuda:N", metavar="DEV")
    eig_k: int = _f(3, "leading eigenvalues the ρ(J*) eigensolver computes per sample", ge=1,
                   le=MAX_PROBES)
    eig_tol: float = _f(1e-6, "Ritz residual below which ρ(J*) is certified", gt=0.0)
    gmres_tol: float = _f(1e-10, "relative tolerance of the linear solves (Prop. 5, ‖dx*/dx0‖_F)", gt=0.0)
    probes: int = _f(4, "random probes of the ‖dx*/dx0‖_F estimate", metavar="K", ge=1,
                    le=MAX_PROBES, why="each probe is one more linear solve per sample, all held in memory at once")
    prop4_probes: int = _f(4, "Prop. 4 on states too large for dense matrices: Gaussian probes of M against J",
                           ge=1, le=MAX_PROBES)
    seed: int = _f(0, "seed of every random start, probe and direction of the analysis")
    eig_batch: Optional[int] = _f(None, "samples per Krylov–Schur batch (none: 1 on the CPU, all on CUDA or with "
                                  "batch all)", ge=1, le=MAX_SAMPLES)
    eig_precision: Literal["mixed", "float64"] = _f(
        "mixed", "products of the ρ(J*) eigensolver: mixed (float32, every result certified by a float64 residual "
        "and re-solved in float64 where it misses) or float64")
    noise_std: Optional[float] = _f(None, "std of the noise start of App. A.8 (default: the checkpoint's "
                                    "noise_std; 1 for --model)", metavar="F", ge=0.0)
    workers: Optional[int] = _f(1, "splits analysed side by side on the CPU, one process each, sharing torch's "
                                "threads (none: one per split, up to the thread count)", metavar="N",
                                ge=1, le=MAX_WORKERS)
    stages: Annotated[tuple[str, ...], BeforeValidator(_stages)] = _f(
        DEFAULT_STAGES, "the stages to run, of STAGES (reachability always runs)")
    geometry_directions: int = _f(8, "geometry: random directions in all loop parameters, each measured with both "
                                  "signs", metavar="K", ge=1, le=MAX_DIRECTIONS)
    geometry_samples: int = _f(4, "geometry: radii are measured on up to N samples of each split, the first N "
                               "whose x* attracts at θ* (1 on states above n = 8,192)", metavar="N", ge=1,
                               le=MAX_SAMPLES)
    geometry_pick: Literal["attracting", "first"] = _f(
        "attracting", "geometry: which samples: the first geometry_samples whose x* attracts at θ* (converged, "
        "ρ(J*) < 1; the first sample where none does), or the first geometry_samples whatever they do (the "
        "replication grid's records were measured so)")
    geometry_accuracy: float = _f(0.1, "geometry: bisect each radius until its bracket [lo, hi] has hi/lo ≤ 1 + F",
                                  metavar="F", gt=0.0, lt=1.0)
    geometry_group_directions: int = _f(1, "geometry: directions within each parameter group (W_x, attention, "
                                        "MLP, norms, embedding, ...), both signs; 0: no per-group radii",
                                        metavar="K", ge=0, le=MAX_DIRECTIONS)
    geometry_certify: int = _f(4, "geometry: radii whose ρ(J*) is certified at both ends of the final bracket "
                               "(the first N that ρ decided)", metavar="N", ge=0,
                               le=MAX_DIRECTIONS)
    repelling_starts: int = _f(3, "repelling: perturbed starts of the root-finder per sample, besides the Picard "
                               "iterate", metavar="K", ge=0, le=MAX_DIRECTIONS)
    repelling_scale: float = _f(0.5, "repelling: relative size of each perturbation, ‖δ‖₂ = F · max(‖x_best‖₂, "
                                "√n)", metavar="F", gt=0.0)
    repelling_budget: int = _f(100, "repelling: Broyden iterations per start", metavar="N", ge=1,
                               le=MAX_ITERATIONS)
    # large states (issue 25): above few_samples_above (the state size n, above every committed record's) the
    # stages whose cost is per sample (a Stage's per_sample: analysis.stages.registry.FEW_SAMPLE_STAGES) measure the
    # first few_samples only
    few_samples: int = _f(8, "on states above n = 8,192: the stages whose cost is per sample (rho and σ_max, prop4, "
                          "input, a8, repelling) measure the first K samples only, said in the report; 0: all",
                          metavar="K", ge=0, le=MAX_SAMPLES)
    few_samples_above: int = _f(8192, "the state size n above which few_samples applies", ge=0,
                                  le=MAX_SEED)
    # issue 35: the GPU's way of batching, selectable on the CPU (where auto keeps every committed number)
    batch: Literal["auto", "all"] = _f(
        "auto", "how the stages batch their samples: all (every sample in one batch, the eigensolver's restarts "
        "batched too, as on a GPU) or auto (per device: the CPU's per-sample eigensolver batches and restarts)")
    # issue 38: off, every analysis keeps the solver's statuses (to_dict writes it only when set, so an analysis
    # and a record written without it keep their shape)
    drift: bool = _f(False, "reachability: test the samples that neither converged nor closed an orbit for a state "
                     "norm growing without bound (max_iter further Picard steps; ‖x_t‖ ∝ t^p with p ≥ 0.5 over "
                     "[T, 2T]) and name them drifting (docs/analysis.md)")
    # not a flag with this default: `stability analyze --geometry-plane N` defaults to 15 with --plots, else 0
    geometry_plane: int = _f(0, "geometry: the ρ(J*) picture over the plane of two directions, N × N cells (0: "
                             "none)", metavar="N", ge=0, le=1000)

    @model_validator(mode="before")
    @classmethod
    def _route(cls, data: Any) -> Any:
        """An analysis written when the eigensolver's route was an option stores ``eig_route``: read its one
        value, refuse any other."""
        if isinstance(data, dict) and "eig_route" in data:
            data = dict(data)
            route = data.pop("eig_route")
            if route != EIG_ROUTE:
                raise ConfigError(f"AnalysisOptions.eig_route: {route!r} is not allowed; allowed: {EIG_ROUTE}")
        return data

    def measured(self, n: int, samples: int) -> int:
        """How many samples (the first ones) the stages of ``FEW_SAMPLE_STAGES`` measure at state size ``n``: all
        ``samples``, or ``few_samples`` of them where ``n > few_samples_above`` (``few_samples`` 0: all)."""
        if self.few_samples and n > self.few_samples_above:
            return min(samples, self.few_samples)
        return samples

    def geometry_count(self, n: int, samples: int) -> int:
        """How many samples the geometry stage measures at state size ``n``: up to ``geometry_samples``, 1 where
        ``n > few_samples_above`` and ``few_samples`` is set (the large-state mode: each sample costs minutes)."""
        k = 1 if self.few_samples and n > self.few_samples_above else self.geometry_samples
        return min(k, samples)

    def eig_chunk(self, samples: int, device_type: str) -> int:
        """Samples per batch of the matrix-free eigensolver: ``eig_batch``, else all of ``samples`` with ``batch``
        all or on CUDA, else 1 (the CPU's default)."""
        if self.eig_batch:
            return self.eig_batch
        return samples if self.batch == "all" or device_type == "cuda" else 1

    @property
    def eig_restart(self) -> str:
        """The Krylov–Schur restart (:func:`stability.numerics.eigen.krylov_schur`): ``batched`` with ``batch`` all,
        else ``auto`` (per-sample on the CPU, batched on a GPU)."""
        return "batched" if self.batch == "all" else "auto"

    @property
    def solver_batched(self) -> Optional[bool]:
        """The solvers' row bookkeeping (``stability.solvers.Solve.batched``): batched with ``batch`` all, else
        None (batched on a GPU, per row on the CPU)."""
        return True if self.batch == "all" else None

    def to_dict(self) -> dict:
        """The JSON's ``options``: every field, ``stages`` a list, and ``eig_route`` after ``seed`` (the keys and
        order of every analysis written so far); ``drift`` only when set."""
        out = {}
        for name, value in to_dict(self).items():
            if name == "drift" and not value:  # written only when set: the options of every analysis before it
                continue
            out[name] = value
            if name == "seed":
                out["eig_route"] = EIG_ROUTE
        return out


#: the sections of a RunConfig (TOML tables [model], [task], [train])
SECTIONS: dict[str, type] = {"model": ModelConfig, "task": TaskConfig, "train": TrainConfig}


# ---- schema metadata ----------------------------------------------------------------------------------
def is_flat_config(config: Any) -> bool:
    """A stored RunConfig dict written before the method block (checkpoint schema 1, and the records and analyses
    written with it): ``train``'s ``method`` a name, the method options beside the other train options. The
    loaders refuse it; ``stability migrate`` converts it once (:mod:`stability.migrate`)."""
    train = config.get("train") if isinstance(config, dict) else None
    return isinstance(train, dict) and (isinstance(train.get("method"), str) or any(k in OPTION_METHOD for k in train))


def dotted(config: Any) -> dict:
    """``{"section.option": value}`` of a RunConfig or any nested dict, tables joined by dots (``model.width``,
    ``train.method.name``, ``train.method.solver_tol``)."""
    out: dict = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}{k}.", v)
        elif prefix:
            out[prefix[:-1]] = value

    walk("", to_dict(config) if isinstance(config, BaseModel) else config)
    return out


def changes(a: Any, b: Any) -> list[tuple[str, Any, Any]]:
    """``(option, value in a, value in b)`` for each :func:`dotted` option whose values differ, sorted by name (an
    option only one side has: None on the other)."""
    da, db = dotted(a), dotted(b)
    return [(k, da.get(k), db.get(k)) for k in sorted(set(da) | set(db)) if da.get(k) != db.get(k)]


def field_extra(info) -> dict:
    """A field's ``json_schema_extra``: ``metavar``, ``flag``, ``derived`` where given."""
    return dict(info.json_schema_extra or {})


def limits(info) -> dict:
    """A field's bounds by kind: ``{"gt": 0.0, "lt": 1.0}`` (``gt``/``ge`` below, ``lt``/``le`` above)."""
    return {k: getattr(m, k) for m in info.metadata for k in ("gt", "ge", "lt", "le")
            if getattr(m, k, None) is not None}


def bounds(info) -> tuple[Optional[float], Optional[float]]:
    """(lower, upper) bound of a field (None: unbounded)."""
    lo = hi = None
    for m in info.metadata:
        lo = getattr(m, "ge", lo)
        hi = getattr(m, "le", hi)
    return lo, hi


# ---- one-line errors ----------------------------------------------------------------------------------------
def unwrap(tp: Any) -> Any:
    """``Optional[X]`` / ``Annotated[X, ...]`` → X."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin is Union and type(None) in typing.get_args(tp):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp


def _walk(cls: type, loc: tuple) -> tuple[str, Optional[str], Any, tuple]:
    """(config class name, field name or None, FieldInfo or None, the rest of loc) of a pydantic error location."""
    name, info = None, None
    loc = tuple(loc)
    while loc:
        key = loc[0]
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or key not in cls.model_fields:
            break
        info = cls.model_fields[key]
        name = key
        loc = loc[1:]
        tp = unwrap(info.annotation)
        if isinstance(tp, type) and issubclass(tp, BaseModel) and loc:
            cls, name, info = tp, None, None
        elif typing.get_origin(tp) is Union and loc and loc[0] in METHOD_CLASSES:
            cls, name, info, loc = METHOD_CLASSES[loc[0]], None, None, loc[1:]
        else:
            break
    owner = getattr(cls, "owner_name", None) or getattr(cls, "__name__", str(cls))
    return owner, name, info, loc


_EXPECTED = {"int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
             "bool_type": "true or false", "bool_parsing": "true or false", "float_type": "a number",
             "float_parsing": "a number", "finite_number": "a finite number", "string_type": "a string",
             "tuple_type": "a list", "list_type": "a list", "model_type": "a table of options",
             "model_attributes_type": "a table of options", "dict_type": "a table of options",
             "none_required": "null"}
_RANGES = ("greater_than", "greater_than_equal", "less_than_equal", "less_than")


def _models(tp: Any) -> list:
    """The model classes an annotation may hold (through Optional, Union, list, tuple, dict values)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _models(typing.get_args(tp)[0])
    if origin in (Union, list, tuple, dict) or str(origin) == "types.UnionType":
        args = typing.get_args(tp)[1:] if origin is dict else typing.get_args(tp)
        return [m for a in args for m in _models(a)]
    return [tp] if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def _path(cls: type, loc: tuple, data: Any) -> tuple[str, Optional[type], Any]:
    """A path-style location (``claim 'id'.a.norm[0]``, ``analysis.val.samples``): the keys from the root, a list
    item by its ``id`` where it has one, else its index; the model class reached at its end (None past a model)
    and the FieldInfo when ``loc`` ends at a field. Keys that are neither fields nor dict keys (pydantic's
    union-member tags) are skipped."""
    parts: list[str] = []
    node, info = data, None
    current: Optional[type] = cls
    in_dict = False
    for key in loc:
        if in_dict:  # a key of a table of models (a split of the record's analysis)
            parts.append(str(key))
            node, info, in_dict = node.get(key) if isinstance(node, dict) else None, None, False
            continue
        if isinstance(key, int):
            item = node[key] if isinstance(node, list) and 0 <= key < len(node) else None
            ident = item.get("id") if isinstance(item, dict) else None
            if parts:
                parts[-1] += f" {ident!r}" if isinstance(ident, str) else f"[{key}]"
            node, info = item, None
            continue
        if current is None or key not in current.model_fields:
            continue
        parts.append(str(key))
        info = current.model_fields[key]
        tp = unwrap(info.annotation)
        in_dict = typing.get_origin(tp) is dict
        models = _models(tp)
        current = models[0] if models else None
        node = node.get(key) if isinstance(node, dict) else None
    return ".".join(parts), current, info


def _place(cls: type, loc: tuple, data: Any) -> tuple[str, Any]:
    """(where, FieldInfo or None) of an error location in ``cls``'s style (``_Config.error_style``)."""
    if getattr(cls, "error_style", "owner") == "path":
        where, _, info = _path(cls, loc, data)
        return where, info
    owner, name, info, _ = _walk(cls, loc)
    return (f"{owner}.{name}" if name else owner), info


def _at(where: str, text: str) -> str:
    return f"{where}: {text}" if where else text


def _message(cls: type, exc: ValidationError, data: Any = None) -> str:
    """The first error of ``exc`` as one line ``where: what is wrong; what is allowed`` (where: ``Class.field`` or,
    for a path-style model, the path from its root)."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    kind, value, ctx = first["type"], first.get("input"), first.get("ctx") or {}
    if isinstance(ctx.get("error"), ConfigError):  # a validator's ConfigError names its own place
        return str(ctx["error"])
    if kind == "extra_forbidden":
        return _unknown_message(cls, errors, data)
    where, info = _place(cls, tuple(first["loc"]), data)
    if kind == "value_error" and "error" in ctx:
        return _at(where, str(ctx["error"]))
    if kind == "missing":
        return _at(where, "missing")
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        got = ctx.get("tag", None)
        what = f"{got!r} is not allowed" if kind == "union_tag_invalid" else "the method table needs a name"
        return f"TrainConfig.method: {what}; allowed: {', '.join(METHODS)}"
    if kind == "literal_error" or kind in _EXPECTED:
        return _value_message(cls, errors, data, where, info)
    if kind == "greater_than" and "gt" in ctx and (info is None or limits(info).keys() <= {"gt"}):
        return f"{where}: {value!r} must be greater than {ctx['gt']}"
    if kind in _RANGES and info is not None:
        lim = limits(info)
        lo = ("(", lim["gt"]) if "gt" in lim else ("[", lim.get("ge", "-inf"))
        hi = (lim["lt"], ")") if "lt" in lim else (lim.get("le", "inf"), "]")
        return f"{where}: {value!r} is outside {lo[0]}{lo[1]}, {hi[0]}{hi[1]}"
    if kind in _RANGES or kind in ("too_short", "too_long", "string_pattern_mismatch"):
        return f"{where}: {value!r}: {first['msg'].lower()}"
    return _at(where, first["msg"])


def _value_message(cls: type, errors: list, data: Any, where: str, info: Any) -> str:
    """A value of the wrong kind, or not among the allowed ones: every alternative of a union that failed at the
    same place is named (``a number or 'lowest', 'middle' or 'highest'``)."""
    first = errors[0]
    kind, value = first["type"], first.get("input")
    same = [e for e in errors if _place(cls, tuple(e["loc"]), data)[0] == where]
    if kind == "literal_error" and info is not None:
        allowed = typing.get_args(unwrap(info.annotation))
        if allowed and all(isinstance(a, (str, int, float)) for a in allowed):
            return f"{where}: {value!r} is not allowed; allowed: {', '.join(map(str, allowed))}"
    options = [(e.get("ctx") or {}).get("expected", "?") if e["type"] == "literal_error" else _EXPECTED[e["type"]]
               for e in same if e["type"] == "literal_error" or e["type"] in _EXPECTED]
    if "a number" in options:  # an int-or-float value: a number
        options = [o for o in options if o != "an integer"]
        kind = "float_type" if options == ["a number"] else kind
    if kind == "literal_error" or len(set(options)) > 1:
        return f"{where}: {value!r} is not allowed; allowed: {' or '.join(dict.fromkeys(options))}"
    if where == "TrainConfig.method" and isinstance(value, str) and value in METHOD_CLASSES:
        return (f"TrainConfig.method: expected a table of options, got {value!r}: a method is a table with its "
                f"name and options, {{\"name\": \"{value}\", ...}} (TOML: [train.method] name = \"{value}\")")
    return f"{where}: expected {_EXPECTED[kind]}, got {value!r}"


def _unknown_message(cls: type, errors: list, data: Any) -> str:
    """Unknown keys of one table: ``Owner: unknown key(s) a, b; allowed: ...`` (a method's option given where it
    does not belong: the line that says where it goes)."""
    parent = tuple(errors[0]["loc"][:-1])
    unknown = sorted(str(e["loc"][-1]) for e in errors if e["type"] == "extra_forbidden"
                     and tuple(e["loc"][:-1]) == parent)
    if getattr(cls, "error_style", "owner") == "path":
        where, target, _ = _path(cls, parent, data)
        allowed = ", ".join(target.model_fields) if target is not None else "?"
        return _at(where, f"unknown key(s) {', '.join(unknown)}; allowed: {allowed}")
    target = _walk_class(cls, parent)
    allowed = list(target.model_fields) if target is not None else []
    owner = getattr(target, "__name__", cls.__name__)
    misplaced = method_option_message(unknown[0], target)
    if misplaced:
        return misplaced
    if target in METHOD_CLASSES.values():
        owner = f"TrainConfig.method ({target.model_fields['name'].default})"
    return f"{owner}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"


def method_option_message(key: str, table: Optional[type]) -> Optional[str]:
    """The one line for a method's option given where it does not belong: beside the other train options
    (``table`` TrainConfig), or in the table of another method; None for any other key."""
    owner = OPTION_METHOD.get(key)
    if owner is None:
        return None
    if table is TrainConfig:
        return (f"TrainConfig.{key}: an option of the {owner} method; it goes in the method table "
                f"({{\"name\": \"{owner}\", \"{key}\": ...}}; TOML: [train.method] name = \"{owner}\")")
    if table in METHOD_CLASSES.values() and key not in table.model_fields:
        name = table.model_fields["name"].default
        return f"TrainConfig.{key}: only the {owner} method uses it, not {name} (choose method {owner} to set it)"
    return None


def _walk_class(cls: type, loc: tuple) -> Optional[type]:
    """The config class at ``loc`` (a section, a method block)."""
    for key in loc:
        if key in METHOD_CLASSES and cls is TrainConfig:
            cls = METHOD_CLASSES[key]
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or key not in cls.model_fields:
            return None
        tp = unwrap(cls.model_fields[key].annotation)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            cls = tp
        elif key == "method":
            continue
        else:
            return None
    return cls



# ---- TOML tables ----------------------------------------------------------------------------------------------
#: the keys of a method table (``[train.method]``): its name and the options of the methods
METHOD_KEYS = ("name", *OPTION_METHOD)


def option_names(section: str) -> list[str]:
    """The keys of a section in a TOML file: the schema's fields (``train.method`` is a table: :data:`METHOD_KEYS`)."""
    return list(SECTIONS[section].model_fields)


def section_options(section: str, table: Any, where: str) -> dict:
    """The options of one TOML section, unknown keys refused (``where`` names the table in the error); a method's
    options live in the ``method`` table of ``train`` (``[train.method]``, with its ``name``)."""
    if section not in SECTIONS:
        raise ConfigError(f"{where}: unknown section {section!r}; allowed: {', '.join(SECTIONS)}")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table of options")
    options = dict(table)
    if section == "train":
        misplaced = next((m for m in (method_option_message(k, TrainConfig) for k in options) if m), None)
        if misplaced:
            raise ConfigError(f"{where}: {misplaced}")
    _unknown(where, options, option_names(section))
    if section == "train" and "method" in options:
        if not isinstance(options["method"], dict):
            raise ConfigError(f"{where}.method: expected a table (name = \"...\" and the method's options), got "
                              f"{options['method']!r}")
        _unknown(f"{where}.method", options["method"], METHOD_KEYS)
    return options


def _unknown(where: str, data: dict, allowed) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")


def parse_toml(path, where: str) -> dict:
    """The TOML file ``path`` as a dict; content that is not TOML text is one ConfigError line starting ``where``
    (run files here, grid files in stability/sweep/grid.py)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not a text file") from None


def read_toml(path) -> dict:
    """A run file (``stability train --config run.toml``): tables ``[model]``, ``[task]``, ``[train]`` and
    ``[train.method]``, as ``{section: {option: value}}`` (``train``'s ``method`` a dict); one ConfigError line on
    bad content."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file" if not path.exists() else f"--config {path}: not a file")
    data = parse_toml(path, f"--config {path}")
    _unknown(f"--config {path}", data, SECTIONS)
    return {s: section_options(s, t, f"--config {path}: [{s}]") for s, t in data.items()}
