"""Equilibrium training (Attractor Models; DEQ): the forward pass finds x* = f(x*, x0) by Anderson acceleration,
the backward pass differentiates x* by the implicit function theorem.

Attractor Models eq. (8): ∂x*/∂θ = (I − J)⁻¹ ∂f/∂θ at x*, with J = ∂f/∂x (x*, x0). For a loss L(x*) with
δ = ∂L/∂x*, the gradient is ∇_θ L = (∂f/∂θ)ᵀ u with u the solution of the adjoint system

    (I − Jᵀ) u = δ,

solved matrix-free with vector–Jacobian products (one vjp of f per iteration, the forward graph of one
application of f kept):

* ``krylov``: restarted GMRES(20), batched per sample in torch;
* ``neumann``: the fixed-point iteration u ← Jᵀu + δ, i.e. the Neumann series Σ_j (Jᵀ)ʲ δ (converges at rate
  ρ(J) when ρ(J) < 1; Attractor Models App. B.1);

both by :func:`stability.numerics.gmres.solve_I_minus_J` on the transposed map v ↦ Jᵀv (:func:`adjoint_solve`), the
one solver of (I − J) systems that the analysis (Prop. 5) and the training monitor use too;
* ``one-step``: the Jacobian-free backward (JFB), u = δ: the gradient through one application of f at x*.

The same u flows to x0 (hence to the embedding): the fixed point depends on x0 through f, not on the first
iterate e. Jacobian regularisation (Bai et al. 2021, cited by Attractor Models App. B.2) adds
λ · ‖J‖_F² / n, estimated by Hutchinson's identity E_ε ‖εᵀ J‖² = ‖J‖_F² with ε ~ N(0, I), per sample
(n = the state's size, so λ weighs the mean squared singular value), averaged over the batch.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from stability.analysis.fixed_point import FixedPoint
from stability.errors import ConfigError
from stability.numerics import solve_I_minus_J
from stability.solvers import IMPLICIT, Solve
from stability.stats import median as med


# ---- linear solvers for the adjoint system --------------------------------------------------------------------
@dataclass
class AdjointInfo:
    """How the adjoint solve went: per-sample relative residual ‖(I − Jᵀ) u − δ‖ / ‖δ‖ and products with Jᵀ."""

    residual: torch.Tensor
    matvecs: int


def adjoint_solve(JT: Callable[[torch.Tensor], torch.Tensor], delta: torch.Tensor, method: str, *,
                  tol: float = 1e-6, max_iter: int = 30, restart: int = 20) -> tuple[torch.Tensor, AdjointInfo]:
    """u with (I − Jᵀ) u = δ for every sample of the batch, by :func:`stability.numerics.gmres.solve_I_minus_J` on
    the transposed map ``JT`` (v ↦ Jᵀ v per sample): ``krylov`` is its batched GMRES(``restart``), ``neumann`` its
    Neumann series u ← Jᵀu + δ. ``max_iter`` caps the products with Jᵀ per sample (the residual check
    included); the info's residual is the per-sample ‖δ − (I − Jᵀ) u‖ / ‖δ‖ recomputed from u, its ``matvecs``
    the most products any sample spent."""
    kind = {"krylov": "gmres", "neumann": "neumann"}.get(method)
    if kind is None:
        raise ConfigError(f"unknown implicit backward {method!r}; allowed: krylov, neumann, one-step")
    sol = solve_I_minus_J(JT, delta, method=kind, tol=tol, max_iter=max_iter, restart=restart)
    return sol.x, AdjointInfo(residual=sol.residual.cpu(), matvecs=int(sol.iterations.max()) if sol.iterations.numel() else 0)


# ---- the implicit backward ---------------------------------------------------------------------------------------
class _ImplicitGradient(torch.autograd.Function):
    """Identity in the forward pass; in the backward pass replaces δ = ∂L/∂f(x*) by u = (I − Jᵀ)⁻¹ δ."""

    @staticmethod
    def forward(ctx, fz: torch.Tensor, adjoint: Callable) -> torch.Tensor:
        ctx.adjoint = adjoint
        return fz.clone()

    @staticmethod
    def backward(ctx, delta: torch.Tensor):
        return ctx.adjoint(delta), None


def attach_implicit_gradient(fz: torch.Tensor, z: torch.Tensor, method: str, *, tol: float = 1e-6,
                             max_iter: int = 30, record: Optional[list] = None) -> torch.Tensor:
    """Return fz (= f(z, x0) computed with z a leaf that requires grad, at z ≈ x*) with the implicit backward
    of Attractor Models eq. (8) attached: gradients reaching it are mapped δ → u = (I − Jᵀ)⁻¹ δ before they flow
    into f's parameters and x0. ``method``: krylov, neumann, or one-step (u = δ). Each adjoint solve's
    :class:`AdjointInfo` is appended to ``record`` when given."""
    if method == "one-step":
        return fz

    def JT(v: torch.Tensor) -> torch.Tensor:
        return torch.autograd.grad(fz, z, v, retain_graph=True)[0]

    def adjoint(delta: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            u, info = adjoint_solve(JT, delta, method, tol=tol, max_iter=max_iter)
        if record is not None:
            record.append(info)
        return u

    return _ImplicitGradient.apply(fz, adjoint)


def jacobian_frobenius(fz: torch.Tensor, z: torch.Tensor, probes: int = 1,
                       generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Hutchinson's estimate of the batch mean of ‖J_b‖_F² / n, J_b = ∂f/∂x of sample b at z (n = its size),
    differentiable in the parameters (the vjp is taken with ``create_graph``). E_ε ‖εᵀJ‖² = ‖J‖_F², ε ~ N(0, I)."""
    est = torch.zeros(z.shape[0], dtype=torch.float32, device=z.device)
    for _ in range(probes):
        eps = torch.randn(z.shape, generator=generator, dtype=z.dtype).to(z.device)
        vJ = torch.autograd.grad(fz, z, eps, retain_graph=True, create_graph=True)[0]
        est = est + vJ.float().pow(2).flatten(1).sum(1)
    return (est / (probes * z[0].numel())).mean()


