"""Attention of the looped block (App. B.1.2; facts file): 8 heads, multidimensional RoPE, QK-norm.

Two implementations that give the same numbers (tested):

* ``math``: explicit softmax(QKᵀ/√d_h)V. Works under torch.func (jvp, vjp, vmap, jacrev, jacfwd), which the
  fused kernels do not (forward-mode AD is not implemented for them). With a local window it computes only the
  banded scores, (L × window) instead of (L × L), so 512-bit prefix sums stay cheap.
* ``sdpa``: torch's fused ``scaled_dot_product_attention`` for training speed (flash / memory-efficient kernels
  on CUDA).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from stability.model.parts import RMSNorm

ATTENTION_IMPLS = ("math", "sdpa")


def rope_tables(spatial: tuple[int, ...], head_dim: int, base: float, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (L, head_dim/2) for RoPE over each spatial axis (frequencies split evenly across axes).

    Axis a rotates the pairs [a·P, (a+1)·P) with P = head_dim / (2·ndim), at frequencies base^(−2i/(2P)).
    """
    ndim = len(spatial)
    pairs = head_dim // (2 * ndim)
    inv_freq = base ** (-torch.arange(pairs, device=device, dtype=torch.float64) / pairs)
    grids = torch.meshgrid(*[torch.arange(n, device=device, dtype=torch.float64) for n in spatial], indexing="ij")
    angles = torch.cat([g.reshape(-1, 1) * inv_freq for g in grids], dim=-1)  # (L, head_dim/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of the last axis. x: (..., L, head_dim)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Non-causal local attention |i − j| ≤ window//2, computing only the band. q, k, v: (B, H, L, D)."""
    half = window // 2
    L = q.shape[-2]
    kp = F.pad(k, (0, 0, half, half)).unfold(-2, window, 1)  # (B, H, L, D, window)
    vp = F.pad(v, (0, 0, half, half)).unfold(-2, window, 1)
    scores = torch.einsum("bhld,bhldw->bhlw", q, kp) / math.sqrt(q.shape[-1])
    pos = torch.arange(L, device=q.device).unsqueeze(1) + torch.arange(-half, half + 1, device=q.device)
    valid = (pos >= 0) & (pos < L)  # (L, window): padded neighbours are masked out
    scores = scores.masked_fill(~valid, float("-inf"))
    return torch.einsum("bhlw,bhldw->bhld", scores.softmax(-1), vp)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """softmax(QKᵀ/√D + mask)V written out, for torch.func. mask: bool (L, L), True = may attend."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


def window_mask(L: int, window: int, device) -> torch.Tensor:
    idx = torch.arange(L, device=device)
    return (idx[:, None] - idx[None, :]).abs() <= window // 2


class Attention(nn.Module):
    """Multi-head self-attention over the flattened spatial positions of a (B, *spatial, d) state.

    qkv = Linear(d, 3d) and output Linear(d, d), both with bias, no dropout; RoPE over each spatial axis; then
    QK-norm (RMSNorm over the head dimension, after RoPE, as in the release); full bidirectional attention,
    or a non-causal local window of ``window`` tokens (prefix sums).
    """

    def __init__(self, width: int, heads: int, spatial_ndim: int, window: Optional[int], rope_base: float,
                 qk_norm: bool, eps: float):
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.spatial_ndim, self.window, self.rope_base = spatial_ndim, window, rope_base
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.q_norm = RMSNorm(self.head_dim, eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim, eps) if qk_norm else nn.Identity()
        self.impl = "math"
        self._rope_cache: dict = {}

    def _rope(self, spatial, device, dtype):
        key = (tuple(spatial), str(device), dtype)
        if key not in self._rope_cache:
            self._rope_cache[key] = rope_tables(tuple(spatial), self.head_dim, self.rope_base, device, dtype)
        return self._rope_cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, spatial, d = x.shape[0], x.shape[1:-1], x.shape[-1]
        L = math.prod(spatial)
        qkv = self.qkv(x.reshape(B, L, d)).reshape(B, L, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (B, H, L, D)
        cos, sin = self._rope(spatial, x.device, q.dtype)
        q, k = self.q_norm(apply_rope(q, cos, sin)), self.k_norm(apply_rope(k, cos, sin))
        if self.impl == "sdpa":
            mask = window_mask(L, self.window, x.device) if self.window is not None else None
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif self.window is not None:
            y = banded_attention(q, k, v, self.window)
        else:
            y = dense_attention(q, k, v, None)
        return self.out(y.transpose(1, 2).reshape(B, *spatial, d))
