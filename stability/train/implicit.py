"""Equilibrium training (Attractor Models; DEQ): the forward pass finds x* = f(x*, x0) by Anderson acceleration,
the backward pass differentiates x* by the implicit function theorem.

Attractor Models eq. (8): ∂x*/∂θ = (I − J)⁻¹ ∂f/∂θ at x*, with J = ∂f/∂x (x*, x0). For a loss L(x*) with
δ = ∂L/∂x*, the gradient is ∇_θ L = (∂f/∂θ)ᵀ u with u the solution of the adjoint system

    (I − Jᵀ) u = δ,

solved matrix-free with vector–Jacobian products (one vjp of f per iteration, the forward graph of one
application of f kept):

* ``krylov``: restarted GMRES, batched per sample in torch (:func:`batched_gmres`);
* ``neumann``: the fixed-point iteration u ← Jᵀu + δ, i.e. the Neumann series Σ_j (Jᵀ)ʲ δ (converges at rate
  ρ(J) when ρ(J) < 1; Attractor Models App. B.1);
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

from stability.solvers import solve


# ---- linear solvers for the adjoint system --------------------------------------------------------------------
@dataclass
class AdjointInfo:
    """How the adjoint solve went: per-sample relative residual ‖(I − Jᵀ) u − δ‖ / ‖δ‖ and products with Jᵀ."""

    residual: torch.Tensor
    matvecs: int


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).flatten(1).sum(1)


def _bcast(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.view(-1, *[1] * (like.dim() - 1))


def batched_gmres(A: Callable[[torch.Tensor], torch.Tensor], b: torch.Tensor, *, tol: float = 1e-6,
                  max_matvecs: int = 30, restart: int = 20) -> tuple[torch.Tensor, AdjointInfo]:
    """Solve A u = b for every sample at once by restarted GMRES(m) with Givens rotations.

    ``A`` maps (B, *S) → (B, *S) and must act on each sample separately (block-diagonal over the batch, as f's
    Jacobian is); each sample has its own Krylov space, Hessenberg matrix and residual. Stops when every
    sample's relative residual is ≤ ``tol`` or after ``max_matvecs`` products. Computed in b's dtype, with the
    small Hessenberg problems in float64.
    """
    B = b.shape[0]
    x = torch.zeros_like(b)
    bnorm = b.flatten(1).norm(dim=1).double()
    safe_b = torch.where(bnorm > 0, bnorm, torch.ones_like(bnorm))
    used = 0
    r = b  # the residual b − A x at x = 0
    while True:
        beta = r.flatten(1).norm(dim=1).double()
        if bool((beta / safe_b <= tol).all()) or used >= max_matvecs:
            break
        m = min(restart, max_matvecs - used)
        V = [r / _bcast(torch.where(beta > 0, beta, torch.ones_like(beta)).to(r.dtype), r)]
        H = torch.zeros(B, m + 1, m, dtype=torch.float64, device=b.device)
        cs = torch.zeros(B, m, dtype=torch.float64, device=b.device)
        sn = torch.zeros(B, m, dtype=torch.float64, device=b.device)
        g = torch.zeros(B, m + 1, dtype=torch.float64, device=b.device)
        g[:, 0] = beta
        j_done = 0
        for j in range(m):
            w = A(V[j])
            used += 1
            for i in range(j + 1):  # modified Gram–Schmidt
                h = _dot(w, V[i])
                H[:, i, j] = h.double()
                w = w - _bcast(h, w) * V[i]
            hn = w.flatten(1).norm(dim=1)
            H[:, j + 1, j] = hn.double()
            V.append(w / _bcast(torch.where(hn > 0, hn, torch.ones_like(hn)), w))
            for i in range(j):  # the earlier Givens rotations, applied to the new column
                a, c = H[:, i, j].clone(), H[:, i + 1, j].clone()
                H[:, i, j] = cs[:, i] * a + sn[:, i] * c
                H[:, i + 1, j] = -sn[:, i] * a + cs[:, i] * c
            a, c = H[:, j, j], H[:, j + 1, j]
            den = torch.sqrt(a * a + c * c)
            ok = den > 0
            cs[:, j] = torch.where(ok, a / torch.where(ok, den, 1.0), torch.ones_like(a))
            sn[:, j] = torch.where(ok, c / torch.where(ok, den, 1.0), torch.zeros_like(a))
            H[:, j, j] = den
            H[:, j + 1, j] = 0.0
            g[:, j + 1] = -sn[:, j] * g[:, j]
            g[:, j] = cs[:, j] * g[:, j]
            j_done = j + 1
            if bool((g[:, j + 1].abs() / safe_b <= tol).all()):
                break
        R = H[:, :j_done, :j_done]
        diag = torch.diagonal(R, dim1=1, dim2=2)  # 0 only after a sample's exact (happy) breakdown, where g is 0
        R = R + torch.diag_embed((diag == 0).to(R.dtype))
        y = torch.linalg.solve_triangular(R, g[:, :j_done, None], upper=True)[..., 0]
        x = x + torch.einsum("bj,bj...->b...", y.to(b.dtype), torch.stack(V[:j_done], dim=1))
        r = b - A(x)  # the true residual: convergence check and restart
        used += 1
    return x, AdjointInfo(residual=(beta / safe_b).cpu(), matvecs=used)


def neumann(JT: Callable[[torch.Tensor], torch.Tensor], delta: torch.Tensor, *, tol: float = 1e-6,
            max_terms: int = 30) -> tuple[torch.Tensor, AdjointInfo]:
    """u = Σ_{j<N} (Jᵀ)ʲ δ by u ← Jᵀu + δ, per sample until ‖u_{j+1} − u_j‖ ≤ tol ‖δ‖ (converged samples are
    frozen) or ``max_terms`` products."""
    dnorm = delta.flatten(1).norm(dim=1)
    dnorm = torch.where(dnorm > 0, dnorm, torch.ones_like(dnorm))
    u = delta.clone()
    done = torch.zeros(delta.shape[0], dtype=torch.bool, device=delta.device)
    used = 0
    for _ in range(max_terms):
        nxt = JT(u) + delta
        used += 1
        step = (nxt - u).flatten(1).norm(dim=1) / dnorm
        u = torch.where(_bcast(done, u), u, nxt)
        done |= step <= tol
        if bool(done.all()):
            break
    residual = (u - JT(u) - delta).flatten(1).norm(dim=1).double() / dnorm.double()
    return u, AdjointInfo(residual=residual.cpu(), matvecs=used + 1)


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
            if method == "krylov":
                u, info = batched_gmres(lambda v: v - JT(v), delta, tol=tol, max_matvecs=max_iter)
            elif method == "neumann":
                u, info = neumann(JT, delta, tol=tol, max_terms=max_iter)
            else:
                raise ValueError(f"unknown implicit backward {method!r}; allowed: krylov, neumann, one-step")
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


def fixed_point(model, x0: torch.Tensor, e: torch.Tensor, cfg):
    """x* by the analysis core's Anderson solver (no graph): per sample, the image with the lowest residual."""
    return solve(model.step, e.detach(), x0.detach(), method="anderson", tol=cfg.solver_tol,
                 max_iter=cfg.iterations, memory=cfg.anderson_memory, max_period=0, certify_rho=False)


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
    x0 = model.embed(inputs)
    sol = fixed_point(model, x0, model.initial_state(x0), cfg)
    z = sol.x_best.detach().requires_grad_()
    reg = math_attention(module if module is not None else model) if cfg.jac_reg > 0 else contextlib.nullcontext()
    with torch.enable_grad(), reg:
        fz = model.step(z, x0)  # graph to the parameters and x0, and to z for the vjps with J
    adjoints: list = []
    out = attach_implicit_gradient(fz, z, cfg.implicit_backward, tol=cfg.backward_tol,
                                   max_iter=backward_budget(cfg), record=adjoints)
    loss = task.loss(model.readout(out), targets)
    if record is not None:
        record.update(forward=sol.summary(), adjoint=adjoints)
    if cfg.jac_reg > 0:
        jf = jacobian_frobenius(fz, z, cfg.jac_reg_probes, generator)
        if record is not None:
            record["jacobian_frobenius"] = float(jf.detach())
        loss = loss + cfg.jac_reg * jf
    return loss


