"""The adapter of HRM-Text (``transformers``' ``hrm_text``, :class:`HrmTextForCausalLM`): two coupled recurrent
stacks, H (slow) and L (fast), as one loop map.

The model's forward, with z_H, z_L (B, T, d) and the scaled token embeddings h = embed(ids) · embedding_scale::

    z_H = h;  z_L = z_L_init
    for H_cycles:                                  # one step of the loop map
        for L_cycles: z_L = L(z_L + z_H)
        z_H = H(z_H + z_L)
    logits = lm_head(z_H)

so the state is x = [z_H, z_L] (B, T, 2d) (the carry, ``carry_channels`` = 2d), e = [h, z_L_init], one ``step``
is one H-cycle and the model's own depth is ``model_steps`` = H_cycles. The input enters only through the first
iterate: the step does not read h (HRM-Text's "no x" variant), so ∂f/∂x0 = 0, dx*/dx0 = 0 and a fixed point it
converges to is independent of the input; the answer depends on the tokens only through the start and the few
cycles the model runs (the analysis shows it as ‖dx*/dx0‖ = 0 and A.8's dependence on e). The readout needs no
context (lm_head per token).

The model runs with eager attention (pure torch operations: torch.func transforms them, and under
:func:`~stability.lm.precision.float64_mode` its float32 softmax becomes float64); the masks are the adapter's own
(:func:`~stability.lm.inputs.attention_bias`). With ``config.prefix_lm`` (the default) the inputs may carry
``token_type_ids`` (``pack(ids, mask, token_type_ids=...)``): the tokens marked 1 form one bidirectional block, as
``model(input_ids, token_type_ids=...)`` computes; J* is then not block-triangular inside that block, and the
per-token ρ, which needs a causal map, is not taken for such a batch.
"""

from __future__ import annotations

from typing import Optional

import torch

from stability.lm import diagonal
from stability.lm.adapter import LMAdapter
from stability.lm.inputs import LMInputs, attention_bias


class HrmTextAdapter(LMAdapter):
    """:class:`HrmTextForCausalLM` as a looped model (module docstring); ``model`` is adapted in place (eager
    attention)."""

    readout_context = "none"

    def __init__(self, model):
        super().__init__()
        model.set_attn_implementation("eager")
        self.hf = model.eval()
        cfg = model.config
        self.d = int(cfg.hidden_size)
        self.carry_channels = 2 * self.d
        self.model_steps = int(cfg.H_cycles)
        self.L_cycles = int(cfg.L_cycles)
        self.prefix_lm = bool(getattr(cfg, "prefix_lm", False))

    @property
    def body(self):
        return self.hf.model

    def injection(self, lm: LMInputs) -> torch.Tensor:
        return self.body.embed_tokens(lm.ids) * self.body.embedding_scale

    def first(self, h, mask, pos, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        z_L = self.body.z_L_init.to(dtype=h.dtype, device=h.device).expand_as(h)
        return torch.cat([h, z_L], dim=-1)

    def _stack_args(self, like: torch.Tensor, mask, pos, block=None) -> dict:
        cos_sin = self.body.rotary_emb(like, pos)
        return {"attention_mask": attention_bias(mask, like.dtype, block=block), "position_embeddings": cos_sin,
                "position_ids": pos}

    def loop(self, carry, h, mask, pos, block=None) -> torch.Tensor:
        z_H, z_L = carry[..., :self.d], carry[..., self.d:]
        kw = self._stack_args(z_H, mask, pos, block)
        for _ in range(self.L_cycles):
            z_L = self.body.L_module(z_L + z_H, **kw)
        z_H = self.body.H_module(z_H + z_L, **kw)
        return torch.cat([z_H, z_L], dim=-1)

    def head(self, carry, h, mask, pos) -> torch.Tensor:
        return self.hf.lm_head(carry[..., :self.d])

    def diagonal_tangents(self):
        """The one-pass diagonal product's context (:mod:`stability.lm.diagonal`): the model's eager attention, its
        only op that couples positions, with the diagonal tangent."""
        from transformers.models.hrm_text import modeling_hrm_text as hf

        fn = diagonal.eager_attention(hf.eager_attention_forward, hf.repeat_kv)
        return diagonal.patched((hf, {"eager_attention_forward": fn}))
