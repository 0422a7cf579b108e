"""Training and the run (App. B.1.2; docs/configuration.md): the methods' tables (:class:`Progressive`,
:class:`DeepSupervision`, :class:`Implicit`, a discriminated union on ``name``), :class:`TrainConfig`,
:class:`RunConfig` (model, task, train), the presets, the sections of a run file and the old flat form
(:func:`is_flat_config`)."""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BeforeValidator, Field, model_validator

from stability.config.base import _Config, is_device_name
from stability.config.fields import (MAX_EPOCHS, MAX_ITERATIONS, MAX_PROBES, MAX_SAMPLES, MAX_SEED, MAX_WORKERS, _f,
                                     _list_to_tuple)
from stability.config.messages import METHODS_KNOWN
from stability.config.model import ModelConfig, TaskConfig
from stability.errors import ConfigError

Method = Literal["progressive", "deep-supervision", "implicit"]
ImplicitBackward = Literal["krylov", "neumann", "one-step"]
DecayExempt = Literal["release", "norms"]
METHODS = typing.get_args(Method)


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
    min(cores, torch's threads, members), on the CPU; 1 on CUDA). ``step`` (``--ensemble-step``): the batched step,
    ``subsets`` (each iteration run on the members in their no-gradient or gradient window, a shape that changes
    every batch), ``fixed`` (every member through all T iterations, masked: one shape, what ``--compile`` and CUDA
    graphs need; stability/train/fixed_step.py) or ``auto`` (fixed on CUDA or with ``--compile``, subsets on the
    CPU). ``max_members``: the most members in one batched step; more train in chunks of that many, one after
    another (``None``, the flag's ``auto`` and the default: K_max from the device's free memory and a member's
    measured need; stability/train/ensemble_memory.py)."""

    #: the fields with a flag of ``stability train``
    FLAGS: typing.ClassVar[tuple[str, ...]] = ("processes", "step", "max_members")

    processes: Optional[int] = _f(None, "with --seeds: split the members across N processes, one thread each on the "
                                  "CPU (auto: one per core torch may use, up to the members; 1 on CUDA)",
                                  metavar="N|auto", ge=1, le=MAX_WORKERS)
    step: Literal["auto", "subsets", "fixed"] = _f("auto", "with --seeds: the batched step: subsets (the members in "
                                                   "each state per iteration), fixed (all members through T "
                                                   "iterations, masked: one shape, compiled with --compile) or auto "
                                                   "(fixed on CUDA or with --compile, else subsets)",
                                                   flag="ensemble-step")
    max_members: Optional[int] = _f(None, "with --seeds: at most N members in one batched step, more in chunks of N "
                                    "one after another (auto: as many as the device's free memory holds)",
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


#: the sections of a RunConfig (TOML tables [model], [task], [train])
SECTIONS: dict[str, type] = {"model": ModelConfig, "task": TaskConfig, "train": TrainConfig}

# what the one-line messages name: the train table that holds a method and the methods' tables
METHODS_KNOWN.table, METHODS_KNOWN.classes = TrainConfig, METHOD_CLASSES


def is_flat_config(config: Any) -> bool:
    """A stored RunConfig dict written before the method block (checkpoint schema 1, and the records and analyses
    written with it): ``train``'s ``method`` a name, the method options beside the other train options. The
    loaders refuse it; ``stability migrate`` converts it once (:mod:`stability.migrate`)."""
    train = config.get("train") if isinstance(config, dict) else None
    return isinstance(train, dict) and (isinstance(train.get("method"), str) or any(k in OPTION_METHOD for k in train))