def backward_budget(cfg) -> int:
    """Products with Jᵀ the adjoint solve may spend. Both solvers stop as soon as the relative residual is below
    ``backward_tol``; the cap is ``backward_iterations`` (the fixed budget) or, with ``backward_max_iterations``
    > 0 (the adaptive budget, the default), the larger of the two. Measured default (150): the training
    tolerance 1e-4 is reached in 46 products on the sudoku-size map at recall ×0.5 and in 123 at ×1.0
    (ρ(J*) ≈ 0.985), where the old fixed 30 ended at residuals 1.4e-3 and 2.8e-2 (benchmarks/RESULTS.md)."""
    cap = int(getattr(cfg, "backward_max_iterations", 0) or 0)
    return max(cap, int(cfg.backward_iterations)) if cap > 0 else int(cfg.backward_iterations)


class ImplicitStats:
    """One epoch's record of the implicit method: every adjoint solve's relative residual ‖(I − Jᵀ)u − δ‖/‖δ‖
    and products with Jᵀ, and the forward solves' convergence. ``summary()`` is what the epoch's metrics line
    gets under ``"implicit"``; the first adjoint solve of the epoch that misses ``backward_tol`` prints one
    warning on stderr (later misses of the same epoch are counted, not repeated)."""

    def __init__(self, cfg, stream=None):
        self.tol, self.budget = float(cfg.backward_tol), backward_budget(cfg)
        self.method = cfg.implicit_backward
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
        import statistics

        def med(v):
            return float(statistics.median(v)) if v else None

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
