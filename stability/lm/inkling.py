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

from stability.lm import diagonal
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

    def diagonal_tangents(self):
        """The one-pass diagonal product's context (:mod:`stability.lm.diagonal`): the ops that couple positions with
        the diagonal tangent: the eager attention over tokens (not the attention over a token's block states), the
        short causal convolutions (``causal_conv1d_fn``) and the dynamic ones (per-token taps: their tangent kept
        whole; the window: the token itself only)."""
        from transformers.models.inkling2_loop import modeling_inkling2_loop as hf

        token_attention = lambda module: isinstance(  # noqa: E731
            module, (hf.Inkling2LoopSlidingAttention, hf.Inkling2LoopFullAttention))
        attention = diagonal.eager_attention(hf.eager_attention_forward, hf.repeat_kv, token_attention)
        return diagonal.patched((hf, {"eager_attention_forward": attention,
                                      "causal_conv1d_fn": _diagonal_conv(hf.causal_conv1d_fn)}),
                                (hf.Inkling2LoopDynamicShortConvolution, {"forward": _diagonal_dynamic_conv}))

    def routers(self) -> list:
        return [(f"layers.{i}.mlp.gate", self.text.layers[i].mlp.gate) for i in range(self.start, self.end)]


def _diagonal_conv(original):
    """``causal_conv1d_fn`` (x (B, C, T), weight (C, K): y_t = Σ_k w_k x_{t+k−K+1}) with the tangent of the tap k =
    K − 1 only (the token itself): :func:`stability.lm.diagonal.conv_diagonal`."""
    from transformers.activations import ACT2FN

    def conv(hidden_states, weight, bias=None, activation=None, **kwargs):
        out = original(hidden_states.detach(), weight, bias, activation=None, **kwargs)
        out = diagonal.conv_diagonal(out, hidden_states.to(weight.dtype), weight[:, -1:]).to(out.dtype)
        return (ACT2FN[activation](out) if activation is not None else out).to(hidden_states.dtype)

    return conv


def _diagonal_dynamic_conv(self, hidden_states, dynamic_input, cache=None, conv_mask=None, cache_offset=0, **kw):
    """``Inkling2LoopDynamicShortConvolution.forward`` (transformers 5.25, no cache, no ``seq_idx``) with the
    diagonal tangent: the per-token taps (from ``dynamic_input`` at the token) keep theirs, the window of earlier
    tokens is cut but for the token itself (lag 0)."""
    import math

    from transformers.models.inkling2_loop.modeling_inkling2_loop import apply_mask_to_padding_states

    if cache is not None or kw.get("seq_idx") is not None:
        raise NotImplementedError("the diagonal dynamic convolution takes no cache and no seq_idx")
    input_dtype, (B, T, C), K = hidden_states.dtype, hidden_states.shape, self.conv_kernel_size
    dynamic = self.weight_proj(dynamic_input).float().view(B, T, self.num_heads, 1, K)
    weights = self.static_weight.float().T.view(self.num_heads, -1, K) + dynamic
    hidden_states = hidden_states.float()
    residual = hidden_states
    context = apply_mask_to_padding_states(hidden_states, conv_mask).transpose(1, 2)
    context = torch.nn.functional.pad(context, (K - 1, 0))[..., -(T + K - 1):]
    windows = context.unfold(-1, K, 1).flip(-1).transpose(1, 2)  # windows[..., lag]: the token lag steps back
    windows = windows.reshape(B, T, self.num_heads, -1, K)
    hidden_states = (windows.detach() * weights).sum(-1)  # the value as the model computes it, the taps' tangent
    hidden_states = diagonal.conv_diagonal(hidden_states, windows[..., 0], weights[..., 0].detach()).reshape(B, T, C)
    return ((hidden_states + residual) / math.sqrt(2 * K + 1)).to(input_dtype)
