"""A training-time stability monitor: the paper's axes of stability, measured cheaply while a model trains.

The paper tracks only ρ(W_x) during training (App. B.3). Every ``every`` epochs, :class:`StabilityMonitor` adds
to the trainer's epoch record

    record["monitor"] = {rho_Wx, rho_J_median, converged_fraction, input_grad_norm_median, ...}

computed on a fixed probe (the first ``samples`` validation samples):

* ``rho_Wx`` — ρ(W_x), the recall matrix's spectral radius (App. B.3; None without recall);
* ``converged_fraction`` — the share of the probe whose Picard iteration from e reaches a fixed point
  (reachability, Def. 3.3), by :func:`stability.solvers.solve`;
* ``rho_J_median`` — the median over the converged probe samples of ρ(J*), J* = ∂f/∂x at (x*, x0): x* attracts
  iff ρ(J*) < 1 (Props. 3–4), by the batched Arnoldi iteration of :mod:`stability.analysis.spectra`;
* ``input_grad_norm_median`` — the median of ‖dx*/dx0‖_F (Prop. 5, the input-dependence axis), by Hutchinson's
  estimator E‖(dx*/dx0) u‖² = ‖dx*/dx0‖_F² over ``probes`` Gaussian directions u. Each w = (dx*/dx0) u solves
  (I − J*) w = (∂f/∂x0) u; the monitor solves it for the whole probe at once by the Neumann iteration
  w ← J* w + (∂f/∂x0) u (one batched jvp of f per iteration, to a relative change of 1e-3 within 100 iterations; it
  converges exactly when ρ(J*) < 1, the attracting case, and samples that do not are left out of the median). :func:`stability.analysis.sensitivity.input_dependence_frobenius` does the same per sample with GMRES on
  the CPU; the batched iteration here is a local helper (:func:`implicit_input_jvp_batched`) so that the monitor
  stays cheap on a GPU, where the per-sample scipy route would move every vector between devices.

Everything runs in the model's own precision (float32 while training) under ``torch.no_grad`` (forward-mode
products only), on the model's math attention path, in eval mode; the model's mode and attention path are restored afterwards and no global RNG is
touched, so a monitored run trains bit-for-bit as an unmonitored one and stays resumable.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Optional

import torch

MONITOR_KEYS = ("rho_Wx", "rho_J_median", "converged_fraction", "input_grad_norm_median")


def implicit_input_jvp_batched(f: Callable, x_star: torch.Tensor, x0: torch.Tensor, u: torch.Tensor, *,
                               tol: float = 1e-4, max_iter: int = 200) -> tuple[torch.Tensor, torch.Tensor]:
    """Prop. 5 for a batch: w_b = (I − J_b)⁻¹ (∂f/∂x0)_b u_b by the Neumann iteration w ← J w + (∂f/∂x0) u.

    One ``torch.func.jvp`` of f in both arguments, at (x*, x0) with tangents (w, u), gives J w + (∂f/∂x0) u for
    every sample at once. Starts from w = (∂f/∂x0) u and iterates until every sample's step ‖Δw‖ ≤ tol·‖w‖, or
    ``max_iter`` (the iteration converges iff ρ(J_b) < 1). Returns w (B, *S) and a (B,) bool of the samples whose
    last step met the tolerance.
    """
    xs, X0, U = x_star.detach(), x0.detach(), u.detach().to(x0.dtype)

    def image(w: torch.Tensor) -> torch.Tensor:
        return torch.func.jvp(f, (xs, X0), (w, U))[1]

    w = torch.func.jvp(lambda a: f(xs, a), (X0,), (U,))[1]
    B = w.shape[0]
    done = torch.zeros(B, dtype=torch.bool, device=w.device)
    for _ in range(max_iter):
        w_new = image(w)
        delta = (w_new - w).flatten(1).norm(dim=1)
        scale = w_new.flatten(1).norm(dim=1)
        finite = torch.isfinite(w_new.flatten(1)).all(1)
        w = torch.where(finite.view(-1, *[1] * (w.dim() - 1)), w_new, w)
        done = finite & (delta <= tol * scale.clamp_min(1e-30))
        if bool(done.all()):
            break
    return w, done


def _median(values: list) -> Optional[float]:
    """The median of the finite values (the mean of the middle two for an even count, as numpy); None if none."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(vals) if vals else None


