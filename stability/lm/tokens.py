"""Per-token statistics of a language model's loop (docs/language-models.md, "Per-token numbers").

The solver judges a whole sequence: one slow token keeps it unconverged, and a pad position counts like a real one.
Here every number is per token t of a state (B, T, C), on its dynamic channels ``x[:, t, :D]``
(``model.dynamic_channels``; the rest of a token's state is a constant tail, :mod:`stability.lm.adapter`), and pad
tokens (``model.token_mask(x0)`` False) are left out (NaN, status ``"pad"``):

* :func:`token_residuals`: r_t(x) = ‖f(x)_t − x_t‖∞ / (‖f(x)_t‖∞ + ε), the solver's residual per token;
* :func:`token_convergence`: Picard from e: r_t at every iterate, the steps each token needs to reach τ, and each
  token's status (converged, periodic, stalled, max-iterations, non-finite);
* :func:`token_spectra`: ρ of each diagonal block ∂f_t/∂x_t of J* and the bottleneck token. With causal attention
  token t's update reads only tokens s ≤ t, so J* is block lower-triangular in token order and its eigenvalues are
  those of the diagonal blocks: ρ(J*) = max_t ρ(∂f_t/∂x_t), exactly, at T blocks of D × D instead of one
  eigenproblem of (T·D)². The blocks come from T·D forward-mode products, which also give every block above the
  diagonal: ``acausal`` is their largest entry, 0 for a causal map (checked, not assumed). Matrix-free, the
  blocks are applied by one forward-mode product per Krylov step where the model has a one-pass context
  (:mod:`stability.lm.diagonal`, checked against the T per-position products).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from stability.numerics import spectral_radius
from stability.numerics.eigen import krylov_schur

#: the statuses of a token (as the solver's, per token; "pad" for a pad position)
TOKEN_STATUSES = ("converged", "periodic", "stalled", "max-iterations", "non-finite", "pad")


def _dims(model, x: torch.Tensor) -> int:
    return int(getattr(model, "dynamic_channels", x.shape[-1]))


def _mask(model, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    fn = getattr(model, "token_mask", None)
    return fn(x0) if fn is not None else torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)


def token_residuals(fx: torch.Tensor, x: torch.Tensor, D: Optional[int] = None, eps: float = 1e-8) -> torch.Tensor:
    """(B, T): ‖f(x)_t − x_t‖∞ / (‖f(x)_t‖∞ + ε) over the first ``D`` channels of each token (all by default)."""
    D = x.shape[-1] if D is None else D
    a, b = fx[..., :D], x[..., :D]
    return (a - b).abs().amax(-1) / (a.abs().amax(-1) + eps)


@dataclass
class TokenConvergence:
    """Picard iteration from e, per token: ``residuals`` (B, T, N) r_t(x_k) for k = 0..N−1 (x_0 = e, NaN at pads),
    ``steps`` (B, T) the first k with r_t(x_k) < τ (−1: never; the passes after e the token needs), ``status``
    per sample and token (:data:`TOKEN_STATUSES`), ``period`` (B, T) k ≥ 2 where a period-k orbit was found,
    ``mask`` (B, T) the real tokens."""

    residuals: torch.Tensor
    steps: torch.Tensor
    status: list
    period: torch.Tensor
    mask: torch.Tensor
    tol: float

    def converged(self) -> torch.Tensor:
        """(B, T) bool: the token reached τ (pads: False)."""
        return (self.steps >= 0) & self.mask

    def sequence_converged(self) -> torch.Tensor:
        """(B,) bool: every real token of the sequence reached τ (the sequence-level verdict, pads excluded)."""
        return (self.converged() | ~self.mask).all(dim=1)

    def slowest(self) -> torch.Tensor:
        """(B,) the slowest real token: of those that never reach τ, the one with the largest last residual;
        where all reach it, the one with the most steps."""
        last = torch.nan_to_num(self.residuals[..., -1].double(), nan=float("inf"))
        never = (self.steps < 0) & self.mask
        key = torch.where(never, 2.0 + last.clamp(max=1e300) / (1.0 + last.clamp(max=1e300)),
                          self.steps.double() / (1.0 + self.steps.double().amax()))
        return torch.where(self.mask, key, torch.full_like(key, -1.0)).argmax(dim=1)

    def to_dict(self) -> dict:
        counts = {s: sum(row.count(s) for row in self.status) for s in TOKEN_STATUSES}
        final = self.residuals[..., -1]
        return {"tol": self.tol, "iterations": int(self.residuals.shape[-1]),
                "tokens": int(self.mask.sum()), "status_counts": counts,
                "converged_tokens": float(self.converged().sum() / self.mask.sum().clamp_min(1)),
                "converged_sequences": float(self.sequence_converged().double().mean()),
                "steps": [[int(s) if m else None for s, m in zip(r, mr)]
                          for r, mr in zip(self.steps.tolist(), self.mask.tolist())],
                "status": self.status, "slowest_token": self.slowest().tolist(),
                "final_residual": [[_num(v) for v in row] for row in final.tolist()]}


def _num(v: float):
    return None if v != v else float(v)


def _status(steps, best_early, best_late, finite, period, real) -> str:
    if not real:
        return "pad"
    if not finite:
        return "non-finite"
    if steps >= 0:
        return "converged"
    if period >= 2:
        return "periodic"
    return "stalled" if best_late >= 0.99 * best_early else "max-iterations"


@torch.no_grad()
def token_convergence(model, x0: torch.Tensor, e: torch.Tensor, *, max_iter: int = 200, tol: float = 1e-5,
                      patience: int = 20, max_period: int = 4) -> TokenConvergence:
    """Picard x_{k+1} = step(x_k, x0) from e for ``max_iter`` steps with every token's residual at every iterate
    (:class:`TokenConvergence`). A token is *stalled* when its best residual of the last ``patience`` iterates is
    not 1 % below its best before; *periodic* when, unconverged, its last iterate equals the one k ≤ ``max_period``
    steps before to τ."""
    D, mask = _dims(model, e), _mask(model, x0, e)
    x, res, recent = e, [], []
    for _ in range(max_iter):
        fx = model.step(x, x0)
        res.append(token_residuals(fx, x, D))
        recent = (recent + [x[..., :D]])[-(max_period + 1):]
        x = fx
    R = torch.stack(res, dim=-1).double()
    R = torch.where(mask.unsqueeze(-1), R, torch.full_like(R, float("nan")))
    below = R < tol
    steps = torch.where(below.any(-1), below.double().argmax(-1).long(), torch.full(mask.shape, -1, dtype=torch.long,
                                                                                       device=R.device))
    period = _periods(x[..., :D], recent, tol, max_period)
    finite = torch.isfinite(R[..., -1]) & torch.isfinite(x[..., :D]).all(-1)
    p = min(patience, max_iter - 1) if max_iter > 1 else 0
    early = torch.nan_to_num(R[..., :max_iter - p], nan=float("inf")).amin(-1)
    late = torch.nan_to_num(R[..., max_iter - p:], nan=float("inf")).amin(-1) if p else early
    status = [[_status(int(s), float(a), float(b), bool(f), int(k), bool(m))
               for s, a, b, f, k, m in zip(*rows)]
              for rows in zip(steps.tolist(), early.tolist(), late.tolist(), finite.tolist(), period.tolist(),
                              mask.tolist())]
    return TokenConvergence(residuals=R.cpu(), steps=steps.cpu(), status=status, period=period.cpu(),
                            mask=mask.cpu(), tol=tol)


def _periods(last: torch.Tensor, recent: list, tol: float, max_period: int) -> torch.Tensor:
    """(B, T): the smallest k in 2..max_period with ‖x_N,t − x_{N−k},t‖∞ < τ·‖x_N,t‖∞ (0: none)."""
    out = torch.zeros(last.shape[:2], dtype=torch.long, device=last.device)
    scale = last.abs().amax(-1).clamp_min(1e-30)
    for k in range(max_period, 1, -1):  # smallest k last, so it wins
        if k <= len(recent):
            close = (last - recent[-k]).abs().amax(-1) < tol * scale
            out = torch.where(close, torch.full_like(out, k), out)
    return out


def token_blocks(f, x: torch.Tensor, x0: torch.Tensor, D: int, *, chunk: int = 64) -> tuple:
    """(blocks (B, T, D, D) with blocks[b, t] = ∂f_t/∂x_t over the first D channels, acausal (B,) the largest
    |∂f_s/∂x_t| for s < t) by T·D forward-mode products (vmapped ``chunk`` at a time; one at a time where vmap
    cannot batch the map)."""
    B, T, C = x.shape
    blocks = torch.zeros(B, T, D, D, dtype=x.dtype, device=x.device)
    acausal = torch.zeros(B, dtype=x.dtype, device=x.device)

    def jvp(v):
        return torch.func.jvp(lambda p: f(p, x0), (x,), (v,))[1]

    batched = torch.func.vmap(jvp)
    for t in range(T):
        for a0 in range(0, D, chunk):
            k = min(chunk, D - a0)
            V = torch.zeros(k, B, T, C, dtype=x.dtype, device=x.device)
            V[torch.arange(k), :, t, a0 + torch.arange(k)] = 1.0
            try:
                Y = batched(V)
            except (RuntimeError, NotImplementedError):
                Y = torch.stack([jvp(v) for v in V])
            blocks[:, t, :, a0:a0 + k] = Y[:, :, t, :D].permute(1, 2, 0)
            if t > 0:
                acausal = torch.maximum(acausal, Y[:, :, :t, :D].abs().flatten(2).amax(-1).amax(0))
    return blocks, acausal


@dataclass
class TokenSpectra:
    """ρ(∂f_t/∂x_t) per token (B, T) (NaN at pads), their maximum ``rho`` (B,) (= ρ(J*) where ``acausal`` is 0),
    the ``bottleneck`` token (B,) that attains it, and ``acausal`` (B,) (0: J* is block lower-triangular)."""

    token_rho: torch.Tensor
    rho: torch.Tensor
    bottleneck: torch.Tensor
    acausal: torch.Tensor
    mask: torch.Tensor
    route: Optional[dict] = None

    @property
    def exact(self) -> torch.Tensor:
        """(B,) bool: ``rho`` is ρ(J*) (the map is causal at this point: no block above the diagonal)."""
        return self.acausal == 0

    def to_dict(self) -> dict:
        return {"quantity": "ρ(∂f_t/∂x_t) per token; rho = max over tokens = ρ(J*) where exact (J* block "
                            "lower-triangular: causal attention)",
                "token_rho": [[_num(v) for v in row] for row in self.token_rho.tolist()],
                "rho": [_num(v) for v in self.rho.tolist()], "bottleneck": self.bottleneck.tolist(),
                "exact": self.exact.tolist(), "acausal": [float(v) for v in self.acausal.tolist()],
                "route": self.route or {"route": "blocks"}}


def _position_chunks(T: int, chunk: int) -> list:
    """The token positions in runs of at most ``chunk``: one vmapped forward-mode product per run."""
    return [range(t0, min(T, t0 + chunk)) for t0 in range(0, T, max(1, int(chunk)))]


def per_position_apply(f, x: torch.Tensor, x0: torch.Tensor, D: int, real: torch.Tensor, acausal: torch.Tensor,
                       *, chunk: int = 8, prefix: bool = False):
    """The batched operator of the real tokens' diagonal blocks for :func:`~stability.numerics.eigen.krylov_schur`:
    V (P, D) (one row per real token, in (b, t) order) ↦ (∂f_t/∂x_t V_bt), one forward-mode product per token
    position, vmapped ``chunk`` positions at a time (memory: ``chunk`` copies of the step's activations, whatever
    T); the entries above the diagonal the same products reach are folded into ``acausal`` (B,) as they go. With
    ``prefix`` (a causal map: f_t reads x_s, s ≤ t, only), a run of positions ending at t is evaluated on the
    tokens 0..t alone: about half the work of the whole sequence, and the same derivatives."""
    B, T, C = x.shape
    runs = _position_chunks(T, chunk)

    def products(n: int, W: torch.Tensor) -> torch.Tensor:
        xs, x0s = x[:, :n], x0[:, :n]

        def jvp(w):
            return torch.func.jvp(lambda p: f(p, x0s), (xs,), (w,))[1]

        try:
            return torch.func.vmap(jvp)(W)
        except (RuntimeError, NotImplementedError):
            return torch.stack([jvp(w) for w in W])

    def apply(V: torch.Tensor) -> torch.Tensor:
        full = torch.zeros(B, T, D, dtype=x.dtype, device=x.device)
        full[real] = V.to(x.dtype)
        out = torch.zeros_like(full)
        for ts in runs:
            n = ts[-1] + 1 if prefix else T
            pos = torch.arange(ts[0], ts[-1] + 1, device=x.device)
            k = len(ts)
            W = torch.zeros(k, B, n, C, dtype=x.dtype, device=x.device)
            W[torch.arange(k), :, pos, :D] = full[:, pos].transpose(0, 1)
            Y = products(n, W)[..., :D]  # (k, B, n, D)
            out[:, pos] = Y[torch.arange(k), :, pos].transpose(0, 1)
            above = (torch.arange(n, device=x.device)[None, :] < pos[:, None]).to(x.dtype)[:, None, :, None]
            acausal.copy_(torch.maximum(acausal, (Y.abs() * above).amax(dim=(0, 2, 3))))
        return out[real]

    return apply


def one_pass_apply(f, x: torch.Tensor, x0: torch.Tensor, D: int, real: torch.Tensor, context):
    """The same operator as :func:`per_position_apply` by ONE forward-mode product with the tangent on every
    position at once, under ``context()`` (a model's :meth:`~stability.lm.LMAdapter.diagonal_tangents`: the ops
    that couple positions pass the tangent along the diagonal only, :mod:`stability.lm.diagonal`)."""
    B, T, C = x.shape

    def apply(V: torch.Tensor) -> torch.Tensor:
        full = torch.zeros(B, T, D, dtype=x.dtype, device=x.device)
        full[real] = V.to(x.dtype)
        W = torch.cat([full, torch.zeros(B, T, C - D, dtype=x.dtype, device=x.device)], dim=-1)
        with context():
            Y = torch.func.jvp(lambda p: f(p, x0), (x,), (W,))[1]
        return Y[..., :D][real]

    return apply


def _check_tol(dtype: torch.dtype) -> float:
    """The largest relative difference of the one-pass product from the per-position one that passes the check:
    1e-10 in float64, 1000 ε of a lower precision (float32: 1.2e-4)."""
    return 1e-10 if dtype == torch.float64 else 1e3 * torch.finfo(dtype).eps


def _checked_apply(one, per, tol: float, route: dict, fallback=None):
    """The per-token ρ's operator: the first application takes the per-position product ``per`` (its answer is the
    one returned) and the one-pass ``one`` on the same V; the later ones take ``one`` where every real token's row
    agrees to ``tol`` (relative to the row, floored at 1e-6 of the largest row), ``per`` otherwise or where ``one``
    fails (``fallback``, where given, in place of ``per`` from the second application: the same products, another
    batching). ``route`` records it: the route, the check's difference, the products of each kind."""

    def apply(V: torch.Tensor) -> torch.Tensor:
        if "route" in route:
            route["applications"] += 1
            return (one if route["route"] == "one-pass" else (fallback or per))(V)
        b = per(V)
        route.update(applications=1, check_tol=tol)
        try:
            a = one(V)
            nb = b.double().norm(dim=-1)
            rel = float(((a - b).double().norm(dim=-1) / (nb + 1e-6 * nb.max()).clamp_min(1e-300)).max())
        except (RuntimeError, NotImplementedError) as exc:
            rel, route["error"] = float("inf"), f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        route["check_rel_diff"] = rel if math.isfinite(rel) else None  # None: failed, or not finite (JSON-safe)
        route["route"] = "one-pass" if math.isfinite(rel) and rel <= tol else "per-position"
        if route["route"] == "per-position":
            what = route.get("error") or f"differed from the per-position one (relative {rel:.3g} > {tol:g})"
            route["note"] = f"one-pass product {what}: per-position products"
        return b

    return apply


