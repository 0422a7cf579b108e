"""The analysis of one split of a checkpoint, end to end: x* by the solver, then every quantity at x*.

``analyze_split(model, task, split, options)`` returns one JSON-ready dict per split whose blocks are the
result objects of the rooms (solver → reachability, operators → spectra, recall, sensitivity, accuracy);
``stability analyze`` prints and writes them (``report.py``), nothing is recomputed there.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import torch

from stability.errors import StabilityError


@dataclass(frozen=True)
class AnalysisOptions:
    """What ``stability analyze`` exposes (samples, solver, tol, max_iter, iterations, device) and the numerical
    settings below it (fixed, reported in the JSON)."""

    samples: int = 32
    solver: str = "picard"
    tol: float = 1e-5
    max_iter: int = 500
    iterations: int = 500  # T_max of the accuracy curve
    device: str = "cpu"
    eig_k: int = 3
    eig_tol: float = 1e-6
    gmres_tol: float = 1e-10
    probes: int = 4
    prop4_columns: int = 256
    seed: int = 0
    eig_route: str = "arnoldi"  # ρ, σ_max: "arnoldi" (torch Krylov–Schur, batched) or "arpack" (scipy, per sample)
    eig_batch: Optional[int] = None  # samples per Arnoldi batch; None: 1 on the CPU, all on CUDA
    eig_precision: str = "mixed"  # ρ's products: "mixed" (float32, each result certified in float64) or "float64"

    def __post_init__(self):
        for name, allowed in (("eig_route", ("arnoldi", "arpack")), ("eig_precision", ("mixed", "float64")),
                              ("solver", ("picard", "anderson"))):
            if getattr(self, name) not in allowed:
                raise StabilityError(f"unknown {name} {getattr(self, name)!r}; allowed: {', '.join(allowed)}")

    def to_dict(self) -> dict:
        return asdict(self)


def analysis_model(model: torch.nn.Module, dtype: torch.dtype = torch.float64, device: Optional[str] = None):
    """A float64 (by default) copy of the model for analysis: eval mode, no parameter gradients."""
    m = copy.deepcopy(model).to(dtype=dtype)
    if device is not None:
        m = m.to(device)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def _median(values) -> Optional[float]:
    vals = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.median(vals)) if vals else None


def _initial_states(model, x0: torch.Tensor, seed: int) -> dict:
    """e ∈ {x0, zeros, noise} (Def. 3.1; App. A.8), noise with the model's noise_std and a fixed seed."""
    gen = torch.Generator().manual_seed(seed)
    std = float(getattr(model.config, "noise_std", 1.0))
    noise = torch.randn(x0.shape, generator=gen, dtype=torch.float64).to(x0) * std
    return {"x0": x0, "zeros": torch.zeros_like(x0), "noise": noise}


