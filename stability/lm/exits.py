"""Exit rules audited: how much compute each early-exit criterion saves, and how often its answer is the
full-depth answer (docs/language-models.md, "Exit rules").

A recurrent-depth LM stops iterating a token when a criterion says the iteration has settled. Huginn's criteria
(Geiping et al., 2025, Section 6) and the fixed-point residual, each per token t at pass k (x_k after k passes
from e, p_k the readout's next-token distribution):

=============  =============================================================  ==============================
rule           fires at the first pass k ≥ 1 with                             threshold (the value compared)
=============  =============================================================  ==============================
``kl``         KL(p_k ‖ p_{k−1}) ≤ θ                                          θ (Huginn: 5e-4)
``entropy``    |H(p_k) − H(p_{k−1})| ≤ θ                                      θ (nats)
``latent``     ‖x_k,t − x_{k−1},t‖₂ / ‖x_k,t‖₂ ≤ θ                            θ
``cosine``     1 − cos(x_k,t, x_{k−1},t) ≤ θ                                  θ
``argmax``     argmax p equal for the last θ passes (k ≥ θ)                   θ passes
``residual``   ‖f(x_k)_t − x_k,t‖∞ / ‖f(x_k)_t‖∞ ≤ θ (the solver's τ, per token)  θ
=============  =============================================================  ==============================

A token that never fires exits at the last pass N. For every rule and threshold :func:`audit_exits` reports the
mean exit pass over the real tokens (``compute`` = that / N, the share of the full depth spent), the share of tokens
that fired, and ``agreement``: the share of tokens whose argmax at their exit is the argmax at pass N (with targets,
the token accuracy at exit against that at pass N too). The audit reads one trajectory of the whole sequence: a
token's exit does not change the states the later tokens see (as it would in a cached generation), so the numbers
are those of each criterion applied to the model's own iteration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from stability.lm.inputs import IGNORE_INDEX
from stability.lm.tokens import token_residuals

#: the rules and the thresholds audited by default
DEFAULT_RULES = {"kl": (1e-2, 1e-3, 5e-4, 1e-4, 1e-5), "entropy": (1e-2, 1e-3, 1e-4),
                 "latent": (1e-2, 1e-3, 1e-4), "cosine": (1e-3, 1e-5, 1e-7), "argmax": (2, 3, 5),
                 "residual": (1e-2, 1e-3, 1e-5)}


def default_passes(model, max_iter: Optional[int] = None) -> int:
    """The passes an audit runs: 4 × the model's own depth, at least 32 (at most ``max_iter`` where given)."""
    passes = max(4 * int(getattr(model, "model_steps", 8)), 32)
    return passes if max_iter is None else min(max_iter, passes)


@dataclass
class ExitTrace:
    """Per pass k = 1..N and token (each (N, B, T)): the criteria's values (``kl``, ``entropy``, ``latent``,
    ``cosine``, ``residual``) and the ``argmax``; ``mask`` (B, T) the real tokens."""

    kl: torch.Tensor
    entropy: torch.Tensor
    latent: torch.Tensor
    cosine: torch.Tensor
    residual: torch.Tensor
    argmax: torch.Tensor
    mask: torch.Tensor

    @property
    def passes(self) -> int:
        return int(self.argmax.shape[0])


def _criteria(logp, prev_logp, x, prev_x, D):
    p = logp.exp()
    kl = (p * (logp - prev_logp)).sum(-1)
    ent = (-(p * logp).sum(-1)) - (-(prev_logp.exp() * prev_logp).sum(-1))
    a, b = x[..., :D], prev_x[..., :D]
    latent = (a - b).norm(dim=-1) / a.norm(dim=-1).clamp_min(1e-30)
    cos = 1 - torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-30)
    return kl.clamp_min(0), ent.abs(), latent, cos


@torch.no_grad()
def exit_trace(model, x0: torch.Tensor, e: torch.Tensor, passes: int) -> ExitTrace:
    """Iterate ``passes`` passes from e and record every criterion per token (:class:`ExitTrace`)."""
    D = int(getattr(model, "dynamic_channels", e.shape[-1]))
    prev_x, x = e, model.step(e, x0)
    prev_logp = torch.log_softmax(model.readout(prev_x).double(), -1)
    rows: dict = {k: [] for k in ("kl", "entropy", "latent", "cosine", "residual", "argmax")}
    for _ in range(passes):
        fx = model.step(x, x0)
        logp = torch.log_softmax(model.readout(x).double(), -1)
        kl, ent, lat, cos = _criteria(logp, prev_logp, x.double(), prev_x.double(), D)
        for k, v in (("kl", kl), ("entropy", ent), ("latent", lat), ("cosine", cos),
                     ("residual", token_residuals(fx, x, D).double()), ("argmax", logp.argmax(-1))):
            rows[k].append(v.cpu())
        prev_x, x, prev_logp = x, fx, logp
    mask = model.token_mask(x0).cpu() if hasattr(model, "token_mask") else torch.ones(e.shape[:2], dtype=torch.bool)
    return ExitTrace(**{k: torch.stack(v) for k, v in rows.items()}, mask=mask)


def exit_passes(trace: ExitTrace, rule: str, threshold: float) -> torch.Tensor:
    """(B, T): the pass (1..N) at which each token exits under ``rule`` at ``threshold`` (N where it never fires)."""
    N = trace.passes
    if rule == "argmax":
        k = int(threshold)
        same = torch.ones_like(trace.argmax, dtype=torch.bool)
        same[1:] = trace.argmax[1:] == trace.argmax[:-1]
        run = torch.zeros_like(trace.argmax)
        for i in range(N):  # length of the current run of equal argmax ending at pass i+1
            run[i] = 1 if i == 0 else torch.where(same[i], run[i - 1] + 1, torch.ones_like(run[i]))
        fired = run >= k
    else:
        fired = getattr(trace, rule) <= threshold
    first = torch.where(fired.any(0), fired.double().argmax(0), torch.full(fired.shape[1:], N - 1.0)).long()
    return first + 1


def audit_exits(trace: ExitTrace, rules: Optional[dict] = None, targets: Optional[torch.Tensor] = None) -> dict:
    """Every rule at every threshold (module docstring): {"passes": N, "rules": [{rule, threshold, compute,
    mean_exit, fired, agreement[, accuracy_at_exit]}], "full_depth_accuracy"}; shares over the real tokens."""
    N, mask = trace.passes, trace.mask
    full = trace.argmax[-1]
    n = int(mask.sum()) or 1
    tgt = None if targets is None else targets.cpu().long()
    scored = None if tgt is None else (tgt != IGNORE_INDEX) & mask
    out = []
    for rule, thresholds in (rules or DEFAULT_RULES).items():
        for th in thresholds:
            k = exit_passes(trace, rule, th)
            answer = trace.argmax.gather(0, (k - 1).unsqueeze(0)).squeeze(0)
            row = {"rule": rule, "threshold": th, "mean_exit": float(k[mask].double().mean()),
                   "compute": float(k[mask].double().mean()) / N, "fired": float((k[mask] < N).sum()) / n,
                   "agreement": float(((answer == full) & mask).sum()) / n}
            if scored is not None and bool(scored.any()):
                row["accuracy_at_exit"] = float(((answer == tgt) & scored).sum()) / float(scored.sum())
            out.append(row)
    result = {"passes": N, "tokens": int(mask.sum()), "rules": out}
    if scored is not None and bool(scored.any()):
        result["full_depth_accuracy"] = float(((full == tgt) & scored).sum()) / float(scored.sum())
    return result
