"""Structured inputs of a language model: token ids, an attention mask and position ids, carried through the model
contract without widening it (docs/language-models.md, "Inputs").

The contract's ``embed(inputs)`` takes one batch-first tensor, so the three LM inputs travel as one:

* ``inputs``: a LongTensor, either ``(B, T)`` token ids (no padding, positions 0..T−1), or ``(B, 3, T)``
  packed by :func:`pack`: rows ids, attention mask (1 real, 0 pad; 2 a real token of the *bidirectional block*,
  Hugging Face's ``token_type_ids == 1`` of a PrefixLM) and position ids;
* ``x0 = embed(inputs)``: ``(B, T, C + 2)``, the model's input injection (C channels per token) followed by two
  *context channels*: the mask (0, 1 or 2 as packed) and the position times :data:`POSITION_SCALE` (2⁻¹⁶, exact in float32 up
  to position 2²⁴, and below 1 up to 65,535 so that it is never the largest entry of a state, which normalises
  the solver's residual). ``step(x, x0)`` reads mask and positions back from x0 (:func:`split_context`, detached:
  the context has no derivative), so it stays pure, batch-independent and transformable by torch.func.

Pad positions: an adapter multiplies the new state by the mask, so a pad token's state is 0 at every iterate: it
has residual 0, never delays convergence, and adds only zero rows to J* (eigenvalue 0), while the real tokens
never attend to it (the mask below). :func:`attention_bias` always lets a query see itself, so a pad query's
softmax has one finite entry (no NaN rows that a masked weight of 0 would carry into real tokens as 0 · NaN).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from stability.analysis.accuracy import IGNORE_INDEX  # noqa: F401 - the one ignore index, re-exported here
from stability.errors import StabilityError
from stability.stored import load_plain

#: positions ride in x0 as position · 2⁻¹⁶ (a power of two: exact in every float format the models use)
POSITION_SCALE = 2.0 ** -16
#: the context channels at the end of x0: mask, scaled position
CONTEXT_CHANNELS = 2


@dataclass
class LMInputs:
    """Token ids, attention mask (bool, True for real tokens) and position ids, each (B, T); ``block`` (B, T) bool:
    the real tokens of the bidirectional block (a PrefixLM's ``token_type_ids == 1``: they attend to each other
    whatever their order), all False for a causal batch."""

    ids: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor
    block: Optional[torch.Tensor] = None

    def __post_init__(self):
        if self.block is None:
            self.block = torch.zeros_like(self.mask)

    @property
    def padded(self) -> bool:
        return not bool(self.mask.all())


def default_positions(mask: torch.Tensor) -> torch.Tensor:
    """Hugging Face's positions for a padded batch: the count of real tokens before each one (0 for the first real
    token, whichever side the padding is on); 0..T−1 without padding."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def pack(input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
         position_ids: Optional[torch.Tensor] = None, token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The one tensor ``embed`` takes: (B, 3, T) of ids, mask (0 pad, 1 real, 2 real and in the bidirectional
    block) and positions (default :func:`default_positions`). ``input_ids`` (B, T) integer; ``attention_mask``
    (B, T) of 0/1 or bool; ``token_type_ids`` (B, T) of 0/1: Hugging Face's PrefixLM marker (1: the block)."""
    ids = _ids(input_ids)
    mask = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else _mask(attention_mask, ids)
    pos = default_positions(mask) if position_ids is None else position_ids.to(ids.device).long().expand_as(ids)
    if bool((pos < 0).any()):
        raise StabilityError("position_ids must be ≥ 0")
    code = mask.long()
    if token_type_ids is not None:
        code = code + (_mask(token_type_ids, ids, "token_type_ids", need_real=False) & mask).long()
    return torch.stack([ids, code, pos], dim=1)


def unpack(inputs: torch.Tensor) -> LMInputs:
    """:class:`LMInputs` from ``(B, T)`` ids or a ``(B, 3, T)`` :func:`pack`; one line for anything else."""
    if not isinstance(inputs, torch.Tensor) or inputs.is_floating_point() or inputs.is_complex():
        raise StabilityError("a language model's inputs are token ids: an integer tensor (B, T), or (B, 3, T) from "
                             "stability.lm.pack(ids, attention_mask, position_ids)")
    if inputs.dim() == 2:
        ids = inputs.long()
        mask = torch.ones_like(ids, dtype=torch.bool)
        return LMInputs(ids, mask, torch.arange(ids.shape[1], device=ids.device).expand_as(ids))
    if inputs.dim() == 3 and inputs.shape[1] == 3:
        return LMInputs(inputs[:, 0].long(), inputs[:, 1] != 0, inputs[:, 2].long(), inputs[:, 1] == 2)
    raise StabilityError(f"a language model's inputs are (B, T) token ids or (B, 3, T) packed ids, mask and "
                         f"positions; got shape {tuple(inputs.shape)}")


