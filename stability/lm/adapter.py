"""The base of every language-model adapter: a causal LM presented as a :class:`~stability.protocols.LoopedModel`
(docs/language-models.md, "Writing an adapter").

A subclass says what its model computes in four pieces, each on plain tensors (B, T, ·) with the token mask (B, T)
bool and the position ids (B, T) long:

* ``injection(lm) -> h``                   the prelude: tokens to the input injection h (B, T, C);
* ``first(h, mask, pos, generator) -> c``  the carry the loop starts from (B, T, D), D = ``carry_channels``;
* ``loop(c, h, mask, pos) -> c'``          one pass of the looped block(s);
* ``head(c, h, mask, pos) -> logits``      the coda and the LM head, from the last carry;

with ``model_steps``, the number of ``loop`` passes after ``first`` that the model's own forward makes, and
``readout_context``, what ``head`` needs besides the carry: ``"none"`` (h, mask and pos are None), ``"context"``
(mask and pos; h is None) or ``"all"`` (h too). This base turns them into the contract:

* ``embed(inputs) = x0``: h followed by the context channels (:mod:`stability.lm.inputs`);
* ``initial_state(x0) = e`` and ``step(x, x0) = x'``: the carry, times the mask (pad tokens stay 0), followed by
  what ``head`` needs of x0 (nothing, the 2 context channels, or all of x0), copied from x0 *detached*: that tail
  does not depend on x (its rows of J* are zero, so it adds eigenvalue 0 only) and carries no derivative in x0
  (so ‖dx*/dx0‖ measures the loop, not a copy); the readout reads it back, so ``readout(x)`` needs only x;
* ``readout(x)``: ``head`` on the carry and the tail.

The state is (B, T, D + tail): token-major, so the per-token statistics of :mod:`stability.lm.tokens` read token t
as ``x[:, t, :dynamic_channels]``. Whenever the parameters are float64 (the analysis copy), every piece runs under
:func:`~stability.lm.precision.float64_mode`, so a model that casts to float32 internally is float64 throughout.
"""

from __future__ import annotations

from typing import Optional

import torch

from stability.lm.inputs import CONTEXT_CHANNELS, LMInputs, split_block, split_context, unpack, with_context
from stability.errors import StabilityError
from stability.lm.precision import float64_mode, model_dtype

READOUT_CONTEXTS = ("none", "context", "all")

#: the geometry stage's parameter groups of a language model, by module type (:meth:`LMAdapter.parameter_groups`)
GROUPS = ("router", "embeddings", "norms", "attention", "MLP / experts", "injection", "other")
#: name components (lower case, substrings) that mark each group; the first group that matches wins
_MARKS = {"router": ("router",), "embeddings": ("embed", "wte", "wpe"),
          "norms": ("norm",), "attention": ("attn", "attention", "q_proj", "k_proj", "v_proj", "o_proj", "qkv"),
          "MLP / experts": ("mlp", "expert", "ffn", "feed_forward", "gate_up", "up_proj", "gate_proj", "down")}


