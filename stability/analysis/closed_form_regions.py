"""Reference models whose stable region is known in closed form, to check the geometry stage's radius search
(:mod:`stability.analysis.geometry`) against exact radii: a diagonal linear recall map (the region is a box) and the
single-layer model of Figure 5 with one eigen-pair (App. B.2; the regions of :mod:`stability.theory.regions`)."""

from __future__ import annotations

import math

import numpy as np
import torch


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


__all__ = ["DiagonalRecall", "Figure5Model", "diagonal_radius", "figure5_radius"]