def _ids(t: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.is_floating_point() or t.is_complex():
        raise StabilityError(f"input_ids must be an integer tensor (B, T), got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    return t.long()


def _mask(m: torch.Tensor, ids: torch.Tensor, name: str = "attention_mask", need_real: bool = True) -> torch.Tensor:
    if not isinstance(m, torch.Tensor) or tuple(m.shape) != tuple(ids.shape):
        shape = tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
        raise StabilityError(f"{name} {shape} must have the shape of input_ids {tuple(ids.shape)}")
    if not bool(((m == 0) | (m == 1)).all()):
        raise StabilityError(f"{name} must hold 0 and 1 only")
    mask = m.to(ids.device) != 0
    if need_real and not bool(mask.any(dim=1).all()):
        raise StabilityError("every sequence needs at least one real token (a row of attention_mask is all 0)")
    return mask


def with_context(h: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                 block: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x0: the injection ``h`` (B, T, C) followed by the context channels (mask (+1 in the bidirectional
    ``block``), position · 2⁻¹⁶)."""
    code = mask.to(h.dtype) if block is None else mask.to(h.dtype) + (block & mask).to(h.dtype)
    ctx = torch.stack([code, positions.to(h.dtype) * POSITION_SCALE], dim=-1)
    return torch.cat([h, ctx], dim=-1)


def split_context(x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(injection (B, T, C), mask (B, T) bool, positions (B, T) long) of an x0 made by :func:`with_context`; the
    context is read detached and rounded, so a derivative in x0 never flows through it."""
    ctx = x0[..., -CONTEXT_CHANNELS:].detach()
    mask = ctx[..., 0] > 0.5
    positions = torch.round(ctx[..., 1] / POSITION_SCALE).clamp(min=0).long()
    return x0[..., :-CONTEXT_CHANNELS], mask, positions


def split_block(x0: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the tokens of the bidirectional block, read (detached) from an x0 made by :func:`with_context`."""
    return x0[..., -CONTEXT_CHANNELS].detach() > 1.5


def attention_bias(mask: torch.Tensor, dtype: torch.dtype, *, window: Optional[int] = None,
                   causal: bool = True, block: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The additive attention mask (B, 1, T, T): 0 where query q may attend key k, the dtype's lowest value
    elsewhere. Allowed: k a real token, k ≤ q when ``causal`` or q and k both in the bidirectional ``block`` (B, T)
    (Hugging Face's PrefixLM mask), q − k < ``window`` when given (Hugging Face's sliding window), and always
    k = q (a pad query then has one finite logit, and its output is discarded)."""
    T = mask.shape[-1]
    q = torch.arange(T, device=mask.device)
    allowed = mask[:, None, :].expand(mask.shape[0], T, T)
    if causal:
        order = q[None, :] <= q[:, None]
        if block is not None:
            order = order | (block[:, :, None] & block[:, None, :])
        allowed = allowed & order
    if window is not None:
        allowed = allowed & (q[:, None] - q[None, :] < window)
    allowed = allowed | torch.eye(T, dtype=torch.bool, device=mask.device)
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    low = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=mask.device)
    return torch.where(allowed, zero, low).unsqueeze(1)


def hf_labels_to_targets(labels: torch.Tensor) -> torch.Tensor:
    """Hugging Face ``labels`` (the tokens themselves, −100 where not scored; the model's loss shifts them) as targets
    aligned with the logits: targets[:, t] = labels[:, t + 1], −100 at the last position."""
    out = torch.full_like(labels.long(), IGNORE_INDEX)
    out[:, :-1] = labels.long()[:, 1:]
    return out


def load_inputs(path: Path | str) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """(packed inputs (B, 3, T), targets or None) from a ``torch.save`` file: a tensor of token ids (B, T), or a
    dict with ``input_ids`` and optionally ``attention_mask``, ``position_ids``, ``token_type_ids`` (a PrefixLM's
    bidirectional block) and either ``labels`` (Hugging
    Face's convention: the tokens, −100 where not scored, shifted here by :func:`hf_labels_to_targets`) or
    ``targets`` (aligned with the logits: targets[b, t] is the token position t should predict); a pad position is
    never scored. Read without executing code (``weights_only``)."""
    p = Path(path)
    if not p.is_file():
        raise StabilityError(f"--inputs {path}: no such file")
    obj = load_plain(p, f"--inputs {path}", "tensor file", "not a tensor file saved with torch.save")
    if isinstance(obj, torch.Tensor):
        return pack(obj), None
    if not isinstance(obj, dict) or "input_ids" not in obj:
        raise StabilityError(f"--inputs {path}: expected token ids (B, T) or a dict with input_ids "
                             f"(attention_mask, position_ids, token_type_ids, labels or targets optional), found "
                             f"{type(obj).__name__}")
    packed = pack(obj["input_ids"], obj.get("attention_mask"), obj.get("position_ids"), obj.get("token_type_ids"))
    if obj.get("labels") is not None and obj.get("targets") is not None:
        raise StabilityError(f"--inputs {path}: give labels (Hugging Face's, shifted here) or targets (aligned with "
                             "the logits), not both")
    key = "labels" if obj.get("labels") is not None else "targets"
    given = obj.get(key)
    if given is None:
        return packed, None
    if not isinstance(given, torch.Tensor) or tuple(given.shape) != tuple(packed[:, 0].shape):
        raise StabilityError(f"--inputs {path}: {key} must be a tensor shaped like input_ids "
                             f"{tuple(packed[:, 0].shape)}")
    targets = hf_labels_to_targets(given) if key == "labels" else given.long()
    return packed, torch.where(packed[:, 1] != 0, targets, torch.full_like(targets, IGNORE_INDEX))  # pads: unscored
