"""Finding x*: one signature for Picard, damped, Anderson and limited-memory Broyden iteration.

``solve(f, x_init, x0, method=...)`` iterates the loop map ``f(x, x0)`` (Def. 3.3; ``x0`` is passed through
unchanged, so an autonomous map simply ignores it) from ``x_init`` until each sample's fixed-point residual

    r(x) = ‖f(x, x0) − x‖∞ / (‖f(x, x0)‖∞ + ε)

falls below ``tol``. For Picard iteration x_{t+1} = f(x_t) this is exactly the FPRM criterion
‖x_{t+1} − x_t‖∞ / (‖x_{t+1}‖∞ + ε) < τ on consecutive iterates; damped, Anderson and Broyden iterations are
judged by the same residual of f, so every method stops at comparable points. Everything is per sample (the
batch is a set of independent problems, as ``step`` guarantees): a sample that converges, diverges or turns
non-finite is frozen (no further evaluations of f are spent on it) and the others continue, so a batch never
stops, or fails, on the account of one sample, and a sample's iterates do not depend on its batch mates.

Methods (the registry :data:`SOLVERS`; ``auto`` is :data:`AUTO`, chosen by ``benchmarks/solver_benchmarks.py``):

* ``picard`` x ← f(x) — the model's own iteration, the reachability the paper means;
* ``damped`` x ← (1 − η) x + η f(x);
* ``anderson`` type-II Anderson acceleration (memory m, Tikhonov λ relative to the Gram matrix, mixing η);
* ``broyden`` Broyden's "good" method on g(x) = f(x) − x with the inverse Jacobian kept as −I + Bᵀ K B over a
  basis B of at most 2·``memory`` residuals (limited memory: 2·m·n numbers per sample, whatever ``max_iter`` is,
  stored in float32 for a float64 state; when the basis is full, the correction is compressed to its best
  rank-(m/2 − 1) approximation).

Anderson and Broyden are root-finders: they can converge to a fixed point that f's own iteration cannot reach
(ρ(J*) > 1, Props. 3–4). For them ``solve`` reports ρ(J*) of every converged sample (:func:`classify`, the
route ``krylov`` of :func:`stability.numerics.spectra.spectral_radius`) and marks those with ρ(J*) > 1 ``repelling``.

Shapes (torchdeq-style; B = batch, S = the state's trailing shape, e.g. (L, d) or (9, 9, d), N = iterations):

=================  =============  ==================================================================================
``x_best``         (B, *S)        the iterate with the lowest residual: for a converged sample the certified x*,
                                  the very point whose r(x) < τ was measured
``x_last``         (B, *S)        f of the last evaluated iterate (the last finite image for a non-finite sample)
``residuals``      (B, N)         r at every solver evaluation; NaN after the sample stopped
``best_residual``  (B,)           the lowest residual, r(x_best)
``nfe``            (B,)           every evaluation of f spent on the sample, the cycle check's included
``status``         (B,) of str    converged | repelling | max-iterations | stalled | diverged | non-finite
``period``         (B,)           1: converged to a fixed point; k ≥ 2: a period-k orbit was found; 0: neither
``rho``            (B,) or None   ρ(J*) at x_best of converged samples (NaN elsewhere); None when not computed
=================  =============  ==================================================================================

Statuses: *converged* r < τ (and, where ρ(J*) was computed, ρ(J*) ≤ 1); *repelling* r < τ at a fixed point with
ρ(J*) > 1 — a fixed point, but not one the model's iteration reaches (``converged`` is true for both: the
root was found and certified); *diverged* ‖f(x)‖∞ or ‖x‖∞ grew past ``diverge_ratio`` times the scale of the
start; *non-finite* f returned NaN/Inf; *stalled* the best residual did not improve by 1 % over the last
``stall_patience`` evaluations, or a period-k orbit was detected (``period`` k ≥ 2); otherwise *max-iterations*
(still improving when the budget ran out). Stalled samples are not frozen early: a residual can plateau for a
while (information crossing a long prefix-sum string) and then collapse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from stability.errors import ConfigError
from stability.numerics import Linearisation, exact, spectral_radius
from stability.stats import FIXED_POINT_STATUSES, median

STATUSES = ("converged", "max-iterations", "stalled", "diverged", "non-finite", "repelling")
_CONV, _MAXIT, _STALL, _DIV, _NONFIN, _REPEL = range(6)


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
    rho: Optional[torch.Tensor] = None

    @property
    def converged(self) -> torch.Tensor:
        """(B,) bool: a fixed point was found and certified (a status of :data:`FIXED_POINT_STATUSES`)."""
        return torch.tensor([s in FIXED_POINT_STATUSES for s in self.status], dtype=torch.bool)

    @property
    def repelling(self) -> torch.Tensor:
        """(B,) bool: status repelling (a certified fixed point with ρ(J*) > 1)."""
        return torch.tensor([s == "repelling" for s in self.status], dtype=torch.bool)

    def status_counts(self) -> dict[str, int]:
        return {s: sum(1 for t in self.status if t == s) for s in STATUSES}

    def summary(self) -> dict:
        """JSON-ready per-batch summary: converged fraction, status counts, medians of nfe and residual."""
        best = self.best_residual.double()
        finite = best[torch.isfinite(best)]
        out = {
            "method": self.method,
            "tol": self.tol,
            "samples": len(self.status),
            "converged_fraction": float(self.converged.float().mean()) if self.status else 0.0,
            "status_counts": self.status_counts(),
            "nfe_median": median(self.nfe.tolist()) if self.status else None,
            "residual_median": median(finite.tolist()),
            "periods": [int(p) for p in self.period],
        }
        if self.rho is not None:
            out["rho"] = [None if not math.isfinite(v) else float(v) for v in self.rho.tolist()]
        return out


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


# ---- the per-method proposals ---------------------------------------------------------------------------------
# Each method keeps its own per-sample state for the samples still running, in the loop's order (rows are dropped
# by ``keep`` as samples finish, so every step works on whole tensors, without gathers), and proposes the next
# iterate from the running samples' iterates x, images fx (both (A, n)) and residuals r; it returns
# (next (A, n), reset (A,)) where ``reset`` marks samples whose proposal a safeguard refused (the loop then
# restarts them with a Picard step from their lowest-residual iterate, and ``forget`` clears their history).

class _Picard:
    name = "picard"

    def __init__(self, B, n, dtype, device, *, damping=1.0, **_):
        self.eta = damping

    def propose(self, x, fx, r, best_r):
        nxt = fx if self.eta == 1.0 else (1 - self.eta) * x + self.eta * fx
        return nxt, None

    def keep(self, mask):
        pass

    def forget(self, mask):
        pass

    def info(self):
        return {"damping": self.eta}


class _Anderson:
    name = "anderson"

    def __init__(self, B, n, dtype, device, *, memory=5, damping=1.0, reg=1e-8, restart_factor=1e2, **_):
        self.m, self.eta, self.reg, self.restart_factor = memory, damping, reg, restart_factor
        self.X = torch.zeros(B, memory, n, dtype=dtype, device=device)
        self.F = torch.zeros(B, memory, n, dtype=dtype, device=device)
        self.filled = torch.zeros(B, memory, dtype=torch.bool, device=device)
        self.slot = torch.zeros(B, dtype=torch.long, device=device)

    def propose(self, x, fx, r, best_r):
        rows = torch.arange(x.shape[0], device=x.device)
        self.X[rows, self.slot] = x
        self.F[rows, self.slot] = fx
        self.filled[rows, self.slot] = True
        mixed, good = _anderson_mix(self.X, self.F, self.filled, self.eta, self.reg)
        self.slot = (self.slot + 1) % self.m
        return mixed, (~good) | (r > self.restart_factor * best_r)

    def keep(self, mask):
        self.X, self.F, self.filled, self.slot = self.X[mask], self.F[mask], self.filled[mask], self.slot[mask]

    def forget(self, mask):
        self.filled[mask] = False
        self.slot[mask] = 0

    def info(self):
        return {"damping": self.eta, "memory": self.m, "reg": self.reg}


def _mv(M: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Batched small matrix–vector products M v, (..., r, k) · (..., k) → (..., r), as one elementwise product and
    a sum: a batched GEMM on many tiny matrices costs ≈ 10 µs a matrix on the CPU (measured: 32 products with
    80 × 80 matrices 322 µs by ``bmm``, 115 µs this way)."""
    return (M * v.unsqueeze(-2)).sum(-1)