def analyze_split(model, task, split: str, options: AnalysisOptions, *, log=None) -> dict:
    """Every quantity of the analysis on the first ``options.samples`` samples of ``split``, in task order.

    ``model`` must be the analysis copy (:func:`analysis_model`). Returns the per-split JSON block.
    """
    from stability.analysis.accuracy import accuracy_at, accuracy_vs_iteration
    from stability.analysis.operators import BatchedJacobian, JacobianOperator
    from stability.analysis.reachability import reachability
    from stability.analysis.recall import prop4, rho_W_x
    from stability.analysis.sensitivity import (KrylovError, default_T_grid, fixed_point_distance,
                                                initial_iterate_sensitivity, input_dependence_frobenius,
                                                prop5_check)
    from stability.analysis.spectra import batched_sigma_max, jacobian_spectral_radius, sigma_max, spectral_radius
    from stability.solvers import solve

    say = log or (lambda msg: None)
    timings: dict = {}
    dtype = next(model.parameters()).dtype
    dev = next(model.parameters()).device
    inputs, targets = task.dataset(split)
    N = min(options.samples, inputs.shape[0])
    inputs, targets = inputs[:N].to(dev, dtype), targets[:N].to(dev)
    with torch.no_grad():
        x0 = model.embed(inputs)
        e = model.initial_state(x0, generator=torch.Generator(device=dev).manual_seed(options.seed))
    f = model.step
    out: dict = {"split": split, "samples": N, "state_shape": list(x0.shape[1:])}

    # ---- x*: the fixed point (reachability) --------------------------------------------------------
    t = time.perf_counter()
    result = solve(f, e, x0, method=options.solver, tol=options.tol, max_iter=options.max_iter)
    timings["solve"] = time.perf_counter() - t
    reach = reachability(result)
    conv = result.converged
    x_star = result.x_best
    fp = reach.to_dict()
    fp.update({"solver": options.solver, "tol": options.tol, "max_iter": options.max_iter,
               "residual_trace": [[None if not np.isfinite(v) else float(v) for v in row]
                                  for row in result.residuals.tolist()]})
    out["fixed_point"] = fp
    say(f"{split}: {int(conv.sum())}/{N} converged ({options.solver}, τ={options.tol:g})")

    # ---- J at x*: spectral radius, leading eigenvalues, σ_max ---------------------------------------
    t = time.perf_counter()
    rhos, sigmas, eigs, conv_flags = [], [], [], []
    if options.eig_route == "arnoldi":
        chunk = options.eig_batch or (N if dev.type == "cuda" else 1)
        mixed = options.eig_precision == "mixed" and dtype == torch.float64
        fast_model = copy.deepcopy(model).float() if mixed else None
        for i in range(0, N, chunk):
            xs, xb = x_star[i:i + chunk], x0[i:i + chunk]
            bj = BatchedJacobian(f, xs, xb)
            spec = jacobian_spectral_radius(f, xs, xb, fast_f=fast_model.step if mixed else None, k=options.eig_k,
                                            tol=options.eig_tol, seed=options.seed)
            sig = batched_sigma_max(bj.apply_reuse, bj.rapply, tuple(xs.shape), dtype=dtype, device=dev,
                                    tol=options.eig_tol, seed=options.seed)
            rhos += spec.rho.cpu().tolist()
            sigmas += sig.cpu().tolist()
            eigs += [[[float(z.real), float(z.imag)] for z in row] for row in spec.eigenvalues.cpu()]
            conv_flags += (spec.ritz_residual < options.eig_tol).cpu().tolist()
        method = (f"Krylov–Schur on Jᵀ (torch, {chunk} sample(s) per batch; "
                  + ("float32 products, each leading Ritz pair certified by float64 products)" if mixed
                     else "float64 products)"))
    elif options.eig_route == "arpack":
        for b in range(N):
            op = JacobianOperator(f, x_star[b], x0[b], mode="vjp")
            s = spectral_radius(op, k=options.eig_k, tol=options.eig_tol, transpose=True)
            rhos.append(s.rho)
            eigs.append(s.to_dict()["eigenvalues"])
            conv_flags.append(s.converged)
            sigmas.append(sigma_max(op, tol=options.eig_tol))
        method = "ARPACK (scipy eigs on Jᵀ, reused vjp)"
    cmask = conv.tolist()
    out["jacobian"] = {
        "evaluated_at": "x_best: the fixed point where status is converged, else the lowest-residual iterate",
        "method": method,
        "spectral_radius": rhos,
        "spectral_radius_median": _median([r for r, c in zip(rhos, cmask) if c]),
        "spectral_radius_median_all": _median(rhos),
        "sigma_max": sigmas,
        "sigma_max_median": _median([s for s, c in zip(sigmas, cmask) if c]),
        "eigenvalues": eigs,
        "eigen_converged": conv_flags,
    }
    timings["jacobian"] = time.perf_counter() - t

    # ---- Prop. 4 / App. A.7 and ρ(W_x) -------------------------------------------------------------
    t = time.perf_counter()
    p4 = prop4(model, x_star, x0, columns=options.prop4_columns, k=options.eig_k, tol=options.eig_tol)
    out["prop4"] = None if p4 is None else p4.to_dict()
    w = rho_W_x(model)
    out["recall"] = None if w is None else {"rho_Wx": w.rho, "eigenvalues": w.to_dict()["eigenvalues"]}
    timings["prop4"] = time.perf_counter() - t

    # ---- Prop. 5 and input-dependence --------------------------------------------------------------
    t = time.perf_counter()
    first = int(conv.nonzero()[0]) if bool(conv.any()) else None
    e_is_x0 = getattr(model.config, "initial_state", "x0") == "x0"
    if first is None:
        out["prop5"] = {"T": [], "rel_error": [], "gmres_residual": None, "sample": None,
                        "skipped": "no sample converged: Prop. 5 needs a fixed point"}
    else:
        # polish x* of that sample by further Picard steps, so that the error floor is set by GMRES and the
        # unrolled T, not by the solver's τ
        polish = solve(f, x_star[first:first + 1], x0[first:first + 1], tol=1e-13, max_iter=options.max_iter,
                       max_period=0)
        try:
            chk = prop5_check(f, polish.x_best[0], x0[first], e[first], default_T_grid(options.max_iter),
                              e_tangent=None, tol=options.gmres_tol, seed=options.seed)
            out["prop5"] = {**chk.to_dict(), "sample": first,
                            "x_star_residual": float(polish.best_residual[0])}
        except KrylovError as exc:
            out["prop5"] = {"T": [], "rel_error": [], "gmres_residual": None, "sample": first, "skipped": str(exc)}
    out["prop5"]["note"] = "dx_T/dx0 unrolled from e held fixed, as Prop. 5 states it (by A.8 the limit is the same)"
    frob: list = []
    for b in range(N):
        if not cmask[b]:
            frob.append(None)
            continue
        try:
            frob.append(input_dependence_frobenius(f, x_star[b], x0[b], probes=options.probes,
                                                   tol=max(options.gmres_tol, 1e-8), seed=options.seed).value)
        except KrylovError:
            frob.append(None)
    out["input_dependence"] = {"frobenius": frob, "frobenius_median": _median(frob), "probes": options.probes,
                               "quantity": "‖dx*/dx0‖_F (Hutchinson estimate, Prop. 5)"}
    timings["prop5"] = time.perf_counter() - t

    # ---- App. A.8: independence of the initial iterate ---------------------------------------------
    t = time.perf_counter()
    starts = _initial_states(model, x0, options.seed)
    solved = {}
    for name, e_start in starts.items():
        r = result if (name == "x0" and e_is_x0) else solve(f, e_start, x0, method=options.solver, tol=options.tol,
                                                            max_iter=options.max_iter)
        solved[name] = r
    all_conv = torch.stack([r.converged for r in solved.values()]).all(0)
    dist = fixed_point_distance([r.x_best for r in solved.values()])
    dist_list = [float(d) if bool(c) else None for d, c in zip(dist, all_conv)]
    a8 = {"starts": list(starts), "fixed_point_distance": dist_list,
          "fixed_point_distance_max": max([d for d in dist_list if d is not None], default=None),
          "converged_fraction": {k: float(r.converged.double().mean()) for k, r in solved.items()}}
    if first is not None:
        sens = initial_iterate_sensitivity(f, e[first], x0[first], default_T_grid(options.max_iter), seed=options.seed)
        a8.update({"T": sens["T"], "dxT_de_norm": sens["norm"], "sample": first})
    out["initial_iterate"] = a8
    timings["initial_iterate"] = time.perf_counter() - t

    # ---- accuracy against iteration and at x* -------------------------------------------------------
    t = time.perf_counter()
    acc = accuracy_vs_iteration(model, task, x0, e, targets, options.iterations)
    acc.at_fixed_point = accuracy_at(model, task, x_star, targets)
    acc.at_fixed_point_converged = accuracy_at(model, task, x_star, targets, conv)
    out["accuracy"] = acc.to_dict()
    timings["accuracy"] = time.perf_counter() - t
    out["timings_s"] = timings
    return out


def analyze_checkpoint(path, *, splits=("val", "hard"), options: AnalysisOptions = AnalysisOptions(), log=None,
                       release_config=None) -> dict:
    """Load a checkpoint and analyse each split; the top level of the returned dict holds ``checkpoint``,
    ``config``, ``options``, ``splits`` (their names) and one block per split under its name."""
    import stability

    if options.device == "cuda" and not torch.cuda.is_available():
        raise StabilityError("--device cuda: no CUDA device is available on this machine")
    loaded = stability.load(path, device=options.device, release_config=release_config)
    if not hasattr(loaded.model, "step"):
        raise StabilityError(f"{path}: a fixed-depth baseline has no loop map, so it has no fixed points to analyse")
    model = analysis_model(loaded.model, torch.float64, options.device)
    report = {"checkpoint": str(path), "config": loaded.config.to_dict(), "options": options.to_dict(),
              "epoch": loaded.epoch, "splits": list(splits)}
    for split in splits:
        report[split] = analyze_split(model, loaded.task, split, options, log=log)
    return report
