"""The stages of the analysis: each a function from :class:`~stability.analysis.fixed_point.AtFixedPoint` to its
result, run in this order by :func:`stability.analysis.pipeline.run_stages`.

==================  ====================================================  =====================================
stage               what                                                  result (JSON key)
==================  ====================================================  =====================================
``reachability``    x* by the solver, statuses, cycles (Section 3.2)      :class:`Reachability` (fixed_point)
``rho``             ρ(J*), σ_max, leading eigenvalues (Props. 3–4)        :class:`JacobianSpectra` (jacobian)
``prop4``           ρ(M) from the named parts, against autograd           :class:`Prop4Result` (prop4)
``rho_wx``          ρ(W_x) of the recall weight (Figs. 6–7)               :class:`RecallWeight` (recall)
``prop5``           the unrolled input-gradient → the implicit one        :class:`Prop5Stage` (prop5)
``input``           ‖dx*/dx0‖_F (Prop. 5)                                 :class:`InputDependence`
``a8``              A.8 local: ‖dx_T/de·u‖ per converged sample;          :class:`InitialIterate` (initial_iterate)
                    global: x* from e ∈ {e, x0, zeros, noise} (basins)
``repelling``       roots of f(x) − x by Broyden from x_best and          :class:`RepellingSearch` (repelling)
                    perturbations, classified by ρ(J) (App. A.1)
``accuracy``        accuracy against iteration and at x* (Fig. 3)         :class:`AccuracyCurve`
``geometry``        radii of stability in parameter space, anisotropy     :class:`~stability.analysis.geometry.Geometry`
                    (Section 3.2, App. B.2; opt-in in the library)        (geometry)
==================  ====================================================  =====================================

Prop. 4 and ρ(W_x) need a model with :class:`~stability.protocols.RecallParts` and are :class:`NotApplicable`
otherwise; accuracy needs targets. The stages use the :class:`~stability.protocols.LoopedModel` contract only.
What a stage leaves for a later one is a member of the AtFixedPoint (its module docstring has the table).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from stability.analysis.fixed_point import AtFixedPoint, DenseJacobians
from stability.analysis.results import (InitialIterate, InputDependence, JacobianSpectra, NotApplicable, Prop5Stage,
                                        RecallWeight)


def stage_reachability(at: AtFixedPoint):
    """x* per sample by the solver from e (Def. 3.3), and the reachability summary (Section 3.2)."""
    from stability.analysis.reachability import reachability
    from stability.solvers import Solve

    o = at.options
    curve = None
    if "accuracy" in o.stages and at.targets is not None and o.solver == "picard":
        # Picard from e is the iteration the accuracy curve scores: the solve's evaluations give it (stage accuracy)
        from stability.analysis.accuracy import CurveRecorder

        curve = CurveRecorder(at.model, at.score, o.iterations, at.targets)
    at.solve(Solve(method=o.solver, tol=o.tol, max_iter=o.max_iter, name="analysis"),
             observe=curve.observe if curve else None, observe_steps=o.iterations if curve else 0)
    if curve is not None:
        at.accuracy_curve = curve.curve()
    reach = reachability(at.solution, solver=o.solver, max_iter=o.max_iter)
    at.log(f"{at.split}: {int(at.converged.sum())}/{at.converged.numel()} converged ({o.solver}, τ={o.tol:g})")
    return reach


def stage_rho(at: AtFixedPoint) -> JacobianSpectra:
    """ρ(J*), σ_max and the leading eigenvalues of J = ∂step/∂x at x_best (Props. 3–4), by
    :func:`stability.numerics.spectra.spectral_radius` and :func:`~stability.numerics.spectra.sigma_max` on the
    route :func:`~stability.numerics.spectra.route_for` gives: the dense routes for small states (the dense J kept
    for stage prop4 where they fit), ``krylov`` on Jᵀ above."""
    from stability.numerics.jacobian import DENSE_BUDGET
    from stability.numerics.spectra import route_for

    N, n = at.x_star.shape[0], int(np.prod(at.x_star.shape[1:]))
    keep = N * n * n * 8 <= 4 * DENSE_BUDGET  # the dense J fit 4 × the chunk budget: kept for stage prop4
    route = route_for(n, dense_kept=keep and "prop4" in at.options.stages)
    spectrum, sigma, flags, method = (_rho_dense if route != "krylov" else _rho_matrix_free)(at, route, keep)
    at.jacobian_spectra = JacobianSpectra(method=method, spectrum=spectrum, sigma=sigma, eigen_flags=flags,
                                          converged=at.converged.tolist())
    return at.jacobian_spectra


def _rho_dense(at: AtFixedPoint, route: str, keep: bool) -> tuple:
    """Stage rho on small states: every sample's dense J (forward-mode columns, compressed where positions reach
    only their neighbours, chunked by memory) and LAPACK, exact to rounding (route ``dense``); mid-size states
    (``dense-krylov``): the same J, ρ by ARPACK on each, for stage prop4 to reuse. The dense J go to stage prop4
    (its check against autograd) where ``keep``."""
    from stability.numerics import Linearisation, Spectrum, sigma_max, spectral_radius
    from stability.numerics.jacobian import DENSE_BUDGET
    from stability.numerics.spectra import DENSE_KRYLOV_MAX, DENSE_MAX

    o, f, x_star, x0 = at.options, at.f, at.x_star, at.x0
    N, n = x_star.shape[0], int(np.prod(x_star.shape[1:]))
    group = max(1, (DENSE_BUDGET // 4) // (8 * n * n))
    Js, specs, sigmas = [], [], []
    for i in range(0, N, group):
        J = Linearisation(f, x_star[i:i + group], x0[i:i + group]).dense()
        specs.append(spectral_radius(J, route=route, k=o.eig_k, tol=o.eig_tol, seed=o.seed))
        sigmas.append(sigma_max(J, route=route).cpu())
        if keep:
            Js.append(J)
    spectrum = Spectrum.cat(specs)
    if keep:
        at.dense_jacobians = DenseJacobians(torch.cat(Js))
    if route == "dense":
        flags = torch.ones(N, dtype=torch.bool)  # exact to rounding
        method = (f"dense (n = {n} ≤ {DENSE_MAX}: every sample's Jacobian by batched forward-mode columns, "
                  f"eigenvalues by LAPACK, σ_max by λ_max(JᵀJ); exact to rounding, ritz_residual 0)")
    else:
        flags = spectrum.ritz_residual < o.eig_tol
        method = (f"dense Jacobian (n = {n} ≤ {DENSE_KRYLOV_MAX}: every sample's J by batched forward-mode columns), "
                  f"ρ by ARPACK on each dense J (leading Ritz residual < {o.eig_tol:g}), σ_max by λ_max(JᵀJ)")
    return spectrum, torch.cat(sigmas), flags, method


def _rho_matrix_free(at: AtFixedPoint, route: str, keep: bool) -> tuple:
    """Stage rho on large states: the Krylov–Schur method on Jᵀ (float32 products certified in float64 with
    ``eig_precision`` mixed), ``eig_batch`` samples a batch, on the first ``at.few`` samples."""
    from stability.numerics import Linearisation, Spectrum, sigma_max, spectral_radius

    o, f, x_star, x0 = at.options, at.f, at.x_star, at.x0
    N = x_star.shape[0]
    K = at.few  # the first K samples (all, but on large states a few: AnalysisOptions.few_samples)
    chunk = o.eig_chunk(K, x_star.device.type)
    mixed = o.eig_precision == "mixed" and x_star.dtype == torch.float64
    fast_model = copy.deepcopy(at.model).float() if mixed else None
    specs, sigmas = [], []
    for i in range(0, K, chunk):
        xs, xb = x_star[i:min(i + chunk, K)], x0[i:min(i + chunk, K)]
        J = Linearisation(f, xs, xb)
        fast = Linearisation(fast_model.step, xs.float(), xb.float()) if mixed else None
        specs.append(spectral_radius(J, route=route, fast=fast, k=o.eig_k, tol=o.eig_tol, seed=o.seed,
                                     restart=o.eig_restart))
        sigmas.append(sigma_max(J, route=route, tol=o.eig_tol, seed=o.seed, restart=o.eig_restart).cpu())
        at.tick(min(i + chunk, K), K)
    spectrum = Spectrum.cat(specs)
    batched = o.batch == "all" or x_star.device.type != "cpu"  # krylov_schur's restart: batched, or auto on a GPU
    method = (f"Krylov–Schur on Jᵀ (torch, {chunk} sample(s) per batch{', restarts batched' if batched else ''}; "
              + ("float32 products, each leading Ritz pair certified by float64 products)" if mixed
                 else "float64 products)"))
    if K < N:  # the rest are not measured (None), said in the method and the split's measured_samples
        method += f"; the first {K} of {N} samples (n = {int(np.prod(x_star.shape[1:])):,} > {o.few_samples_above:,})"
    sigma = torch.cat(sigmas) if sigmas else torch.zeros(0, dtype=torch.float64)
    return spectrum, sigma, spectrum.ritz_residual < o.eig_tol, method


def stage_prop4(at: AtFixedPoint):
    """Prop. 4 / App. A.7: ρ(M) of the matrix assembled from the named parts, checked against autograd."""
    from stability.analysis.recall import prop4
    from stability.protocols import has_recall_parts, recall_parts_missing

    if not has_recall_parts(at.model):
        return NotApplicable(f"the model does not expose the named recall parts (RecallParts: missing "
                             f"{', '.join(recall_parts_missing(at.model))})")
    if at.model.recall == "none":
        return NotApplicable("no recall (recall none): Prop. 4 concerns recall models")
    o, dense = at.options, at.dense_jacobians  # stage rho's dense Jacobians, when it took the dense route
    spec = at.jacobian_spectra  # stage rho's spectra at this x*, taken where M = J
    mixed = o.eig_precision == "mixed" and at.x_star.dtype == torch.float64
    N, K = at.x_star.shape[0], at.few  # the first K samples (all, but on large states a few)
    out = prop4(at.model, at.x_star[:K], at.x0[:K], probes=o.prop4_probes, k=o.eig_k, tol=o.eig_tol,
                J=None if dense is None else dense.J,
                J_spectra=None if spec is None else spec.spectrum.rows(slice(0, K)),
                fast_model=copy.deepcopy(at.model).float() if mixed else None,
                chunk=o.eig_chunk(K, at.x_star.device.type), seed=o.seed, tick=at.tick, restart=o.eig_restart)
    if out is not None and K < N:
        out.rho_M = list(out.rho_M) + [None] * (N - K)
    return out


def stage_rho_wx(at: AtFixedPoint):
    """ρ(W_x) of the recall weight (bias ignored), the one quantity the paper's release computes."""
    from stability.analysis.recall import rho_W_x
    from stability.protocols import has_recall_parts

    if not has_recall_parts(at.model):
        return NotApplicable("the model does not expose the named recall parts (RecallParts), so no W_x")
    w = rho_W_x(at.model)
    if w is None:
        return NotApplicable("no recall weight (W_x is None)")
    return RecallWeight(rho_Wx=float(w.rho[0]), eigenvalues=w.eigenvalue_lists()[0])


