"""Discontinuities of a routed mixture-of-experts loop: the expert choice along the last iterates.

With top-k routing the loop map is piecewise smooth: where a token's k-th and (k+1)-th expert scores cross, f
jumps. J* (and ρ(J*)) describes one smooth piece only; an iteration can sit on an exact period-2 orbit that flips a
token's experts every pass while ρ < 1 on each piece, so that neither converges nor diverges. This module iterates
``iterates`` passes from a state (x_best of the solve, usually), records every router's top-k choice per token at
every pass (forward hooks on ``model.routers()``: :meth:`~stability.lm.LMAdapter.routers`), and counts, per sample:

* ``changes``: (router, token, pass) triples whose chosen set differs from the pass before;
* ``alternating``: (router, token) pairs whose choice alternates with period 2 over the whole window (A, B, A, B…);
* ``margin``: per token, the smallest gap between the k-th and (k+1)-th routing score at the last pass, over the
  routers: how close the token is to a switch (0: on the boundary);

and whether the state itself is on a period-2 orbit (``period2``: ‖x_N − x_{N−2}‖∞ < τ‖x_N‖∞ < ‖x_N − x_{N−1}‖∞).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass
class RoutingChanges:
    """Routing along the last ``iterates`` passes (module docstring); (B,) counts, (B, T) per token."""

    routers: list
    iterates: int
    changes: torch.Tensor
    token_changes: torch.Tensor
    alternating: torch.Tensor
    margin: Optional[torch.Tensor]
    period2: torch.Tensor

    def to_dict(self) -> dict:
        return {"routers": self.routers, "iterates": self.iterates, "changes": self.changes.tolist(),
                "token_changes": self.token_changes.tolist(), "alternating": self.alternating.tolist(),
                "period2": self.period2.tolist(),
                "margin": None if self.margin is None else
                [[None if v != v else float(v) for v in row] for row in self.margin.tolist()],
                "meaning": "changes: (router, token, pass) whose top-k expert set differs from the pass before; "
                           "alternating: (router, token) flipping with period 2; margin: smallest k-th minus "
                           "(k+1)-th routing score at the last pass"}


def _margin(module, out) -> Optional[torch.Tensor]:
    """The k-th minus (k+1)-th routing score per token from a router's output (its logits first), through the
    router's own score function and bias where it has them; None when the output has no logits."""
    k = getattr(module, "top_k", None)
    logits = out[0] if isinstance(out, (tuple, list)) and isinstance(out[0], torch.Tensor) else None
    if k is None or logits is None or not logits.is_floating_point() or logits.shape[-1] <= k:
        return None
    fn = getattr(module, "score_fn", None)
    scores = fn(logits) if callable(fn) else logits
    bias = getattr(module, "e_score_correction_bias", None)
    if isinstance(bias, torch.Tensor):
        scores = scores + bias
    top = scores.topk(k + 1, dim=-1).values
    return (top[..., k - 1] - top[..., k]).detach()


def _indices(out) -> torch.Tensor:
    """The expert indices of a router's output: its last integer tensor, each token's set sorted."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    ints = [t for t in outs if isinstance(t, torch.Tensor) and not t.is_floating_point()]
    return ints[-1].detach().sort(dim=-1).values


@torch.no_grad()
def routing_changes(model, x0: torch.Tensor, x: torch.Tensor, *, iterates: int = 8,
                    tol: float = 1e-8) -> Optional[RoutingChanges]:
    """Iterate ``iterates`` passes from x and count the routing changes (module docstring); None for a model
    without routers."""
    routers = list(model.routers()) if hasattr(model, "routers") else []
    if not routers:
        return None
    B, T = x.shape[:2]
    seen: dict = {name: [] for name, _ in routers}
    margins: dict = {}

    def hook(name, module):
        def record(_mod, _inp, out):
            seen[name].append(_indices(out).reshape(B, T, -1))
            m = _margin(module, out)
            if m is not None:
                margins[name] = m.reshape(B, T)
        return record

    handles = [mod.register_forward_hook(hook(name, mod)) for name, mod in routers]
    states = [x]
    try:
        for _ in range(iterates):
            states.append(model.step(states[-1], x0))
    finally:
        for h in handles:
            h.remove()
    mask = model.token_mask(x0).cpu() if hasattr(model, "token_mask") else torch.ones(B, T, dtype=torch.bool)
    return _count(seen, margins, states, mask, tol, [n for n, _ in routers], iterates,
                  int(getattr(model, "dynamic_channels", x.shape[-1])))


def _count(seen, margins, states, mask, tol, names, iterates, D) -> RoutingChanges:
    token_changes = torch.zeros(mask.shape, dtype=torch.long)
    alternating = torch.zeros(mask.shape[0], dtype=torch.long)
    for name in names:
        sets = torch.stack(seen[name], dim=0).cpu()  # (passes, B, T, k)
        diff = (sets[1:] != sets[:-1]).any(-1)  # (passes-1, B, T)
        token_changes += (diff & mask).sum(0)
        if sets.shape[0] >= 3:
            alt = ((sets[2:] == sets[:-2]).all(-1) & diff[1:]).all(0) & mask
            alternating += alt.sum(-1)
    margin = None
    if margins:
        margin = torch.stack([margins[n].cpu().double() for n in names if n in margins]).amin(0)
        margin = torch.where(mask, margin, torch.full_like(margin, float("nan")))
    a, b, c = (s[..., :D] for s in states[-3:]) if len(states) >= 3 else (None, None, None)
    if a is None:
        period2 = torch.zeros(mask.shape[0], dtype=torch.bool)
    else:
        scale = c.flatten(1).abs().amax(1).clamp_min(1e-30)
        two, one = (c - a).flatten(1).abs().amax(1), (c - b).flatten(1).abs().amax(1)
        period2 = ((two < tol * scale) & (one >= tol * scale)).cpu()
    return RoutingChanges(routers=names, iterates=iterates, changes=token_changes.sum(1), token_changes=token_changes,
                          alternating=alternating, margin=margin, period2=period2)
