"""The Krylov–Schur iteration of :func:`stability.numerics.eigen.krylov_schur` with its restarts batched
(``restart="batched"``, the default on a GPU): every sample restarts at once, its bookkeeping stays on the device,
and the host sees the device once per restart and once per check between restarts (every :data:`CHECK_EVERY`
products), never per product.

Restart: a thick restart (Morgan 1996; Wu & Simon 2000) on an invariant subspace of G = H[:s, :s], the
Krylov–Schur restart of Stewart (2002, SIAM J. Matrix Anal. Appl. 23:601) with an orthonormal basis of the
invariant subspace in place of the ordered Schur vectors. For all samples at once: the eigenvalues θ and
eigenvectors of G (batched ``torch.linalg.eig``), the ``want`` of largest modulus kept (a conjugate pair never
split), a real basis of their invariant subspace (real and imaginary parts of the eigenvectors) orthonormalised by
a batched QR, Y (B, s, p). Then V ← V Y, H[:p, :p] = Yᵀ G Y, H[p, :p] = bᵀ Y (b = H[s, :s]): as Y spans a
G-invariant subspace, A V Y = V Y (Yᵀ G Y) + v bᵀ Y is again a Krylov decomposition, as Stewart's (any basis of
the subspace serves: the Rayleigh quotient need not be triangular). The ordered Schur form spans the same subspace
with a unitary transformation; the eigenvector basis can be ill-conditioned (a near-defective G), so every
sample's basis is checked, ‖G Y − Y (Yᵀ G Y)‖_F ≤ :data:`DEFECT_MAX` ‖G‖_F, and a sample that misses it (rare:
measured in tests/numerics/test_krylov_schur_batched.py) takes scipy's ordered Schur form instead, on the host.

The small dense problems (m × m, m ≤ 60 by default) run on the host: ``torch.linalg.eig`` on a CUDA tensor
copies it to the host and runs LAPACK there anyway, so the restart copies every sample's H over at once (the one
host sync of a restart) and returns Y, Yᵀ G Y and bᵀ Y; the products with V (B, s, n) run on the device.

Lockstep: every sample restarts when its basis holds m vectors, as it would alone, and the next restart waits for
all of them: a sample whose kept block is a vector larger (a conjugate pair) reaches m a step early and idles that
step (its product is not counted and writes only to scratch rows), so a sample's iteration does not depend on its
batch mates. The checks between restarts fall on every sample at the same count of products since its own
restart (each cycle's steps start together), so where a sample stops does not depend on them either. A sample
whose basis breaks down (an invariant subspace, v = 0) idles on zero vectors until the
restart, which finishes it.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import numpy as np
import torch

from stability.errors import ConfigError

RESTARTS = ("auto", "batched", "per-sample")
#: the largest ‖G Y − Y M‖_F / ‖G‖_F of a batched restart's basis Y (M = Yᵀ G Y) before the sample takes scipy's
#: ordered Schur form instead; the neglected term perturbs A by as much relative to ‖A‖, far below any Ritz tolerance
DEFECT_MAX = 1e-12
#: a kept column whose QR diagonal falls below this (the columns have norm ≤ 1) makes the basis suspect too
WEAK_COLUMN = 1e-8
#: the secondary Ritz pairs within this relative distance of the leading modulus (a cluster around ρ, where the
#: leading pair can converge to a member while a larger eigenvalue is missing) converge to slack · tol; those
#: farther below converge to :data:`FAR_SLACK` · tol only: a cluster well below ρ (measured: pairs at 0.790, 0.790,
#: 0.788 under ρ = 0.891) otherwise holds a converged ρ for 3 more restarts, and the slowest sample of a batch
#: sets its steps (issue 35)
NEAR = 0.05
FAR_SLACK = 1e4
#: the Krylov steps between two checks inside a cycle: a sample near convergence (:data:`CHECK_NEAR`) has its
#: Ritz pairs looked at 10, 20, … products after its restart as well as at the restart, and leaves there once
#: converged. A cycle is m − keep = 30 products, so without the checks a sample ran up to 29 products past its
#: convergence, and the slowest sample of a batch sets its launches (issue 35; measured in benchmarks/RESULTS.md:
#: stage rho's products −5 to −9 %, its 8 → 64 ops ratio 1.33 → 1.12 on the launch-boundness benchmark). Each
#: check is one host sync and a host eigensolve of the samples near convergence.
CHECK_EVERY = 10
#: a sample is looked at between restarts only once its measure at its last restart is within this factor of the
#: tolerance: one farther off will not converge in the next 20 products (measured: the measure falls ~10× a
#: cycle), and the host's eigensolve at a check is then of the few samples near convergence, not the whole batch
CHECK_NEAR = 1e3


def restart_mode(restart: str, device) -> str:
    """``batched`` or ``per-sample`` for ``restart`` (``auto``: per-sample on the CPU, batched elsewhere)."""
    if restart not in RESTARTS:
        raise ConfigError(f"unknown restart {restart!r}; allowed: {', '.join(RESTARTS)}")
    if restart == "auto":
        return "per-sample" if torch.device(device).type == "cpu" else "batched"
    return restart


class Plan(NamedTuple):
    """One restart of a batch, computed on the host: per sample ``done``, the sorted Ritz values ``theta`` (a, m)
    (NaN beyond s), the convergence measure ``res``, the leading Ritz vector ``y`` (a, m) in basis coordinates,
    and for the others the kept size ``p``, basis ``Q`` (a, m, P), ``M`` = Qᵀ G Q (a, P, P), ``bQ`` (a, P), and
    ``bad``: a basis that misses :data:`DEFECT_MAX`."""

    done: torch.Tensor
    theta: torch.Tensor
    res: torch.Tensor
    y: torch.Tensor
    p: torch.Tensor
    Q: torch.Tensor
    M: torch.Tensor
    bQ: torch.Tensor
    bad: torch.Tensor
    G: torch.Tensor
    b: torch.Tensor


def eig_threads(G: torch.Tensor):
    """``torch.linalg.eig`` of a batch of small matrices on the host, in chunks over threads: LAPACK releases the
    GIL and torch runs a batch's problems one after another on one core, so a GPU's batch of hundreds of samples
    would otherwise wait on one core of its host at every restart (500 matrices 60 × 60: 0.53 s on one core, 0.31 s
    in two chunks on two)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    workers = min(os.cpu_count() or 1, 16, G.shape[0] // 8)
    if workers < 2:
        return torch.linalg.eig(G)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        parts = list(pool.map(torch.linalg.eig, G.chunk(workers)))
    return torch.cat([t for t, _ in parts]), torch.cat([y for _, y in parts])


def ritz_plan(Hh: torch.Tensor, s: torch.Tensor, dead: torch.Tensor, *, want: int, nev: int, tol: float,
              last: bool, slack: float, restart: bool = True) -> Plan:
    """Ritz values, convergence and the thick restart of every sample at once (host, float64). ``Hh`` (a, m+1, m):
    the samples' H; ``s`` (a,): their basis sizes; ``dead``: bases that broke down; ``want``: Ritz values to keep
    (more by one to keep a conjugate pair whole); ``last``: the restart budget is spent. The measure ``res`` is
    :func:`~stability.numerics.eigen._rayleigh_ritz`'s, max(|bᵀy₁|/|θ₁|, max_{i≤nev} |bᵀyᵢ|/|θᵢ| / ``slack``), but for
    the pairs with |θᵢ| < (1 − :data:`NEAR`) |θ₁|, divided by :data:`FAR_SLACK` instead. ``restart=False`` (a check
    between restarts): no restart basis (``p``, ``Q``, ``M``, ``bQ``, ``bad`` are None)."""
    a, m = Hh.shape[0], Hh.shape[2]
    inside = torch.arange(m)[None, :] < s[:, None]  # (a, m): the coordinates of each sample's basis
    G = torch.where(inside[:, :, None] & inside[:, None, :], Hh[:, :m, :m], 0.0)
    b = torch.where(inside, Hh[torch.arange(a), s, :m], 0.0)
    finite = torch.isfinite(G).flatten(1).all(1) & torch.isfinite(b).all(1)
    G, b = torch.where(finite[:, None, None], G, 0.0), torch.where(finite[:, None], b, 0.0)
    theta, Y = eig_threads(G)
    # the padding's eigenvectors (0 on e_j, j ≥ s) sort last
    outside = (Y.abs() ** 2 * (~inside)[:, :, None]).sum(1)
    order = torch.argsort(-torch.where(outside < 0.5, theta.abs(), -1.0), dim=1, stable=True)
    theta = theta.gather(1, order)
    Y = torch.where(inside[:, :, None], Y.gather(2, order[:, None, :].expand(a, m, m)), 0)
    j = min(nev, m)
    r = (b.to(Y.dtype)[:, None, :] @ Y[:, :, :j]).squeeze(1).abs() / theta[:, :j].abs().clamp_min(1e-300)
    near = theta[:, :j].abs() >= (1 - NEAR) * theta[:, :1].abs()
    weight = torch.where(torch.arange(j) == 0, 1.0, torch.where(near, 1.0 / slack, 1.0 / FAR_SLACK)).to(r.dtype)
    res = torch.where(torch.arange(j)[None, :] < s[:, None], r * weight, 0.0).amax(1)
    res = torch.where(finite, res, float("nan"))
    theta = torch.where(finite[:, None] & inside, theta, complex("nan"))
    done = (res < tol) | dead | ~finite | last
    if not restart:
        return Plan(done, theta, res, Y[:, :, 0], None, None, None, None, None, G, b)
    p, Q, M, bQ, bad = invariant_basis(G, b, theta, Y, s, want)
    return Plan(done, theta, res, Y[:, :, 0], p, Q, M, bQ, bad & ~done, G, b)


def invariant_basis(G, b, theta, Y, s, want: int):
    """The kept size p (a,), an orthonormal basis Q (a, m, P) of the invariant subspace of the p leading
    eigenvalues of every G (P = min(want + 1, m); columns beyond p zero), M = Qᵀ G Q, bQ = bᵀ Q and ``bad``
    (the basis misses :data:`DEFECT_MAX` or :data:`WEAK_COLUMN`). θ, Y: sorted as in :func:`ritz_plan`."""
    m = G.shape[-1]
    P = min(want + 1, m)
    limit = (s - 1).clamp_min(1)
    w = limit.clamp(max=want)
    opens = theta.imag.gather(1, (w - 1)[:, None]).squeeze(1) > 0  # the w-th value is the first of a pair
    p = torch.where(opens, torch.where(w + 1 <= limit, w + 1, w - 1), w)
    p = torch.where(p < 1, s.clamp(min=1, max=m - 1), p)
    # a real basis: Re y for a real θ and for the first of a pair, Im y for the second
    cols = torch.where(theta.imag[:, None, :P] >= 0, Y.real[:, :, :P], Y.imag[:, :, :P])
    kept = torch.arange(P)[None, :] < p[:, None]
    Q, R = torch.linalg.qr(torch.where(kept[:, None, :], cols, 0.0))
    Q = torch.where(kept[:, None, :], Q, 0.0)
    M = Q.mT @ G @ Q
    bQ = (b[:, None, :] @ Q).squeeze(1)
    defect = (G @ Q - Q @ M).flatten(1).norm(dim=1) / G.flatten(1).norm(dim=1).clamp_min(1e-300)
    weak = torch.where(kept, R.diagonal(dim1=1, dim2=2).abs(), float("inf")).amin(1) < WEAK_COLUMN
    return p, Q, M, bQ, ~(defect <= DEFECT_MAX) | weak


def schur_fallback(plan: Plan, rows: list, s: list, p: list, want: int, schur: Callable) -> None:
    """Replace the basis of the samples ``rows`` (whose eigenvector basis missed :data:`DEFECT_MAX`) by scipy's
    ordered real Schur vectors (``schur``: the per-sample restart's, ``schur(G, want, limit)`` → T, Z, p, θ), in
    place; ``p`` updated."""
    P = plan.Q.shape[2]
    for r in rows:
        n_ = s[r]
        T, Z, k, _ = schur(plan.G[r, :n_, :n_].numpy(), want, min(P, max(1, n_ - 1)))
        Z, T = torch.from_numpy(np.ascontiguousarray(Z[:, :k])), torch.from_numpy(np.ascontiguousarray(T[:k, :k]))
        plan.Q[r], plan.M[r], plan.bQ[r] = 0.0, 0.0, 0.0
        plan.Q[r, :n_, :k], plan.M[r, :k, :k], plan.bQ[r, :k] = Z, T, plan.b[r, :n_] @ Z
        plan.p[r], p[r] = k, k


def arnoldi_step(op: Callable, V: torch.Tensor, H: torch.Tensor, pos: torch.Tensor, dead: torch.Tensor,
                 top: int, m: int, shape: tuple, dtype) -> torch.Tensor:
    """One batched Arnoldi step (classical Gram–Schmidt twice, as the per-sample path) without a host sync; in
    place on V, H, pos, dead. Samples at m (idle) write to the scratch row m + 1 and column m; broken-down ones
    stay. ``top``: a bound on every position (host). Returns the mask of samples that took a product."""
    a, n = V.shape[0], V.shape[2]
    ar = torch.arange(a, device=V.device)
    active = ~dead & (pos < m)
    W = op(V[ar, pos].reshape(a, *shape)).detach().reshape(a, n).to(dtype)
    scale = W.norm(dim=1)
    Vt = V[:, :top + 1]
    h = torch.bmm(Vt, W.unsqueeze(2)).squeeze(2)
    W = W - torch.bmm(h.unsqueeze(1), Vt).squeeze(1)
    h2 = torch.bmm(Vt, W.unsqueeze(2)).squeeze(2)
    W = W - torch.bmm(h2.unsqueeze(1), Vt).squeeze(1)
    h = h + h2
    beta = W.norm(dim=1)
    brk = beta <= 1e-12 * scale.clamp_min(1e-300)
    H[ar[:, None], torch.arange(top + 1, device=V.device)[None, :], pos[:, None]] = h
    H[ar, pos + 1, pos] = torch.where(brk, torch.zeros_like(beta), beta)
    V[ar, pos + 1] = torch.where(brk[:, None], torch.zeros_like(W), W / beta.clamp_min(1e-300)[:, None])
    dead |= brk & active
    pos += active.long()
    return active


def restart_device(V: torch.Tensor, H: torch.Tensor, pos: torch.Tensor, Q, M, bQ, p) -> None:
    """The thick restart on the device, in place: V[:P] ← Qᵀ V[:m], V[p] ← v (the continuation vector V[s]),
    H ← [[M], [bQᵀ]] at rows :p and p, pos ← p. Q, M, bQ, p: the plan's, on V's device and dtype."""
    a, P, m = V.shape[0], Q.shape[2], H.shape[2] - 1
    ar = torch.arange(a, device=V.device)
    cont = V[ar, pos]
    lead = torch.bmm(Q.mT, V[:, :m])
    V.zero_()
    V[:, :P] = lead
    V[ar, p] = cont
    H.zero_()
    H[:, :P, :P] = M
    H[ar, p, :P] = bQ
    pos.copy_(p)


def batched_krylov_schur(apply: Callable, shape: tuple, v0: torch.Tensor, *, m: int, keep: int, nev: int, kk: int,
                         tol: float, restarts: int, dtype, device, restrict: Optional[Callable],
                         return_vectors: bool, padded: Callable, schur: Callable, slack: float,
                         check_every: Optional[int] = None):
    """The iteration of :func:`~stability.numerics.eigen.krylov_schur` with batched restarts (module
    docstring), from the unit start vectors ``v0`` (B, n); ``padded``, ``schur`` and ``slack``: krylov_schur's
    product for some samples, per-sample ordered Schur form and NEV_SLACK; ``check_every``: the Krylov steps
    between two checks of a cycle (default :data:`CHECK_EVERY`; 0: at restarts only). Returns (rho, eigenvalues,
    ritz_residual, products, vectors) as krylov_schur reports them."""
    B, S = shape[0], tuple(shape[1:])
    n = v0.shape[1]
    want = max(keep, nev + 1)
    check_every = CHECK_EVERY if check_every is None else check_every
    V = torch.zeros(B, m + 2, n, dtype=dtype, device=device)  # row m + 1 and H's column m: scratch of idle steps
    H = torch.zeros(B, m + 2, m + 1, dtype=dtype, device=device)
    V[:, 0] = v0
    live = _Live(V, H, torch.zeros(B, dtype=torch.long, device=device), torch.zeros(B, dtype=torch.bool, device=device),
                 torch.arange(B, device=device), apply)
    products = torch.zeros(B, dtype=torch.long, device=device)
    out = _Out(B, kk, n, device, return_vectors)
    plan_kw = dict(want=want, nev=nev, tol=tol, slack=slack)
    product = restrict if restrict is not None else (lambda ids: padded(apply, shape, ids))
    lo, top, cycle = 0, 0, 0  # lo, top: the least and largest position (host, exact for live samples)
    near = [False] * B  # per live sample: its last restart's measure within CHECK_NEAR · tol (checked between)
    while True:
        for step in range(1, m - lo + 1):
            active = arnoldi_step(live.op, live.V, live.H, live.pos, live.dead, top, m, S, dtype)
            products.index_add_(0, live.ids, active.long())
            top = min(top + 1, m)
            rows = [r for r in range(len(near)) if near[r]] if check_every and step % check_every == 0 else []
            if rows and step < m - lo:
                plan = ritz_plan(*_host(live, m, rows), last=False, restart=False, **plan_kw)  # one host sync
                got = torch.nonzero(plan.done).flatten().tolist()
                if got:
                    fin = [rows[i] for i in got]
                    out.write(plan, got, live.ids, live.V, m, live_rows=fin)
                    if len(fin) == len(live.ids):
                        return out.rho, out.eigs, out.resid, products.cpu(), out.vecs
                    live = live.without(fin, product)
                    gone = set(fin)
                    near = [near[r] for r in range(len(near)) if r not in gone]
        Hh, s, dead = _host(live, m)  # the restart's one host sync
        plan = ritz_plan(Hh, s, dead, last=cycle + 1 >= restarts, **plan_kw)
        done, bad, p, s, close = torch.stack([plan.done.long(), plan.bad.long(), plan.p, s,
                                              (plan.res < CHECK_NEAR * tol).long()]).tolist()
        a = len(done)
        schur_fallback(plan, [r for r in range(a) if bad[r]], s, p, want, schur)
        fin, stay = [r for r in range(a) if done[r]], [r for r in range(a) if not done[r]]
        if fin:
            out.write(plan, fin, live.ids, live.V, m)
        if not stay:
            break
        if fin:
            live = live.without(fin, product)
        sel = torch.tensor(stay)
        near = [bool(close[r]) for r in stay]
        restart_device(live.V, live.H, live.pos,
                       *(t[sel].to(device=device, dtype=dtype) for t in (plan.Q, plan.M, plan.bQ)),
                       plan.p[sel].to(device))
        lo, top, cycle = min(p[r] for r in stay), max(p[r] for r in stay), cycle + 1
    return out.rho, out.eigs, out.resid, products.cpu(), out.vecs


class _Live(NamedTuple):
    """The samples still iterating: their bases V, H, positions, breakdowns, indices in the batch, and product."""

    V: torch.Tensor
    H: torch.Tensor
    pos: torch.Tensor
    dead: torch.Tensor
    ids: torch.Tensor
    op: Callable

    def without(self, rows: list, product: Callable) -> "_Live":
        """These samples less ``rows`` (finished), multiplied by ``product(ids)`` (ids: their batch indices)."""
        stay = torch.ones(len(self.ids), dtype=torch.bool)
        stay[rows] = False
        keep = torch.nonzero(stay).flatten().to(self.ids.device)
        ids = self.ids[keep]
        return _Live(self.V[keep], self.H[keep], self.pos[keep], self.dead[keep], ids, product(ids))


def _host(live: _Live, m: int, rows: Optional[list] = None):
    """The live samples' (``rows`` of them, default all) H (a, m + 1, m), basis size and breakdown flag, on the
    host in float64: one transfer."""
    H, pos, dead = live.H, live.pos, live.dead
    if rows is not None:
        at = torch.tensor(rows, device=H.device)
        H, pos, dead = H[at], pos[at], dead[at]
    a = H.shape[0]
    packed = torch.cat([H[:, :m + 1, :m].reshape(a, -1).double(), pos[:, None].double(),
                        dead[:, None].double()], 1).cpu()
    return packed[:, :-2].reshape(a, m + 1, m), packed[:, -2].long(), packed[:, -1].bool()


class _Out:
    """The results of finished samples, on the device, in the batch's original order."""

    def __init__(self, B: int, kk: int, n: int, device, vectors: bool):
        self.kk = kk
        self.rho = torch.full((B,), float("nan"), dtype=torch.float64, device=device)
        self.eigs = torch.full((B, kk), complex("nan"), dtype=torch.complex128, device=device)
        self.resid = torch.full((B,), float("inf"), dtype=torch.float64, device=device)
        self.vecs = torch.zeros(B, n, dtype=torch.complex128, device=device) if vectors else None

    def write(self, plan: Plan, rows: list, ids: torch.Tensor, V: torch.Tensor, m: int,
              live_rows: Optional[list] = None) -> None:
        """The plan's rows ``rows``, which are the live samples ``live_rows`` (default the same) of ``ids``, V."""
        host = torch.tensor(rows)
        dev = torch.tensor(rows if live_rows is None else live_rows).to(ids.device)
        at = ids[dev]
        theta = plan.theta[host, :self.kk].to(ids.device)
        self.rho[at] = theta[:, 0].abs()
        self.eigs[at] = theta
        self.resid[at] = plan.res[host].to(ids.device)
        if self.vecs is not None:
            y = plan.y[host].to(ids.device)
            self.vecs[at] = torch.bmm(y[:, None, :], V[dev, :m].to(torch.complex128)).squeeze(1)