def stage_prop5(at: AtFixedPoint) -> Prop5Stage:
    """Prop. 5 on the first converged sample: dx_T/dx0·u (unrolled from e, held fixed) against the implicit
    (I − J)⁻¹ ∂f/∂x0 u (GMRES), by the batched routes of :mod:`stability.analysis.prop5`."""
    from stability.analysis.initial_iterate import prop5_and_initial_iterate_batched
    from stability.analysis.prop5 import KrylovError
    from stability.solvers import POLISH, solve

    o, first = at.options, at.first_converged
    if first is None:
        return Prop5Stage(skipped="no sample converged: Prop. 5 needs a fixed point")
    # polish x* of that sample by further Picard steps, so that the error floor is set by GMRES and the
    # unrolled T, not by the solver's τ
    sl = slice(first, first + 1)
    polish = solve(at.f, at.x_star[sl], at.x0[sl], POLISH.replace(max_iter=o.max_iter))
    # one unroll from e carries both tangents: dx_T/dx0·u here and A.8's dx_T/de·u (kept for stage a8)
    p5, at.initial_iterate_tangent = prop5_and_initial_iterate_batched(at.f, polish.x_best, at.x0[sl], at.e[sl],
                                                                       at.T_grid, tol=o.gmres_tol, seed=o.seed)
    try:
        chk = p5.sample(0)
    except KrylovError as exc:
        return Prop5Stage(sample=first, skipped=str(exc))
    return Prop5Stage(check=chk, sample=first, x_star_residual=float(polish.best_residual[0]))


