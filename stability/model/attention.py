"""Attention of the looped block (App. B.1.2; docs/release-differences.md): 8 heads, multidimensional RoPE,
QK-norm, full or local.

Three implementations that give the same numbers to rounding (math and sdpa tested):

* ``math``: explicit softmax(QKᵀ/√d_h)V. Works under torch.func (jvp, vjp, vmap, jacrev, jacfwd), which the
  fused kernels do not (forward-mode AD is not implemented for them). With a local window it computes only the
  scores of each query's neighbours, (L × window) instead of (L × L), so 512-bit prefix sums stay cheap.
* ``dense``: the ``math`` route's dense softmax(QKᵀ/√d_h + mask)V with sdpa's mask, batched by torch.vmap
  (ensembles: torch has no vmap rule for the CPU's fused sdpa).
* ``sdpa``: torch's fused ``scaled_dot_product_attention`` for training speed (flash / memory-efficient kernels
  on CUDA), with the local window as a boolean mask.

The local window at the ends of a sequence (``window_edges``, docs/release-differences.md):

* ``shift`` (the release's neighbourhood attention, the default): every query attends exactly ``window`` keys;
  along each spatial axis of length n, query i sees keys start … start+w−1 with w = min(window, n) and
  start = clamp(i − window//2, 0, n − w). On a board the neighbourhood is the product of the per-axis windows.
* ``cut`` (this toolkit before the release was matched): the band |i − j| ≤ window//2 over the flattened
  positions, cut at the ends (window//2 + 1 keys for the first and last query).

RoPE angles (``rope_precision``): computed in float32 (the release) or float64, then cast to the activations'
dtype.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from stability.model.parts import RMSNorm

ATTENTION_IMPLS = ("math", "sdpa", "dense")
WINDOW_EDGES = ("shift", "cut")
ROPE_PRECISIONS = {"float32": torch.float32, "float64": torch.float64}


def rope_tables(spatial: tuple[int, ...], head_dim: int, base: float, device, dtype,
                precision: str = "float64") -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (L, head_dim/2) for RoPE over each spatial axis (frequencies split evenly across axes).

    Axis a rotates the pairs [a·P, (a+1)·P) with P = head_dim / (2·ndim), at frequencies base^(−i/P).
    The angles position × frequency and their cos/sin are computed in ``precision`` (float32 as the release,
    or float64), then cast to ``dtype``.
    """
    ndim = len(spatial)
    pairs = head_dim // (2 * ndim)
    work = ROPE_PRECISIONS[precision]
    if precision == "float32":  # the release's formula, in float32
        inv_freq = 1.0 / base ** (torch.arange(pairs, device=device, dtype=work) / pairs)
    else:  # this toolkit's before the release was matched (kept bit for bit for existing checkpoints)
        inv_freq = base ** (-torch.arange(pairs, device=device, dtype=work) / pairs)
    grids = torch.meshgrid(*[torch.arange(n, device=device, dtype=work) for n in spatial], indexing="ij")
    angles = torch.cat([g.reshape(-1, 1) * inv_freq for g in grids], dim=-1)  # (L, head_dim/2)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of the last axis. x: (..., L, head_dim)."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


def banded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int) -> torch.Tensor:
    """Non-causal local attention |i − j| ≤ window//2 over the flattened positions, cut at the ends
    (``window_edges`` cut), computing only the band. q, k, v: (B, H, L, D)."""
    half = window // 2
    L = q.shape[-2]
    kp = F.pad(k, (0, 0, half, half)).unfold(-2, window, 1)  # (B, H, L, D, window)
    vp = F.pad(v, (0, 0, half, half)).unfold(-2, window, 1)
    scores = torch.einsum("bhld,bhldw->bhlw", q, kp) / math.sqrt(q.shape[-1])
    pos = torch.arange(L, device=q.device).unsqueeze(1) + torch.arange(-half, half + 1, device=q.device)
    valid = (pos >= 0) & (pos < L)  # (L, window): padded neighbours are masked out
    scores = scores.masked_fill(~valid, float("-inf"))
    return torch.einsum("bhlw,bhldw->bhld", scores.softmax(-1), vp)


def shifted_neighbours(spatial: tuple[int, ...], window: int, device) -> torch.Tensor:
    """Flat key indices (L, K) each query attends with shifted windows (``window_edges`` shift).

    Along an axis of length n a query at i sees start … start+w−1, w = min(window, n),
    start = clamp(i − window//2, 0, n − w); over several axes the neighbourhood is the product, K = ∏ w_a,
    so every query sees the same number of keys. Keys are listed in increasing flat index.
    """
    flat = torch.zeros(1, 1, dtype=torch.long, device=device)  # (positions so far, neighbours so far)
    for n in spatial:
        w = min(window, n)
        start = (torch.arange(n, device=device) - window // 2).clamp(0, n - w)
        axis = start[:, None] + torch.arange(w, device=device)  # (n, w)
        flat = (flat[:, None, :, None] * n + axis[None, :, None, :]).reshape(flat.shape[0] * n, -1)
    return flat


def neighbour_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, nb: torch.Tensor) -> torch.Tensor:
    """softmax over each query's neighbours ``nb`` (L, K) only: O(L·K) scores and memory, torch.func-safe.
    q, k, v: (B, H, L, D)."""
    kn, vn = k[..., nb, :], v[..., nb, :]  # (B, H, L, K, D)
    scores = torch.einsum("bhld,bhlkd->bhlk", q, kn) / math.sqrt(q.shape[-1])
    return torch.einsum("bhlk,bhlkd->bhld", scores.softmax(-1), vn)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """softmax(QKᵀ/√D + mask)V written out, for torch.func. mask: bool (L, L), True = may attend."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1) @ v


def _dense_exp_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         mask: Optional[torch.Tensor]) -> torch.Tensor:
    """:func:`dense_attention` with the softmax written as exp / sum: the ``dense`` implementation (ensembles,
    stability/train/ensemble.py), since torch's CPU softmax over short rows (L = 11) is several times slower than
    one exp over the whole tensor."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    e = (scores - scores.amax(-1, keepdim=True).detach()).exp()
    return (e / e.sum(-1, keepdim=True)) @ v


