"""The stability monitor's measurement: the paper's axes of stability, measured cheaply on a small probe.

The paper tracks only ρ(W_x) during training (App. B.3). :func:`measure` returns, and the trainer's callback
:class:`stability.train.monitor.StabilityMonitor` adds every ``every`` epochs to the epoch record,

    record["monitor"] = {rho_Wx, rho_J_median, converged_fraction, input_grad_norm_median, ...}

computed on a fixed probe (the first ``samples`` validation samples):

* ``rho_Wx`` — ρ(W_x), the recall matrix's spectral radius (App. B.3; None without recall);
* ``converged_fraction`` — the share of the probe whose Picard iteration from e reaches a fixed point
  (reachability, Def. 3.3): the analysis' :class:`~stability.analysis.fixed_point.FixedPoint` (x0, e seeded by
  ``seed``, the solve) with the monitor's cheap solve (:data:`SOLVE`, :data:`stability.solvers.MONITOR`: Picard to
  τ = 1e-4 within 200 evaluations; the analysis' own: τ = 1e-5 within 500);
* ``rho_J_median`` — the median over the converged probe samples of ρ(J*), J* = ∂f/∂x at (x*, x0): x* attracts
  iff ρ(J*) < 1 (Props. 3–4), by the analysis' :func:`stability.numerics.spectra.spectral_radius` with the
  monitor's preset (:data:`RHO_PRESET`: at :data:`POINT` x_last, the Picard solve's last image, route ``krylov``
  on forward-mode products J v, a basis of ``krylov`` vectors, ``restarts`` restarts, Ritz residual 1e-4; the
  analysis takes x_best and the transposed products to 1e-6);
* ``input_grad_norm_median`` — the median of ‖dx*/dx0‖_F (Prop. 5, the input-dependence axis), by Hutchinson's
  estimator E‖(dx*/dx0) u‖² = ‖dx*/dx0‖_F² over ``probes`` Gaussian directions u. Each w = (dx*/dx0) u solves
  (I − J*) w = (∂f/∂x0) u; the monitor solves it for the whole probe at once by the Neumann series of
  :func:`stability.numerics.gmres.solve_I_minus_J` (through :func:`stability.analysis.prop5.implicit_input_jvp_batched`,
  one batched product with J per iteration, to a relative residual of 1e-3 within 100 products; it converges exactly
  when ρ(J*) < 1, the attracting case, and samples that do not are left out of the median). The analysis solves
  the same system by GMRES to a tight tolerance.

Everything runs in the model's own precision (float32 while training) under ``torch.no_grad`` (forward-mode
products only), on the model's math attention path, in eval mode; the model's mode and attention path are restored afterwards and no global RNG is
touched, so a monitored run trains bit-for-bit as an unmonitored one and stays resumable. Medians are
:func:`stability.stats.median`, as in the analysis report. This module never imports :mod:`stability.train`.
"""

from __future__ import annotations

import time
from typing import Optional

import torch

from stability.analysis.fixed_point import FixedPoint
from stability.analysis.prop5 import implicit_input_jvp_batched
from stability.analysis.recall import rho_W_x
from stability.errors import ConfigError
from stability.numerics import Linearisation, exact, spectral_radius
from stability.protocols import is_looped
from stability.solvers import MONITOR
from stability.stats import median

MONITOR_KEYS = ("rho_Wx", "rho_J_median", "converged_fraction", "input_grad_norm_median")
#: the monitor's cheap preset, beside the analysis': its solve (τ and budget set by :func:`measure`'s arguments) ...
SOLVE = MONITOR
#: ... the point ρ(J*) and ‖dx*/dx0‖_F are measured at (the analysis: ``x_best``) ...
POINT = "x_last"
#: ... and how it calls :func:`stability.numerics.spectra.spectral_radius` (besides its ``krylov``, ``restarts`` and
#: ``seed``): forward-mode products under ``torch.no_grad``, finished samples riding along as zero vectors
RHO_PRESET = {"route": "krylov", "product": "forward", "shrink": False, "tol": 1e-4}