def stage_input(at: AtFixedPoint) -> InputDependence:
    """‖dx*/dx0‖_F per converged sample (Hutchinson; Prop. 5), every sample's probes in one batched solve."""
    from stability.analysis.input_dependence import input_dependence_frobenius_batched

    o, conv = at.options, at.converged
    frob: list = [None] * conv.numel()
    idx = conv[:at.few].nonzero().flatten()  # the first few samples on large states (AnalysisOptions.few_samples)
    if idx.numel():
        dev = at.x_star.device
        est = input_dependence_frobenius_batched(at.f, at.x_star[idx.to(dev)], at.x0[idx.to(dev)],
                                                 probes=o.probes, tol=max(o.gmres_tol, 1e-8), seed=o.seed)
        for j, b in enumerate(idx.tolist()):
            frob[b] = float(est.value[j]) if bool(est.converged[j]) else None
    return InputDependence(frobenius=frob, probes=o.probes)


def stage_a8(at: AtFixedPoint) -> InitialIterate:
    """App. A.8 and basins, reported apart (:mod:`stability.analysis.initial_iterate`). Local (A.8): ‖dx_T/de·u‖
    at the largest T per converged sample, against T on the first (batched route). Global: solve from e ∈ {x0,
    zeros, noise} (noise of std ``noise_std``) besides the model's e; x* from starts whose solves converged are
    compared (basins)."""
    from stability.analysis.initial_iterate import (fixed_point_distance, global_dependence,
                                                    initial_iterate_sensitivity_batched, local_dependence)
    from stability.analysis.verdict import THRESHOLDS
    from stability.solvers import Solve, solve

    # the first K samples (all, but on large states a few: AnalysisOptions.few_samples)
    o, K = at.options, at.few
    x0, e, x_star, converged = at.x0[:K], at.e[:K], at.x_star[:K], at.converged[:K]
    std = 1.0 if o.noise_std is None else float(o.noise_std)
    gen = torch.Generator().manual_seed(o.seed)
    starts = {"x0": x0 if x0.shape == e.shape else None, "zeros": torch.zeros_like(e),
              "noise": torch.randn(e.shape, generator=gen, dtype=torch.float64).to(e) * std}
    starts = {k: v for k, v in starts.items() if v is not None}  # e = x0 needs a state shaped like x0
    # the starts other than e are solved together, as one batch of len(new) · B samples (the samples of step are
    # independent, so this is the same per-sample iteration at a fraction of the per-iteration overhead)
    new = [k for k, v in starts.items() if not torch.equal(v, e)]
    B = e.shape[0]
    both = (solve(at.f, torch.cat([starts[k] for k in new]), torch.cat([x0] * len(new)),
                  Solve(method=o.solver, tol=o.tol, max_iter=o.max_iter, name="a8 starts")) if new else None)
    x_best, conv = {}, {}
    for k in starts:
        if k in new:
            i = new.index(k)
            x_best[k], conv[k] = both.x_best[i * B:(i + 1) * B], both.converged[i * B:(i + 1) * B]
        else:
            x_best[k], conv[k] = x_star, converged
    all_conv = torch.stack(list(conv.values())).all(0)
    dist = fixed_point_distance(list(x_best.values()))
    a8 = InitialIterate(starts=list(starts), fixed_point_distance=[float(d) if bool(c) else None
                                                                   for d, c in zip(dist, all_conv)],
                        converged_fraction={k: float(c.double().mean()) for k, c in conv.items()},
                        noise_std=std)
    # global: the model's e and every other start, x* compared only between converged solves
    alias = [k for k in starts if k not in new]
    names = [f"e (= {alias[0]})" if alias else "e", *new]
    a8.global_ = global_dependence(names, [x_star, *[x_best[k] for k in new]],
                                   [converged, *[conv[k] for k in new]],
                                   tol=max(THRESHOLDS["e_distance_max"], 100 * o.tol))
    # local (A.8): ‖dx_T/de·u‖ at the largest T on every converged sample (the first one's from stage prop5's unroll)
    first, norms = at.first_converged, [None] * B
    if first is not None:
        sens = at.initial_iterate_tangent.sample(0)  # from stage prop5's unroll, or computed now
        a8.T, a8.dxT_de_norm, a8.sample = sens["T"], sens["norm"], first
        if first < K:
            norms[first] = sens["norm"][-1]
        rest = [b for b in converged.nonzero().flatten().tolist() if b != first]
        if rest:
            sel = torch.tensor(rest, device=e.device)
            more = initial_iterate_sensitivity_batched(at.f, e[sel], x0[sel], at.T_grid, seed=o.seed)
            for j, b in enumerate(rest):
                norms[b] = float(more.norm[j, -1])
    a8.local = local_dependence(norms, at.T_grid[-1], THRESHOLDS["e_local_max"])
    return a8