def forward_solve(cfg) -> Solve:
    """The forward solve's options: the preset :data:`stability.solvers.IMPLICIT` (Anderson, no cycle check, no ρ)
    to the run's ``solver_tol`` within its ``iterations``, with its Anderson memory."""
    return IMPLICIT.replace(tol=cfg.method.solver_tol, max_iter=cfg.iterations, memory=cfg.method.anderson_memory)


@contextlib.contextmanager
def math_attention(module):
    """Run the attention's explicit math path: the fused kernel has no double backward, which the Jacobian
    regulariser's gradient needs."""
    impl = module.attention_impl
    module.attention_impl = "math"
    try:
        yield
    finally:
        module.attention_impl = impl


def implicit_loss(model, task, inputs: torch.Tensor, targets: torch.Tensor, cfg,
                  generator: Optional[torch.Generator] = None, record: Optional[dict] = None,
                  module: Optional[torch.nn.Module] = None) -> torch.Tensor:
    """The equilibrium-training loss of one batch: CE(readout(f(x*, x0))) with the implicit backward attached,
    plus ``jac_reg`` · ‖J‖_F²/n at x* when ``jac_reg`` > 0. ``record`` (a dict) receives the forward solve's
    summary, the adjoint solves' infos and the Jacobian estimate. ``module``: the nn.Module behind ``model``
    when ``model`` is a compiled wrapper (its attention path is switched for the regulariser)."""
    # x0 = embed(inputs) (with its graph), e as training draws it, and x* by the analysis' FixedPoint (no graph):
    # per sample, the iterate with the lowest residual
    fp = FixedPoint.of(model, inputs)
    sol, x0 = fp.solve(forward_solve(cfg)), fp.x0
    z = sol.x_best.detach().requires_grad_()
    reg = math_attention(module if module is not None else model) if cfg.method.jac_reg > 0 else contextlib.nullcontext()
    with torch.enable_grad(), reg:
        fz = model.step(z, x0)  # graph to the parameters and x0, and to z for the vjps with J
    adjoints: list = []
    out = attach_implicit_gradient(fz, z, cfg.method.implicit_backward, tol=cfg.method.backward_tol,
                                   max_iter=backward_budget(cfg), record=adjoints)
    loss = task.loss(model.readout(out), targets)
    if record is not None:
        record.update(forward=sol.summary(), adjoint=adjoints)
    if cfg.method.jac_reg > 0:
        jf = jacobian_frobenius(fz, z, cfg.method.jac_reg_probes, generator)
        if record is not None:
            record["jacobian_frobenius"] = float(jf.detach())
        loss = loss + cfg.method.jac_reg * jf
    return loss