def measure(model, inputs: torch.Tensor, *, max_iter: int = 200, tol: float = 1e-4, krylov: int = 20,
            restarts: int = 2, probes: int = 2, seed: int = 0) -> dict:
    """The monitor's quantities for ``model`` on ``inputs`` (JSON-ready; ``seconds`` included).

    ``model`` needs only ``embed(inputs) -> x0`` and ``step(x, x0)`` (``initial_state`` and a recall weight ``W_x``
    are used when present). ``max_iter`` / ``tol``: the Picard solve for x* (Def. 3.3's reachability, FPRM's
    residual criterion). ``krylov`` / ``restarts``: the batched Krylov–Schur iteration for ρ(J*). ``probes``: Hutchinson
    directions for ‖dx*/dx0‖_F. The model's mode and attention path are restored afterwards.
    """
    if not is_looped(model):
        raise ConfigError("a fixed-depth baseline has no loop map: nothing to monitor")
    t0 = time.perf_counter()
    was_training = model.training
    impl = getattr(model, "attention_impl", None)
    model.eval()
    if impl is not None:
        model.attention_impl = "math"  # forward-mode AD needs the math attention path
    try:
        param = next(iter(model.parameters()), None)
        dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
        with torch.no_grad():  # forward-mode products only: no autograd graph on the parameters
            out = _measure(model, inputs.to(dtype), max_iter=max_iter, tol=tol, krylov=krylov, restarts=restarts,
                           probes=probes, seed=seed)
    finally:
        if impl is not None:
            model.attention_impl = impl
        model.train(was_training)
    out["seconds"] = time.perf_counter() - t0
    return out


def input_gradient_norms(f, x_star: torch.Tensor, x0: torch.Tensor, *, probes: int = 2, seed: int = 0,
                         tol: float = 1e-3, max_iter: int = 100) -> tuple[torch.Tensor, torch.Tensor]:
    """Hutchinson's estimate of ‖dx*/dx0‖_F per sample (Prop. 5): the root of the mean over ``probes`` Gaussian
    directions u of ‖(dx*/dx0) u‖², each (dx*/dx0) u = (I − J*)⁻¹ (∂f/∂x0) u by the batched Neumann series of
    :func:`stability.numerics.gmres.solve_I_minus_J` to relative residual ``tol`` within ``max_iter`` products.
    Returns the (B,) norms (float64) and a (B,) bool of the samples whose every solve met ``tol``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    sq = torch.zeros(x_star.shape[0], dtype=torch.float64, device=x_star.device)
    ok = torch.ones(x_star.shape[0], dtype=torch.bool, device=x_star.device)
    for _ in range(probes):
        u = torch.randn(x0.shape, generator=g, dtype=torch.float64).to(x0)
        sol = implicit_input_jvp_batched(f, x_star, x0, u, tol=tol, max_iter=max_iter, method="neumann")
        sq += sol.x.flatten(1).double().pow(2).sum(1)
        ok &= (sol.residual <= tol).to(ok.device)
    return exact.sqrt(sq / probes), ok


def _measure(model, inputs: torch.Tensor, *, max_iter, tol, krylov, restarts, probes, seed) -> dict:
    spec = rho_W_x(model) if getattr(model, "W_x", None) is not None else None
    # x0, e (its noise from a CPU generator seeded by ``seed``) and the solve, as the analysis builds them
    fp = FixedPoint.of(model, inputs, generator=torch.Generator(device="cpu").manual_seed(seed))
    result = fp.solve(SOLVE.replace(tol=tol, max_iter=max_iter))
    x0 = fp.x0
    conv = result.converged.to(x0.device)
    out = {
        "rho_Wx": None if spec is None else float(spec.rho[0]),
        "rho_J_median": None,
        "converged_fraction": float(conv.float().mean()),
        "input_grad_norm_median": None,
        "samples": int(inputs.shape[0]),
        "nfe_median": median(result.nfe.tolist()),
        "rho_J_max": None,
        "input_grad_converged": 0,
    }
    if not bool(conv.any()):
        return out
    xs, X0 = getattr(result, POINT)[conv].detach(), x0[conv].detach()
    rho = spectral_radius(Linearisation(model.step, xs, X0), krylov=krylov, restarts=restarts, seed=seed,
                          **RHO_PRESET).rho
    out["rho_J_median"] = median(rho.tolist())
    out["rho_J_max"] = float(rho.max())
    norms, ok = input_gradient_norms(model.step, xs, X0, probes=probes, seed=seed + 1, tol=1e-3,
                                     max_iter=min(max_iter, 100))
    out["input_grad_norm_median"] = median(norms[ok].tolist())
    out["input_grad_converged"] = int(ok.sum())
    return out


def monitor_history(history: list) -> list[dict]:
    """The epochs of a checkpoint's history that carry a monitor record: [{epoch, **monitor}, ...]."""
    return [{"epoch": int(r["epoch"]), **r["monitor"]} for r in history if isinstance(r, dict) and r.get("monitor")]