def stage_repelling(at: AtFixedPoint):
    """Repelling fixed points (ρ(J) > 1, App. A.1 case 2), which plain iteration cannot reach: roots of
    f(x, x0) − x by Broyden from x_best and ``repelling_starts`` perturbations of it, classified by ρ(J) at each
    distinct root (:mod:`stability.analysis.repelling`); stage ``rho``'s ρ is reused at x* itself."""
    from stability.analysis.repelling import search
    from stability.analysis.verdict import THRESHOLDS

    o, spec, K = at.options, at.jacobian_spectra, at.few  # the first K samples (a few on large states)
    return search(at.f, at.x_star[:K], at.x0[:K], starts=o.repelling_starts, scale=o.repelling_scale,
                  budget=o.repelling_budget, tol=o.tol, distinct_tol=max(THRESHOLDS["e_distance_max"], 100 * o.tol),
                  seed=o.seed, rho_at_best=None if spec is None else spec.rhos[:K], eig_tol=o.eig_tol,
                  eig_k=o.eig_k)


def stage_accuracy(at: AtFixedPoint):
    """Accuracy against the iteration count 1..T and at x* (Fig. 3), by the task's (or argmax) scoring. With the
    Picard solver the curve was scored during stage reachability's solve (the same iterates from e; its time is in
    that stage's)."""
    from stability.analysis.accuracy import accuracy_at, accuracy_vs_iteration

    if at.targets is None:
        return NotApplicable("no targets given")
    acc = at.accuracy_curve
    if acc is not None:
        acc.scored_in = "reachability"
    else:
        acc = accuracy_vs_iteration(at.model, at.score, at.x0, at.e, at.targets, at.options.iterations)
    acc.at_fixed_point = accuracy_at(at.model, at.score, at.x_star, at.targets)
    acc.at_fixed_point_converged = accuracy_at(at.model, at.score, at.x_star, at.targets, at.converged)
    return acc