class StabilityMonitor:
    """Trainer callback ``(model, task, record) -> None``: every ``every`` epochs, adds ``record["monitor"]``.

    ``task``: the run's task (its first ``samples`` val samples are the fixed probe). ``device``: where the model
    lives. ``max_iter`` / ``tol``: the Picard solve for x* (Def. 3.3's reachability, FPRM's residual criterion).
    ``krylov`` / ``restarts``: the batched Arnoldi iteration for ρ(J*). ``probes``: Hutchinson directions for
    ‖dx*/dx0‖_F. The monitor can also be called directly on any looped model: :meth:`measure` needs only
    ``embed(inputs) -> x0`` and ``step(x, x0)`` (``initial_state`` and a recall weight ``W_x`` are used when present),
    so a model that is not ours works too (``task`` may then be None and ``inputs`` given).
    """

    def __init__(self, task, every: int = 1, samples: int = 16, device="cpu", *, max_iter: int = 200,
                 tol: float = 1e-4, krylov: int = 20, restarts: int = 2, probes: int = 2, seed: int = 0):
        if every < 1:
            raise ValueError("every must be at least 1")
        self.task, self.every, self.samples = task, int(every), int(samples)
        self.device = torch.device(device)
        self.max_iter, self.tol, self.krylov, self.restarts = max_iter, tol, krylov, restarts
        self.probes, self.seed = probes, seed
        self._probe: Optional[torch.Tensor] = None

    # ---- the trainer's hook ----------------------------------------------------------------------
    def __call__(self, model, task, record: dict) -> None:
        epoch = int(record.get("epoch", 0))
        if epoch % self.every:
            return
        record["monitor"] = self.measure(model)

    def probe(self) -> torch.Tensor:
        """The fixed probe: the first ``samples`` val inputs (the same at every epoch)."""
        if self._probe is None:
            inputs, _ = self.task.dataset("val")
            self._probe = inputs[: self.samples].to(self.device)
        return self._probe

    # ---- the measurement ---------------------------------------------------------------------------
    def measure(self, model, inputs: Optional[torch.Tensor] = None) -> dict:
        """The monitor's quantities for ``model`` on ``inputs`` (default: the probe). JSON-ready."""
        from stability.protocols import is_looped

        if not is_looped(model):
            raise ValueError("a fixed-depth baseline has no loop map: nothing to monitor")
        t0 = time.perf_counter()
        inputs = self.probe() if inputs is None else inputs.to(self.device)
        was_training = model.training
        impl = getattr(model, "attention_impl", None)
        model.eval()
        if impl is not None:
            model.attention_impl = "math"  # forward-mode AD needs the math attention path
        try:
            param = next(iter(model.parameters()), None)
            dtype = param.dtype if param is not None and param.is_floating_point() else torch.float32
            with torch.no_grad():  # forward-mode products only: no autograd graph on the parameters
                out = self._measure(model, inputs.to(dtype))
        finally:
            if impl is not None:
                model.attention_impl = impl
            model.train(was_training)
        out["seconds"] = time.perf_counter() - t0
        return out

    def _measure(self, model, inputs: torch.Tensor) -> dict:
        from stability.analysis.operators import BatchedJacobian
        from stability.analysis.recall import rho_W_x
        from stability.analysis.spectra import batched_spectral_radius
        from stability.solvers import solve

        spec = rho_W_x(model) if getattr(model, "W_x", None) is not None else None
        x0 = model.embed(inputs)
        kind = getattr(getattr(model, "config", None), "initial_state", "x0")
        if not hasattr(model, "initial_state"):
            e = x0  # a model of one's own without initial_state: e = x0, as the paper's release
        elif kind == "noise":
            e = model.initial_state(x0, generator=torch.Generator(device="cpu").manual_seed(self.seed))
        else:
            e = model.initial_state(x0)
        result = solve(model.step, e, x0, method="picard", tol=self.tol, max_iter=self.max_iter)
        conv = result.converged.to(x0.device)
        out = {
            "rho_Wx": None if spec is None else float(spec.rho),
            "rho_J_median": None,
            "converged_fraction": float(conv.float().mean()),
            "input_grad_norm_median": None,
            "samples": int(inputs.shape[0]),
            "nfe_median": float(result.nfe.double().median()),
            "rho_J_max": None,
            "input_grad_converged": 0,
        }
        if not bool(conv.any()):
            return out
        xs, X0 = result.x_last[conv].detach(), x0[conv].detach()
        jac = BatchedJacobian(model.step, xs, X0)
        rho = batched_spectral_radius(jac.apply, tuple(xs.shape), dtype=xs.dtype, device=xs.device,
                                      krylov=self.krylov, restarts=self.restarts, tol=1e-4, seed=self.seed).rho
        out["rho_J_median"] = _median(rho.tolist())
        out["rho_J_max"] = float(rho.max())
        # ‖dx*/dx0‖_F by Hutchinson: mean over probes of ‖(dx*/dx0) u‖², u ~ N(0, I)
        g = torch.Generator(device="cpu").manual_seed(self.seed + 1)
        sq = torch.zeros(xs.shape[0], dtype=torch.float64, device=xs.device)
        ok = torch.ones(xs.shape[0], dtype=torch.bool, device=xs.device)
        for _ in range(self.probes):
            u = torch.randn(X0.shape, generator=g, dtype=torch.float64).to(X0)
            w, done = implicit_input_jvp_batched(model.step, xs, X0, u, tol=1e-3, max_iter=min(self.max_iter, 100))
            sq += w.flatten(1).double().pow(2).sum(1)
            ok &= done
        norms = (sq / self.probes).sqrt()
        out["input_grad_norm_median"] = _median(norms[ok].tolist())
        out["input_grad_converged"] = int(ok.sum())
        return out


def monitor_history(history: list) -> list[dict]:
    """The epochs of a checkpoint's history that carry a monitor record: [{epoch, **monitor}, ...]."""
    return [{"epoch": int(r["epoch"]), **r["monitor"]} for r in history if isinstance(r, dict) and r.get("monitor")]
