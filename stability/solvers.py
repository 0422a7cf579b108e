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
``x_last``         (B, *S)        f of the last evaluated iterate; for a sample that diverged or turned non-finite,
                                  the last image that was neither (Picard: the iterate its last evaluation started
                                  from)
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

Options: every knob is a field of one frozen value, :class:`Solve` (``solve(f, e, x0, Solve(method="broyden"))``, or
the same fields as keywords), with a preset for each caller that is not the analysis' own solve from e
(:data:`POLISH`, :data:`MONITOR`, :data:`HALTING`, :data:`IMPLICIT`, :data:`CONTINUED`). A row-wise option
(``rows=``, a :class:`Rows`) adds early stop rules and rows that start and end at their own times, each with a
budget of its own (the geometry stage's continued solves, :mod:`stability.analysis.continuation`). One solve is
its state (:class:`Run`), its passes (:func:`_iterate`: :meth:`Run.evaluate`, the rows' stop rules,
:meth:`Run.advance`) and its finish (:meth:`Run.finish`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, NamedTuple, Optional

import torch

from stability.errors import ConfigError
from stability.numerics import Linearisation, exact, spectral_radius
from stability.stats import FIXED_POINT_STATUSES, median

#: the status of a converged sample whose fixed point repels (ρ(J*) > 1): stability.stats names it once
REPELLING = FIXED_POINT_STATUSES[1]

STATUSES = ("converged", "max-iterations", "stalled", "diverged", "non-finite", REPELLING)
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
        return torch.tensor([s == REPELLING for s in self.status], dtype=torch.bool)

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
            "periods": [int(p) for p in self.period.tolist()],
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
        self.filled &= ~mask[:, None]  # no boolean-mask write (a host sync on a GPU)
        self.slot = torch.where(mask, torch.zeros_like(self.slot), self.slot)

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

    def __init__(self, B, n, dtype, device, *, memory=40, damping=1.0, restart_factor=1e2, batched=False, **_):
        self.m, self.eta, self.restart_factor = memory, damping, restart_factor
        self.batched = batched  # rows leave and are compressed by one batched operation (Solve.batched)
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
        self.all_fresh = True  # the batched path's host copy of fresh.all() (see _all_fresh)
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
        if self.batched:  # every row at once: one product, (A, k, n) more memory for the while
            self.B[rows, :k] = torch.matmul(Tb, self.B[rows])
        for i, row in enumerate([] if self.batched else rows.tolist()):  # B ← T B in place, a block at a time
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
        if not (self.any_fresh and self._all_fresh()):
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
            if self.batched or not bool(ok.all()):  # batched: always masked, no host sync (issue 35)
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
            self.any_fresh = self.all_fresh = False
        return nxt, (~torch.isfinite(nxt.sum(1))) | (r > self.restart_factor * best_r)

    def _all_fresh(self) -> bool:
        """Every row restarted (no previous step): read on the host per row; on the batched path known without a
        sync, since the rows are fresh together only before the first step or after a forget of them all."""
        return self.all_fresh if self.batched else bool(self.fresh.all())

    def keep(self, mask):
        if self.batched:  # one gather of the running rows (a fresh buffer), no loop over them
            self.B = self.B[mask]
            idx = self.B.shape[0]
        else:  # in place: the running rows move up (a fresh (B, cap, n) buffer: a copy and its page faults)
            rows = mask.nonzero().flatten().tolist()
            for new_row, old_row in enumerate(rows):
                if new_row != old_row:
                    self.B[new_row, :self.top] = self.B[old_row, :self.top]
            idx = len(rows)
            self.B = self.B[:idx]
        self.G, self.K, self.sig, self.gp = self.G[mask], self.K[mask], self.sig[mask], self.gp[mask]
        self.fresh, self.count = self.fresh[mask], self.count[mask]
        # batched: kmax stays an upper bound (the slots past a row's count are zeros) and uniform stays False, so
        # that rows leaving cost no host sync (issue 35); per row: both read in one host sync
        if idx and not self.uniform and not self.batched:
            uniform, self.kmax = torch.stack([(self.count == self.count[0]).all().long(), self.count.max()]).tolist()
            self.uniform = bool(uniform)

    def forget_reads(self, mask):
        """What :meth:`forget` of ``mask`` reads on the host, as tensors for the caller's one sync: whether every
        row is forgotten, and the longest history left."""
        return [mask.all().long(), torch.where(mask, 0, self.count).max()]

    def forget(self, mask, reads=None):
        """Clear the histories of the rows ``mask``; ``reads``: :meth:`forget_reads`'s values, read by the caller
        (None: read here, one host sync)."""
        if reads is None:
            reads = torch.stack(self.forget_reads(mask)).tolist()
        self.B[mask, :self.top] = 0
        for t in (self.G, self.K, self.sig, self.gp):
            t[mask] = 0
        self.fresh[mask] = True
        self.any_fresh = True
        self.count[mask] = 0
        every, self.kmax = reads
        self.uniform = self.all_fresh = bool(every)

    def info(self):
        return {"damping": self.eta, "memory": self.m, "compressions": self.compressions, "rank": self.q,
                "basis": self.cap, "storage": str(self.B.dtype).replace("torch.", "")}


# ---- the registry ---------------------------------------------------------------------------------------------
#: method name -> the class of its proposals (torchdeq-style: one signature, a registry)
SOLVERS: dict[str, type] = {}
#: method name -> its defaults when the options leave them None (damping, memory, restart_factor)
_DEFAULTS: dict[str, dict] = {}
#: the methods that are root-finders: their ρ(J*) is certified by default and their restarts are reported
ROOT_FINDERS: tuple = ()
METHODS: tuple = ("auto",)
#: what ``method="auto"`` runs (chosen by benchmarks/solver_benchmarks.py; benchmarks/RESULTS.md states the measurement)
AUTO = "broyden"


def register_solver(name: str, cls: type, *, damping: float = 1.0, memory: int = 5, restart_factor: float = 1e2,
                    root_finder: bool = False) -> None:
    """Add a method to :data:`SOLVERS`, as the built-in ones are: ``cls`` has ``__init__(B, n, dtype, device,
    **options)``, ``propose``, ``keep``, ``forget`` and ``info`` (the per-method proposals above); ``damping``,
    ``memory`` and ``restart_factor`` are its defaults where the options leave them None; a ``root_finder`` has its
    converged samples' ρ(J*) certified by default and its restarts reported."""
    global METHODS, ROOT_FINDERS
    SOLVERS[name] = cls
    _DEFAULTS[name] = {"damping": damping, "memory": memory, "restart_factor": restart_factor}
    ROOT_FINDERS = tuple(m for m in ROOT_FINDERS if m != name) + ((name,) if root_finder else ())
    METHODS = (*SOLVERS, "auto")


register_solver("picard", _Picard)
register_solver("damped", _Picard, damping=0.5)
# memory and restart factors measured: benchmarks/RESULTS.md, "Fixed-point solvers"
register_solver("anderson", _Anderson, memory=20, root_finder=True)
register_solver("broyden", _Broyden, memory=40, restart_factor=1e4, root_finder=True)


# ---- the options --------------------------------------------------------------------------------------------
#: how the divergence bound is scaled: by max(1, ‖x_init‖∞, ‖f(x_init)‖∞) ("start-and-image", the default), or by
#: max(1, ‖x_init‖∞) alone ("start": the continued solves of the geometry stage, whose start is a fixed point of a
#: nearby map)
SCALES = ("start-and-image", "start")
#: a stall patience no solve reaches: a sample still running at the budget is max-iterations, never stalled
NEVER = 2 ** 62


@dataclass(frozen=True)
class Solve:
    """How :func:`solve` iterates: every knob, one frozen value (the presets below; ``replace`` for a variant).

    method: one of :data:`METHODS` (module docstring); ``auto`` runs :data:`AUTO`. tol: τ of the relative L∞
    residual. max_iter: the evaluations of f per sample (the cycle check's aside). damping: η (default 1, 0.5 for
    damped; Anderson's mixing, Broyden's step length; plain Picard is always η = 1). memory: Anderson's m past
    iterates (20) or Broyden's m (40: 2m stored vectors). reg: Anderson's Tikhonov λ, relative to the largest
    diagonal entry of the Gram matrix. eps: the residual's ε. stall_patience: evaluations without a 1 %
    improvement of the best residual after which a sample still running at the budget is reported stalled.
    diverge_ratio: ‖f(x)‖∞ or ‖x‖∞ above this times the start's scale (:data:`SCALES`) means diverged.
    restart_factor: root-finder safeguard: when a step's residual exceeds this times the best so far, or the
    proposal is not finite, the sample's history is cleared and it restarts with a Picard step from its best
    iterate (default 1e2 for Anderson, 1e4 for Broyden, whose residual can rise by 10²–10³ on its way down:
    measured in benchmarks/RESULTS.md). max_period / cycle_tol: unconverged finite samples are checked for
    period-k orbits, k ≤ max_period, at tolerance cycle_tol (default 10·tol); 0 disables the check (its
    2·max_period evaluations per checked sample count in ``nfe``). certify_rho: compute ρ(J*) of the converged
    samples and mark ρ > 1 ``repelling`` (:func:`classify`, to Ritz residual ``rho_tol``); default: for the
    root-finders, not for picard/damped. name: what the preset is for (a label; it changes nothing). batched:
    the GPU's path of the solvers' row bookkeeping (Broyden's rows leave the batch and are compressed by one batched
    operation each, no per-row Python loop; the same iteration to rounding); None: on a GPU only (the CPU keeps
    its in-place per-row path, bit for bit), True with ``--batch all`` (issue 35)."""

    method: str = "picard"
    tol: float = 1e-4
    max_iter: int = 500
    damping: Optional[float] = None
    memory: Optional[int] = None
    reg: float = 1e-8
    eps: float = 1e-8
    stall_patience: int = 50
    diverge_ratio: float = 1e6
    scale: str = "start-and-image"
    restart_factor: Optional[float] = None
    max_period: int = 8
    cycle_tol: Optional[float] = None
    certify_rho: Optional[bool] = None
    rho_tol: float = 1e-6
    name: str = "solve"
    batched: Optional[bool] = None

    def replace(self, **changes) -> "Solve":
        """This preset with ``changes`` (field name → value); an unknown name is a TypeError."""
        return replace(self, **changes)

    def plan(self) -> "_Plan":
        """The options resolved and checked: the method ``auto`` stands for, η, m, the restart factor, the cycle
        check's τ and whether ρ(J*) is certified (a :class:`~stability.errors.ConfigError` for a bad one)."""
        method = AUTO if self.method == "auto" else self.method
        if method not in SOLVERS:
            raise ConfigError(f"unknown solver method {self.method!r}; allowed: {', '.join(METHODS)}")
        if self.max_iter < 1:
            raise ConfigError("max_iter must be at least 1")
        if self.scale not in SCALES:
            raise ConfigError(f"unknown scale {self.scale!r}; allowed: {', '.join(SCALES)}")
        defaults = _DEFAULTS[method]
        eta = defaults["damping"] if self.damping is None else float(self.damping)
        if not 0.0 < eta <= 1.0:
            raise ConfigError(f"damping must be in (0, 1], got {eta}")
        if method == "picard":
            eta = 1.0
        mem = defaults["memory"] if self.memory is None else int(self.memory)
        if mem < 1:
            raise ConfigError("memory must be at least 1")
        return _Plan(method=method, eta=eta, memory=mem,
                     restart_factor=defaults["restart_factor"] if self.restart_factor is None else self.restart_factor,
                     cycle_tol=10 * self.tol if self.cycle_tol is None else self.cycle_tol,
                     certify=method in ROOT_FINDERS if self.certify_rho is None else bool(self.certify_rho))


@dataclass(frozen=True)
class _Plan:
    method: str
    eta: float
    memory: int
    restart_factor: float
    cycle_tol: float
    certify: bool


#: stage prop5's polish of one x* by further Picard steps, so that its error floor is GMRES's and not τ's
POLISH = Solve(tol=1e-13, max_period=0, name="polish")
#: residual halting at inference (:mod:`stability.analysis.halting`): Picard, each sample frozen at r < τ, no
#: divergence or cycle checks (a sample runs until it halts or the budget is spent)
HALTING = Solve(diverge_ratio=math.inf, max_period=0, certify_rho=False, name="halting")
#: implicit training's forward solve (:mod:`stability.train.implicit`): Anderson, no cycle check, no ρ
IMPLICIT = Solve(method="anderson", max_period=0, certify_rho=False, name="implicit")
#: the training monitor's cheap solve (:mod:`stability.analysis.monitor`): Picard to τ = 1e-4 within 200
MONITOR = Solve(tol=1e-4, max_iter=200, name="monitor")
#: the continued solves of the geometry stage (:mod:`stability.analysis.continuation`, which adds its early stop
#: rules): Picard, the divergence bound scaled by the start alone, no stall status and no cycle check at the budget
CONTINUED = Solve(scale="start", stall_patience=NEVER, max_period=0, certify_rho=False, name="continued")


# ---- orbits ---------------------------------------------------------------------------------------------------

def orbit_period(ys: torch.Tensor, max_period: int, tol: float, eps: float = 1e-8) -> torch.Tensor:
    """Smallest period k ∈ [1, max_period] of the orbits ``ys`` (B, L, *S), L ≥ 2·max_period + 1 consecutive
    iterates y_0 … y_{L−1} per sample: the smallest k with ‖y_{s+k} − y_s‖∞ / (‖y_{s+k}‖∞ + ε) < tol for every
    s ∈ [0, max_period] (k = 1: a fixed point); 0 where none. The one orbit criterion of the package
    (:func:`detect_period`, and the continued solves' plateaus on their stored iterates)."""
    Y = ys.flatten(2)
    M = max_period
    period = torch.zeros(Y.shape[0], dtype=torch.long, device=Y.device)
    for k in range(M, 0, -1):  # descending so the smallest k wins
        a = Y[:, k:k + M + 1]
        r = (a - Y[:, :M + 1]).abs().amax(2) / (a.abs().amax(2) + eps)
        ok = (torch.nan_to_num(r, nan=math.inf) < tol).all(1)
        period = torch.where(ok, torch.full_like(period, k), period)
    return period


def detect_period(f: Callable, x: torch.Tensor, x0: Optional[torch.Tensor], *, max_period: int = 8,
                  tol: float = 1e-4, eps: float = 1e-8) -> torch.Tensor:
    """Smallest period k ∈ [1, max_period] of an orbit through ``x`` (B, *S); 0 where none is found.

    Iterates y_{j+1} = f(y_j) for 2·max_period steps from y_0 = x (2·max_period evaluations of f per sample)
    and returns :func:`orbit_period` of y_0 … y_{2·max_period} (k = 1: a fixed point).
    """
    with torch.no_grad():
        ys = [x]
        for _ in range(2 * max_period):
            ys.append(f(ys[-1], x0))
        return orbit_period(torch.stack(ys, 1), max_period, tol, eps)


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
            result.status[b] = REPELLING if float(rho[b]) > 1.0 else "converged"
    result.rho = rho
    result.info["rho_products"] = products
    result.info["rho_tol"] = tol
    return result


# ---- one solve: its state, a pass, the finish -----------------------------------------------------------------

class Rows:
    """A hook on the rows (samples) of a solve, :func:`solve`'s row-wise option; this base does nothing.

    ``stop(run)`` is called after every evaluation, on the rows still running (``run.act``; their iterates,
    images and residuals ``run.cur``, None when none is): it may end some by ``run.stop`` (an early stop rule).
    ``after(run)`` is called at the end of every pass (``run.ended``: the rows that pass ended, those its
    evaluation ended first, then those of each ``run.stop``). With
    ``rowwise`` set, every row starts idle and is (re)started by ``run.restart`` from ``before(run)`` or
    ``after(run)``, at any pass, with a budget of ``max_iter`` evaluations of its own, and the solve ends when no
    row is running after ``before``: rows that start and finish independently (the continued solves of the
    geometry stage, each at its own parameters). Row-wise solves are plain Picard (the root-finders' histories
    do not restart)."""

    rowwise = False

    def before(self, run: "Run") -> None:
        """Before each pass."""

    def stop(self, run: "Run") -> None:
        """After each evaluation, on the rows still running."""

    def after(self, run: "Run") -> None:
        """At the end of each pass."""


class _Pass(NamedTuple):
    x: torch.Tensor  # (A, *S) the running rows' iterates
    fx: torch.Tensor  # their images
    r: torch.Tensor  # (A,) float64 their residuals


class Run:
    """The state of one solve: every sample's iterate and bookkeeping, all (B, ...) in the batch's order, the
    running samples' rows in ``act`` (ascending). ``age``: evaluations since the sample (re)started; ``best_r``
    the lowest residual and ``x_best`` its pre-image; ``ref_r`` / ``last_improve``: the last 1 % improvement of
    the residual and the age it was reached at; ``code``: −1 running, else an index into :data:`STATUSES`."""

    def __init__(self, f: Callable, x_init: torch.Tensor, x0, how: Solve, plan: _Plan, rowwise: bool = False):
        x = x_init.detach().clone()
        B, dev = x.shape[0], x.device
        self.f, self.x0, self.how, self.plan, self.rowwise = f, x0, how, plan, rowwise
        self.batched = dev.type == "cuda" if how.batched is None else how.batched  # Solve.batched
        self.S = x.shape[1:]
        self.solver = SOLVERS[plan.method](B, x[0].numel(), x.dtype, dev, memory=plan.memory, damping=plan.eta,
                                           reg=how.reg, restart_factor=plan.restart_factor,
                                           batched=self.batched)
        self.x, self.x_last, self.x_best = x, x.clone(), x.clone()
        self.fx_best = x.clone()  # the image of x_best: a restart's Picard step
        self.best_r = torch.full((B,), math.inf, dtype=torch.float64, device=dev)
        self.ref_r = torch.full((B,), math.inf, dtype=torch.float64, device=dev)  # for stall detection
        self.last_improve = torch.zeros(B, dtype=torch.long, device=dev)
        self.age = torch.zeros(B, dtype=torch.long, device=dev)
        self.nfe = torch.zeros(B, dtype=torch.long, device=dev)
        # -1 running, else an index into STATUSES (a row-wise row not started yet: max-iterations, 0 evaluations)
        self.code = torch.full((B,), _MAXIT if rowwise else -1, dtype=torch.long, device=dev)
        self.period = torch.zeros(B, dtype=torch.long, device=dev)
        self.trace = torch.full((B, how.max_iter), math.nan, dtype=torch.float64, device=dev)
        self.start_norm = x.flatten(1).abs().amax(1).double()
        self.scale = torch.ones(B, dtype=torch.float64, device=dev)
        self.fresh = torch.ones(B, dtype=torch.bool, device=dev)  # scale set from the next image
        self.any_fresh = how.scale == "start-and-image" and not rowwise
        if how.scale == "start":
            self.scale = torch.maximum(self.start_norm, torch.ones_like(self.start_norm))
        self.restarts = torch.zeros(B, dtype=torch.long, device=dev)
        self.iters = 0
        self.act = torch.arange(B, device=dev)[:0 if rowwise else B]
        self.cur: Optional[_Pass] = None
        self.ended: list = []
        self.pending: Optional[torch.Tensor] = None  # Solve.batched: refused rows whose histories are not cleared

    def evaluate(self, images: Optional[torch.Tensor] = None) -> None:
        """One evaluation of f on the running rows (``images``: the whole batch's images, already evaluated),
        their bookkeeping, and the rows it ends (converged, diverged, non-finite; row-wise: out of budget)."""
        act, how = self.act, self.how
        xa = self.x[act]
        fa = images[act] if images is not None else self.f(xa, _take(self.x0, act))
        self.nfe[act] += 1
        self.age[act] += 1
        finite = _finite(fa)
        r = residual(fa, xa, how.eps).double()
        r = torch.where(finite, r, torch.full_like(r, math.nan))
        self.trace[act, self.age[act] - 1] = r
        norm_f = fa.flatten(1).abs().amax(1).double()
        norm_x = xa.flatten(1).abs().amax(1).double()
        if self.any_fresh:  # the scale of a (re)started row: its start and its first image
            new = torch.maximum(torch.maximum(self.start_norm[act], norm_f.nan_to_num(0.0)), torch.ones_like(norm_f))
            self.scale[act] = torch.where(self.fresh[act], new, self.scale[act])
            self.fresh[act] = False
            self.any_fresh = False
        conv = finite & (r < how.tol)
        pending = self._take_pending()
        diverged = finite & (torch.maximum(norm_f, norm_x) > how.diverge_ratio * self.scale[act]) & ~conv
        self._progress(act, xa, fa, r, finite)
        # x_last: the last image that neither diverged nor turned non-finite
        kept = finite & ~diverged
        if self.batched:  # every running row rewritten, no boolean-mask gather (a host sync on a GPU)
            self.x_last[act] = torch.where(kept.view(-1, *[1] * len(self.S)), fa, self.x_last[act])
        else:
            self.x_last[act[kept]] = fa[kept]
        new_code = torch.full_like(act, -1)
        new_code[diverged] = _DIV
        new_code[conv] = _CONV
        new_code[~finite] = _NONFIN
        if self.rowwise:
            new_code[(new_code < 0) & (self.age[act] >= how.max_iter)] = _MAXIT
        self.code[act] = new_code
        run = new_code < 0
        self.ended, self.cur = [act[:0]], _Pass(xa, fa, r)
        # the evaluation's one host sync: whether every row runs, whether any does, and (batched) whether the
        # last proposal refused a row, with what clearing those rows' histories reads (a method's optional
        # forget_reads)
        extra = [] if pending is None else getattr(self.solver, "forget_reads", lambda mask: [])(pending)
        reads = [] if pending is None else [pending.any(), *extra]
        all_run, any_run, *refused = torch.stack([t.long() for t in (run.all(), run.any(), *reads)]).tolist()
        if refused and refused[0] and extra:
            self.solver.forget(pending, refused[1:])
        elif refused and refused[0]:
            self.solver.forget(pending)
        if not all_run:
            self.ended[0] = act[~run]
            if not any_run:
                self.act, self.cur = act[:0], None
                return
            self._drop(run)

    def _progress(self, act, xa, fa, r, finite) -> None:
        """The best iterate (the pre-image whose residual was measured) and the last 1 % improvement."""
        better = finite & (r < self.best_r[act])
        if self.batched:  # no host sync: every running row rewritten, the better ones with their new values
            row = better.view(-1, *[1] * len(self.S))
            self.best_r[act] = torch.where(better, r, self.best_r[act])
            self.x_best[act] = torch.where(row, xa, self.x_best[act])
            self.fx_best[act] = torch.where(row, fa, self.fx_best[act])
            improved = finite & (r < 0.99 * self.ref_r[act])
            self.ref_r[act] = torch.where(improved, r, self.ref_r[act])
            self.last_improve[act] = torch.where(improved, self.age[act], self.last_improve[act])
            return
        if bool(better.any()):
            idx = act[better]
            self.best_r[idx] = r[better]
            self.x_best[idx] = xa[better]
            self.fx_best[idx] = fa[better]
        improved = finite & (r < 0.99 * self.ref_r[act])
        if bool(improved.any()):
            idx = act[improved]
            self.ref_r[idx] = r[improved]
            self.last_improve[idx] = self.age[idx]

    def _take_pending(self) -> Optional[torch.Tensor]:
        """The rows (a mask over ``act``) whose proposal the batched path refused in :meth:`advance` and whose
        histories it has not cleared yet; None when none is pending."""
        pending, self.pending = self.pending, None
        return pending

    def _flush(self) -> None:
        """Clear the pending refused rows' histories now (before the solver's rows change)."""
        pending = self._take_pending()
        if pending is not None and bool(pending.any()):
            self.solver.forget(pending)

    def _drop(self, keep: torch.Tensor) -> None:
        """Keep the running rows where ``keep`` (a mask over ``act``)."""
        self._flush()
        self.solver.keep(keep)
        self.act = self.act[keep]
        self.cur = _Pass(*(t[keep] for t in self.cur))

    def stop(self, mask: torch.Tensor, status: str, period: Optional[torch.Tensor] = None) -> None:
        """End the running rows where ``mask`` (over ``act``) with ``status`` (of :data:`STATUSES`; and
        ``period``)."""
        rows = self.act[mask]
        self.code[rows] = STATUSES.index(status)
        if period is not None:
            self.period[rows] = period
        self.ended.append(rows)
        if bool(mask.all()):
            self.act, self.cur = self.act[:0], None
        else:
            self._drop(~mask)

    def status(self, rows: torch.Tensor) -> list:
        """The status of the rows ``rows`` now (``running`` for a row still running)."""
        return [STATUSES[c] if c >= 0 else "running" for c in self.code[rows].tolist()]

    def advance(self) -> None:
        """The next iterate of every running row (the method's proposal; a refused one restarts the row's history
        with a Picard step from its best iterate, never worse than plain iteration from there)."""
        if self.cur is None:
            return
        act, (xa, fa, r) = self.act, self.cur
        nxt, reset = self.solver.propose(xa.flatten(1), fa.flatten(1), r, self.best_r[act])
        nxt = nxt.view(-1, *self.S)
        if reset is not None and self.batched:  # no host sync: the refused rows' Picard steps by torch.where
            self.x[act] = torch.where(reset.view(-1, *[1] * len(self.S)), self.fx_best[act], nxt)
            self.restarts[act] += reset.long()
            self.pending = reset  # their histories cleared before the solver's state is next used (_flush)
            return
        if reset is not None and bool(reset.any()):
            nxt = torch.where(reset.view(-1, *[1] * len(self.S)), self.fx_best[act], nxt)
            self.solver.forget(reset)
            self.restarts[act[reset]] += 1
        self.x[act] = nxt

    def restart(self, rows: torch.Tensor, x_init: torch.Tensor) -> None:
        """(Row-wise) start the rows ``rows`` afresh from ``x_init`` (len(rows), *S) with a budget of their own."""
        self.x[rows] = x_init
        for t in (self.x_last, self.x_best, self.fx_best):
            t[rows] = x_init
        for t, v in ((self.best_r, math.inf), (self.ref_r, math.inf), (self.trace, math.nan)):
            t[rows] = v
        for t in (self.last_improve, self.age, self.period):
            t[rows] = 0
        self.code[rows] = -1
        self.start_norm[rows] = x_init.flatten(1).abs().amax(1).double()
        if self.how.scale == "start":
            self.scale[rows] = torch.maximum(self.start_norm[rows], torch.ones_like(self.start_norm[rows]))
        else:
            self.fresh[rows] = True
            self.any_fresh = True
        self.act = torch.sort(torch.cat([self.act, rows])).values

    def finish(self) -> SolveResult:
        """Statuses of the rows still running (stalled, or out of budget), the cycle check, the result."""
        how, plan = self.how, self.plan
        code, period, nfe = self.code, self.period, self.nfe
        running = code < 0
        stalled = running & (self.age - self.last_improve >= how.stall_patience)
        code[stalled] = _STALL
        code[running & ~stalled] = _MAXIT
        period[code == _CONV] = 1
        check = ((code == _STALL) | (code == _MAXIT)).nonzero().flatten()
        if how.max_period > 0 and check.numel():
            p = detect_period(self.f, self.x_last[check], _take(self.x0, check), max_period=how.max_period,
                              tol=plan.cycle_tol, eps=how.eps)
            nfe[check] += 2 * how.max_period
            cyc = p >= 2
            period[check] = torch.where(cyc, p, torch.zeros_like(p))
            code[check[cyc]] = _STALL
        root = plan.method in ROOT_FINDERS
        info = {"damping": plan.eta, "memory": plan.memory if root else None, "iterations": self.iters,
                "restarts": self.restarts.cpu().tolist() if root else None, "requested": how.method,
                **{k: v for k, v in self.solver.info().items() if k not in ("damping", "memory")}}
        return SolveResult(
            x_last=self.x_last, x_best=self.x_best, residuals=self.trace[:, :self.iters].cpu(),
            best_residual=self.best_r.cpu(), nfe=nfe.cpu(), status=[STATUSES[c] for c in code.cpu().tolist()],
            period=period.cpu(), method=plan.method, tol=how.tol, info=info)


def _iterate(run: Run, rows: Optional[Rows], observe: Optional[Callable], observe_steps: int) -> None:
    """The passes of a solve: one evaluation of f on the running rows each, their bookkeeping and the next
    iterates, until no row is running or the budget is spent (``observe``: :func:`solve`)."""
    max_iter = run.how.max_iter
    watching = observe is not None and observe_steps > 0
    bound = max(max_iter, observe_steps) if watching else max_iter
    plain = run.x.clone() if watching else None  # the whole batch's plain iterate, for observe
    it = 0
    while run.rowwise or it < bound:
        if rows is not None:
            rows.before(run)
        observing = watching and it < observe_steps  # past observe_steps: the running samples only, as without
        if observing:
            plain = run.f(plain, run.x0)
            observe(it + 1, plain)
            if run.act.numel() == 0 or it >= max_iter:
                it += 1
                continue
        elif run.act.numel() == 0:
            break
        run.iters = it + 1
        # a running sample's iterate is its row of the plain iterate (Picard with η = 1: x_{t+1} = f(x_t))
        run.evaluate(plain if observing else None)
        if rows is not None:
            rows.stop(run)
        run.advance()
        if rows is not None:
            rows.after(run)
        it += 1


def solve(f: Callable, x_init: torch.Tensor, x0: Optional[torch.Tensor] = None, how: Optional[Solve] = None, *,
          rows: Optional[Rows] = None, observe: Optional[Callable[[int, torch.Tensor], None]] = None,
          observe_steps: int = 0, **knobs) -> SolveResult:
    """Find x* = f(x*, x0) per sample by Picard, damped, Anderson or limited-memory Broyden iteration.

    Args:
        f: the loop map, ``f(x, x0) -> x'`` batch-first with independent samples (``model.step``).
        x_init: (B, *S) the first iterate e (Def. 3.1). x0: (B, *S') or None, passed through to f (restricted to
            the running samples' rows, so an index tensor works: the geometry stage's rows).
        how: the options (:class:`Solve`; default ``Solve()``: Picard, τ = 1e-4, 500 evaluations); ``knobs``:
            fields of :class:`Solve` that replace its values (``solve(f, e, x0, method="broyden", tol=1e-6)``).
        rows: a row-wise option (:class:`Rows`): early stop rules, and rows that start and finish at their own
            times (the continued solves of :mod:`stability.analysis.continuation`).
        observe / observe_steps (plain Picard only): every sample is iterated from x_init for observe_steps steps
            whatever its status, one evaluation of the whole batch a step, and ``observe(t, x_t)`` sees each
            x_t = f(x_{t−1}, x0), t = 1..observe_steps: the accuracy against iteration from the solve's own
            evaluations (stage accuracy of :mod:`stability.analysis.stages`). The solve reads its running
            samples' rows of these, so its result is the one without ``observe`` (equal bit for bit where f's
            rows do not depend on the rest of the batch: tests/solvers/test_solvers.py); those evaluations of samples it
            has stopped are not in ``nfe``.

    Returns: :class:`SolveResult` (shapes in the module docstring). No autograd graph is built.
    """
    how = Solve() if how is None else how
    if knobs:
        how = how.replace(**knobs)
    plan = how.plan()
    rowwise = rows is not None and rows.rowwise
    if (observe is not None and observe_steps > 0 or rowwise) and (plan.method != "picard" or plan.eta != 1.0):
        raise ConfigError(f"{'observe' if not rowwise else 'a row-wise solve'} needs plain Picard iteration "
                          f"(method picard), whose iterates are f's images")
    if rowwise and observe is not None:
        raise ConfigError("observe and a row-wise solve do not go together")
    with torch.no_grad():
        run = Run(f, x_init, x0, how, plan, rowwise)
        _iterate(run, rows, observe, observe_steps)
        result = run.finish()
    if plan.certify:
        classify(result, f, x0, tol=how.rho_tol)
    return result
