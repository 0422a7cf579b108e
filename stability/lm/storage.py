"""Mixed storage: the float64 analysis copy of a language model with its token embedding and LM head kept in float32.

A looped LM's vocabulary-sized matrices (the token embedding, read once by ``embed``, and the LM head, read by
``readout`` only) are most of its parameters (69 M of the 101 M of benchmarks/lm_size.py's model) and never enter the
loop map, so ρ(J*), Props. 4–5 and the per-token statistics never differentiate through them. Held in float32 and
computed in float64 they give the float64 model's numbers:

* an embedding lookup copies rows: the float32 rows cast to float64 are the float64 copy's rows exactly
  (:class:`Float32Embedding`: ``F.embedding`` on the float32 table, then the rows cast);
* the head's product is a float64 product of the float32 weight cast exactly to float64, a block of
  :data:`HEAD_ROWS` output rows at a time (:class:`Float32Head`): the float64 head's logits to rounding of the
  summation order.

Exact only when the float32 values *are* the model's values: :func:`mixed_storage` keeps a table in float32 only
when it is float32 already or its float64 values are float32 numbers (a directory's float32 or bfloat16 weights),
and only modules of the plain classes (``type(m) is nn.Embedding``; an ``nn.Linear`` with the vocabulary as its
outputs); a subclass with its own forward (a scaled or normed embedding) stays float64, and so does a parameter
shared with such a module. Everything else is cast to float64 in place, tensor by tensor (at most one tensor's
second copy at a time).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from stability.analysis.fixed_point import cast_copy

#: output rows of the head's float64 product at a time (its float64 weight block: 4,096 × d × 8 B)
HEAD_ROWS = 4096


class Float32Embedding(nn.Embedding):
    """An ``nn.Embedding`` whose table is stored in float32 and whose rows come out in float64 (exactly the rows of
    the float64 table: a cast copies a float32 number)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = F.embedding(ids, self.weight, self.padding_idx, self.max_norm, self.norm_type,
                           self.scale_grad_by_freq, self.sparse)
        return rows.to(torch.float64)


class Float32Head(nn.Linear):
    """An ``nn.Linear`` whose weight is stored in float32 and whose product is taken in float64, :data:`HEAD_ROWS`
    output rows at a time (the float64 weight never whole)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(torch.float64)
        W, b = self.weight, self.bias
        return torch.cat([F.linear(x, W[i:i + HEAD_ROWS].to(torch.float64),
                                   None if b is None else b[i:i + HEAD_ROWS].to(torch.float64))
                          for i in range(0, W.shape[0], HEAD_ROWS)], dim=-1)


def _is_float32_number(t: torch.Tensor) -> bool:
    """Every entry of ``t`` is a float32 number (a float32 tensor, or float64 values that survive the round trip),
    checked a million entries at a time."""
    if t.dtype == torch.float32:
        return True
    if t.dtype != torch.float64:
        return False
    flat = t.detach().reshape(-1)
    return all(bool(torch.equal(p.to(torch.float32).to(torch.float64), p)) for p in flat.split(1 << 20))


def vocabulary_modules(model: nn.Module) -> dict:
    """name → module of the token embeddings (``type(m) is nn.Embedding``) and of the LM heads (``type(m) is
    nn.Linear`` with as many outputs as an embedding has rows) of ``model``: the candidates for float32 storage."""
    mods = dict(model.named_modules())
    vocab = {m.num_embeddings for m in mods.values() if isinstance(m, nn.Embedding)}
    return {k: m for k, m in mods.items()
            if type(m) is nn.Embedding or (type(m) is nn.Linear and m.out_features in vocab)}


def kept_float32(model: nn.Module) -> set:
    """The ids of the parameters :func:`mixed_storage` keeps in float32: those of :func:`vocabulary_modules`
    whose values are float32 numbers and that no other module holds."""
    chosen = vocabulary_modules(model)
    owners: dict = {}
    for name, mod in model.named_modules():
        for p in mod.parameters(recurse=False):
            owners.setdefault(id(p), set()).add(name)
    keep = set()
    for name, mod in chosen.items():
        for p in mod.parameters(recurse=False):
            if owners[id(p)] <= set(chosen) and _is_float32_number(p):
                keep.add(id(p))
    return keep


def mixed_storage(model: nn.Module) -> nn.Module:
    """``model`` made the float64 analysis copy in place (module docstring): the vocabulary tables of
    :func:`kept_float32` in float32 (their modules now :class:`Float32Embedding` / :class:`Float32Head`), every
    other floating parameter and buffer float64, one tensor at a time; eval mode, no parameter gradients."""
    keep = kept_float32(model)
    for mod in model.modules():
        for name, t in [*mod._parameters.items(), *mod._buffers.items()]:
            if t is None or not t.is_floating_point():
                continue
            dtype = torch.float32 if id(t) in keep else torch.float64
            if t.dtype != dtype:
                t.data = t.data.to(dtype)  # in place: every module holding the tensor sees the cast
        own = list(mod.parameters(recurse=False))
        if own and all(id(p) in keep for p in own):
            if type(mod) is nn.Embedding:
                mod.__class__ = Float32Embedding
            elif type(mod) is nn.Linear:
                mod.__class__ = Float32Head
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def stored_float32(model: nn.Module) -> int:
    """The parameters (a count of numbers) that ``model`` stores in float32 under :func:`mixed_storage`."""
    return sum(p.numel() for m in model.modules() if isinstance(m, (Float32Embedding, Float32Head))
               for p in m.parameters(recurse=False))


def analysis_copy(model: nn.Module) -> nn.Module:
    """The float64 analysis copy of a (float32) ``model`` under :func:`mixed_storage`, made without a float64 copy
    of its vocabulary tables (:func:`~stability.analysis.fixed_point.cast_copy` keeps them in their dtype); the
    model itself is left as it was."""
    return mixed_storage(cast_copy(model, torch.float64, keep=frozenset(kept_float32(model))))