def window_mask(L: int, window: int, device) -> torch.Tensor:
    """Bool (L, L), True = may attend: the cut band |i − j| ≤ window//2 over flattened positions."""
    idx = torch.arange(L, device=device)
    return (idx[:, None] - idx[None, :]).abs() <= window // 2


def shifted_window_mask(spatial: tuple[int, ...], window: int, device) -> torch.Tensor:
    """Bool (L, L), True = may attend: the shifted neighbourhoods of ``shifted_neighbours``."""
    nb = shifted_neighbours(spatial, window, device)
    mask = torch.zeros(nb.shape[0], nb.shape[0], dtype=torch.bool, device=device)
    return mask.scatter_(1, nb, True)


class Attention(nn.Module):
    """Multi-head self-attention over the flattened spatial positions of a (B, *spatial, d) state.

    qkv = Linear(d, 3d) and output Linear(d, d), both with bias, no dropout; RoPE over each spatial axis; then
    QK-norm (RMSNorm over the head dimension, after RoPE, as in the release); full bidirectional attention,
    or a non-causal local window of ``window`` tokens (prefix sums) whose ends follow ``window_edges``
    (module docstring). ``eps`` None: the QK-norms use the input dtype's machine epsilon.
    """

    def __init__(self, width: int, heads: int, spatial_ndim: int, window: Optional[int], rope_base: float,
                 qk_norm: bool, eps: Optional[float], window_edges: str = "cut", rope_precision: str = "float64"):
        super().__init__()
        if window_edges not in WINDOW_EDGES:
            raise ValueError(f"window_edges {window_edges!r}; allowed: {', '.join(WINDOW_EDGES)}")
        if rope_precision not in ROPE_PRECISIONS:
            raise ValueError(f"rope_precision {rope_precision!r}; allowed: {', '.join(ROPE_PRECISIONS)}")
        self.heads, self.head_dim = heads, width // heads
        self.spatial_ndim, self.window, self.rope_base = spatial_ndim, window, rope_base
        self.window_edges, self.rope_precision = window_edges, rope_precision
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.q_norm = RMSNorm(self.head_dim, eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim, eps) if qk_norm else nn.Identity()
        self.impl = "math"
        self._rope_cache: dict = {}
        self._window_cache: dict = {}

    def _rope(self, spatial, device, dtype):
        key = (tuple(spatial), str(device), dtype)
        if key not in self._rope_cache:
            self._rope_cache[key] = rope_tables(tuple(spatial), self.head_dim, self.rope_base, device, dtype,
                                                self.rope_precision)
        return self._rope_cache[key]

    def _window(self, kind: str, spatial, device) -> torch.Tensor:
        """Cached neighbour table ("nb") or boolean mask ("mask") of the local window."""
        key = (kind, tuple(spatial), str(device))
        if key not in self._window_cache:
            if self.window_edges == "cut":
                table = window_mask(math.prod(spatial), self.window, device)
            elif kind == "nb":
                table = shifted_neighbours(tuple(spatial), self.window, device)
            else:
                table = shifted_window_mask(tuple(spatial), self.window, device)
            self._window_cache[key] = table
        return self._window_cache[key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, spatial, d = x.shape[0], x.shape[1:-1], x.shape[-1]
        L = math.prod(spatial)
        qkv = self.qkv(x.reshape(B, L, d)).reshape(B, L, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (B, H, L, D)
        cos, sin = self._rope(spatial, x.device, q.dtype)
        q, k = self.q_norm(apply_rope(q, cos, sin)), self.k_norm(apply_rope(k, cos, sin))
        if self.impl == "sdpa":
            mask = self._window("mask", spatial, x.device) if self.window is not None else None
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif self.impl == "dense":  # sdpa's computation written out (torch.vmap batches it: ensembles)
            y = _dense_exp_attention(q, k, v, self._window("mask", spatial, x.device) if self.window is not None
                                     else None)
        elif self.window is not None and self.window_edges == "cut":
            y = banded_attention(q, k, v, self.window)
        elif self.window is not None:
            y = neighbour_attention(q, k, v, self._window("nb", spatial, x.device))
        else:
            y = dense_attention(q, k, v, None)
        return self.out(y.transpose(1, 2).reshape(B, *spatial, d))
