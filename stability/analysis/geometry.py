"""Geometry, the third axis (Section 3.2): how far the parameters can move before the fixed point stops attracting.

The paper's framework judges a looped model on three axes: reachability, input-dependence and geometry. The first
two are properties of the trained θ*; geometry is the *shape of the stable regime around it*: "stability regions
that are highly direction-dependent — narrow slivers in parameter space rather than round, broad neighbourhoods —
force stable configurations into a narrow band", which the paper calls anisotropy (App. B.2 measures it on the toy
model of Figure 5; :mod:`stability.theory.regions`). This module measures it on any looped model through the
:class:`~stability.protocols.LoopedModel` contract.

**Radius of stability.** For a direction D in parameter space the radius r(D) is the smallest t > 0 at which the
fixed point of one input stops being attracting along θ* + t·D: the Picard solve of the perturbed map fails
(:func:`stability.solvers.solve`, the analysis' own τ and budget: any status but ``converged``), or ρ(J*) reaches 1
(Props. 3–4: x* attracts iff ρ(J*) < 1). The solve at each t is continued: warm-started from the x* of the largest
t known to be attracting, so the search follows the fixed point the model reaches rather than jumping to another.
Directions are Gaussian, drawn from a seeded generator, and scaled tensor by tensor: the part of D on a parameter
tensor W is z·‖W‖/‖z‖ (z standard normal of W's shape), so ``t`` is a *relative* perturbation — t = 0.1 moves
every tensor by 10 % of its norm (an all-zero tensor by 10 % of the loop parameters' RMS per entry). Both signs of
each direction are measured (±D are two radii). Parameters are perturbed with ``torch.func.functional_call``
(the model itself is never edited); the embedding's parameters move x0 = embed(inputs) too; parameters that enter
neither ``step`` nor ``embed`` (the readout) cannot move x* or J* and are left out (``outside_loop``).

**The search.** Each radius is bracketed on the grid T_START·GROWTH^k (0.1·√2^k: up while attracting, down towards
:data:`T_MIN` while not), then bisected in log t until the bracket [lo, hi] has hi/lo ≤ 1 + ``accuracy``; the
radius is √(lo·hi), within ``accuracy``/2 of the crossing. A window of instability narrower than one grid step is
stepped over, so the radius is the first crossing the grid sees. A radius past :data:`T_MAX` (1: a perturbation
as large as the weights) is censored there; one below T_MIN is 0 ("unstable at t → 0"). A continued solve fails
as the toolkit's Picard solve does (not below τ within the budget, diverged, non-finite), and earlier where that
outcome is already clear: a plateau in a period-k orbit or far from any fixed point (:data:`STALL`), or a residual
falling too slowly to reach τ in the budget (:data:`SLOW`). Inside the search ρ(J*) is a cheap estimate: the
Krylov–Schur method of :func:`stability.linalg.batched_spectral_radius` on Jᵀ with a basis of :data:`KRYLOV`
vectors and at most :data:`RESTARTS` restarts (Ritz residual :data:`ESTIMATE_TOL`). The final ρ is certified on a
few radii (``certify``: the first ones, in sample then direction order, whose crossing ρ decided): at both ends of
their bracket by :func:`stability.analysis.spectra.jacobian_spectral_radius`, the routine of stage ``rho`` (LAPACK
on the dense J for n ≤ 256, Krylov–Schur to Ritz residual ``eig_tol`` above); a certified value that reverses a
decision re-opens that bracket, searched again with certified ρ. Every open radius iterates at once: the
perturbed parameters of all rows are stacked and the map is vmapped over them (a loop over rows where the model's
code cannot be vmapped; ``evaluation`` says which), and a radius whose solve ends moves on to its next t at once.

**Anisotropy** (App. B.2's log-range and balance, applied to the radii of one input): ``log_range`` = log(max r /
min r) over its directions (0 for a round region), its robust form ``log_iqr`` (the interquartile range of log r),
``balance`` = min r / max r (1 for a round region), the ``median_radius``, and ``unstable_t0`` (the share of
radii that are 0: already unstable at t → 0; an input whose x* does not attract at θ* has every radius 0).
Per-input values are summarised by their median over the inputs whose x* attracts.

**Which parts are narrow.** The same radii with D restricted to one group of parameters: for a model with the
named parts of :class:`~stability.protocols.RecallParts`, the recall weight W_x, the rest of the recall map g,
attention (h(1, ·)), MLP (h(2, ·)), the norm gains (pre, φ and every *Norm module), the residual R (a GRU cell),
the embedding and what remains; for any other model the groups are named by parameter name (first component).
A part is found by calling it under ``functional_call`` and asking autograd which parameters it reached.

**The plane picture.** ρ(J*) over the plane θ* + a·D1 + b·D2 of the first two directions, on a grid, continued
cell by cell (the column a = 0 outward from θ*, then every row outward from it), with the ρ = 1 contour and the
cells whose solve failed marked: the stability region of a trained checkpoint beside Figure 5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from stability.stats import median

#: first t tried (relative perturbation) and the factor between bracket steps
T_START, GROWTH = 0.1, math.sqrt(2.0)
#: a radius below T_MIN counts as 0 (unstable at t → 0); one at T_MAX or beyond is censored there
T_MIN, T_MAX = 1e-4, 1.0
#: the cheap ρ estimate inside the search: Krylov–Schur basis, restarts, Ritz-residual tolerance
KRYLOV, RESTARTS, ESTIMATE_TOL = 20, 2, 1e-3


# ---- the perturbed model ---------------------------------------------------------------------------------------

class _Method(torch.nn.Module):
    """``model.<name>(*args)`` as a module's forward, so that ``functional_call`` can swap the model's parameters."""

    def __init__(self, model: torch.nn.Module, name: str):
        super().__init__()
        self.model = model
        self.name = name

    def forward(self, *args):
        return getattr(self.model, self.name)(*args)


def _call(model, name: str, params: dict, *args):
    """``model.<name>(*args)`` with ``params`` (name → tensor, a subset of the model's) in place of its own."""
    return torch.func.functional_call(_Method(model, name), {"model." + k: v for k, v in params.items()}, args,
                                      strict=False)


class Family:
    """Rows of perturbed parameters, each with its own input, and the model's maps under them.

    ``base``: the loop parameters (name → tensor); ``dirs``: name → (n_directions, *shape) stacked directions
    (zero where a direction leaves a tensor alone). A row r has the parameters θ* + t_r·sign_r·D_{dir_r}
    (``row_dir``, ``row_sign``; t_r set by :meth:`set_t`), or, with ``coef`` (R, n_directions), θ* + Σ_j
    coef_rj·D_j (the plane picture); ``row_input``: the row's sample inputs. ``step(x, rows)`` is the loop map of
    the rows ``rows`` (an index tensor: the solver passes it through as its x0, so it can freeze and restrict
    rows as it does samples); their x0 are the embedding at their current parameters (``embed_moves``: the
    embedding has perturbed parameters; otherwise ``x0`` stays as given)."""

    def __init__(self, model, base: dict, dirs: dict, row_input: torch.Tensor, x0: torch.Tensor, *,
                 row_dir: Optional[torch.Tensor] = None, row_sign: Optional[torch.Tensor] = None,
                 coef: Optional[torch.Tensor] = None, embed_moves: bool = True):
        self.model, self.base, self.dirs, self.inputs = model, base, dirs, row_input
        self.row_dir, self.row_sign, self.coef = row_dir, row_sign, coef
        R = int(row_input.shape[0])
        dev = next(iter(base.values())).device
        self.t = torch.zeros(R, dtype=torch.float64, device=dev)
        self.embed_moves = embed_moves
        self.x0 = x0.detach().clone()
        self.vmap = True
        self.calls = 0
        self._wrappers: dict = {}
        self._vmapped: dict = {}
        # every row's parameters, kept (R, *shape) per tensor and updated for the rows whose t changes
        if coef is not None:
            self.P = {k: v + torch.einsum("ac,c...->a...", coef.to(v), dirs[k]) for k, v in base.items()}
            if embed_moves:
                idx = torch.arange(R, device=dev)
                self.x0 = self.map("embed", idx, self.inputs).detach().to(self.x0.dtype)
        else:
            self.P = {k: v.unsqueeze(0).repeat(R, *([1] * v.dim())) for k, v in base.items()}

    def params(self, rows: torch.Tensor) -> dict:
        """The perturbed loop parameters of ``rows``: name → (len(rows), *shape)."""
        return {k: v[rows] for k, v in self.P.items()}

    def set_t(self, rows: torch.Tensor, t: torch.Tensor) -> None:
        """Move the rows ``rows`` to step sizes ``t`` (and their x0 with them where the embedding moves)."""
        if rows.numel() == 0:
            return
        self.t[rows] = t.to(self.t)
        s = self.t[rows] * self.row_sign[rows]
        d = self.row_dir[rows]
        for k, v in self.base.items():
            self.P[k][rows] = v + s.to(v).view(-1, *([1] * v.dim())) * self.dirs[k][d]
        if self.embed_moves:
            self.x0[rows] = self.map("embed", rows, self.inputs[rows]).detach().to(self.x0.dtype)

    def map(self, name: str, rows: torch.Tensor, *args):
        """``model.<name>`` of every row in ``rows`` on its own parameters (args batch-first, one row each)."""
        P = self.params(rows)
        self.calls += 1
        wrapper = self._wrappers.get(name)
        if wrapper is None:
            wrapper = self._wrappers[name] = _Method(self.model, name)
        if self.vmap:
            fn = self._vmapped.get(name)
            if fn is None:
                def one(p, *a, _w=wrapper):
                    return torch.func.functional_call(_w, p, tuple(t.unsqueeze(0) for t in a), strict=False)[0]

                fn = self._vmapped[name] = torch.func.vmap(one)
            try:
                return fn({"model." + k: v for k, v in P.items()}, *args)
            except (RuntimeError, ValueError, NotImplementedError, TypeError):
                self.vmap = False  # an operation vmap cannot batch: one row at a time from here on
        outs = [torch.func.functional_call(wrapper, {"model." + k: v[i] for k, v in P.items()},
                                           tuple(a[i:i + 1] for a in args), strict=False)
                for i in range(int(rows.numel()))]
        return torch.cat(outs)

    def step(self, x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """The loop map of the rows ``rows`` at their current parameters: step(x_r, x0_r)."""
        return self.map("step", rows, x, self.x0[rows])


# ---- parameters: which enter the loop, and their groups ----------------------------------------------------------

def _used(model, name: str, params: dict, args, cotangent_seed: int = 0) -> set:
    """The names of ``params`` that ``model.<name>(*args)`` reaches (autograd's graph, not values)."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    with torch.enable_grad():
        out = _call(model, name, leaves, *args)
        if not isinstance(out, torch.Tensor) or not out.requires_grad:  # reaches no parameter (an identity)
            return set()
        g = torch.Generator(device="cpu").manual_seed(cotangent_seed)
        w = torch.randn(out.shape, generator=g, dtype=torch.float64).to(out)
        grads = torch.autograd.grad((out * w).sum(), list(leaves.values()), allow_unused=True)
    return {k for k, gr in zip(leaves, grads) if gr is not None}


def loop_parameters(model, inputs: torch.Tensor, x: torch.Tensor, x0: torch.Tensor) -> tuple[list, list, list]:
    """(names that ``step`` or ``embed`` reach, names that neither does, names that ``embed`` reaches) of the
    model's floating-point parameters (autograd's graph on one sample: structural, not a test of values)."""
    params = {k: v for k, v in model.named_parameters() if v.is_floating_point()}
    in_embed = _used(model, "embed", params, (inputs,))
    used = _used(model, "step", params, (x, x0)) | in_embed
    return [k for k in params if k in used], [k for k in params if k not in used], [k for k in params if k in in_embed]


def _is_norm_param(model, name: str) -> bool:
    mod = model
    for part in name.split(".")[:-1]:
        mod = getattr(mod, part, None)
        if mod is None:
            return False
    return "norm" in type(mod).__name__.lower()


def parameter_groups(model, names: list, inputs: torch.Tensor, x: torch.Tensor, x0: torch.Tensor) -> dict:
    """Group name → parameter names (loop parameters only, each in one group, empty groups left out).

    With the named parts of :class:`~stability.protocols.RecallParts`: W_x, the rest of g, attention (h1), MLP
    (h2), norm gains, residual (R), embedding, other — each part found by calling it under ``functional_call`` and
    asking autograd which parameters it reached. Otherwise by the first component of the parameter name (the
    first two when that gives a single group)."""
    from stability.protocols import has_recall_parts

    params = {k: v for k, v in model.named_parameters() if k in names}
    groups: dict[str, list] = {}
    if has_recall_parts(model):
        wx = getattr(model, "W_x", None)
        wx_name = next((k for k, v in params.items() if wx is not None and v is wx), None)
        u = x[:1]
        parts = {}
        try:
            parts["g"] = _used(model, "g", params, (u, x0[:1]))
            parts["h1"] = _used_part(model, "h", 1, params, u)
            parts["h2"] = _used_part(model, "h", 2, params, u)
            parts["norm"] = (_used_part(model, "pre", 1, params, u) | _used_part(model, "pre", 2, params, u)
                             | _used_part(model, "phi", 1, params, u) | _used_part(model, "phi", 2, params, u))
            parts["residual"] = _used_part(model, "residual", 1, params, u, u) | \
                _used_part(model, "residual", 2, params, u, u)
            parts["embed"] = _used(model, "embed", params, (inputs[:1],))
        except Exception:  # noqa: BLE001 - a part that cannot be called alone: name the groups by parameter name
            parts = None
        if parts is not None:
            order = [("W_x (recall weight)", {wx_name} if wx_name else set()),
                     ("norm gains", parts["norm"] | {k for k in params if _is_norm_param(model, k)}),
                     ("recall g (W_0, biases)", parts["g"]), ("attention (h1)", parts["h1"]),
                     ("MLP (h2)", parts["h2"]), ("residual (R)", parts["residual"]), ("embedding", parts["embed"])]
            seen: set = set()
            for label, members in order:
                got = [k for k in params if k in members and k not in seen]
                if got:
                    groups[label] = got
                    seen.update(got)
            rest = [k for k in params if k not in seen]
            if rest:
                groups["other"] = rest
            return groups
    for depth in (1, 2):
        groups = {}
        for k in params:
            groups.setdefault(".".join(k.split(".")[:depth]), []).append(k)
        if len(groups) > 1:
            break
    return groups


def _used_part(model, name: str, s: int, params: dict, *args) -> set:
    """:func:`_used` for a part called as ``model.<name>(s, *args)`` (pre, h, residual, phi)."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}

    class _Part(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *a):
            return getattr(self.model, name)(s, *a)

    with torch.enable_grad():
        out = torch.func.functional_call(_Part(), {"model." + k: v for k, v in leaves.items()}, args, strict=False)
        if not isinstance(out, torch.Tensor) or not out.requires_grad:
            return set()
        grads = torch.autograd.grad(out.sum(), list(leaves.values()), allow_unused=True)
    return {k for k, gr in zip(leaves, grads) if gr is not None}


def random_directions(base: dict, count: int, seed: int, members: Optional[list] = None) -> dict:
    """``count`` Gaussian directions, name → (count, *shape): on each tensor W in ``members`` (default all),
    z·‖W‖/‖z‖ with z ~ N(0, I) from ``torch.Generator().manual_seed(seed)`` (tensors in name order, directions
    one after the other); an all-zero W gets the RMS of the parameters per entry instead of ‖W‖; zero elsewhere."""
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    total = sum(float(v.double().pow(2).sum()) for v in base.values())
    rms = math.sqrt(total / max(1, sum(v.numel() for v in base.values())))
    out = {k: torch.zeros((count, *v.shape), dtype=v.dtype, device=v.device) for k, v in base.items()}
    for j in range(count):
        for k in sorted(base):
            if members is not None and k not in members:
                continue
            v = base[k]
            z = torch.randn(v.shape, generator=gen, dtype=torch.float64)
            scale = float(v.double().norm()) or rms * math.sqrt(v.numel())
            out[k][j] = (z * (scale / max(float(z.norm()), 1e-300))).to(v)
    return out


# ---- ρ inside the search, and certified -------------------------------------------------------------------------

def rho_estimate(fam: Family, x: torch.Tensor, rows: torch.Tensor, seed: int = 0) -> tuple:
    """The cheap ρ(J*) of the search for the rows ``rows`` at states ``x``: Krylov–Schur on Jᵀ with a basis of
    :data:`KRYLOV` vectors, at most :data:`RESTARTS` restarts, to Ritz residual :data:`ESTIMATE_TOL`. Returns
    (ρ (A,), Ritz residual (A,), products)."""
    from stability.linalg import BatchedJacobian, batched_spectral_radius

    bj = BatchedJacobian(fam.step, x, rows)
    spec = batched_spectral_radius(bj.rapply, tuple(x.shape), krylov=KRYLOV, restarts=RESTARTS, tol=ESTIMATE_TOL,
                                   k=3, seed=seed, restrict=lambda i: bj.restrict(i).rapply, dtype=x.dtype,
                                   device=x.device)
    return spec.rho.double().cpu(), spec.ritz_residual.double().cpu(), int(spec.matvecs)


def rho_certified(fam: Family, x: torch.Tensor, rows: torch.Tensor, *, tol: float = 1e-6, k: int = 3,
                  seed: int = 0) -> torch.Tensor:
    """ρ(J*) of the rows by stage ``rho``'s routine, :func:`stability.analysis.spectra.jacobian_spectral_radius`
    (dense LAPACK for n ≤ DENSE_MAX, Krylov–Schur to Ritz residual ``tol`` above)."""
    from stability.analysis.spectra import jacobian_spectral_radius

    return jacobian_spectral_radius(fam.step, x, rows, tol=tol, k=k, seed=seed).rho.double().cpu()


# ---- the search ---------------------------------------------------------------------------------------------------

@dataclass
class Radii:
    """The radii of a set of rows (one row: one input, one direction, one sign), with their brackets."""

    radius: list
    lo: list
    hi: list
    reason: list  # why hi does not attract: "rho", a solver status, "t_max" (censored), "not attracting at θ*"
    rho_lo: list  # ρ at lo: the estimate, or the certified value where ``certified``
    certified: list
    rho_hi: list = field(default_factory=list)
    evaluations: int = 0
    rounds: int = 0
    products: int = 0
    certified_rho: int = 0
    estimate_gap: Optional[float] = None  # the largest |estimate − certified| at the certified bracket ends
    reopened: int = 0


def search_radii(fam: Family, x_star: torch.Tensor, *, tol: float, max_iter: int, accuracy: float,
                 certify: int = 0, eig_tol: float = 1e-6, eig_k: int = 3, seed: int = 0,
                 t_start: float = T_START, t_min: float = T_MIN, t_max: float = T_MAX, growth: float = GROWTH,
                 skip: Optional[torch.Tensor] = None, log=None) -> Radii:
    """The radius of every row of ``fam`` (module docstring). ``x_star`` (R, *S): each row's x* at θ*; rows with
    ``skip`` set (x* does not attract at θ*) get radius 0 without a search. Every open row iterates at once
    (:func:`_continuation`); then the certification of the first ``certify`` brackets that ρ decided."""
    R = int(x_star.shape[0])
    dev = x_star.device
    lo = [0.0] * R
    hi = [math.inf] * R
    x_lo = x_star.detach().clone()
    rho_lo: list = [None] * R
    rho_hi: list = [None] * R
    reason: list = [None] * R
    cert = [False] * R
    strict = [False] * R  # rows whose bracket a certified ρ re-opened: searched on with certified ρ
    history: list = [[(0.0, x_star[r].detach().clone(), None)] for r in range(R)]  # attracting (t, x*, ρ)
    done = [False] * R
    if skip is not None:
        for r in skip.nonzero().flatten().tolist():
            done[r], reason[r], hi[r] = True, "not attracting at θ*", 0.0
    out = Radii(radius=[], lo=[], hi=[], reason=[], rho_lo=[], certified=[])
    gaps: list = []

    def next_t(r: int) -> float:
        if math.isinf(hi[r]):
            return min(t_max, t_start if lo[r] == 0 else lo[r] * growth)
        if lo[r] == 0:
            return hi[r] / growth
        return math.sqrt(lo[r] * hi[r])

    def finished(r: int) -> bool:
        if math.isinf(hi[r]):
            return lo[r] >= t_max
        if lo[r] == 0:
            return hi[r] <= t_min
        return hi[r] / lo[r] <= 1 + accuracy

    def rho_of(xs, idx, certified: bool) -> list:
        if certified:
            out.certified_rho += int(idx.numel())
            return [float(v) for v in rho_certified(fam, xs, idx, tol=eig_tol, k=eig_k, seed=seed)]
        est, _, prods = rho_estimate(fam, xs, idx, seed=seed)
        out.products += prods
        return [float(v) for v in est]

    def evaluate(rows: list, ts: list, x_init: torch.Tensor, certified: bool) -> tuple:
        """(x per row, converged flags, ρ per row (None where the solve failed)) at t = ts."""
        idx = torch.tensor(rows, dtype=torch.long, device=dev)
        fam.set_t(idx, torch.tensor(ts, dtype=torch.float64))
        xr, st = _picard(fam, x_init, idx, tol, max_iter)
        conv = [v == "converged" for v in st]
        rho: list = [None] * len(rows)
        ok = [i for i, c in enumerate(conv) if c]
        if ok:
            sub = torch.tensor(ok, device=dev)
            for i, v in zip(ok, rho_of(xr[sub], idx[sub], certified)):
                rho[i] = v
        out.evaluations += len(rows)
        return xr, conv, rho

    def decide(r: int, t: float, good: bool, x_conv, rho, why: str, certified: bool) -> None:
        if good:
            lo[r], rho_lo[r], cert[r] = t, rho, certified
            x_lo[r] = x_conv
            history[r].append((t, x_conv.clone(), rho))
            if t >= t_max:
                reason[r] = "t_max"
        else:
            hi[r], rho_hi[r], reason[r] = t, rho, why

    while True:
        # the search: every open row iterates its own continued Picard solve; a row whose solve ends (converged
        # and ρ decided, or failed) moves on to its next t at once, so no row waits for the slowest
        _continuation(fam, x_star, x_lo, done, finished, next_t, decide, strict, rho_of, out, tol=tol,
                      max_iter=max_iter, log=log)
        todo = [r for r in range(R) if not done[r]]
        if todo:
            continue
        # the final ρ: certified at both ends of the first ``certify`` brackets that ρ decided
        picks = [r for r in range(R) if reason[r] == "rho" and lo[r] > 0 and not cert[r]][:certify]
        if not picks:
            break
        certify -= len(picks)
        idx = torch.tensor(picks, device=dev)
        fam.set_t(idx, torch.tensor([lo[r] for r in picks], dtype=torch.float64))
        c_lo = rho_of(x_lo[idx], idx, True)
        x_hi, conv, c_hi = evaluate(picks, [hi[r] for r in picks], x_lo[idx], True)
        for i, r in enumerate(picks):
            gaps += [abs(c_lo[i] - rho_lo[r])] if rho_lo[r] is not None else []
            gaps += [abs(c_hi[i] - rho_hi[r])] if c_hi[i] is not None and rho_hi[r] is not None else []
            rho_lo[r], rho_hi[r], cert[r] = c_lo[i], c_hi[i], True
            if not c_lo[i] < 1.0:  # ρ(lo) ≥ 1 after all: the crossing lies below lo
                hi[r] = lo[r]
                t, x, _ = max((h for h in history[r] if h[0] < lo[r]), key=lambda h: h[0])
                lo[r], rho_lo[r] = t, None
                x_lo[r] = x
            elif conv[i] and c_hi[i] < 1.0:  # attracting at hi after all: the crossing lies above it
                lo[r], hi[r] = hi[r], math.inf
                x_lo[r] = x_hi[i]
                history[r].append((lo[r], x_lo[r].clone(), c_hi[i]))
            else:
                continue
            strict[r], done[r], reason[r] = True, False, None
            out.reopened += 1
    for r in range(R):
        if reason[r] == "not attracting at θ*" or lo[r] == 0:
            out.radius.append(0.0)
        elif math.isinf(hi[r]):
            out.radius.append(float(lo[r]))
            reason[r] = "t_max"
        else:
            out.radius.append(math.sqrt(lo[r] * hi[r]))
        out.lo.append(float(lo[r]))
        out.hi.append(None if math.isinf(hi[r]) else float(hi[r]))
    out.reason, out.rho_lo, out.certified, out.rho_hi = reason, rho_lo, cert, rho_hi
    out.estimate_gap = max(gaps) if gaps else None
    return out


#: a continued solve whose best residual has not improved by 1 % in STALL evaluations has failed if it sits in a
#: period-k orbit (k ≤ MAX_PERIOD, :func:`stability.solvers.detect_period`'s criterion at 10·τ, "cycle") or if its
#: best residual is still above STALL_FAR (relative L∞: nowhere near a fixed point, "stalled"); otherwise it goes
#: on to the budget (a residual near τ can plateau and then collapse). The toolkit's solver carries such samples on
#: to its budget and then reports them stalled; measured on the demo checkpoint, past the boundary the continued
#: solves plateau at residuals 0.07–0.7 from the first 25 evaluations and never improve by 1 % in the 500 of the
#: budget, so cutting them at the plateau changes no radius and makes the search affordable.
STALL, MAX_PERIOD, STALL_FAR = 50, 8, 1e-2


#: a continued solve whose best residual, at the rate it fell over the last STALL evaluations, would need more than
#: SLOW × the budget to reach τ has failed ("max-iterations", decided early; checked from 2·STALL evaluations on)
SLOW = 2.0


def _too_slow(it: int, best: float, before: float, tol: float, max_iter: int) -> bool:
    """Whether a solve at evaluation ``it`` (best residual ``best``, ``before`` STALL evaluations ago) is on course
    to miss τ by the budget: the geometric rate of the last STALL evaluations extrapolated."""
    if it < 2 * STALL or not (math.isfinite(best) and math.isfinite(before)) or best <= tol:
        return False
    if best >= before:
        return False  # no progress at all: the plateau check decides
    rate = math.log(best / before) / STALL  # < 0
    return it + math.log(tol / best) / rate > SLOW * max_iter


class _Orbits:
    """The last 2·MAX_PERIOD + 1 iterates of every row (a ring per row), so that a plateau can be checked for a
    period-k orbit with :func:`stability.solvers.detect_period`'s criterion without evaluating f again: the
    smallest k ≤ MAX_PERIOD with ‖y_{s+k} − y_s‖∞ / (‖y_{s+k}‖∞ + ε) < 10·τ for every s ∈ [0, MAX_PERIOD]."""

    L = 2 * MAX_PERIOD + 1

    def __init__(self, R: int, shape: tuple, dtype, device):
        self.buf = torch.empty((R, self.L, *shape), dtype=dtype, device=device)
        self.count = torch.zeros(R, dtype=torch.long)

    def reset(self, rows: list) -> None:
        self.count[rows] = 0

    def push(self, rows: list, y: torch.Tensor) -> None:
        r = torch.tensor(rows, dtype=torch.long)
        self.buf[r.to(self.buf.device), (self.count[r] % self.L).to(self.buf.device)] = y
        self.count[r] += 1

    def period(self, rows: list, tol: float, eps: float = 1e-8) -> list:
        """The period k ≥ 2 of an orbit through each row's last iterates, 0 where none (or too few iterates)."""
        out = []
        for r in rows:
            c = int(self.count[r])
            if c < self.L:
                out.append(0)
                continue
            order = [(c + j) % self.L for j in range(self.L)]  # oldest first
            Y = self.buf[r, order].flatten(1)
            found = 0
            for k in range(1, MAX_PERIOD + 1):
                d = (Y[k:k + MAX_PERIOD + 1] - Y[:MAX_PERIOD + 1]).abs().amax(1)
                if bool((d / (Y[k:k + MAX_PERIOD + 1].abs().amax(1) + eps) < 10 * tol).all()):
                    found = k
                    break
            out.append(found if found >= 2 else 0)
        return out


def _picard(fam: "Family", x_init: torch.Tensor, rows: torch.Tensor, tol: float, max_iter: int,
            diverge_ratio: float = 1e6):
    """The continued Picard solve of the search for a batch of rows at their current parameters, with
    :func:`stability.solvers.solve`'s criteria (its residual and τ, ``max_iter`` evaluations, divergence past
    ``diverge_ratio`` × the start's scale, non-finite images) and the cycle check of :data:`STALL`. Returns
    (x (A, *S): x* where converged, else the last iterate; statuses: converged, cycle, diverged, non-finite,
    max-iterations)."""
    from stability.solvers import residual

    A = int(rows.numel())
    dev = x_init.device
    x = x_init.detach().clone()
    status: list = [None] * A
    best = [math.inf] * A
    last = [0] * A
    scale = [max(1.0, float(v)) for v in x.flatten(1).abs().amax(1).tolist()]
    act = list(range(A))
    it = 0
    orbits = _Orbits(A, tuple(x.shape[1:]), x.dtype, dev)
    with torch.no_grad():
        while act and it < max_iter:
            it += 1
            ia = torch.tensor(act, device=dev)
            xa = x[ia]
            fa = fam.step(xa, rows[ia])
            fin = torch.isfinite(fa.flatten(1)).all(1).tolist()
            r = residual(fa, xa).double().tolist()
            nrm = torch.maximum(fa.flatten(1).abs().amax(1), xa.flatten(1).abs().amax(1)).double().tolist()
            nxt, plateau = [], []
            for q, i in enumerate(act):
                if not fin[q]:
                    status[i] = "non-finite"
                elif r[q] < tol:
                    status[i] = "converged"
                elif nrm[q] > diverge_ratio * scale[i]:
                    status[i] = "diverged"
                else:
                    if r[q] < 0.99 * best[i]:
                        best[i], last[i] = r[q], it
                    x[i] = fa[q]
                    nxt.append(i)
                    if it - last[i] >= STALL:
                        plateau.append(i)
            if nxt:
                orbits.push(nxt, x[torch.tensor(nxt, device=dev)])
            if plateau:
                for i, per in zip(plateau, orbits.period(plateau, tol)):
                    if per or best[i] > STALL_FAR:
                        status[i] = "cycle" if per else "stalled"
                        nxt.remove(i)
                    else:
                        last[i] = it
            act = nxt
    for i in act:
        status[i] = "max-iterations"
    return x, status


def _continuation(fam: Family, x_star, x_lo, done, finished, next_t, decide, strict, rho_of, out, *, tol: float,
                  max_iter: int, log=None, diverge_ratio: float = 1e6) -> None:
    """Run every open row's search until each one's bracket is finished: one batched step of all iterating rows
    per pass; converged rows wait for one batched ρ (estimate, or certified for ``strict`` rows) while the others
    iterate on; a decided row starts its next t from its x_lo. The solve's criteria are
    :func:`stability.solvers.solve`'s Picard ones (its residual and τ, ``max_iter`` evaluations, ‖f‖ past
    ``diverge_ratio`` × the start's scale is divergence, a non-finite image fails), plus :data:`STALL`."""
    from stability.solvers import residual

    R = int(x_star.shape[0])
    dev = x_star.device
    x = x_lo.clone()
    t_cur = [0.0] * R
    it = [0] * R
    best = [math.inf] * R
    ref = [math.inf] * R
    last = [0] * R
    scale = [1.0] * R
    state = ["idle"] * R  # idle (needs a t) | iterating | waiting (converged, needs ρ) | done
    mark = [math.inf] * R  # the best residual STALL evaluations ago (for _too_slow)
    waiting_x: dict = {}
    passes = 0
    orbits = _Orbits(R, tuple(x_star.shape[1:]), x_star.dtype, dev)

    def start(rows: list) -> None:
        go = []
        for r in rows:
            if done[r] or finished(r):
                done[r], state[r] = True, "done"
                continue
            go.append(r)
        if not go:
            return
        ts = [next_t(r) for r in go]
        idx = torch.tensor(go, dtype=torch.long, device=dev)
        fam.set_t(idx, torch.tensor(ts, dtype=torch.float64))
        x[idx] = x_lo[idx]
        orbits.reset(go)
        for r, t in zip(go, ts):
            t_cur[r], it[r], best[r], ref[r], last[r], state[r] = t, 0, math.inf, math.inf, 0, "iterating"
            mark[r] = math.inf
            scale[r] = max(1.0, float(x_lo[r].abs().max()))
        out.evaluations += len(go)

    start(list(range(R)))
    while True:
        run = [r for r in range(R) if state[r] == "iterating"]
        wait = [r for r in range(R) if state[r] == "waiting"]
        if wait and (not run or len(wait) >= max(1, len(run))):
            for flag in (False, True):
                rows = [r for r in wait if strict[r] == flag]
                if not rows:
                    continue
                idx = torch.tensor(rows, dtype=torch.long, device=dev)
                xs = torch.stack([waiting_x.pop(r) for r in rows])
                rho = rho_of(xs, idx, flag)
                for i, r in enumerate(rows):
                    good = math.isfinite(rho[i]) and rho[i] < 1.0
                    decide(r, t_cur[r], good, xs[i], rho[i], "rho", flag)
                    state[r] = "idle"
            start([r for r in wait])
            continue
        if not run:
            break
        passes += 1
        idx = torch.tensor(run, dtype=torch.long, device=dev)
        with torch.no_grad():
            xa = x[idx]
            fa = fam.step(xa, idx)
        finite = torch.isfinite(fa.flatten(1)).all(1)
        r_all = residual(fa, xa).double().cpu().tolist()
        norm = torch.maximum(fa.flatten(1).abs().amax(1), xa.flatten(1).abs().amax(1)).double().cpu().tolist()
        finite = finite.cpu().tolist()
        ended, plateau = [], []
        for i, r in enumerate(run):
            it[r] += 1
            res_r = r_all[i] if finite[i] else math.nan
            if finite[i] and res_r < tol:
                state[r] = "waiting"
                waiting_x[r] = xa[i].clone()
                continue
            why = None
            if not finite[i]:
                why = "non-finite"
            elif norm[i] > diverge_ratio * scale[r]:
                why = "diverged"
            else:
                if res_r < best[r]:
                    best[r] = res_r
                if res_r < 0.99 * ref[r]:
                    ref[r], last[r] = res_r, it[r]
                if it[r] % STALL == 0:
                    if _too_slow(it[r], best[r], mark[r], tol, max_iter):
                        why = "max-iterations"
                    mark[r] = best[r]
                if it[r] >= max_iter:
                    why = "max-iterations"
                elif why is None and it[r] - last[r] >= STALL:
                    plateau.append(r)
            if why is not None:
                decide(r, t_cur[r], False, None, None, why, strict[r])
                state[r] = "idle"
                ended.append(r)
        keep = [i for i, r in enumerate(run) if state[r] == "iterating"]
        if keep:
            k = torch.tensor(keep, device=dev)
            x[idx[k]] = fa[k]
            orbits.push([run[i] for i in keep], fa[k])
        if plateau:  # a plateau: a period-k orbit ends the solve as failed, otherwise it goes on
            for r, per in zip(plateau, orbits.period(plateau, tol)):
                if per or best[r] > STALL_FAR:
                    decide(r, t_cur[r], False, None, None, "cycle" if per else "stalled", strict[r])
                    state[r] = "idle"
                    ended.append(r)
                else:
                    last[r] = it[r]
        if ended:
            start(ended)
        if log is not None and passes % 200 == 0:
            log(f"geometry: {sum(1 for d in done if not d)} of {R} radii open")
    out.rounds += passes


# ---- anisotropy -----------------------------------------------------------------------------------------------

def anisotropy(radii, *, t_min: float = T_MIN) -> dict:
    """App. B.2's measures on one input's radii: log_range = log(max/min), log_iqr (interquartile range of log r),
    balance = min/max, median_radius, unstable_t0 (the share of radii that are 0). Radii of 0 enter the logs as
    ``t_min`` (they are below it); censored radii as the censoring value (so log_range is then a lower bound)."""
    r = np.asarray([float(v) for v in radii], dtype=float)
    if r.size == 0:
        return {"median_radius": None, "log_range": None, "log_iqr": None, "balance": None, "unstable_t0": None}
    zero = r <= 0
    logs = np.log(np.maximum(r, t_min))
    q1, q3 = np.percentile(logs, [25, 75])
    return {"median_radius": float(np.median(r)), "log_range": float(logs.max() - logs.min()),
            "log_iqr": float(q3 - q1), "balance": float(r.min() / r.max()) if r.max() > 0 else None,
            "unstable_t0": float(zero.mean())}


# ---- the stage ------------------------------------------------------------------------------------------------

@dataclass
class Geometry:
    """The geometry stage's result (the ``geometry`` JSON block); see the module docstring."""

    samples: list
    attracting: list
    rho_at_theta: list
    directions: int
    accuracy: float
    radii: list  # per sample: 2·directions radii, (direction 0 +, direction 0 −, direction 1 +, …)
    reasons: list
    rho_inner: list
    certified: list
    per_sample: list
    groups: list
    outside_loop: list
    evaluation: str
    counts: dict
    plane: Optional[dict] = None
    certify: int = 0
    estimate_gap: Optional[float] = None
    t_range: tuple = (T_MIN, T_MAX)
    note: Optional[str] = None

    def summary(self) -> dict:
        """Medians over the inputs whose x* attracts at θ*; ``unstable_t0`` over every radius measured."""
        good = [p for p, a in zip(self.per_sample, self.attracting) if a]
        every = [r for rs in self.radii for r in rs]
        pooled = [r for rs, a in zip(self.radii, self.attracting) if a for r in rs]
        return {"median_radius": median(pooled) if pooled else (0.0 if every else None),
                "log_range": median([p["log_range"] for p in good]),
                "log_iqr": median([p["log_iqr"] for p in good]),
                "balance": median([p["balance"] for p in good]),
                "unstable_t0": float(np.mean([r <= 0 for r in every])) if every else None,
                "censored": float(np.mean([x == "t_max" for rs in self.reasons for x in rs])) if every else None,
                "attracting_samples": int(sum(bool(a) for a in self.attracting)), "samples": len(self.samples)}

    def to_dict(self) -> dict:
        lo, hi = self.t_range
        return {"definition": "r = smallest relative step t along θ* + t·D (each tensor's part of D scaled to that "
                              "tensor's norm) at which the continued Picard solve fails or ρ(J*) ≥ 1",
                "samples": self.samples, "attracting_at_theta": self.attracting, "rho_at_theta": self.rho_at_theta,
                "directions": self.directions, "signs": 2, "accuracy": self.accuracy,
                "t_min": lo, "t_max": hi, "t_start": T_START, "growth": GROWTH,
                "radii": self.radii, "reasons": self.reasons, "rho_inner": self.rho_inner,
                "certified": self.certified, "per_sample": self.per_sample, "summary": self.summary(),
                "groups": self.groups, "outside_loop": self.outside_loop,
                "rho_estimate": f"Krylov–Schur on Jᵀ, basis {KRYLOV}, ≤ {RESTARTS} restarts, Ritz residual "
                                f"{ESTIMATE_TOL:g}",
                "rho_certified": f"spectra.jacobian_spectral_radius at both ends of the first {self.certify} "
                                 f"brackets that ρ decided",
                "estimate_gap_max": self.estimate_gap, "evaluation": self.evaluation, "counts": self.counts,
                "plane": self.plane, "note": self.note}


def measure(model, inputs: torch.Tensor, x_star: torch.Tensor, x0: torch.Tensor, attracting, rho_at_theta, *,
            samples: list, directions: int = 8, accuracy: float = 0.1, group_directions: int = 1,
            certify: int = 4, plane: int = 0, tol: float = 1e-5, max_iter: int = 500, eig_tol: float = 1e-6,
            eig_k: int = 3, seed: int = 0, t_max: float = T_MAX, log=None) -> Geometry:
    """The geometry stage on the inputs ``samples`` (indices into ``inputs`` / ``x_star`` / ``x0``): radii along
    ``directions`` directions in all loop parameters and ``group_directions`` per parameter group, both signs;
    anisotropy per input; with ``plane`` > 0 the ρ(J*) picture on a plane × plane grid around the first input
    whose x* attracts. ``attracting`` (per sample of the batch: x* converged and ρ(J*) < 1 at θ*) and
    ``rho_at_theta`` come from the stages before."""
    say = log or (lambda msg: None)
    dev = x_star.device
    sel = torch.tensor(samples, dtype=torch.long, device=dev)
    inp, xs, x0s = inputs[sel], x_star[sel], x0[sel]
    names, outside, in_embed = loop_parameters(model, inp[:1], xs[:1], x0s[:1])
    base = {k: v.detach() for k, v in model.named_parameters() if k in names}
    groups = parameter_groups(model, names, inp[:1], xs[:1], x0s[:1]) if group_directions > 0 else {}
    full = random_directions(base, directions, seed)
    parts = [full]
    labels = [("all", j) for j in range(directions)]
    for g_i, (label, members) in enumerate(groups.items()):
        parts.append(random_directions(base, group_directions, seed + 1000 * (g_i + 1), members))
        labels += [(label, j) for j in range(group_directions)]
    dirs = {k: torch.cat([p[k] for p in parts]) for k in base}
    D, S = len(labels), len(samples)
    per = 2 * D
    # rows: sample-major, then direction, then sign (+, −)
    row_sample = torch.arange(S, device=dev).repeat_interleave(per)
    row_dir = torch.arange(D, device=dev).repeat_interleave(2).repeat(S)
    row_sign = torch.tensor([1.0, -1.0], dtype=torch.float64, device=dev).repeat(S * D)
    att = [bool(attracting[b]) for b in samples]
    fam = Family(model, base, dirs, inp[row_sample], x0s[row_sample], row_dir=row_dir, row_sign=row_sign,
                 embed_moves=any(k in base for k in in_embed))
    skip = torch.tensor([not att[int(s)] for s in row_sample.cpu()])
    say(f"geometry: {S} sample(s) × {D} directions × 2 signs = {S * per} radii ({directions} in all loop "
        f"parameters, {group_directions} in each of {len(groups)} groups)")
    found = search_radii(fam, xs[row_sample], tol=tol, max_iter=max_iter, accuracy=accuracy, certify=certify,
                         eig_tol=eig_tol, eig_k=eig_k, seed=seed, skip=skip, t_max=t_max, log=say)
    radii, reasons, rho_in, certs, per_sample = [], [], [], [], []
    for i in range(S):
        sl = slice(i * per, i * per + 2 * directions)
        radii.append(found.radius[sl])
        reasons.append(found.reason[sl])
        rho_in.append(found.rho_lo[sl])
        certs.append(found.certified[sl])
        an = anisotropy(found.radius[sl])
        if not att[i]:
            an.update(log_range=None, log_iqr=None, balance=None)
        per_sample.append(an)
    group_out = []
    for label, members in groups.items():
        js = [j for j, (lab, _) in enumerate(labels) if lab == label]
        at = [i * per + 2 * j + s for i in range(S) if att[i] for j in js for s in (0, 1)]
        rs, why = [found.radius[q] for q in at], [found.reason[q] for q in at]
        group_out.append({"name": label, "parameters": members, "radii": rs, "reasons": why,
                          "median_radius": median(rs) if rs else None, "min_radius": min(rs) if rs else None,
                          "censored": float(np.mean([w == "t_max" for w in why])) if why else None})
    counts = {"radii": S * per, "rounds": found.rounds, "evaluations": found.evaluations,
              "rho_products": found.products, "certified_rho": found.certified_rho, "map_calls": fam.calls,
              "reopened": found.reopened}
    geo = Geometry(samples=list(samples), attracting=att, rho_at_theta=[rho_at_theta[b] for b in samples],
                   directions=directions, accuracy=accuracy, radii=radii, reasons=reasons, rho_inner=rho_in,
                   certified=certs, per_sample=per_sample, groups=group_out, outside_loop=outside,
                   evaluation="vmap over rows" if fam.vmap else "one row at a time (the model's code does not vmap)",
                   counts=counts, certify=certify, estimate_gap=found.estimate_gap, t_range=(T_MIN, t_max))
    if plane and any(att):
        i = att.index(True)
        say(f"geometry: the plane of directions 1 and 2, {plane} × {plane} cells")
        geo.plane = plane_picture(model, base, full, inp[i:i + 1], xs[i:i + 1], x0s[i:i + 1], radii[i], n=plane,
                                  tol=tol, max_iter=max_iter, seed=seed, t_max=t_max,
                                  embed_moves=any(k in base for k in in_embed))
        geo.plane["sample"] = samples[i]
    return geo


def plane_picture(model, base: dict, full: dict, inputs, x_star, x0, radii, *, n: int = 21, tol: float = 1e-5,
                  max_iter: int = 500, seed: int = 0, t_max: float = T_MAX, embed_moves: bool = True) -> dict:
    """ρ(J*) (the search's estimate) over θ* + a·D1 + b·D2 on an n × n grid of a, b ∈ [−s, s], s = 1.5 × the
    largest of the four radii along ±D1, ±D2 (at most ``t_max``): the column a = 0 continued outward from θ*,
    then every row outward from it (each cell warm-started from its neighbour towards θ*). Returns the axes, ρ
    (None where the solve failed or ρ is not finite) and every cell's solver status."""
    n = max(3, int(n) | 1)  # odd: θ* is a grid point
    pos = [r for r in radii[:4] if r is not None and r > 0]
    s = min(t_max, 1.5 * max(pos or [T_START]))
    axis = np.linspace(-s, s, n)
    c = n // 2
    dev = x_star.device
    cells = [(i, j) for i in range(n) for j in range(n)]  # (row i: b = axis[i], column j: a = axis[j])
    coef = torch.tensor([[axis[j], axis[i]] for i, j in cells], dtype=torch.float64, device=dev)
    two = {k: v[:2] for k, v in full.items()}
    R = len(cells)
    fam = Family(model, base, two, inputs.expand(R, *inputs.shape[1:]), x0.expand(R, *x0.shape[1:]), coef=coef,
                 embed_moves=embed_moves)
    X = x_star.expand(R, *x_star.shape[1:]).clone()
    rho = [[None] * n for _ in range(n)]
    status = [[None] * n for _ in range(n)]

    def run(batch, starts):
        idx = torch.tensor([i * n + j for i, j in batch], device=dev)
        xr, st = _picard(fam, X[torch.tensor(starts, device=dev)], idx, tol, max_iter)
        ok = [q for q, v in enumerate(st) if v == "converged"]
        vals = {}
        if ok:
            sub = torch.tensor(ok, device=dev)
            vals = dict(zip(ok, rho_estimate(fam, xr[sub], idx[sub], seed=seed)[0].tolist()))
        for q, (i, j) in enumerate(batch):
            X[i * n + j] = xr[q]
            status[i][j] = st[q]
            v = vals.get(q)
            rho[i][j] = v if v is not None and math.isfinite(v) else None

    run([(c, c)], [c * n + c])
    for d in range(1, c + 1):  # the column a = 0, outward from θ*
        run([(c - d, c), (c + d, c)], [(c - d + 1) * n + c, (c + d - 1) * n + c])
    for d in range(1, c + 1):  # every row, outward from that column
        run([(i, c - d) for i in range(n)] + [(i, c + d) for i in range(n)],
            [i * n + c - d + 1 for i in range(n)] + [i * n + c + d - 1 for i in range(n)])
    return {"a": axis.tolist(), "b": axis.tolist(), "rho": rho, "status": status, "extent": float(s),
            "radii_D1": [radii[0], radii[1]], "radii_D2": [radii[2], radii[3]],
            "rho_source": f"the search's estimate (Krylov–Schur, basis {KRYLOV})"}


# ---- reference models whose stable region is known in closed form ------------------------------------------------

class DiagonalRecall(torch.nn.Module):
    """A linear recall map with a diagonal weight, x ↦ a ⊙ x + x0, as a :class:`~stability.protocols.LoopedModel`
    (embed: the inputs themselves; readout: (x, −x) as two logits per position). J* = diag(a): x* attracts iff
    every |a_i| < 1, so the radius along D is min_i of the smallest t > 0 with |a_i + t·D_i| = 1
    (:func:`diagonal_radius`). With inputs 0 the fixed point is x* = 0 for every a (the solve converges at once),
    so the radius is decided by ρ alone."""

    def __init__(self, a):
        super().__init__()
        self.a = torch.nn.Parameter(torch.as_tensor(a, dtype=torch.float64).clone())

    def embed(self, inputs):
        return inputs

    def initial_state(self, x0, generator=None):
        return x0

    def step(self, x, x0):
        return self.a * x + x0

    def readout(self, x):
        return torch.stack([x, -x], dim=-1)


def diagonal_radius(a, d) -> float:
    """The closed-form radius of :class:`DiagonalRecall` along the parameter direction ``d`` (∞ if none)."""
    a, d = np.asarray(a, dtype=float), np.asarray(d, dtype=float)
    best = math.inf
    for ai, di in zip(a, d):
        if di != 0:
            best = min(best, ((1.0 if di > 0 else -1.0) - ai) / di)
    return best


class Figure5Model(torch.nn.Module):
    """The single-layer model of Figure 5 with one eigen-pair, θ = (λ_g, λ_h) one parameter tensor: external
    recall x ↦ g(x) + h(g(x)) = (1 + λ_h)(λ_g x + x0), internal x ↦ x + h(g(x)) = x + λ_h(λ_g x + x0); J* is
    (1 + λ_h)λ_g or 1 + λ_gλ_h (:mod:`stability.theory.regions`), x* = 0 for inputs 0. The radius along a
    direction has a closed form (:func:`figure5_radius`)."""

    def __init__(self, placement: str, lam_g: float, lam_h: float):
        super().__init__()
        if placement not in ("external", "internal"):
            raise ValueError(f"placement must be external or internal, got {placement!r}")
        self.placement = placement
        self.theta = torch.nn.Parameter(torch.tensor([lam_g, lam_h], dtype=torch.float64))

    def embed(self, inputs):
        return inputs

    def initial_state(self, x0, generator=None):
        return x0

    def step(self, x, x0):
        lg, lh = self.theta[0], self.theta[1]
        u = lg * x + x0
        return (1 + lh) * u if self.placement == "external" else x + lh * u

    def readout(self, x):
        return torch.stack([x, -x], dim=-1)


def figure5_radius(placement: str, theta, d) -> float:
    """The smallest t > 0 at which θ + t·d leaves the open region of Figure 5: external |x(1 + y)| < 1, internal
    −2 < x·y < 0 (the roots of a quadratic in t on each boundary level); ∞ if the ray never leaves it."""
    (x, y), (u, v) = np.asarray(theta, dtype=float), np.asarray(d, dtype=float)
    if placement == "external":  # (x + u t)(1 + y + v t) = ±1
        quad = [(u * v, u * (1 + y) + v * x, x * (1 + y) - c) for c in (1.0, -1.0)]
    else:  # (x + u t)(y + v t) = 0 or −2
        quad = [(u * v, u * y + v * x, x * y - c) for c in (0.0, -2.0)]
    best = math.inf
    for A, B, C in quad:
        roots = np.roots([A, B, C]) if abs(A) > 1e-300 else ([-C / B] if B != 0 else [])
        for t in np.atleast_1d(roots):
            if abs(complex(t).imag) < 1e-12 and complex(t).real > 1e-12:
                best = min(best, float(complex(t).real))
    return best


__all__ = ["DiagonalRecall", "Family", "Figure5Model", "Geometry", "Radii", "anisotropy", "diagonal_radius",
           "figure5_radius", "loop_parameters", "measure", "parameter_groups",
           "plane_picture", "random_directions", "rho_certified", "rho_estimate", "search_radii"]