def backward_budget(cfg) -> int:
    """Products with Jᵀ the adjoint solve may spend. Both solvers stop as soon as the relative residual is below
    ``backward_tol``; the cap is ``backward_iterations`` (the fixed budget) or, with ``backward_max_iterations``
    > 0 (the adaptive budget, the default), the larger of the two. Measured default (150): the training
    tolerance 1e-4 is reached in 46 products on the sudoku-size map at recall ×0.5 and in 123 at ×1.0
    (ρ(J*) ≈ 0.985), where the old fixed 30 ended at residuals 1.4e-3 and 2.8e-2 (benchmarks/RESULTS.md)."""
    m = cfg.method if hasattr(getattr(cfg, "method", None), "backward_iterations") else cfg  # TrainConfig or Implicit
    cap = int(getattr(m, "backward_max_iterations", 0) or 0)
    return max(cap, int(m.backward_iterations)) if cap > 0 else int(m.backward_iterations)


class ImplicitStats:
    """One epoch's record of the implicit method: every adjoint solve's relative residual ‖(I − Jᵀ)u − δ‖/‖δ‖
    and products with Jᵀ, and the forward solves' convergence. ``summary()`` is what the epoch's metrics line
    gets under ``"implicit"``; the first adjoint solve of the epoch that misses ``backward_tol`` prints one
    warning on stderr (later misses of the same epoch are counted, not repeated)."""

    def __init__(self, cfg, stream=None):
        self.tol, self.budget = float(cfg.method.backward_tol), backward_budget(cfg)
        self.method = cfg.method.implicit_backward
        self.residuals: list[float] = []
        self.products: list[int] = []
        self.forward_converged: list[float] = []
        self.forward_nfe: list[float] = []
        self.missed = 0
        self.warned = False
        self.stream = stream

    def add(self, record: dict) -> None:
        fwd = record.get("forward") or {}
        if fwd:
            self.forward_converged.append(float(fwd["converged_fraction"]))
            if fwd.get("nfe_median") is not None:
                self.forward_nfe.append(float(fwd["nfe_median"]))
        for info in record.get("adjoint", []):
            worst = float(info.residual.max()) if info.residual.numel() else 0.0
            self.residuals.append(worst)
            self.products.append(int(info.matvecs))
            if not worst <= self.tol:  # NaN counts as a miss
                self.missed += 1
                if not self.warned:
                    self.warned = True
                    import sys

                    print(f"stability train: warning: implicit backward ({self.method}) missed its tolerance: "
                          f"adjoint residual {worst:.2e} > backward_tol {self.tol:g} after {info.matvecs} products "
                          f"with Jᵀ (budget {self.budget}); the gradient is inexact by about that factor. Raise "
                          "--backward-max-iterations (iterate until the tolerance or that cap) or loosen "
                          "--backward-tol (this warning is shown once per epoch; the epoch's metrics count every "
                          "miss)", file=self.stream or sys.stderr, flush=True)

    def summary(self) -> dict:
        return {"adjoint_method": self.method, "adjoint_tol": self.tol, "adjoint_budget": self.budget,
                "adjoint_solves": len(self.residuals),
                "adjoint_residual_max": max(self.residuals) if self.residuals else None,
                "adjoint_residual_median": med(self.residuals),
                "adjoint_iterations_mean": (sum(self.products) / len(self.products)) if self.products else None,
                "adjoint_iterations_max": max(self.products) if self.products else None,
                "adjoint_missed": self.missed,
                "forward_converged_fraction": (sum(self.forward_converged) / len(self.forward_converged)
                                               if self.forward_converged else None),
                "forward_nfe_median": med(self.forward_nfe)}


def implicit_batch(ctx, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, int]:
    """One optimizer step of equilibrium training; returns (loss, 1). The probes of the Jacobian regulariser are
    drawn from the run's data generator, so a resumed run draws the same ones. The adjoint solve's residual and
    products reach the epoch's metrics through ``ctx.stats["implicit"]`` (:class:`ImplicitStats`)."""
    record: dict = {}
    with ctx.autocast():
        loss = implicit_loss(ctx.model, ctx.task, inputs, targets, ctx.cfg, generator=ctx.gen, module=ctx.params,
                             record=record)
    ctx.optimize(loss)  # the backward pass runs the adjoint solve, which appends to record["adjoint"]
    stats = getattr(ctx, "stats", None)
    if stats is not None:
        stats.setdefault("implicit", ImplicitStats(ctx.cfg)).add(record)
    return loss.item(), 1
