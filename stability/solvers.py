"""Finding x*: one signature for Picard iteration, damped iteration and Anderson acceleration.

``solve(f, x_init, x0, method=...)`` iterates the loop map ``f(x, x0)`` (Def. 3.3; ``x0`` is passed through
unchanged, so an autonomous map simply ignores it) from ``x_init`` until each sample's fixed-point residual

    r(x) = ‖f(x, x0) − x‖∞ / (‖f(x, x0)‖∞ + ε)

falls below ``tol``. For Picard iteration x_{t+1} = f(x_t) this is exactly the FPRM criterion
‖x_{t+1} − x_t‖∞ / (‖x_{t+1}‖∞ + ε) < τ on consecutive iterates; damped and Anderson iterations are judged by the
same residual of f, so the three methods stop at comparable points. Everything is per sample (the batch is a
set of independent problems, as ``step`` guarantees): a sample that converges, diverges or turns non-finite
is frozen (no further evaluations of f are spent on it) and the others continue, so a batch never stops, or
fails, on the account of one sample.

Shapes (torchdeq-style; B = batch, S = the state's trailing shape, e.g. (L, d) or (9, 9, d), N = iterations):

=================  =============  ==================================================================================
``x_last``         (B, *S)        f of the last evaluated iterate (for a converged sample: the accepted x*)
``x_best``         (B, *S)        f of the iterate with the lowest residual
``residuals``      (B, N)         r at every evaluation; NaN after the sample stopped
``best_residual``  (B,)           the lowest residual (the one of ``x_best``'s pre-image)
``nfe``            (B,)           evaluations of f spent on the sample by the solve (cycle checks excluded)
``status``         (B,) of str    converged | max-iterations | stalled | diverged | non-finite
``period``         (B,)           1: converged to a fixed point; k ≥ 2: a period-k orbit was found; 0: neither
=================  =============  ==================================================================================

Statuses: *converged* r < τ; *diverged* ‖f(x)‖∞ grew past ``diverge_ratio`` times the scale of the start;
*non-finite* f returned NaN/Inf (``x_last`` then keeps the last finite image); *stalled* the best residual did
not improve by 1 % over the last ``stall_patience`` evaluations, or a period-k orbit was detected; otherwise
*max-iterations* (still improving when the budget ran out). Stalled samples are not frozen early: a residual can
plateau for a while (information crossing a long prefix-sum string) and then collapse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

STATUSES = ("converged", "max-iterations", "stalled", "diverged", "non-finite")
METHODS = ("picard", "damped", "anderson")
_DEFAULT_DAMPING = {"picard": 1.0, "damped": 0.5, "anderson": 1.0}


@dataclass
class SolveResult:
    """What :func:`solve` returns; see the module docstring for every field's shape."""

    x_last: torch.Tensor
    x_best: torch.Tensor
    residuals: torch.Tensor
    best_residual: torch.Tensor
    nfe: torch.Tensor
    status: list[str]
    period: torch.Tensor
    method: str = "picard"
    tol: float = 1e-4
    info: dict = field(default_factory=dict)

    @property
    def converged(self) -> torch.Tensor:
        """(B,) bool: status == converged."""
        return torch.tensor([s == "converged" for s in self.status], dtype=torch.bool)

    def status_counts(self) -> dict[str, int]:
        return {s: sum(1 for t in self.status if t == s) for s in STATUSES}

    def summary(self) -> dict:
        """JSON-ready per-batch summary: converged fraction, status counts, medians of nfe and residual."""
        best = self.best_residual.double()
        finite = best[torch.isfinite(best)]
        return {
            "method": self.method,
            "tol": self.tol,
            "samples": len(self.status),
            "converged_fraction": float(self.converged.float().mean()) if self.status else 0.0,
            "status_counts": self.status_counts(),
            "nfe_median": float(self.nfe.double().median()) if self.status else None,
            "residual_median": float(finite.median()) if finite.numel() else None,
            "periods": [int(p) for p in self.period],
        }