class LMAdapter(torch.nn.Module):
    """Base class of the adapters (module docstring). Subclasses set ``carry_channels``, ``model_steps`` and
    ``readout_context`` and define ``injection``, ``first``, ``loop`` and ``head``."""

    #: marks a language-model adapter (``stability.analyze`` routes it to :func:`stability.lm.analyze_lm`)
    lm_adapter = True
    #: J* is block lower-triangular in token order (causal attention): ρ(J*) is the largest per-token ρ
    causal = True
    readout_context = "none"
    carry_channels: int = 0
    model_steps: int = 1
    #: the model has a bidirectional block (a PrefixLM's ``token_type_ids``): ``loop`` takes ``block=`` (B, T)
    prefix_lm = False

    # ---- what a subclass defines -------------------------------------------------------------------------------

    def injection(self, lm: LMInputs) -> torch.Tensor:
        raise NotImplementedError

    def first(self, h, mask, pos, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        raise NotImplementedError

    def loop(self, carry, h, mask, pos) -> torch.Tensor:
        raise NotImplementedError

    def head(self, carry, h, mask, pos) -> torch.Tensor:
        raise NotImplementedError

    # ---- the contract --------------------------------------------------------------------------------------------

    @property
    def dynamic_channels(self) -> int:
        """The channels of a token's state that evolve (the carry); the rest is the constant tail."""
        return int(self.carry_channels)

    def precision(self):
        """float64 throughout (:func:`~stability.lm.precision.float64_mode`) when the parameters are float64."""
        return float64_mode(model_dtype(self) == torch.float64)

    def _device(self) -> torch.device:
        p = next(iter(self.parameters()), None)
        return p.device if p is not None else torch.device("cpu")

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        lm = unpack(inputs.to(self._device()))
        if not self.prefix_lm and bool(lm.block.any()):
            raise StabilityError(f"{type(self).__name__}: this model has no bidirectional block; its inputs take no "
                                 "token_type_ids")
        with self.precision():
            h = self.injection(lm)
        return with_context(h, lm.mask, lm.positions, lm.block)

    def initial_state(self, x0: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        h, mask, pos = split_context(x0)
        with self.precision():
            carry = self.first(h, mask, pos, generator)
        return self._state(carry, mask, x0)

    def step(self, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        h, mask, pos = split_context(x0)
        kw = {"block": split_block(x0)} if self.prefix_lm else {}
        with self.precision():
            carry = self.loop(x[..., :self.carry_channels], h, mask, pos, **kw)
        return self._state(carry, mask, x0)

    def readout(self, x: torch.Tensor) -> torch.Tensor:
        carry, tail = x[..., :self.carry_channels], x[..., self.carry_channels:]
        h = mask = pos = None
        if self.readout_context != "none":
            h, mask, pos = split_context(tail)
            h = h if self.readout_context == "all" else None
        with self.precision():
            return self.head(carry, h, mask, pos)

    def _state(self, carry: torch.Tensor, mask: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        carry = carry * mask.unsqueeze(-1).to(carry.dtype)
        if self.readout_context == "none":
            return carry
        tail = x0 if self.readout_context == "all" else x0[..., -CONTEXT_CHANNELS:]
        return torch.cat([carry, tail.detach().to(carry.dtype)], dim=-1)

    # ---- conveniences --------------------------------------------------------------------------------------------

    def causal_at(self, x0: torch.Tensor) -> bool:
        """Whether J* is block lower-triangular in token order for the batch x0: a causal model whose inputs have
        no bidirectional block (within a PrefixLM's block every token reads every other)."""
        return bool(self.causal) and not bool(split_block(x0).any())

    def token_mask(self, x0: torch.Tensor) -> torch.Tensor:
        """(B, T) bool: the real (not pad) tokens of a batch, read from x0."""
        return split_context(x0)[1]

    @torch.no_grad()
    def unroll(self, inputs: torch.Tensor, steps: Optional[int] = None,
               generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """The logits after ``steps`` loop passes (default ``model_steps``: the model's own forward)."""
        x0 = self.embed(inputs)
        x = self.initial_state(x0, generator=generator)
        for _ in range(self.model_steps if steps is None else steps):
            x = self.step(x, x0)
        return self.readout(x)

    #: name components of the input injection's own parameters (Huginn's concat adapter: ``adapter``)
    injection_names: tuple = ()
    #: an architecture's own groups, label → name components (checked before the types'; e.g. Inkling's messages)
    group_marks: dict = {}
    #: user-given groups, label → parameter-name prefixes (``analyze_lm(..., parameter_groups=...)``); None: by type
    user_groups: Optional[dict] = None

    def parameter_groups(self) -> dict:
        """Label → parameter names, for the geometry stage's narrow directions (docs/language-models.md): the user's
        prefixes (:attr:`user_groups`) where given, else by module type (:data:`GROUPS`): a router of
        :meth:`routers`, an ``nn.Embedding``, a norm (a module whose type names it), attention, MLP or experts,
        the injection (:attr:`injection_names`), by the module's type and the components of the name."""
        names = [k for k, _ in self.named_parameters()]
        if self.user_groups is not None:
            return {label: [k for k in names if any(k == p or k.startswith(p.rstrip(".") + ".") for p in prefixes)]
                    for label, prefixes in self.user_groups.items()}
        routers = {id(p) for _, mod in self.routers() for p in mod.parameters()}
        modules = dict(self.named_modules())
        out: dict = {}
        for k, p in self.named_parameters():
            out.setdefault(self._group_of(k, p, routers, modules), []).append(k)
        order = [*GROUPS[:-1], *self.group_marks, GROUPS[-1]]
        return {label: out[label] for label in order if label in out}

    def _group_of(self, name: str, p, routers: set, modules: dict) -> str:
        if id(p) in routers or any(m in f".{name.lower()}" for m in (".mlp.gate.", ".moe.gate.", ".router.")):
            return "router"  # a mixture of experts' gate is its router (transformers' naming)
        owner = modules.get(name.rpartition(".")[0])
        if isinstance(owner, torch.nn.Embedding):
            return "embeddings"
        if owner is not None and "norm" in type(owner).__name__.lower():
            return "norms"
        parts = [c.lower() for c in name.split(".")[:-1]] or [name.lower()]
        if any(c in self.injection_names for c in parts):
            return "injection"
        for label, marks in {**self.group_marks, **_MARKS}.items():
            if any(m in c for c in parts for m in marks):
                return label
        return "other"

    def diagonal_tangents(self):
        """A context manager under which one forward-mode product of ``step`` gives the diagonal blocks' products
        ∂f_t/∂x_t V_t for all t at once (:mod:`stability.lm.diagonal`), or None: unknown for this model (the
        per-token ρ then takes one product per token position). None by default."""
        return None

    def routers(self) -> list:
        """(name, module) of the routers inside the loop (top-k expert choice), for
        :func:`stability.lm.routing.routing_changes`; none by default."""
        return []
