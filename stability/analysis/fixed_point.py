"""The fixed point x* = f(x*, x0) of one batch of inputs (Def. 3.3), and everything the analysis knows there.

:class:`FixedPoint` is the one way the package goes from inputs to x*: x0 = embed(inputs), the first iterate e
(:func:`first_iterate`) and the solve from e (:func:`stability.solvers.solve`, with a preset that says whose solve
it is). The analysis' :class:`AtFixedPoint` is one; so are the training monitor's (its cheap preset,
:mod:`stability.analysis.monitor`), residual halting's (:mod:`stability.analysis.halting`) and implicit training's
(:mod:`stability.train.implicit`), and the trainer's evaluation iterates from its e.

:class:`AtFixedPoint` is what every stage of :mod:`stability.analysis.stages` reads and the one place where a stage
leaves a quantity for a later one: the analysis copy of the model (:func:`analysis_model`), the options, the inputs
with their x0 = embed(inputs) and initial iterate e, the targets and their scoring, and the solve from e (set by
stage ``reachability``, which runs first). What one stage computes for another is a typed member, so it is by
construction a quantity at this object's x*:

=============================  =====================================  ===========================================
member                         set by                                 read by
=============================  =====================================  ===========================================
``accuracy_curve``             ``reachability`` (Picard from e)       ``accuracy`` (else it iterates on its own)
``dense_jacobians``            ``rho`` (its dense route)              ``prop4`` (else its matrix-free route)
``jacobian_spectra``           ``rho``                                ``prop4`` (J's spectrum, taken where
                                                                      M = J), ``geometry`` (which samples
                                                                      attract; else ρ on its own samples),
                                                                      ``repelling`` (ρ at a root that is x*)
``initial_iterate_tangent``    ``prop5`` (its unroll carries it)      ``a8`` (the first converged sample's
                                                                      local A.8 number; else computed on first
                                                                      use)
=============================  =====================================  ===========================================
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Optional, Protocol

import torch

from stability.analysis.initial_iterate import initial_iterate_sensitivity_batched
from stability.analysis.perturbation import reached_parameters
from stability.analysis.prop5 import default_T_grid
from stability.solvers import solve

if TYPE_CHECKING:
    from stability.analysis.accuracy import AccuracyCurve
    from stability.analysis.progress import Progress
    from stability.analysis.initial_iterate import InitialIterateBatched
    from stability.analysis.options import AnalysisOptions
    from stability.numerics import Spectrum
    from stability.solvers import SolveResult


def cast_copy(model: torch.nn.Module, dtype: torch.dtype, keep: frozenset = frozenset()) -> torch.nn.Module:
    """A deep copy of ``model`` whose floating parameters and buffers are in ``dtype``, each cast straight from the
    original's tensor: the same module as ``copy.deepcopy(model).to(dtype)``, without that route's moment of
    holding a second full copy in the original's precision. Tensors whose ids are in ``keep`` are copied in their
    own dtype (a language model's float32 vocabulary tables: :mod:`stability.lm.storage`)."""
    memo: dict = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if id(t) in memo or not t.is_floating_point():
            continue
        c = t.detach().to(dtype=t.dtype if id(t) in keep else dtype, copy=True)
        memo[id(t)] = torch.nn.Parameter(c, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else c
    return copy.deepcopy(model, memo)


def step_parameters(model: torch.nn.Module, x: torch.Tensor, x0: torch.Tensor) -> set:
    """The ids of the parameters that ``model.step(x, x0)`` reaches (autograd's graph of one step, structural:
    :func:`stability.analysis.perturbation.loop_parameters`' test, no copy, no gradient)."""
    named = {k: v for k, v in model.named_parameters() if v.is_floating_point()}
    return {id(named[k]) for k in reached_parameters(model, "step", named, (x, x0))}


def step_copy(model: torch.nn.Module, dtype: torch.dtype, x: torch.Tensor, x0: torch.Tensor) -> torch.nn.Module:
    """A copy of ``model`` for products of ``step`` in ``dtype`` (stage rho's and prop4's float32 products): the
    parameters ``step`` reaches (:func:`step_parameters`, at one sample of (x, x0)) and the buffers cast to
    ``dtype``, every other parameter an empty placeholder on the meta device (a language model's embedding and
    head: no memory). Checked by one step on that sample; where that fails (a parameter ``step`` reads out of
    autograd's sight), the whole model is cast (:func:`cast_copy`)."""
    try:
        reached = step_parameters(model, x[:1], x0[:1])
    except Exception:  # noqa: BLE001 - a step autograd cannot follow: the whole copy, as before
        return cast_copy(model, dtype)
    memo: dict = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if id(t) in memo or not t.is_floating_point():
            continue
        if isinstance(t, torch.nn.Parameter) and id(t) not in reached:
            c = torch.empty(t.shape, dtype=dtype, device="meta")
        else:
            c = t.detach().to(dtype=dtype, copy=True)
        memo[id(t)] = torch.nn.Parameter(c, requires_grad=False) if isinstance(t, torch.nn.Parameter) else c
    fast = copy.deepcopy(model, memo)
    try:
        with torch.no_grad():
            fast.step(x[:1].to(dtype), x0[:1].to(dtype) if x0.is_floating_point() else x0[:1])
    except Exception:  # noqa: BLE001 - a parameter step reads that autograd did not see: the whole copy
        return cast_copy(model, dtype)
    return fast


def analysis_model(model: torch.nn.Module, dtype: torch.dtype = torch.float64, device: Optional[str] = None):
    """A float64 (by default) copy of the model for analysis: eval mode, no parameter gradients."""
    m = cast_copy(model, dtype)
    if device is not None:
        m = m.to(device)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


class JacobianSpectra(Protocol):
    """What stage ``rho`` leaves for later stages: its result (:class:`stability.analysis.stages.rho.JacobianSpectra`,
    named here by what the readers use, so that this module does not import the stage's), the spectrum of J* of the
    measured samples in the numerics' one type and ρ(J*) per sample (None where not measured)."""

    spectrum: Spectrum

    @property
    def rhos(self) -> list: ...


@dataclass
class DenseJacobians:
    """Every sample's dense J* = ∂f/∂x at x* (B, n, n), as stage ``rho`` built them: stage ``prop4`` checks the
    assembled matrix of Prop. 4 against these J and takes their spectra (stage rho's ``jacobian_spectra``) where
    M = J* entry by entry (:func:`stability.analysis.recall.prop4_dense`)."""

    J: torch.Tensor


def first_iterate(model, x0: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """The first iterate e (Def. 3.1) for x0: the model's ``initial_state`` (its noise drawn from ``generator``;
    None: torch's global generator, as training draws it), or x0 itself for a model without one (the paper's
    release)."""
    if not hasattr(model, "initial_state"):
        return x0
    return model.initial_state(x0) if generator is None else model.initial_state(x0, generator=generator)


@dataclass(eq=False, kw_only=True)
class FixedPoint:
    """One batch of inputs on its way to x* (module docstring): ``model`` (its ``step`` is f), ``x0`` =
    embed(inputs) and the first iterate ``e``, (B, ...) on the model's device, and ``solution``, the solve from e
    (:meth:`solve`)."""

    model: torch.nn.Module  # a LoopedModel (stability.protocols); the analysis' copy in AtFixedPoint
    x0: torch.Tensor
    e: torch.Tensor
    solution: Optional[SolveResult] = None

    @classmethod
    def of(cls, model, inputs: torch.Tensor, /, *, generator: Optional[torch.Generator] = None, **fields):
        """x0 = ``model.embed(inputs)`` and e = :func:`first_iterate` (``generator``: e's noise); ``fields``: the
        other fields of ``cls``."""
        x0 = model.embed(inputs)
        return cls(model=model, x0=x0, e=first_iterate(model, x0, generator), **fields)

    def solve(self, how, **kwargs) -> SolveResult:
        """x* from e by :func:`stability.solvers.solve` with the options ``how`` (a :class:`~stability.solvers.Solve`
        preset; ``kwargs``: solve's other arguments); kept as :attr:`solution`."""
        self.solution = solve(self.f, self.e, self.x0, how, **kwargs)
        return self.solution

    @property
    def f(self) -> Callable:
        """The loop map f(x, x0) (``model.step``)."""
        return self.model.step

    @property
    def x_star(self) -> torch.Tensor:
        """x_best of the solve: x* where converged, else the lowest-residual iterate (B, *S)."""
        return self.solution.x_best

    @property
    def converged(self) -> torch.Tensor:
        """(B,) bool: the solve reached τ."""
        return self.solution.converged


@dataclass(eq=False, kw_only=True)
class AtFixedPoint(FixedPoint):
    """One batch of inputs at its fixed point, as the analysis' stages read it (module docstring). ``model``: the
    analysis copy; ``inputs``: (B, ...) on the model's device; ``score(logits, targets) -> (correct,
    position_accuracy)`` (None: argmax); ``log``: one line of progress; ``split``: the name the log lines carry.
    Its ``solution`` is set by stage reachability."""

    options: AnalysisOptions
    inputs: torch.Tensor
    targets: Optional[torch.Tensor]
    score: Optional[Callable]
    log: Callable
    split: str
    accuracy_curve: Optional[AccuracyCurve] = None  # Fig. 3's curve, scored during that solve
    dense_jacobians: Optional[DenseJacobians] = None
    jacobian_spectra: Optional[JacobianSpectra] = None  # ρ(J*), σ_max, eigenvalues per sample (Props. 3–4)
    progress: Optional[Progress] = None  # stage-by-stage progress with the time left (stability.analysis.progress)

    def tick(self, done: int, total: int, what: str = "samples") -> None:
        """Inside a long stage: ``done`` of ``total`` units finished (a progress line now and then)."""
        if self.progress is not None:
            self.progress.tick(done, total, what)

    @property
    def few(self) -> int:
        """How many samples (the first ones) the per-sample Krylov stages measure: all, or the first
        ``options.few_samples`` on states above ``options.few_samples_above`` (:meth:`AnalysisOptions.measured`)."""
        return self.options.measured(int(self.e[0].numel()), int(self.e.shape[0]))

    @property
    def first_converged(self) -> Optional[int]:
        """The first sample whose solve converged (the sample of Prop. 5 and of A.8's ‖dx_T/de‖), None if none."""
        c = self.converged
        return int(c.nonzero()[0]) if bool(c.any()) else None

    @property
    def T_grid(self) -> list:
        """The iteration counts T of the unrolled checks (Prop. 5, App. A.8): 1, 2, 5, 10, … up to max_iter."""
        return default_T_grid(self.options.max_iter)

    @cached_property
    def initial_iterate_tangent(self) -> InitialIterateBatched:
        """App. A.8's ‖dx_T/de · u‖ on :attr:`first_converged` for T in :attr:`T_grid` (u a seeded unit direction of
        e, x0 held fixed). Stage ``prop5`` sets it from its own unroll from e, which carries this tangent beside
        Prop. 5's; otherwise it is computed here by an unroll of its own (the same numbers to rounding)."""
        sl = slice(self.first_converged, self.first_converged + 1)
        return initial_iterate_sensitivity_batched(self.f, self.e[sl], self.x0[sl], self.T_grid,
                                                   seed=self.options.seed)