def _token_rho_matrix_free(f, x, x0, D, mask, tol, *, chunk: int = 8, prefix: bool = False, context=None,
                           why: str = "no one-pass context for this model"):
    """ρ per real token by Krylov–Schur on every diagonal block at once, matrix-free; (rho (B, T) NaN at pads,
    acausal (B,), route (dict)). With ``context`` (the model's one-pass context) the products are one per Krylov
    step where the check of :func:`_checked_apply` passes; otherwise (or without it) T per step, ``chunk``
    positions at a time. ``acausal`` comes from the per-position products (with one-pass: the first application's,
    on the random start vectors)."""
    real = mask.to(x.device)
    acausal = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
    P = int(real.sum())
    per = per_position_apply(f, x, x0, D, real, acausal, chunk=chunk, prefix=prefix)
    if context is None:
        route = {"route": "per-position", "note": f"{why}: per-position products", "applications": 0}

        def apply(V):
            route["applications"] += 1
            return per(V)
    else:
        # the check's per-position products one position at a time (one copy of the step's activations, not
        # ``chunk``): the one-pass route's peak is then the one-pass product's; a fallback runs ``per`` as before
        check = per_position_apply(f, x, x0, D, real, acausal, chunk=1, prefix=prefix)
        route = {}
        apply = _checked_apply(one_pass_apply(f, x, x0, D, real, context), check, _check_tol(x.dtype), route,
                               fallback=per)
    spec = krylov_schur(apply, (P, D), dtype=torch.float64, device=x.device, tol=tol, k=3)
    rho = torch.full(mask.shape, float("nan"), dtype=torch.float64, device=x.device)
    rho[real] = spec.rho.to(rho)
    return rho, acausal, route


