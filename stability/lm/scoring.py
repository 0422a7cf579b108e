"""Scoring a language model's readout: next-token loss, perplexity and per-token accuracy, with the ignore index.

Targets are aligned with the logits: ``targets[b, t]`` is the token position t should predict (the next one), and
:data:`~stability.lm.inputs.IGNORE_INDEX` (−100) where nothing is scored (the last position, pads, a prompt one
does not score). :func:`next_token_targets` builds them from the ids and the mask. A language model's accuracy is
per token (:func:`token_accuracy`); "all positions right" (the tasks' sample accuracy) is reported too, as
``sequence_accuracy``, over the scored tokens only.
"""

from __future__ import annotations

from typing import Optional

import torch

from stability.lm.inputs import IGNORE_INDEX


def next_token_targets(ids: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(B, T): ids[b, t+1] at position t where both t and t+1 are real tokens, −100 elsewhere (the last position,
    pads, and the position before a pad)."""
    ids = ids.long()
    real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.to(ids.device) != 0
    out = torch.full_like(ids, IGNORE_INDEX)
    keep = real[:, :-1] & real[:, 1:]
    out[:, :-1] = torch.where(keep, ids[:, 1:], torch.full_like(ids[:, 1:], IGNORE_INDEX))
    return out


def _scored(logits: torch.Tensor, targets: torch.Tensor):
    targets = targets.to(logits.device).reshape(logits.shape[:-1])
    scored = targets != IGNORE_INDEX
    right = (logits.argmax(-1) == targets) & scored
    return scored, right


def lm_score(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The analysis' ``score(logits, targets) -> (correct, position_accuracy)``, both (B,), for a language model:
    ``correct`` every scored token right, ``position_accuracy`` the share of the scored tokens that are right;
    −100 is never scored. A sample with no scored token counts as correct with position accuracy 1 (nothing
    was asked of it)."""
    scored, right = _scored(logits, targets)
    n = scored.flatten(1).sum(1)
    correct = (right | ~scored).flatten(1).all(1)
    acc = torch.where(n > 0, right.flatten(1).sum(1).double() / n.clamp_min(1), torch.ones_like(n, dtype=torch.double))
    return correct, acc


def token_losses(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """(B, T) cross entropy of each scored token (0 where −100), computed in float64."""
    targets = targets.to(logits.device)
    logp = torch.log_softmax(logits.double(), dim=-1)
    safe = targets.clamp_min(0).unsqueeze(-1)
    nll = -logp.gather(-1, safe).squeeze(-1)
    return torch.where(targets != IGNORE_INDEX, nll, torch.zeros_like(nll))


def token_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> Optional[float]:
    """The share of all scored tokens of the batch whose argmax is right (None: nothing scored)."""
    scored, right = _scored(logits, targets)
    n = int(scored.sum())
    return float(right.sum()) / n if n else None


def score_lm(logits: torch.Tensor, targets: torch.Tensor) -> dict:
    """Next-token loss (mean cross entropy over the scored tokens), perplexity (its exp), per-token accuracy,
    sequence accuracy (every scored token right) and the number of scored tokens."""
    scored, _ = _scored(logits, targets)
    n = int(scored.sum())
    loss = float(token_losses(logits, targets).sum()) / n if n else None
    correct, _ = lm_score(logits, targets)
    return {"loss": loss, "perplexity": None if loss is None else float(torch.tensor(loss).exp()),
            "token_accuracy": token_accuracy(logits, targets), "sequence_accuracy": float(correct.double().mean()),
            "scored_tokens": n}