def pick_geometry_samples(o, n: int, status: list, rho: list, fill) -> list:
    """The samples the geometry stage measures (``AnalysisOptions.geometry_pick``): the first
    ``geometry_count(n, N)`` samples whose x* attracts at θ* (converged, ρ(J*) < 1), in order, or the first sample
    where none does ("attracting"); the first ``geometry_count`` samples ("first"). ``rho`` holds ρ(J*) per sample
    (None where not measured), ``fill(samples)`` measures the missing ones in place, a chunk at a time."""
    N = len(status)
    k = o.geometry_count(n, N)
    if o.geometry_pick == "first":
        fill([b for b in range(k) if rho[b] is None])
        return list(range(k))
    candidates, picked = [b for b in range(N) if status[b] == "converged"], []
    for i in range(0, len(candidates), k):
        chunk = candidates[i:i + k]
        fill([b for b in chunk if rho[b] is None])
        picked += [b for b in chunk if rho[b] is not None and np.isfinite(rho[b]) and rho[b] < 1.0]
        if len(picked) >= k:
            break
    if not picked:
        fill([0] if rho[0] is None else [])
    return picked[:k] or [0]


def stage_geometry(at: AtFixedPoint):
    """Section 3.2's third axis: radii of stability along random directions in parameter space, their anisotropy
    (App. B.2), per parameter group, and (``geometry_plane``) the ρ(J*) picture over a plane, on the samples of
    :func:`pick_geometry_samples` (:mod:`stability.analysis.geometry`)."""
    from stability.analysis.geometry import measure

    o = at.options
    N = at.x_star.shape[0]
    rho = [None] * N if at.jacobian_spectra is None else list(at.jacobian_spectra.rhos)

    def fill(missing):  # ρ(J*) at θ* of samples stage rho did not measure, by its routine
        if not missing:
            return
        from stability.numerics import Linearisation, spectral_radius

        sel = torch.tensor(missing, device=at.x_star.device)
        got = spectral_radius(Linearisation(at.f, at.x_star[sel], at.x0[sel]), tol=o.eig_tol, k=o.eig_k,
                              seed=o.seed)
        for b, v in zip(missing, got.rho.tolist()):
            rho[b] = float(v)

    status = at.solution.status
    samples = pick_geometry_samples(o, int(at.x_star[0].numel()), list(status), rho, fill)
    attracting = [status[b] == "converged" and rho[b] is not None and np.isfinite(rho[b]) and rho[b] < 1.0
                  for b in range(N)]
    return measure(at.model, at.inputs, at.x_star, at.x0, attracting, rho, samples=samples,
                   directions=o.geometry_directions, accuracy=o.geometry_accuracy,
                   group_directions=o.geometry_group_directions, certify=o.geometry_certify,
                   plane=o.geometry_plane if o.geometry_directions >= 2 else 0, tol=o.tol, max_iter=o.max_iter,
                   eig_tol=o.eig_tol, eig_k=o.eig_k, seed=o.seed,
                   log=lambda m: at.log(f"{at.split}: {m}"))


#: the function of each stage (:data:`stability.analysis.options.STAGES`)
STAGE_FUNCTIONS = {"reachability": stage_reachability, "rho": stage_rho, "prop4": stage_prop4,
                   "rho_wx": stage_rho_wx, "prop5": stage_prop5, "input": stage_input, "a8": stage_a8,
                   "repelling": stage_repelling, "accuracy": stage_accuracy, "geometry": stage_geometry}