def residual(fx: torch.Tensor, x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Per-sample relative L∞ fixed-point residual ‖f(x) − x‖∞ / (‖f(x)‖∞ + ε), shape (B,)."""
    diff = (fx - x).flatten(1).abs().amax(1)
    return diff / (fx.flatten(1).abs().amax(1) + eps)


def _finite(t: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(t.flatten(1)).all(1)


def _take(x0, idx):
    return None if x0 is None else x0[idx]


def _anderson_mix(X: torch.Tensor, F: torch.Tensor, filled: torch.Tensor, beta: float, reg: float):
    """Type-II Anderson step for a batch of samples with their own histories.

    X, F: (A, m, n) past iterates and their images; filled: (A, m) bool. Solves
    min ‖Σ α_i (F_i − X_i)‖² s.t. Σ α_i = 1 (Tikhonov λ·max diag of the Gram matrix) through the bordered
    system, in float64; returns the mixed iterate (A, n) and ok (A,) (False where α is not finite or wild).
    """
    A, m, n = X.shape
    G = (F - X).double()
    H = G @ G.transpose(1, 2)  # (A, m, m)
    fm = filled.double()
    H = H * fm[:, :, None] * fm[:, None, :]
    scale = (torch.diagonal(H, dim1=1, dim2=2).amax(1) + 1e-300)
    eye = torch.eye(m, dtype=torch.float64, device=X.device)
    H = H + reg * scale[:, None, None] * eye + (1 - fm)[:, :, None] * eye  # empty slots: α_i = 0
    K = torch.zeros(A, m + 1, m + 1, dtype=torch.float64, device=X.device)
    K[:, 0, 1:] = fm
    K[:, 1:, 0] = fm
    K[:, 1:, 1:] = H
    rhs = torch.zeros(A, m + 1, dtype=torch.float64, device=X.device)
    rhs[:, 0] = 1.0
    sol = torch.linalg.solve_ex(K, rhs)[0]
    alpha = sol[:, 1:] * fm
    ok = torch.isfinite(alpha).all(1) & (alpha.abs().sum(1) < 1e4)
    alpha = torch.where(ok[:, None], alpha, torch.zeros_like(alpha)).to(X.dtype)
    mixed = beta * torch.einsum("am,amn->an", alpha, F) + (1 - beta) * torch.einsum("am,amn->an", alpha, X)
    return mixed, ok


def detect_period(f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], *, max_period: int = 8,
                  tol: float = 1e-4, eps: float = 1e-8) -> torch.Tensor:
    """Smallest period k ∈ [1, max_period] of an orbit through ``x`` (B, *S); 0 where none is found.

    Iterates y_{j+1} = f(y_j) for 2·max_period steps from y_0 = x and returns, per sample, the smallest k with
    ‖y_{s+k} − y_s‖∞ / (‖y_{s+k}‖∞ + ε) < tol for every s ∈ [0, max_period] (k = 1: a fixed point).
    """
    with torch.no_grad():
        ys = [x]
        for _ in range(2 * max_period):
            ys.append(f(ys[-1], x0))
        B = x.shape[0]
        period = torch.zeros(B, dtype=torch.long, device=x.device)
        for k in range(max_period, 0, -1):  # descending so the smallest k wins
            ok = torch.ones(B, dtype=torch.bool, device=x.device)
            for s in range(0, max_period + 1):
                r = residual(ys[s + k], ys[s], eps)
                ok &= torch.nan_to_num(r, nan=math.inf) < tol
            period = torch.where(ok, torch.full_like(period, k), period)
    return period


def solve(f: Callable, x_init: torch.Tensor, x0: Optional[torch.Tensor] = None, *, method: str = "picard",
          tol: float = 1e-4, max_iter: int = 500, damping: Optional[float] = None, memory: int = 5,
          reg: float = 1e-8, eps: float = 1e-8, stall_patience: int = 50, diverge_ratio: float = 1e6,
          restart_factor: float = 1e2, max_period: int = 8, cycle_tol: Optional[float] = None) -> SolveResult:
    """Find x* = f(x*, x0) per sample by Picard, damped or (safeguarded) Anderson iteration.

    Args:
        f: the loop map, ``f(x, x0) -> x'`` batch-first with independent samples (``model.step``).
        x_init: (B, *S) the first iterate e (Def. 3.1). x0: (B, *S') or None, passed through to f.
        method: ``picard`` x ← f(x); ``damped`` x ← (1−η)x + η f(x); ``anderson`` type-II Anderson acceleration
            with ``memory`` m past iterates, Tikhonov ``reg`` λ (relative to the Gram matrix) and mixing η.
        tol: τ of the relative L∞ residual. damping: η (default 1 for picard and anderson, 0.5 for damped).
        stall_patience: evaluations without a 1 % improvement of the best residual after which an unconverged
            sample is reported stalled. diverge_ratio: ‖f(x)‖∞ above this times max(1, ‖x_init‖∞, ‖f(x_init)‖∞)
            means diverged. restart_factor: Anderson safeguard: when a step's residual exceeds this times the
            best so far, or the mixing coefficients are not finite, the sample's history is cleared and it
            restarts from ``x_best``. max_period / cycle_tol: unconverged finite samples are checked for period-k
            orbits, k ≤ max_period, at tolerance cycle_tol (default 10·tol); 0 disables the check.

    Returns: :class:`SolveResult` (shapes in the module docstring). No autograd graph is built.
    """
    if method not in METHODS:
        raise ValueError(f"unknown solver method {method!r}; allowed: {', '.join(METHODS)}")
    if max_iter < 1:
        raise ValueError("max_iter must be at least 1")
    eta = _DEFAULT_DAMPING[method] if damping is None else float(damping)
    if not 0.0 < eta <= 1.0:
        raise ValueError(f"damping must be in (0, 1], got {eta}")
    if method == "picard":
        eta = 1.0
    cycle_tol = 10 * tol if cycle_tol is None else cycle_tol

    with torch.no_grad():
        x = x_init.detach().clone()
        B, dev = x.shape[0], x.device
        n = x[0].numel()
        x_last = x.clone()
        x_best = x.clone()
        best_r = torch.full((B,), math.inf, dtype=torch.float64, device=dev)
        ref_r = torch.full((B,), math.inf, dtype=torch.float64, device=dev)  # for stall detection
        last_improve = torch.zeros(B, dtype=torch.long, device=dev)
        nfe = torch.zeros(B, dtype=torch.long, device=dev)
        code = torch.full((B,), -1, dtype=torch.long, device=dev)  # -1 running, else index into STATUSES
        trace = torch.full((B, max_iter), math.nan, dtype=torch.float64, device=dev)
        scale = torch.ones(B, dtype=torch.float64, device=dev)
        start_norm = x.flatten(1).abs().amax(1).double()
        if method == "anderson":
            Xh = torch.zeros(B, memory, n, dtype=x.dtype, device=dev)
            Fh = torch.zeros(B, memory, n, dtype=x.dtype, device=dev)
            filled = torch.zeros(B, memory, dtype=torch.bool, device=dev)
            slot = torch.zeros(B, dtype=torch.long, device=dev)
        restarts = torch.zeros(B, dtype=torch.long, device=dev)
        iters = 0

        for it in range(max_iter):
            act = (code < 0).nonzero().flatten()
            if act.numel() == 0:
                break
            iters = it + 1
            xa = x[act]
            fa = f(xa, _take(x0, act))
            nfe[act] += 1
            finite = _finite(fa)
            r = residual(fa, xa, eps).double()
            r = torch.where(finite, r, torch.full_like(r, math.nan))
            trace[act, it] = r
            norm_f = fa.flatten(1).abs().amax(1).double()
            if it == 0:
                scale[act] = torch.maximum(torch.maximum(start_norm[act], norm_f.nan_to_num(0.0)),
                                           torch.ones_like(norm_f))
            diverged = finite & (norm_f > diverge_ratio * scale[act])
            # bookkeeping of the best image and of progress
            better = finite & (r < best_r[act])
            if better.any():
                idx = act[better]
                best_r[idx] = r[better]
                x_best[idx] = fa[better]
            improved = finite & (r < 0.99 * ref_r[act])
            if improved.any():
                idx = act[improved]
                ref_r[idx] = r[improved]
                last_improve[idx] = it
            ok = finite
            x_last[act[ok]] = fa[ok]
            conv = finite & (r < tol)
            new_code = torch.full_like(act, -1)
            new_code[conv] = STATUSES.index("converged")
            new_code[diverged & ~conv] = STATUSES.index("diverged")
            new_code[~finite] = STATUSES.index("non-finite")
            code[act] = new_code

            # next iterate for the samples still running
            run = new_code < 0
            if not run.any():
                continue
            ridx = act[run]
            xr, fr = xa[run], fa[run]
            if method == "anderson":
                Xa, Fa, fl, sl = Xh[ridx], Fh[ridx], filled[ridx], slot[ridx]
                rows = torch.arange(ridx.numel(), device=dev)
                Xa[rows, sl] = xr.flatten(1)
                Fa[rows, sl] = fr.flatten(1)
                fl[rows, sl] = True
                mixed, good = _anderson_mix(Xa, Fa, fl, eta, reg)
                blown = r[run] > restart_factor * best_r[ridx]
                reset = (~good) | blown
                nxt = mixed.view_as(xr)
                if reset.any():
                    # safeguard: forget the history and restart from the best image (a Picard step from the
                    # lowest-residual iterate), never worse than plain iteration from there
                    nxt = torch.where(reset.view(-1, *[1] * (xr.dim() - 1)), x_best[ridx], nxt)
                    fl[reset] = False
                    restarts[ridx[reset]] += 1
                Xh[ridx], Fh[ridx], filled[ridx] = Xa, Fa, fl
                slot[ridx] = torch.where(reset, torch.zeros_like(sl), (sl + 1) % memory)
                x[ridx] = nxt
            else:
                x[ridx] = fr if eta == 1.0 else (1 - eta) * xr + eta * fr

        # samples still running: stalled or out of budget
        running = code < 0
        stalled = running & (iters - 1 - last_improve >= stall_patience)
        code[stalled] = STATUSES.index("stalled")
        code[running & ~stalled] = STATUSES.index("max-iterations")
        period = torch.zeros(B, dtype=torch.long, device=dev)
        period[code == STATUSES.index("converged")] = 1
        check = ((code == STATUSES.index("stalled")) | (code == STATUSES.index("max-iterations"))).nonzero().flatten()
        if max_period > 0 and check.numel():
            p = detect_period(f, x_last[check], _take(x0, check), max_period=max_period, tol=cycle_tol, eps=eps)
            cyc = p >= 2
            period[check] = torch.where(cyc, p, torch.zeros_like(p))
            code[check[cyc]] = STATUSES.index("stalled")

    return SolveResult(
        x_last=x_last, x_best=x_best, residuals=trace[:, :iters].cpu(), best_residual=best_r.cpu(), nfe=nfe.cpu(),
        status=[STATUSES[int(c)] for c in code.cpu()], period=period.cpu(), method=method, tol=tol,
        info={"damping": eta, "memory": memory if method == "anderson" else None, "iterations": iters,
              "restarts": restarts.cpu().tolist() if method == "anderson" else None},
    )
