"""A reference recurrent-depth language model in the style of Huginn (Geiping et al., 2025, "Scaling up test-time
compute with latent reasoning"), small and readable, written directly as an :class:`~stability.lm.LMAdapter`.

Three parts, each a stack of causal "sandwich" blocks (a norm before and after each sublayer:
x ← n₂(x + attn(n₁ x)), x ← n₄(x + mlp(n₃ x)), which keeps the recurrent state on the sphere's scale)::

    prelude:  e = P(embed(ids))                          the input injection x0 (per token, width d)
    start:    s₀ ~ N(0, σ²)                              a random initial state (``initial_state`` with a generator)
    step:     s ← R(A[s; e])                             A: the concat adapter, a linear map 2d → d
    coda:     logits = head(norm(C(s)))

so x0 = e (+ the context channels), the state is s (+ mask and positions, which the coda's attention needs), and
the model's own depth is ``mean_recurrence`` steps. :func:`tiny` builds a seeded instance for tests and examples
(``stability analyze --model stability.lm.huginn:tiny --inputs ids.pt``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from stability.lm import diagonal
from stability.lm.adapter import LMAdapter
from stability.lm.inputs import LMInputs, attention_bias


@dataclass
class HuginnConfig:
    """The sizes of :class:`Huginn` (defaults: a tiny model for tests)."""

    vocab_size: int = 64
    hidden: int = 32
    heads: int = 4
    mlp: int = 64
    prelude_layers: int = 1
    core_layers: int = 2
    coda_layers: int = 1
    mean_recurrence: int = 8
    init_std: float = 0.4
    rope_base: float = 10000.0


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def rotate(x: torch.Tensor, pos: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary position embedding of x (B, heads, T, hd) at positions pos (B, T)."""
    hd = x.shape[-1]
    freq = base ** (-torch.arange(0, hd, 2, dtype=x.dtype, device=x.device) / hd)
    ang = pos.to(x.dtype)[:, None, :, None] * freq  # (B, 1, T, hd/2)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1), torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    def __init__(self, cfg: HuginnConfig):
        super().__init__()
        self.heads, self.base = cfg.heads, cfg.rope_base
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden, bias=False)
        self.out = nn.Linear(cfg.hidden, cfg.hidden, bias=False)

    def forward(self, x, bias, pos):
        B, T, d = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, pos, self.base), rotate(k, pos, self.base)
        w = torch.softmax(q @ diagonal.cut(k).transpose(-1, -2) / math.sqrt(d // self.heads) + bias, dim=-1)
        o = diagonal.attention_diagonal(w @ diagonal.cut(v), w, q, k, v, 1 / math.sqrt(d // self.heads))
        return self.out(o.transpose(1, 2).reshape(B, T, d))


class Block(nn.Module):
    """The sandwich block: x ← n₂(x + attn(n₁ x)); x ← n₄(x + mlp(n₃ x)), the MLP a gated SiLU."""

    def __init__(self, cfg: HuginnConfig):
        super().__init__()
        self.norms = nn.ModuleList(RMSNorm(cfg.hidden) for _ in range(4))
        self.attn = Attention(cfg)
        self.gate_up = nn.Linear(cfg.hidden, 2 * cfg.mlp, bias=False)
        self.down = nn.Linear(cfg.mlp, cfg.hidden, bias=False)

    def forward(self, x, bias, pos):
        n1, n2, n3, n4 = self.norms
        x = n2(x + self.attn(n1(x), bias, pos))
        g, u = self.gate_up(n3(x)).chunk(2, dim=-1)
        return n4(x + self.down(nn.functional.silu(g) * u))


class Huginn(LMAdapter):
    """The reference recurrent-depth LM (module docstring)."""

    readout_context = "context"
    injection_names = ("adapter",)

    def __init__(self, cfg: Optional[HuginnConfig] = None):
        super().__init__()
        cfg = cfg or HuginnConfig()
        self.cfg = cfg
        self.embedding = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.prelude = nn.ModuleList(Block(cfg) for _ in range(cfg.prelude_layers))
        self.adapter = nn.Linear(2 * cfg.hidden, cfg.hidden, bias=False)
        self.core = nn.ModuleList(Block(cfg) for _ in range(cfg.core_layers))
        self.coda = nn.ModuleList(Block(cfg) for _ in range(cfg.coda_layers))
        self.norm = RMSNorm(cfg.hidden)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        self.carry_channels = cfg.hidden
        self.model_steps = cfg.mean_recurrence

    @staticmethod
    def _stack(blocks, x, mask, pos):
        bias = attention_bias(mask, x.dtype)
        for block in blocks:
            x = block(x, bias, pos)
        return x

    def injection(self, lm: LMInputs) -> torch.Tensor:
        return self._stack(self.prelude, self.embedding(lm.ids), lm.mask, lm.positions)

    def first(self, h, mask, pos, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        g = generator if generator is not None else torch.Generator(device="cpu").manual_seed(0)
        return (self.cfg.init_std * torch.randn(h.shape, generator=g, dtype=h.dtype, device=g.device)).to(h.device)

    def loop(self, carry, h, mask, pos) -> torch.Tensor:
        return self._stack(self.core, self.adapter(torch.cat([carry, h], dim=-1)), mask, pos)

    def head(self, carry, h, mask, pos) -> torch.Tensor:
        return self.lm_head(self.norm(self._stack(self.coda, carry, mask, pos)))

    def diagonal_tangents(self):
        """The context of the one-pass diagonal product (:mod:`stability.lm.diagonal`): the attention is the only op
        that couples positions, and it reads the flag."""
        return diagonal.tangent_mode()


def tiny(seed: int = 0, **sizes) -> Huginn:
    """A seeded :class:`Huginn` of :class:`HuginnConfig`'s sizes (overridden by ``sizes``), in eval mode."""
    with torch.random.fork_rng(devices=[]):  # the caller's random state is left as it was
        torch.manual_seed(seed)
        return Huginn(HuginnConfig(**sizes)).eval()