@torch.no_grad()
def is_causal(model, x0) -> bool:
    """The model is causal on this batch (:meth:`~stability.lm.LMAdapter.causal_at`; ``causal`` for any other)."""
    at = getattr(model, "causal_at", None)
    return bool(at(x0)) if callable(at) else bool(getattr(model, "causal", False))


def token_spectra(model, x: torch.Tensor, x0: torch.Tensor, *, method: str = "auto", chunk: int = 64,
                  tol: float = 1e-10, blocks_max: int = 64, positions: int = 8, one_pass: bool = True) -> TokenSpectra:
    """Per-token spectral radii at the states x (B, T, C), usually x* (:class:`TokenSpectra`; module docstring).

    ``method``: ``blocks`` forms every diagonal block (T·D forward-mode products, then T eigenproblems of D × D:
    exact to rounding); ``krylov`` never forms them (Krylov–Schur on all the real tokens' blocks at once, T
    products per Krylov step, ρ to the Ritz residual ``tol``: for large D); ``auto``: blocks up to D =
    ``blocks_max``. Both report ``acausal`` from the products they take (with ``krylov``, on the random Krylov
    directions: nonzero for a map that reads later tokens, with probability one). ``chunk``: the directions of one
    vmapped product (``blocks``); ``positions``: the token positions of one vmapped product (``krylov``), which
    bounds its memory; a model marked ``causal`` has each run of positions evaluated on its prefix only. With
    ``one_pass`` (``krylov``) and a model that has a one-pass context (``diagonal_tangents()``), one product per
    Krylov step, checked on the first against the per-position products (:func:`_checked_apply`); ``route`` says
    which ran."""
    D, mask = _dims(model, x), _mask(model, x0, x)
    x, x0 = x.detach(), x0.detach()
    if method == "auto":
        method = "blocks" if D <= blocks_max else "krylov"
    route = None
    if method == "blocks":
        blocks, acausal = token_blocks(model.step, x, x0, D, chunk=chunk)
        flat = blocks.double().reshape(-1, D, D)  # every token's block, one batch of dense matrices
        rho = spectral_radius(flat, route="dense").rho.reshape(blocks.shape[:-2]).to(blocks.device)
        rho = torch.where(mask.to(rho.device), rho, torch.full_like(rho, float("nan")))
    elif method == "krylov":
        hook = getattr(model, "diagonal_tangents", None) if one_pass else None
        context = hook if callable(hook) and hook() is not None else None
        why = "no one-pass context for this model" if one_pass else "one-pass route turned off"
        rho, acausal, route = _token_rho_matrix_free(model.step, x, x0, D, mask, tol, chunk=positions,
                                                     prefix=is_causal(model, x0), context=context, why=why)
    else:
        raise ValueError(f"method must be auto, blocks or krylov, got {method!r}")
    filled = torch.nan_to_num(rho, nan=-1.0)
    return TokenSpectra(token_rho=rho.cpu(), rho=filled.amax(1).cpu(), bottleneck=filled.argmax(1).cpu(),
                        acausal=acausal.double().cpu(), mask=mask.cpu(), route=route)