class _Broyden:
    """Limited-memory "good" Broyden on g(x) = f(x) − x (Broyden 1965, the inverse-Jacobian update DEQ solvers
    use) in a compact form over one basis: H ≈ (∂g/∂x)⁻¹ = −I + Bᵀ K B, where the rows of B (k × n) are the
    residuals g₀ … g_k since the last restart and K is k × k (in the spirit of the compact quasi-Newton matrices
    of Byrd, Nocedal & Schnabel 1994: every uᵢ, vᵢ of the update −I + Σ uᵢvᵢᵀ lies in span(g₀ … gᵢ), so it is
    kept as a coefficient vector). The step x ← x − η H g is the plain Broyden one: with s = Δx, y = Δg,
    v = Hᵀ s, u = (s − H y) / (vᵀ y), K ← K + μ νᵀ for the coefficients μ, ν of u, v, where H g_{k−1} = −s/η
    reuses the previous step. The Gram matrix Γ = B Bᵀ is kept, so the update is done in coefficient space and a
    step makes two passes over the stored vectors: B g (inner products, also Γ's new row) and x − η Bᵀ h.

    Limited memory: at most 2·``memory`` basis vectors (the 2·m·n numbers per sample of m stored pairs; 5 for
    m < 3). When full, the correction Bᵀ K B is replaced by its best rank-q approximation Ũᵀ Ṽ (Broyden rank
    reduction, van de Rotten & Verduyn Lunel 2003; q = ``memory``/2 − 1 unless ``rank`` is set), through Γ's
    eigendecomposition (no n × k factorisation); the new basis is Ũ, Ṽ and the last s and g (2q + 2 vectors), so
    the next update's secant condition holds for the compressed H. The measurements that set these defaults are in
    ``benchmarks/RESULTS.md``.

    Storage: for a float64 state the basis is kept in float32 (:attr:`storage`), the coefficients, Γ and K in
    float64. Both passes are memory-bound, so this halves their cost (and the memory); the residuals' rounding,
    6e-8 of each stored g, perturbs the quasi-Newton direction relative to the step, not to x, so the attainable
    residual does not floor (measured to τ = 1e-12 with the same evaluation counts; benchmarks/RESULTS.md)."""

    name = "broyden"
    rank: Optional[int] = None  # q of the rank reduction; None: memory // 2 − 1
    #: dtype of the stored basis for a float64 state (None: the state's own; other states keep their dtype)
    storage: Optional[torch.dtype] = torch.float32
    chunk = 4096  # columns per block of the in-place basis change

    def __init__(self, B, n, dtype, device, *, memory=40, damping=1.0, restart_factor=1e2, **_):
        self.m, self.eta, self.restart_factor = memory, damping, restart_factor
        self.q = q = max(1, min(self.rank if self.rank is not None else memory // 2 - 1, memory - 2))
        self.cap = c = max(2 * memory, 2 * q + 3)  # room after a rank reduction (memory < 3: 5 vectors)
        # B is not zeroed: slots [0, top) hold a basis vector or zeros in every row, those above are never read
        self.B = torch.empty(B, c, n, dtype=self.storage if dtype == torch.float64 and self.storage is not None
                             else dtype, device=device)
        self.top = 0
        self.G = torch.zeros(B, c, c, dtype=torch.float64, device=device)  # Γ = B Bᵀ
        self.K = torch.zeros(B, c, c, dtype=torch.float64, device=device)
        self.sig = torch.zeros(B, c, dtype=torch.float64, device=device)  # coefficients of s = x_k − x_{k−1}
        self.gp = torch.zeros(B, c, dtype=torch.float64, device=device)  # coefficients of g_{k−1}
        self.count = torch.zeros(B, dtype=torch.long, device=device)  # basis vectors in use per row
        self.kmax, self.uniform = 0, True  # max of count; every row has the same count
        self.fresh = torch.ones(B, dtype=torch.bool, device=device)  # restarted: no previous step
        self.any_fresh = True
        self.compressions = 0

    def _compress(self, rows):
        """Replace the correction Bᵀ K B of ``rows`` (full bases) by its best rank-q approximation Ũᵀ Ṽ, on the
        new basis (Ũ, Ṽ, s, g_{k−1})."""
        q, k = self.q, 2 * self.q + 2
        G, K = self.G[rows], self.K[rows]
        # B = Rᵀ Qᵀ with Q = Bᵀ C orthonormal: C = D E Λ^-½, R = Λ^½ Eᵀ D⁻¹ (D scales Γ to unit diagonal)
        d = torch.diagonal(G, dim1=1, dim2=2).clamp_min(1e-300).rsqrt()
        lam, E = torch.linalg.eigh(G * d[:, :, None] * d[:, None, :])
        cut = lam > 1e-12 * lam[:, -1:].clamp_min(1e-300)  # directions Γ cannot resolve are dropped
        sq = torch.where(cut, exact.sqrt(lam.clamp_min(0)), torch.zeros_like(lam))
        inv = torch.where(cut, 1 / sq.clamp_min(1e-300), torch.zeros_like(lam))
        C = d[:, :, None] * E * inv[:, None, :]
        R = sq[:, :, None] * E.transpose(1, 2) / d[:, None, :]
        W, s, Zh = torch.linalg.svd(R @ K @ R.transpose(1, 2))  # Bᵀ K B = Q (R K Rᵀ) Qᵀ
        Tu = (C @ (W[:, :, :q] * s[:, None, :q])).transpose(1, 2)
        Tv = (C @ Zh[:, :q, :].transpose(1, 2)).transpose(1, 2)
        T = torch.cat([Tu, Tv, self.sig[rows, None], self.gp[rows, None]], 1)  # (A, 2q + 2, cap)
        Tb = T.to(self.B.dtype)
        n = self.B.shape[2]
        for i, row in enumerate(rows.tolist()):  # B ← T B in place, a block of columns at a time
            for j in range(0, n, self.chunk):
                blk = self.B[row, :, j:j + self.chunk]
                blk[:k] = Tb[i] @ blk
        if rows.numel() == self.B.shape[0]:
            self.top = k  # every row holds k vectors; the slots above are not read before they are written
        else:
            self.B[rows, k:self.top] = 0
            self.uniform = False
        G = torch.zeros_like(G)
        G[:, :k, :k] = T @ self.G[rows] @ T.transpose(1, 2)
        K = torch.zeros_like(K)
        ar = torch.arange(q, device=K.device)
        K[:, ar, q + ar] = 1.0  # Σ ũᵢ ṽᵢᵀ
        self.G[rows], self.K[rows] = G, K
        self.sig[rows] = 0
        self.sig[rows, 2 * q] = 1.0
        self.gp[rows] = 0
        self.gp[rows, 2 * q + 1] = 1.0
        self.count[rows] = k
        self.kmax = int(self.count.max())
        self.compressions += int(rows.numel())

    def propose(self, x, fx, r, best_r):
        if self.kmax >= self.cap:
            self._compress((self.count >= self.cap).nonzero().flatten())
        A = x.shape[0]
        k = self.kmax + 1
        # g as stored (rounded to float32 for a float64 state), written straight into its slot
        if self.uniform:  # the usual case: one slot for every row
            c0 = k - 1
            g = torch.sub(fx, x, out=self.B[:, c0])
            self.top = max(self.top, k)
        else:
            if k > self.top:
                self.B[:, self.top:k] = 0
                self.top = k
            rows = torch.arange(A, device=x.device)
            g = (fx - x).to(self.B.dtype)
            self.B[rows, self.count] = g
        Bk = self.B[:, :k]
        # p_j = b_j · g (rows past c: 0), with the stored (rounded) g, so that Γ is the Gram matrix of B as stored
        p = torch.bmm(g.unsqueeze(1), Bk.transpose(1, 2)).squeeze(1).double()
        if self.uniform:
            self.G[:, c0, :k] = p
            self.G[:, :k, c0] = p
            eg = torch.zeros_like(p)
            eg[:, c0] = 1.0
        else:
            self.G[rows, self.count, :k] = p
            self.G[rows, :k, self.count] = p
            eg = torch.nn.functional.one_hot(self.count, k).double()
        G, K = self.G[:, :k, :k], self.K[:, :k, :k]
        h = _mv(K, p) - eg  # coefficients of H g
        if not (self.any_fresh and bool(self.fresh.all())):
            sig = self.sig[:, :k]
            psi = eg - self.gp[:, :k]  # y = g − g_{k−1}
            nu = _mv(K.transpose(1, 2), _mv(G, sig)) - sig  # v = Hᵀ s
            Y = torch.stack([nu, psi], 1)
            M = (Y.unsqueeze(2) * _mv(G.unsqueeze(1), Y).unsqueeze(1)).sum(-1)  # [v, y]ᵀ Γ [v, y]: (A, 2, 2)
            den, vv, dd = M[:, 0, 1], M[:, 0, 0], M[:, 1, 1]
            # |vᵀΔg| not negligible against ‖v‖‖Δg‖ (false for NaN; squares from Γ can round below 0)
            ok = den * den > 1e-60 * (vv * dd).abs()
            if self.any_fresh:
                ok &= ~self.fresh
            mu = (sig * (1 - 1 / self.eta) - h if self.eta != 1.0 else -h) / den[:, None]
            if not bool(ok.all()):
                mu = torch.where(ok[:, None], mu, torch.zeros_like(mu)).nan_to_num(0.0, 0.0, 0.0)
            K.addcmul_(mu.unsqueeze(2), nu.unsqueeze(1))  # K + μ νᵀ, in place in self.K
            h = torch.addcmul(h, mu, torch.linalg.vecdot(nu, p)[:, None])  # H' g = H g + u (vᵀ g)
        # x − η Bᵀ h (h holds g's own −1: the −g term of H g)
        if Bk.dtype == x.dtype:
            nxt = torch.baddbmm(x.unsqueeze(1), h.to(Bk.dtype).unsqueeze(1), Bk, alpha=-self.eta).squeeze(1)
        else:  # the pass in the basis' dtype, the sum with x in x's
            nxt = torch.add(x, torch.bmm(h.to(Bk.dtype).unsqueeze(1), Bk).squeeze(1), alpha=-self.eta)
        torch.mul(h, -self.eta, out=self.sig[:, :k])
        self.gp[:, :k] = eg
        self.count += 1
        self.kmax += 1
        if self.any_fresh:
            self.fresh.zero_()
            self.any_fresh = False
        return nxt, (~torch.isfinite(nxt.sum(1))) | (r > self.restart_factor * best_r)

    def keep(self, mask):
        # in place: the running rows move up (a fresh (B, cap, n) buffer would cost a copy and its page faults)
        idx = mask.nonzero().flatten().tolist()
        for new_row, old_row in enumerate(idx):
            if new_row != old_row:
                self.B[new_row, :self.top] = self.B[old_row, :self.top]
        self.B = self.B[:len(idx)]
        self.G, self.K, self.sig, self.gp = self.G[mask], self.K[mask], self.sig[mask], self.gp[mask]
        self.fresh, self.count = self.fresh[mask], self.count[mask]
        if idx and not self.uniform:
            self.uniform = bool((self.count == self.count[0]).all())
            self.kmax = int(self.count.max())

    def forget(self, mask):
        self.B[mask, :self.top] = 0
        for t in (self.G, self.K, self.sig, self.gp):
            t[mask] = 0
        self.fresh[mask] = True
        self.any_fresh = True
        self.count[mask] = 0
        self.uniform = bool(mask.all())
        self.kmax = int(self.count.max())

    def info(self):
        return {"damping": self.eta, "memory": self.m, "compressions": self.compressions, "rank": self.q,
                "basis": self.cap, "storage": str(self.B.dtype).replace("torch.", "")}


SOLVERS: dict[str, type] = {"picard": _Picard, "damped": _Picard, "anderson": _Anderson, "broyden": _Broyden}
#: what ``method="auto"`` runs (chosen by benchmarks/solver_benchmarks.py; benchmarks/RESULTS.md states the measurement)
AUTO = "broyden"
METHODS = (*SOLVERS, "auto")
ROOT_FINDERS = ("anderson", "broyden")
_DEFAULT_DAMPING = {"picard": 1.0, "damped": 0.5, "anderson": 1.0, "broyden": 1.0}
_DEFAULT_MEMORY = {"anderson": 20, "broyden": 40}  # measured: benchmarks/RESULTS.md, "Fixed-point solvers"
_DEFAULT_RESTART = {"broyden": 1e4}  # measured: benchmarks/RESULTS.md, "Fixed-point solvers" (others: 1e2)


def register_solver(name: str, cls: type) -> None:
    """Add a method to :data:`SOLVERS` (a class with ``__init__(B, n, dtype, device, **options)``, ``propose``,
    ``forget`` and ``info`` as the built-in ones)."""
    global METHODS
    SOLVERS[name] = cls
    _DEFAULT_DAMPING.setdefault(name, 1.0)
    METHODS = (*SOLVERS, "auto")


def detect_period(f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], *, max_period: int = 8,
                  tol: float = 1e-4, eps: float = 1e-8) -> torch.Tensor:
    """Smallest period k ∈ [1, max_period] of an orbit through ``x`` (B, *S); 0 where none is found.

    Iterates y_{j+1} = f(y_j) for 2·max_period steps from y_0 = x (2·max_period evaluations of f per sample)
    and returns, per sample, the smallest k with ‖y_{s+k} − y_s‖∞ / (‖y_{s+k}‖∞ + ε) < tol for every
    s ∈ [0, max_period] (k = 1: a fixed point).
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


def classify(result: SolveResult, f: Callable, x0: Optional[torch.Tensor], *, tol: float = 1e-6,
             fast_f: Optional[Callable] = None, **kwargs) -> SolveResult:
    """ρ(J*) at ``x_best`` of every converged sample, by :func:`stability.numerics.spectra.spectral_radius`
    (route ``krylov``: matrix-free Krylov–Schur on Jᵀ, Ritz residual ``tol``; exact to rounding for n ≤ 60; with
    ``fast_f``, the same map in float32, its products in float32 and every result certified in float64); sets
    ``result.rho`` (NaN for the others) and marks a converged sample with ρ(J*) > 1 ``repelling`` (Props. 3–4:
    plain iteration of f cannot reach it). In place; returns ``result``. The products with Jᵀ are counted in
    ``result.info["rho_products"]`` (they are not evaluations of f, so not in ``nfe``)."""
    B = len(result.status)
    rho = torch.full((B,), math.nan, dtype=torch.float64)
    idx = result.converged.nonzero().flatten()
    products = 0
    if idx.numel():
        dev = result.x_best.device
        xs = result.x_best[idx.to(dev)]
        xb = None if x0 is None else x0[idx.to(x0.device)]
        fast = None if fast_f is None else Linearisation(fast_f, xs.float(), None if xb is None else xb.float())
        spec = spectral_radius(Linearisation(f, xs, xb), route="krylov", fast=fast, tol=tol, **kwargs)
        rho[idx] = spec.rho.detach().double().cpu()
        products = int(spec.matvecs)
        for i, b in enumerate(idx.tolist()):
            result.status[b] = "repelling" if float(rho[b]) > 1.0 else "converged"
    result.rho = rho
    result.info["rho_products"] = products
    result.info["rho_tol"] = tol
    return result


def solve(f: Callable, x_init: torch.Tensor, x0: Optional[torch.Tensor] = None, *, method: str = "picard",
          tol: float = 1e-4, max_iter: int = 500, damping: Optional[float] = None, memory: Optional[int] = None,
          reg: float = 1e-8, eps: float = 1e-8, stall_patience: int = 50, diverge_ratio: float = 1e6,
          restart_factor: Optional[float] = None, max_period: int = 8, cycle_tol: Optional[float] = None,
          certify_rho: Optional[bool] = None, rho_tol: float = 1e-6,
          observe: Optional[Callable[[int, torch.Tensor], None]] = None, observe_steps: int = 0) -> SolveResult:
    """Find x* = f(x*, x0) per sample by Picard, damped, Anderson or limited-memory Broyden iteration.

    Args:
        f: the loop map, ``f(x, x0) -> x'`` batch-first with independent samples (``model.step``).
        x_init: (B, *S) the first iterate e (Def. 3.1). x0: (B, *S') or None, passed through to f.
        method: one of :data:`METHODS` (module docstring); ``auto`` runs :data:`AUTO`.
        tol: τ of the relative L∞ residual. damping: η (default 1, 0.5 for damped; Anderson's mixing, Broyden's
            step length). memory: Anderson's m past iterates (20) or Broyden's m (40: 2m stored vectors).
        reg: Anderson's Tikhonov λ, relative to the largest diagonal entry of the Gram matrix.
        stall_patience: evaluations without a 1 % improvement of the best residual after which an unconverged
            sample is reported stalled. diverge_ratio: ‖f(x)‖∞ or ‖x‖∞ above this times
            max(1, ‖x_init‖∞, ‖f(x_init)‖∞) means diverged. restart_factor: root-finder safeguard: when a step's
            residual exceeds this times the best so far, or the proposal is not finite, the sample's history is
            cleared and it restarts with a Picard step from its best iterate (default 1e2 for Anderson, 1e4 for
            Broyden, whose residual can rise by 10²–10³ on its way down: measured in benchmarks/RESULTS.md). max_period / cycle_tol: unconverged
            finite samples are checked for period-k orbits, k ≤ max_period, at tolerance cycle_tol (default
            10·tol); 0 disables the check (its 2·max_period evaluations per checked sample count in ``nfe``).
        certify_rho: compute ρ(J*) of the converged samples and mark ρ > 1 ``repelling`` (:func:`classify`, to
            Ritz residual ``rho_tol``); default: for the root-finders (anderson, broyden), not for picard/damped.
        observe / observe_steps (plain Picard only): every sample is iterated from x_init for observe_steps steps
            whatever its status, one evaluation of the whole batch a step, and ``observe(t, x_t)`` sees each
            x_t = f(x_{t−1}, x0), t = 1..observe_steps: the accuracy against iteration from the solve's own
            evaluations (stage accuracy of :mod:`stability.analysis.stages`). The solve reads its running
            samples' rows of these, so its result is the one without ``observe`` (equal bit for bit where f's
            rows do not depend on the rest of the batch: tests/solvers/test_solvers.py); those evaluations of samples it
            has stopped are not in ``nfe``.

    Returns: :class:`SolveResult` (shapes in the module docstring). No autograd graph is built.
    """
    requested = method
    if method == "auto":
        method = AUTO
    if method not in SOLVERS:
        raise ConfigError(f"unknown solver method {requested!r}; allowed: {', '.join(METHODS)}")
    if max_iter < 1:
        raise ConfigError("max_iter must be at least 1")
    eta = _DEFAULT_DAMPING[method] if damping is None else float(damping)
    if not 0.0 < eta <= 1.0:
        raise ConfigError(f"damping must be in (0, 1], got {eta}")
    if method == "picard":
        eta = 1.0
    mem = _DEFAULT_MEMORY.get(method, 5) if memory is None else int(memory)
    if mem < 1:
        raise ConfigError("memory must be at least 1")
    cycle_tol = 10 * tol if cycle_tol is None else cycle_tol
    if restart_factor is None:
        restart_factor = _DEFAULT_RESTART.get(method, 1e2)
    watching = observe is not None and observe_steps > 0
    if watching and (method != "picard" or eta != 1.0):
        raise ConfigError("observe needs plain Picard iteration (method picard), whose iterates are f's images")

    with torch.no_grad():
        x = x_init.detach().clone()
        B, dev = x.shape[0], x.device
        S = x.shape[1:]
        n = x[0].numel()
        solver = SOLVERS[method](B, n, x.dtype, dev, memory=mem, damping=eta, reg=reg,
                                 restart_factor=restart_factor)
        x_last = x.clone()
        x_best = x.clone()
        fx_best = x.clone()  # the image of x_best: a restart's Picard step
        best_r = torch.full((B,), math.inf, dtype=torch.float64, device=dev)
        ref_r = torch.full((B,), math.inf, dtype=torch.float64, device=dev)  # for stall detection
        last_improve = torch.zeros(B, dtype=torch.long, device=dev)
        nfe = torch.zeros(B, dtype=torch.long, device=dev)
        code = torch.full((B,), -1, dtype=torch.long, device=dev)  # -1 running, else index into STATUSES
        trace = torch.full((B, max_iter), math.nan, dtype=torch.float64, device=dev)
        scale = torch.ones(B, dtype=torch.float64, device=dev)
        start_norm = x.flatten(1).abs().amax(1).double()
        restarts = torch.zeros(B, dtype=torch.long, device=dev)
        iters = 0
        act = torch.arange(B, device=dev)
        plain = x.clone() if watching else None  # the whole batch's plain iterate, for observe

        for it in range(max(max_iter, observe_steps) if watching else max_iter):
            observing = watching and it < observe_steps  # past observe_steps: the running samples only, as without
            if observing:
                plain = f(plain, x0)
                observe(it + 1, plain)
                if act.numel() == 0 or it >= max_iter:
                    continue
            elif act.numel() == 0:
                break
            iters = it + 1
            xa = x[act]
            # a running sample's iterate is its row of the plain iterate (Picard with η = 1: x_{t+1} = f(x_t))
            fa = plain[act] if observing else f(xa, _take(x0, act))
            nfe[act] += 1
            finite = _finite(fa)
            r = residual(fa, xa, eps).double()
            r = torch.where(finite, r, torch.full_like(r, math.nan))
            trace[act, it] = r
            norm_f = fa.flatten(1).abs().amax(1).double()
            norm_x = xa.flatten(1).abs().amax(1).double()
            if it == 0:
                scale[act] = torch.maximum(torch.maximum(start_norm[act], norm_f.nan_to_num(0.0)),
                                           torch.ones_like(norm_f))
            diverged = finite & (torch.maximum(norm_f, norm_x) > diverge_ratio * scale[act])
            # bookkeeping of the best iterate (the pre-image whose residual was measured) and of progress
            better = finite & (r < best_r[act])
            if bool(better.any()):
                idx = act[better]
                best_r[idx] = r[better]
                x_best[idx] = xa[better]
                fx_best[idx] = fa[better]
            improved = finite & (r < 0.99 * ref_r[act])
            if bool(improved.any()):
                idx = act[improved]
                ref_r[idx] = r[improved]
                last_improve[idx] = it
            x_last[act[finite]] = fa[finite]
            conv = finite & (r < tol)
            new_code = torch.full_like(act, -1)
            new_code[diverged & ~conv] = _DIV
            new_code[conv] = _CONV
            new_code[~finite] = _NONFIN
            code[act] = new_code

            # next iterate for the samples still running
            run = new_code < 0
            if not bool(run.all()):
                if not bool(run.any()):
                    act = act[:0]
                    continue
                solver.keep(run)
                act, xa, fa, r = act[run], xa[run], fa[run], r[run]
            nxt, reset = solver.propose(xa.flatten(1), fa.flatten(1), r, best_r[act])
            nxt = nxt.view(-1, *S)
            if reset is not None and bool(reset.any()):
                # safeguard: forget the history and restart with a Picard step from the best iterate, never
                # worse than plain iteration from there
                nxt = torch.where(reset.view(-1, *[1] * len(S)), fx_best[act], nxt)
                solver.forget(reset)
                restarts[act[reset]] += 1
            x[act] = nxt

        # samples still running: stalled or out of budget
        running = code < 0
        stalled = running & (iters - 1 - last_improve >= stall_patience)
        code[stalled] = _STALL
        code[running & ~stalled] = _MAXIT
        period = torch.zeros(B, dtype=torch.long, device=dev)
        period[code == _CONV] = 1
        check = ((code == _STALL) | (code == _MAXIT)).nonzero().flatten()
        if max_period > 0 and check.numel():
            p = detect_period(f, x_last[check], _take(x0, check), max_period=max_period, tol=cycle_tol, eps=eps)
            nfe[check] += 2 * max_period
            cyc = p >= 2
            period[check] = torch.where(cyc, p, torch.zeros_like(p))
            code[check[cyc]] = _STALL

    info = {"damping": eta, "memory": mem if method in ROOT_FINDERS else None, "iterations": iters,
            "restarts": restarts.cpu().tolist() if method in ROOT_FINDERS else None, "requested": requested,
            **{k: v for k, v in solver.info().items() if k not in ("damping", "memory")}}
    result = SolveResult(
        x_last=x_last, x_best=x_best, residuals=trace[:, :iters].cpu(), best_residual=best_r.cpu(), nfe=nfe.cpu(),
        status=[STATUSES[int(c)] for c in code.cpu()], period=period.cpu(), method=method, tol=tol, info=info)
    if certify_rho is None:
        certify_rho = method in ROOT_FINDERS
    if certify_rho:
        classify(result, f, x0, tol=rho_tol)
    return result
