"""The fixed point x* = f(x*, x0) of one batch of inputs (Def. 3.3), and everything the analysis knows there.

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
``jacobian_spectra``           ``rho``                                ``prop4`` (its matrix-free route, where
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
from typing import TYPE_CHECKING, Callable, Optional

import torch

if TYPE_CHECKING:
    from stability.analysis.accuracy import AccuracyCurve
    from stability.analysis.progress import Progress
    from stability.analysis.initial_iterate import InitialIterateBatched
    from stability.analysis.options import AnalysisOptions
    from stability.analysis.recall import DenseSpectra
    from stability.solvers import SolveResult


def analysis_model(model: torch.nn.Module, dtype: torch.dtype = torch.float64, device: Optional[str] = None):
    """A float64 (by default) copy of the model for analysis: eval mode, no parameter gradients."""
    m = copy.deepcopy(model).to(dtype=dtype)
    if device is not None:
        m = m.to(device)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


@dataclass
class DenseJacobians:
    """Every sample's dense J* = ∂f/∂x at x* (B, n, n) and their spectra, as stage ``rho`` computed them: stage
    ``prop4`` checks the assembled matrix of Prop. 4 against these J and takes their spectra where M = J* entry by
    entry (:func:`stability.analysis.recall.prop4_dense`)."""

    J: torch.Tensor
    spectra: DenseSpectra


@dataclass
class JacobianRho:
    """ρ(J*) and the leading eigenvalues ([re, im] pairs) per sample, as stage ``rho`` measured them (None where it
    did not: the samples past the first few on large states); what stages prop4, repelling and geometry reuse."""

    spectral_radius: list
    eigenvalues: list


@dataclass(eq=False)
class AtFixedPoint:
    """One batch of inputs at its fixed point (module docstring). ``model``: the analysis copy; ``inputs``,
    ``x0``, ``e``: (B, ...) on the model's device; ``score(logits, targets) -> (correct, position_accuracy)``
    (None: argmax); ``log``: one line of progress; ``split``: the name the log lines carry."""

    model: torch.nn.Module  # the analysis copy of a LoopedModel (stability.protocols)
    options: AnalysisOptions
    inputs: torch.Tensor
    x0: torch.Tensor
    e: torch.Tensor
    targets: Optional[torch.Tensor]
    score: Optional[Callable]
    log: Callable
    split: str
    solution: Optional[SolveResult] = None  # the solve from e (stage reachability)
    accuracy_curve: Optional[AccuracyCurve] = None  # Fig. 3's curve, scored during that solve
    dense_jacobians: Optional[DenseJacobians] = None
    jacobian_spectra: Optional[JacobianRho] = None  # ρ(J*) and the leading eigenvalues per sample (Props. 3–4)
    progress: Optional[Progress] = None  # stage-by-stage progress with the time left (stability.analysis.progress)

    def tick(self, done: int, total: int, what: str = "samples") -> None:
        """Inside a long stage: ``done`` of ``total`` units finished (a progress line now and then)."""
        if self.progress is not None:
            self.progress.tick(done, total, what)

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
        from stability.analysis.prop5 import default_T_grid

        return default_T_grid(self.options.max_iter)

    @cached_property
    def initial_iterate_tangent(self) -> InitialIterateBatched:
        """App. A.8's ‖dx_T/de · u‖ on :attr:`first_converged` for T in :attr:`T_grid` (u a seeded unit direction of
        e, x0 held fixed). Stage ``prop5`` sets it from its own unroll from e, which carries this tangent beside
        Prop. 5's; otherwise it is computed here by an unroll of its own (the same numbers to rounding)."""
        from stability.analysis.initial_iterate import initial_iterate_sensitivity_batched

        sl = slice(self.first_converged, self.first_converged + 1)
        return initial_iterate_sensitivity_batched(self.f, self.e[sl], self.x0[sl], self.T_grid,
                                                   seed=self.options.seed)
