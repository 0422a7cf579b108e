"""The diagonal blocks of a causal J* applied in one forward-mode pass (docs/language-models.md, "Per-token ρ").

Per-token ρ needs ∂f_t/∂x_t V_t for every token t. A forward-mode product J·V with a tangent V on every position
at once mixes positions, but only through the ops that couple positions: attention and causal convolutions; every
other op of a transformer step (linear layers, MLPs, experts, norms, residuals) acts per position, so its
derivative is already block-diagonal. Under :func:`tangent_mode` each coupling op computes its primal exactly as
before (the same operations on the same values) and lets the tangent through only along the diagonal; then one
``torch.func.jvp`` of the step gives (∂f_t/∂x_t V_t) for all t at once, where the per-position route takes T
products.

The rules (``cut`` = the value without its tangent):

* attention out_t = Σ_j w_tj v_j, w_t = softmax_j(s q_t·k_j + b_tj): the query side (q_t and a bias or sink
  computed from token t) keeps its whole tangent, and of the keys and values only the j = t term:
  d out_t = (∂out_t/∂q_t) dq_t + w_tt (s (q_t·dk_t) (v_t − out_t) + dv_t) (the softmax's derivative along
  s_tt): :func:`attention_diagonal`, after the attention is computed on cut keys and values;
* a causal convolution y_t = Σ_l w_l x_{t−l}: only the tap l = 0 (:func:`conv_diagonal`).

The contexts: :class:`SdpaDiagonal` (a ``TorchFunctionMode`` that computes
``torch.nn.functional.scaled_dot_product_attention`` by its mathematical definition with the diagonal tangent),
and the flag :func:`tangent_mode` that the reference Huginn's attention reads (:mod:`stability.lm.huginn`); the
``transformers`` adapters wrap their model's attention and convolution functions in theirs
(:meth:`stability.lm.HrmTextAdapter.diagonal_tangents`, :meth:`stability.lm.InklingLoopAdapter.diagonal_tangents`).
A model states its context by a method ``diagonal_tangents()`` (returning a context manager, or None: unknown);
the per-token ρ checks the one-pass product against the per-position one before trusting it
(:mod:`stability.lm.tokens`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import torch
from torch.overrides import TorchFunctionMode

_ACTIVE = contextvars.ContextVar("stability_diagonal_tangents", default=False)


def active() -> bool:
    """Whether the coupling ops should pass the tangent along the diagonal only (inside :func:`tangent_mode`)."""
    return _ACTIVE.get()


@contextlib.contextmanager
def tangent_mode():
    """Within: :func:`cut` cuts tangents and :func:`attention_diagonal` adds the diagonal term (outside both are
    the identity, so a model's ordinary forward and its gradients are untouched)."""
    token = _ACTIVE.set(True)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def cut(x: torch.Tensor) -> torch.Tensor:
    """x without its tangent inside :func:`tangent_mode` (the same values), x itself outside."""
    return x.detach() if active() else x


def _delta(term: torch.Tensor) -> torch.Tensor:
    """term − cut(term): exactly 0 as a value, the tangent of ``term`` as a tangent."""
    return term - term.detach()


def attention_diagonal(out: torch.Tensor, w: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       scale: float) -> torch.Tensor:
    """``out`` (…, T, hd), computed from q with cut keys and values and weights w (…, T, T), plus the j = t term of
    the keys' and values' tangents: w_tt (s (q_t·dk_t)(v_t − out_t) + dv_t) (module docstring); the value is
    ``out``'s exactly. k and v (…, T, hd) as the heads read them (grouped heads repeated). Identity outside
    :func:`tangent_mode`."""
    if not active():
        return out
    wd = w.detach().diagonal(dim1=-2, dim2=-1).unsqueeze(-1)
    s = scale * (q.detach() * k).sum(-1, keepdim=True)
    return out + _delta(wd * (s * (v.detach() - out.detach()) + v))


def conv_diagonal(out: torch.Tensor, x: torch.Tensor, w0: torch.Tensor) -> torch.Tensor:
    """``out`` of a causal convolution computed on cut inputs, plus the tangent of the tap that reads the token
    itself: w0 · dx_t (w0 broadcast against x). The value is ``out``'s exactly."""
    return out + _delta(w0 * x)


def _sdpa_math(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """scaled_dot_product_attention by its definition: (out, weights); queries and keys of equal length only."""
    if dropout_p:
        raise NotImplementedError("the diagonal attention has no dropout")
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        r = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(r, dim=-3), v.repeat_interleave(r, dim=-3)
    logits = (q @ cut(k).transpose(-2, -1)) * s
    T = q.shape[-2]
    if is_causal:
        keep = torch.ones(T, k.shape[-2], dtype=torch.bool, device=q.device).tril()
        logits = logits.masked_fill(~keep, float("-inf"))
    if attn_mask is not None:
        logits = logits.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else \
            logits + attn_mask
    w = torch.softmax(logits, dim=-1)
    return attention_diagonal(w @ cut(v), w, q, k, v, s)


class SdpaDiagonal(TorchFunctionMode):
    """Self-attention by ``scaled_dot_product_attention`` with the diagonal tangent (module docstring), computed
    by its definition (forward mode has no rule for the CPU's fused kernels); the flag of :func:`tangent_mode` is
    set within. Attention whose queries and keys differ in length (cross attention: no diagonal) runs as is."""

    def __enter__(self):
        self._token = _ACTIVE.set(True)
        return super().__enter__()

    def __exit__(self, *exc):
        _ACTIVE.reset(self._token)
        return super().__exit__(*exc)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention and args[0].shape[-2] == args[1].shape[-2]:
            return _sdpa_math(*args, **kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def patched(*patches):
    """:func:`tangent_mode` with, within, the attributes of each (namespace, {name: function}) of ``patches`` (a
    module or a class) replaced by those functions; restored after."""
    old = [(ns, {name: getattr(ns, name) for name in fns}) for ns, fns in patches]
    try:
        for ns, fns in patches:
            for name, fn in fns.items():
                setattr(ns, name, fn)
        with tangent_mode():
            yield
    finally:
        for ns, fns in old:
            for name, fn in fns.items():
                setattr(ns, name, fn)


def eager_attention(original, repeat_kv, token_attention=lambda module: True):
    """A ``transformers`` eager attention function (``original(module, query, key, value, attention_mask,
    scaling, ...) -> (out (B, T, H, hd), weights)``) with the diagonal tangent where ``token_attention(module)``
    (attention over tokens; others, e.g. attention over a layer's block states, act per token and keep their
    tangent). ``repeat_kv``: the model's repetition of grouped key/value heads."""

    def attention(module, query, key, value, attention_mask, scaling, *args, **kwargs):
        if not (active() and token_attention(module)):
            return original(module, query, key, value, attention_mask, scaling, *args, **kwargs)
        out, w = original(module, query, key.detach(), value.detach(), attention_mask, scaling, *args, **kwargs)
        groups = module.num_key_value_groups
        k, v = repeat_kv(key, groups), repeat_kv(value, groups)
        return attention_diagonal(out.transpose(1, 2), w, query, k, v, scaling).transpose(1, 2).contiguous(), w

    return attention
