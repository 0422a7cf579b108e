"""The recall matrices of Prop. 4 and their outer-normalised forms (App. A.7), assembled from the named parts.

Without outer normalisation (norm none / pre / peri: φ_s = I, additive residual), Prop. 4 reads, with the
paper's h_s absorbing the Pre norm (the release applies Pre inside the sublayer, see ``stability.model``):

    M_ext = (I + J[h2∘pre2](z*)) (I + J[h1∘pre1](u*)) W_x,            u* = g(x*, x0)
    M_int = (I + J[h2](g(pre2 z*, x0)) W_x J[pre2](z*)) (I + J[h1](g(pre1 x*, x0)) W_x J[pre1](x*))

and x* attracts iff ρ(M) < 1. With outer normalisation (post: φ_s = RMSNorm; gru: the GRU residual R_s), App.
A.7 multiplies in the norm Jacobians: with z̃ = R1(·), x̃ = R2(·) the pre-φ values,

    M_ext = Jφ2(x̃*) [∂_u R2 + ∂_v R2 J[h2∘pre2](z*)] Jφ1(z̃*) [∂_u R1 + ∂_v R1 J[h1∘pre1](u*)] W_x
    M_int = Jφ2(x̃*) [∂_u R2 + ∂_v R2 J[h2](a2*) W_x J[pre2](z*)] Jφ1(z̃*) [∂_u R1 + ∂_v R1 J[h1](a1*) W_x J[pre1](x*)]

(a1* = g(pre1 x*, x0), a2* = g(pre2 z*, x0); for post ∂_u R = ∂_v R = I, for gru φ = I). Each factor is a
Jacobian-vector product of one named part of the model's :class:`~stability.protocols.RecallParts` at its point
(∂g/∂x = W_x is the jvp of g, ∂R the jvp of ``residual``, Jφ the jvp of ``phi``), so the assembled M is a
matrix-free operator that never asks which norm the model uses; it must equal the autograd Jacobian of ``step``
(tested for every recall × norm, and on a model that is not ours).

The Fixed-Point Reasoner options enter as the parts define them: residual scaling β lives in ``residual``
(∂_u R = (1 − β) I, ∂_v R = β I); the latent convolution ``conv`` c(x) = x + DWConv(x) puts the forms at c(x*) and
multiplies J[c](x*) on the right; damping η (``variant_options["damping"]``) makes the step's Jacobian
(1 − η) I + η M.
ρ(W_x) is the recall matrix's own spectral radius (bias ignored), the one quantity the release computes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from stability.numerics import Linearisation, spectral_radius
from stability.numerics.jacobian import DENSE_BUDGET
from stability.numerics.spectra import Spectrum
from stability.protocols import damping


def _tile(p: torch.Tensor, k: int) -> torch.Tensor:
    """The P points p: (P, ...) repeated for k = c · P tangents, tangent t at point t mod P (P = 1: a broadcast)."""
    P = p.shape[0]
    if k == P:
        return p
    if P == 1:
        return p.expand(k, *p.shape[1:]).contiguous()
    return p.repeat(k // P, *([1] * (p.dim() - 1)))


def _jvp(fn, primals: tuple, tangents: tuple) -> torch.Tensor:
    k = tangents[0].shape[0]
    return torch.func.jvp(fn, tuple(_tile(p, k) for p in primals), tangents)[1]


def _g_x(model, x0: torch.Tensor):
    """x ↦ g(x, x0) at fixed x0 (its P points tiled to the tangents' count, as :func:`_jvp` tiles the primals)."""
    def fn(t):
        return model.g(t, _tile(x0, t.shape[0]))
    return fn


def recall_form(model) -> str:
    """Which matrix describes J: "M_ext" / "M_int" (Prop. 4) or their A.7 outer-norm forms."""
    name = {"external": "M_ext", "internal": "M_int"}.get(model.recall, "J_autonomous")
    name += " (App. A.7, with outer-norm Jacobians)" if getattr(model, "has_outer_norm", False) else " (Prop. 4)"
    variants = getattr(model, "variant_options", None) or {}
    if variants:
        name += "; with " + ", ".join(f"{k} {v}" for k, v in variants.items())
    return name


class RecallMatrixOperator:
    """M_ext or M_int of Prop. 4 / App. A.7 at P samples' points (x*, x0), assembled from the named parts of a
    :class:`~stability.protocols.RecallParts` model: g, pre, h, residual R, φ (and conv, damping when present).

    Every factor is a jvp of one part at its point: ∂g/∂x (= W_x, g is linear in x), J[pre_s], J[h_s], the two
    partials of R_s, Jφ_s, J[conv]; no norm name is consulted. x_star, x0: (P, *S) / (P, *S0). For an autonomous
    model (recall none) the same product with g = I is assembled (J of Def. 3.2's map); Prop. 4 itself concerns
    recall models. :meth:`linear_map` is M as the package's operator type (products, Mᵀ, dense).
    """

    def __init__(self, model, x_star: torch.Tensor, x0: torch.Tensor):
        self.model = m = model
        x, X0 = x_star.detach(), x0.detach()
        self.x_in, self.X0 = x, X0
        self._linear = None
        self.has_conv = callable(getattr(m, "conv", None))
        self.damping = damping(m)
        self.g_x = _g_x(m, X0)
        with torch.no_grad():
            if self.has_conv:
                x = m.conv(x)  # the forms read at c(x*)
            if m.recall == "internal":
                self.a1 = m.g(m.pre(1, x), X0)
                self.v1 = m.h(1, self.a1)
                self.u1 = x
            else:
                self.u1 = m.g(x, X0) if m.recall == "external" else x  # u* = g(x*, x0)
                self.v1 = m.h(1, m.pre(1, self.u1))
            self.x_forms = x  # where ∂g/∂x is taken (external: at c(x*); g is linear in x anyway)
            self.zt = m.residual(1, self.u1, self.v1)  # z̃*
            self.z = m.phi(1, self.zt)  # z*
            if m.recall == "internal":
                self.a2 = m.g(m.pre(2, self.z), X0)
                self.v2 = m.h(2, self.a2)
            else:
                self.v2 = m.h(2, m.pre(2, self.z))
            self.xt = m.residual(2, self.z, self.v2)  # x̃*
            self.p1, self.p2 = m.pre(1, self.u1), m.pre(2, self.z)  # the points where h1, h2 are linearised
            if m.recall == "internal":
                self.q1, self.q2 = m.pre(1, self.u1), m.pre(2, self.z)  # where ∂g/∂x is taken

    def linear_map(self) -> Linearisation:
        """M as a linear map (:class:`~stability.numerics.jacobian.Linearisation` with ``linear=True``): ``J`` is
        :meth:`apply_M`, ``JT`` its vjp taken once at V = 0 and reused (sudoku, width 32: 1.2 ms a product against
        16 ms for the forward-mode M V), ``dense()`` every sample's M_b (P, n, n), the product applied to the basis
        vectors, vmapped and compressed where positions reach only their neighbours (measured on the demo's hard
        split: 1.4 s for 32 samples of n = 512, against 7–9 s for the rows by reverse mode; benchmarks/RESULTS.md)."""
        if self._linear is None:
            self._linear = Linearisation(lambda V, _: self.apply_M(V), torch.zeros_like(self.x_in), linear=True)
        return self._linear

    # J[part] products at the stored points ------------------------------------------------------
    def _g(self, point, v):
        return _jvp(self.g_x, (point,), (v,))

    def _pre(self, s, point, v):
        return _jvp(lambda t: self.model.pre(s, t), (point,), (v,))

    def _h(self, s, point, v):
        return _jvp(lambda t: self.model.h(s, t), (point,), (v,))

    def _R(self, s, u, vv, du, dv):
        """∂_u R_s du + ∂_v R_s dv, one jvp of the part ``residual`` (u + v gives du + dv; residual scaling β gives
        (1 − β) du + β dv; a GRU cell its own linearisation)."""
        return _jvp(lambda p, q: self.model.residual(s, p, q), (u, vv), (du, dv))

    def _phi(self, s, point, v):
        return _jvp(lambda t: self.model.phi(s, t), (point,), (v,))

    def apply_M(self, V: torch.Tensor) -> torch.Tensor:
        """∂step/∂x V for V: (k, *S): the product below, with the model's conv and damping around it."""
        inner = _jvp(self.model.conv, (self.x_in,), (V,)) if self.has_conv else V  # J[c](x*) V
        out = self._apply_forms(inner)
        return out if self.damping == 1.0 else (1.0 - self.damping) * V + self.damping * out

    def _apply_forms(self, V: torch.Tensor) -> torch.Tensor:
        """M V of Prop. 4 / App. A.7 (module docstring) at the stored points."""
        m = self.model
        if m.recall == "internal":
            # first factor: ∂_u R1 + ∂_v R1 J[h1](a1*) W_x J[pre1](x*), then Jφ1(z̃*)
            c = self._h(1, self.a1, self._g(self.q1, self._pre(1, self.u1, V)))
            E = self._phi(1, self.zt, self._R(1, self.u1, self.v1, V, c))
            # second factor: ∂_u R2 + ∂_v R2 J[h2](a2*) W_x J[pre2](z*), then Jφ2(x̃*)
            h = self._h(2, self.a2, self._g(self.q2, self._pre(2, self.z, E)))
            return self._phi(2, self.xt, self._R(2, self.z, self.v2, E, h))
        A = self._g(self.x_forms, V) if m.recall == "external" else V  # ∂g/∂x* (= I without recall)
        c = self._h(1, self.p1, self._pre(1, self.u1, A))  # J[h1∘pre1](u*) A
        E = self._phi(1, self.zt, self._R(1, self.u1, self.v1, A, c))
        h = self._h(2, self.p2, self._pre(2, self.z, E))  # J[h2∘pre2](z*) E
        return self._phi(2, self.xt, self._R(2, self.z, self.v2, E, h))


def rho_W_x(model) -> Optional[Spectrum]:
    """ρ(W_x) and the leading eigenvalues of the recall weight (bias ignored; Figs. 6–7), a spectrum of one matrix
    (LAPACK); None without one."""
    W = getattr(model, "W_x", None)
    if W is None:
        return None
    return spectral_radius(W.detach().double(), route="dense", k=6)


@dataclass
class Prop4Result:
    """Per sample ρ(M) (M_ext / M_int, or the A.7 form) and the agreement of the assembled M with autograd;
    ``spectra``: M's spectra, one :class:`~stability.numerics.spectra.Spectrum` in sample order (the rows of
    ``spectra_of_J`` samples are stage rho's spectra of J, taken where M = J)."""

    form: str
    rho_M: list
    max_abs_diff_vs_autograd: float
    columns_checked: int
    spectra: Optional[Spectrum] = None
    spectra_of_J: int = 0  # samples whose M equalled J entry by entry, so their spectra are J's (stage rho's)
    probes_checked: int = 0  # the matrix-free route: Gaussian probe products per sample (columns_checked 0)

    def to_dict(self) -> dict:
        out = {"form": self.form, "rho_M": self.rho_M, "max_abs_diff_vs_autograd": self.max_abs_diff_vs_autograd,
               "columns_checked": self.columns_checked, "spectra_of_J": self.spectra_of_J,
               "eigenvalues": [] if self.spectra is None else self.spectra.eigenvalue_lists()}
        if self.probes_checked:
            out["probes_checked"] = self.probes_checked
        return out


def _rows_of(parts: list, route: tuple, rho: Optional[list] = None) -> Spectrum:
    """One spectrum from (eigenvalues, ritz_residual, products) row blocks in sample order; ρ of each row
    |λ_1| unless given."""
    eig = torch.cat([p[0] for p in parts]) if parts else torch.zeros(0, 0, dtype=torch.complex128)
    res = torch.cat([p[1] for p in parts]) if parts else torch.zeros(0, dtype=torch.float64)
    prod = torch.cat([p[2] for p in parts]) if parts else torch.zeros(0, dtype=torch.long)
    rho = [float(row[0].abs()) for row in eig] if rho is None else rho
    return Spectrum(rho=torch.tensor(rho, dtype=torch.float64), eigenvalues=eig, ritz_residual=res,
                    matvecs=int(prod.sum()), products=prod, route=route)


def prop4_dense(model, x_star: torch.Tensor, x0: torch.Tensor, *, k: int = 3, J: Optional[torch.Tensor] = None,
                sample_chunk: Optional[int] = None, krylov_tol: Optional[float] = None,
                J_spectra: Optional[Spectrum] = None) -> Prop4Result:
    """Prop. 4 / App. A.7 on small states, every sample at once: M_b assembled densely from the named parts
    (:meth:`RecallMatrixOperator.linear_map`), ρ(M_b) and its leading eigenvalues by LAPACK (exact to rounding),
    and max |M_b − J_b| over ALL n columns against the dense autograd Jacobian of ``step``: ``J`` (B, n, n) when
    the caller has it (stage rho's), else built (:meth:`~stability.numerics.jacobian.Linearisation.dense`).
    Samples go in groups of ``sample_chunk`` (default: dense matrices of at most 64 MiB per group). With
    ``krylov_tol`` (mid-size states) ρ(M_b) is taken by the ``dense-krylov`` route of
    :func:`~stability.numerics.spectra.spectral_radius` (leading Ritz residual below ``krylov_tol``) instead of
    LAPACK's full ``eigvals``. ``J_spectra``: the spectrum stage rho computed on ``J``; a group whose M equals its
    J entry by entry (as it does for this toolkit's models, whose M is built from the same forward-mode products)
    takes it instead of computing the same eigenvalues of the same matrices again, when it was computed by the
    same route (its ``route``)."""
    B = x_star.shape[0]
    n = int(torch.tensor(x_star.shape[1:]).prod())
    g = sample_chunk or max(1, (DENSE_BUDGET // 4) // (8 * n * n))
    route = ("dense", k) if krylov_tol is None else ("dense-krylov", k, krylov_tol, 0)
    parts, diff, reused = [], 0.0, 0
    for i in range(0, B, g):
        xs, xb = x_star[i:i + g], x0[i:i + g]
        M = RecallMatrixOperator(model, xs, xb).linear_map().dense()
        Jg = J[i:i + g].to(M) if J is not None else Linearisation(model.step, xs, xb).dense()
        diff = max(diff, float((M - Jg).abs().max()))
        same = torch.zeros(M.shape[0], dtype=torch.bool)
        given = J_spectra.rows(slice(i, i + M.shape[0])) if (J_spectra is not None and J_spectra.route == route
                                                             and J is not None) else None
        if given is not None:
            same = torch.tensor([bool(torch.equal(Mb, Jb)) for Mb, Jb in zip(M, Jg)])
        reused += int(same.sum())
        own = torch.nonzero(~same).flatten()
        if krylov_tol is not None:
            ks = given
            if own.numel():
                mine = spectral_radius(M[own.to(M.device)], route="dense-krylov", k=k, tol=krylov_tol)
                ks = _merge(ks, own, mine)
            parts.append((ks.eigenvalues.cpu(), ks.ritz_residual.cpu(), ks.products.cpu()))
            continue
        vals = torch.zeros(M.shape[0], n, dtype=torch.complex128)
        if bool(same.any()):
            taken = given.eigenvalues.cpu()
            vals[same, :taken.shape[1]] = taken[same]
        if own.numel():
            vals[own] = spectral_radius(M[own.to(M.device)], route="dense", k=n).eigenvalues.cpu()
        parts.append((vals[:, :k], torch.zeros(M.shape[0], dtype=torch.float64),
                      torch.full((M.shape[0],), n, dtype=torch.long)))
    spectra = _rows_of(parts, route)
    return Prop4Result(form=recall_form(model), rho_M=spectra.rho.tolist(), max_abs_diff_vs_autograd=diff,
                       columns_checked=n, spectra=spectra, spectra_of_J=reused)


def _merge(given: Optional[Spectrum], own: torch.Tensor, mine: Spectrum) -> Spectrum:
    """Rows ``own`` of a group's spectra from ``mine`` (a spectrum of those rows), the others ``given``."""
    if given is None:
        return mine.rows(slice(None))
    out = given.rows(slice(None))
    out.eigenvalues[own] = mine.eigenvalues.cpu()[:, :out.eigenvalues.shape[1]]
    out.ritz_residual[own], out.products[own] = mine.ritz_residual.cpu(), mine.products.cpu()
    return out


SAME_TO = 1e-12  #: M = J where every probe agrees to this relative to max |J v| (rounding: measured ≤ 1.2e-15)


def probe_check(model, x_star: torch.Tensor, x0: torch.Tensor, *, probes: int = 4, seed: int = 0) -> tuple:
    """M against the autograd Jacobian of ``step`` by ``probes`` seeded Gaussian products v, every sample at once:
    (max |M_b v − J_b v|, (B,) float64; every probe within :data:`SAME_TO`, (B,) bool). D ≠ 0 has Dv ≠ 0 for a
    Gaussian v with probability 1, so this certifies M = J (to rounding) for 2 · ``probes`` products a sample."""
    M = RecallMatrixOperator(model, x_star, x0)
    J = Linearisation(model.step, x_star, x0)
    g = torch.Generator().manual_seed(seed)
    diff = torch.zeros(x_star.shape[0], dtype=torch.float64)
    equal = torch.ones(x_star.shape[0], dtype=torch.bool)
    with torch.no_grad():
        for _ in range(probes):
            V = torch.randn(x_star.shape, generator=g, dtype=torch.float64).to(x_star)
            JV = J.jvp(V).flatten(1)
            D = (M.apply_M(V).flatten(1) - JV).abs().amax(1)
            diff = torch.maximum(diff, D.double().cpu())
            equal &= (D <= SAME_TO * JV.abs().amax(1)).cpu()
    return diff, equal


def _take(rho: list, eig: list, samples: list, values: list, eigenvalues: torch.Tensor) -> None:
    """rho[b], eig[b] of the ``samples`` from one batch's ρ (a list) and eigenvalues (a tensor, a row each)."""
    for b, v, e in zip(samples, values, eigenvalues.unbind(0)):
        rho[b], eig[b] = float(v), e


def prop4_matrix_free(model, x_star: torch.Tensor, x0: torch.Tensor, *, probes: int = 4, k: int = 3,
                      tol: float = 1e-6, seed: int = 0, fast_model=None, chunk: int = 1,
                      J_spectra: Optional[Spectrum] = None, tick=None, restart: str = "auto") -> Prop4Result:
    """Prop. 4 / App. A.7 on states too large for dense matrices, every sample matrix-free: M checked against J by
    :func:`probe_check`; where M = J on every probe and ``J_spectra`` (stage rho's spectrum of J per sample, at the
    same x*) is given, M's spectra are J's; elsewhere ρ(M) by the Krylov–Schur method stage rho runs on Jᵀ, here on
    Mᵀ (route ``krylov`` of :func:`~stability.numerics.spectra.spectral_radius` on
    :meth:`RecallMatrixOperator.linear_map`: float32 products of ``fast_model``'s M, each leading Ritz pair
    certified by float64 products; float64 alone without it), ``chunk`` samples a batch, ``restart`` the
    eigensolver's (:func:`~stability.numerics.eigen.krylov_schur`)."""
    B = x_star.shape[0]
    diff, equal = probe_check(model, x_star, x0, probes=probes, seed=seed)
    reuse = equal.clone() if J_spectra is not None else torch.zeros(B, dtype=torch.bool)
    rho, eig, res, prod = [None] * B, [None] * B, torch.zeros(B, dtype=torch.float64), torch.zeros(B, dtype=torch.long)
    taken = J_spectra.rows(slice(0, B)) if J_spectra is not None else None
    sel = torch.nonzero(reuse).flatten()
    if sel.numel():  # stage rho's spectra, 0 products of M's own; one transfer, not one per sample
        _take(rho, eig, sel.tolist(), taken.rho[sel.to(taken.rho.device)].tolist(),
              taken.eigenvalues[sel.to(taken.eigenvalues.device)])
        res[sel] = taken.ritz_residual[sel.to(taken.ritz_residual.device)].to(res)
    own = torch.nonzero(~reuse).flatten().tolist()
    for i in range(0, len(own), chunk):
        idx = torch.tensor(own[i:i + chunk], device=x_star.device)
        xs, xb = x_star[idx], x0[idx]
        exact = RecallMatrixOperator(model, xs, xb).linear_map()
        fast = None if fast_model is None else RecallMatrixOperator(fast_model, xs.float(), xb.float()).linear_map()
        got = spectral_radius(exact, route="krylov", fast=fast, tol=tol, k=k, seed=seed, restart=restart)
        if tick is not None:
            tick(min(i + chunk, len(own)), len(own), "samples of M's own spectra")
        took = torch.tensor(own[i:i + chunk])
        _take(rho, eig, took.tolist(), got.rho.tolist(), got.eigenvalues.cpu()[:, :k])
        res[took], prod[took] = got.ritz_residual.cpu().to(res), got.products.cpu().to(prod)
    eigenvalues = torch.stack(eig) if B else torch.zeros(0, k, dtype=torch.complex128)
    spectra = Spectrum(rho=torch.tensor(rho, dtype=torch.float64), eigenvalues=eigenvalues, ritz_residual=res,
                       matvecs=int(prod.sum()), products=prod, route=("krylov", k, tol, seed))
    return Prop4Result(form=recall_form(model), rho_M=rho,
                       max_abs_diff_vs_autograd=float(diff.max()) if B else 0.0, columns_checked=0,
                       spectra=spectra, spectra_of_J=int(reuse.sum()), probes_checked=probes)


def prop4(model, x_star: torch.Tensor, x0: torch.Tensor, *, probes: int = 4, k: int = 3,
          tol: float = 1e-10, J: Optional[torch.Tensor] = None, dense_max: Optional[int] = None,
          J_spectra: Optional[Spectrum] = None, fast_model=None, chunk: int = 1, seed: int = 0,
          tick=None, restart: str = "auto") -> Optional[Prop4Result]:
    """Prop. 4 / App. A.7 on a batch of fixed points x_star (B, *S): ρ(M) per sample, and the largest difference
    between M and the autograd Jacobian of ``step``. States of n ≤ ``dense_max`` (default
    :data:`~stability.numerics.spectra.DENSE_MAX`): :func:`prop4_dense` (dense M, LAPACK, all n columns checked;
    ``J`` the dense Jacobians when already built); mid-size states with ``J`` at hand likewise, ρ by Krylov–Schur
    on the dense M. Larger states: :func:`prop4_matrix_free` (``probes`` Gaussian probe products per sample).
    ``J_spectra``: stage rho's spectrum of J at these x*, taken where M = J (and, on the dense routes, where it was
    computed by the same route). None without recall."""
    # read at call time, not at import: the tests lower these bounds (monkeypatch on stability.numerics.spectra)
    from stability.numerics.spectra import DENSE_KRYLOV_MAX, DENSE_MAX

    if model.recall not in ("external", "internal"):
        return None
    n = int(torch.tensor(x_star.shape[1:]).prod())
    if n <= (DENSE_MAX if dense_max is None else dense_max):
        return prop4_dense(model, x_star, x0, k=k, J=J, J_spectra=J_spectra)
    if J is not None and n <= DENSE_KRYLOV_MAX:  # mid-size: the dense J is at hand (stage rho's), so is dense M
        return prop4_dense(model, x_star, x0, k=k, J=J, krylov_tol=max(tol, 1e-10), J_spectra=J_spectra)
    return prop4_matrix_free(model, x_star, x0, probes=probes, k=k, tol=tol, seed=seed, fast_model=fast_model,
                             chunk=chunk, J_spectra=J_spectra, tick=tick, restart=restart)
