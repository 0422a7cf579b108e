"""The adapter of Inkling-2 Loop (``transformers``' ``inkling2_loop``, :class:`Inkling2LoopForCausalLM` or the text
model of :class:`Inkling2LoopForConditionalGeneration`): a prelude, a looped block of layers with message passing
between passes, a coda, top-k mixture-of-experts feed-forwards.

The model's forward (layers ``[0, s)`` prelude, ``[s, e)`` the loop, ``[e, L)`` coda; every layer reads the
"block states" of the layers before it through learned attention over them)::

    prelude:  h_pre, B_pre = layers[:s](embed(ids))             # hidden state and P block states per token
    pass 1:   h, B = loop layers from (h_pre, B_pre), no messages
    pass k>1: m = message_input(B_prev, h_prev)                 # from the previous pass's blocks and output
              h, B = loop layers from (h_pre, B_pre), gated by m
    coda:     logits = softcap(lm_head(norm(final_input(B, layers[e:](h)))))

Each pass restarts from the prelude's output and sees the previous pass only through its messages, which read the
K − 1 block states the pass appended after its first and its output h (K = (e − s) / layers per block). So the
carry is c = [B_prev, h_prev] (B, T, K·d) and ``step`` is one pass with messages; e = pass 1 (no messages; the map
that the model iterates is the message pass), so the model's ``loop_num_passes`` passes are ``initial_state`` and
``model_steps`` = passes − 1 steps. x0 = [B_pre, h_pre] (B, T, (P+1)·d) + the context channels; the coda needs all
of it, so the state carries x0 as its constant tail (``readout_context`` = "all"; :mod:`stability.lm.adapter`).

Run as the model is, except: eager attention (the model's only implementation), experts by ``batched_mm`` (gathers
each token's experts: no data-dependent shapes, so torch.func's vmap batches it, and float64 works, where
``grouped_mm`` has no float64 CPU kernel), the adapter's own masks (:func:`~stability.lm.inputs.attention_bias`,
sliding windows included) and, for the float64 copy, :func:`~stability.lm.precision.float64_mode` (the model casts
to float32 throughout). Routing is discontinuous: :func:`stability.lm.routing.routing_changes` counts the changes of
expert choice along the last iterates (``routers()``: the loop layers' routers).
"""

from __future__ import annotations

from typing import Optional

import torch

from stability.lm.adapter import LMAdapter
from stability.lm.inputs import LMInputs, attention_bias


def _text_model(model):
    """(the text model: embed_tokens, layers, norm, ...; the LM head; the logit softcap) of a causal-LM or a
    conditional-generation Inkling model."""
    inner = model.model
    text = getattr(inner, "language_model", inner)
    return text, model.lm_head, getattr(model, "logit_softcap", None)


class InklingLoopAdapter(LMAdapter):
    """An Inkling-2 Loop causal LM as a looped model (module docstring); ``model`` is adapted in place (eager
    attention, batched_mm experts)."""

    readout_context = "all"
    #: the message passing between passes (message_input, the layers' message gates): a group of its own
    group_marks = {"messages": ("message",)}

    def __init__(self, model):
        super().__init__()
        model.set_experts_implementation("batched_mm")
        self.hf = model.eval()
        text, _, _ = _text_model(model)
        cfg = text.config
        self.d = int(cfg.hidden_size)
        self.start, self.end = int(cfg.loop_layer_index_start), int(cfg.loop_layer_index_end)
        per_block = int(cfg.n_layers_per_attn_res_block)
        self.P = self.start // per_block  # block states the prelude leaves (one per block boundary)
        self.K = (self.end - self.start) // per_block  # block states a pass appends
        self.carry_channels = self.K * self.d
        self.model_steps = int(cfg.loop_num_passes) - 1
        self.window = int(cfg.sliding_window_size)

    @property
    def text(self):
        return _text_model(self.hf)[0]

    def _layer_args(self, like: torch.Tensor, mask, pos) -> dict:
        """The keyword arguments every decoder layer takes, for both attention types."""
        T = like.shape[1]
        q = torch.arange(T, device=like.device)
        dist = q[:, None] - q[None, :]
        return {"masks": {"full_attention": attention_bias(mask, like.dtype),
                          "sliding_attention": attention_bias(mask, like.dtype, window=self.window)},
                "relative_distance": dist, "conv_mask": mask.to(like.dtype), "position_ids": pos}

    def _run(self, layers, hidden, blocks, kw, messages=None):
        """``layers`` in order from (hidden, blocks), as the model's forward runs them; (hidden, blocks) after."""
        for i, layer in enumerate(layers):
            extra = () if messages is None else (messages(i),)
            new = layer(hidden, blocks, *extra, attention_mask=kw["masks"][layer.attention_type],
                        relative_distance=kw["relative_distance"], conv_mask=kw["conv_mask"], cache=None,
                        position_ids=kw["position_ids"])
            if layer.is_block_boundary:
                blocks = torch.cat([blocks, hidden.unsqueeze(-2)], dim=-2)
            hidden = new
        return hidden, blocks

    def injection(self, lm: LMInputs) -> torch.Tensor:
        emb = self.text.embed_tokens(lm.ids)
        kw = self._layer_args(emb, lm.mask, lm.positions)
        blocks = emb.new_zeros(*emb.shape[:-1], 0, emb.shape[-1])
        hidden, blocks = self._run(self.text.layers[:self.start], emb, blocks, kw)
        return torch.cat([blocks, hidden.unsqueeze(-2)], dim=-2).flatten(-2)

    def _pre(self, h):
        """(h_pre (B, T, d), B_pre (B, T, P, d)) of the injection."""
        pre = h.unflatten(-1, (self.P + 1, self.d))
        return pre[..., -1, :], pre[..., :-1, :]

    def _pass(self, h, mask, pos, carry=None) -> torch.Tensor:
        hidden, blocks = self._pre(h)
        kw = self._layer_args(hidden, mask, pos)
        messages = None
        if carry is not None:
            prev = carry.unflatten(-1, (self.K, self.d))
            prev_blocks, prev_hidden = prev[..., :-1, :], prev[..., -1, :]
            messages = lambda i: self.text.message_input(prev_blocks, prev_hidden, i)  # noqa: E731
        hidden, blocks = self._run(self.text.layers[self.start:self.end], hidden, blocks, kw, messages)
        return torch.cat([blocks[..., self.P + 1:, :], hidden.unsqueeze(-2)], dim=-2).flatten(-2)

    def first(self, h, mask, pos, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        return self._pass(h, mask, pos)

    def loop(self, carry, h, mask, pos) -> torch.Tensor:
        return self._pass(h, mask, pos, carry)

    def head(self, carry, h, mask, pos) -> torch.Tensor:
        text, lm_head, softcap = _text_model(self.hf)
        pre_hidden, pre_blocks = self._pre(h)
        c = carry.unflatten(-1, (self.K, self.d))
        blocks = torch.cat([pre_blocks, pre_hidden.unsqueeze(-2), c[..., :-1, :]], dim=-2)
        kw = self._layer_args(pre_hidden, mask, pos)
        hidden, blocks = self._run(text.layers[self.end:], c[..., -1, :], blocks, kw)
        hidden = text.norm(text.final_input(blocks, hidden)[0]).to(h.dtype)
        logits = lm_head(hidden).float()
        return softcap(logits) if softcap is not None else logits

    def routers(self) -> list:
        return [(f"layers.{i}.mlp.gate", self.text.layers[i].mlp.gate) for i in range(self.start, self.end)]
