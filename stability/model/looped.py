"""The looped transformer: the map f of Defs. 3.1–5.2, and the fixed-depth baseline.

One iteration is x_{t+1} = step(x_t, x0) (Def. 3.3); the first iterate is x_1 = step(e, x0) with e = x0 by
default (Def. 3.1; options zeros and Gaussian noise). ``step`` is composed from named parts so that the analysis
can assemble the paper's matrices without re-implementing the model (App. A.7), with s ∈ {1, 2} the sublayer
(1 = attention, 2 = MLP):

* ``g(x, x0)``       linear recall W_x x + W_0 x0 (+ biases); the identity for autonomous models
* ``pre(s, u)``      Pre norm, inside the sublayer's input
* ``h(s, v)``        sublayer update Peri(F_s(v))
* ``residual(s, u, v)``  u + v, or the GRU cell for "gru"
* ``phi(s, u)``      outer normalisation φ_s (Post norm, Def. 3.4)

and, following the release (docs/release-differences.md), where the paper writes h_s(g(·)) the release applies
Pre first:

* external (Def. 5.1): u = g(x, x0); z = φ1(R1(u, h1(pre1(u)))); x' = φ2(R2(z, h2(pre2(z))))
* internal (Def. 5.2): z = φ1(R1(x, h1(g(pre1(x), x0)))); x' = φ2(R2(z, h2(g(pre2(z), x0))))
* none (Def. 3.2):     z = φ1(R1(x, h1(pre1(x)))); x' = φ2(R2(z, h2(pre2(z))))

With norm none, Pre = I and the forms are exactly the paper's. Norm sites per variant (docs/release-differences.md):
none –; pre: Pre; peri: Pre + Peri; post: Post; gru: Pre + Peri with the GRU residual.

Fixed-Point Reasoner options (ModelConfig; off by default, and then ``step`` is exactly the composition above):

* ``residual_scale`` β: R_s(u, v) = (1 − β)·u + β·v (pre-norm with residual scaling, FPRM Thm. 1 / App. B);
  it lives in the named part ``residual``, so the composition above still holds.
* ``conv``: a depth-wise convolution at the start of each loop, ``conv(x) = x + DWConv(x)`` (1-D over a
  sequence, 2-D over a board; FPRM App. C); the forms above then read with conv(x) in place of x.
* ``damping`` η: ``step(x, x0) = (1 − η)·x + η·undamped_step(x, x0)`` (FPRM App. A.3: the same fixed points,
  Jacobian (1 − η) I + η J).

With any of them set, J = ∂step/∂x is no longer the product of Prop. 4's factors alone; ``variant_options``
names the ones in use.
"""

from __future__ import annotations

from typing import Iterator, Optional

import torch
import torch.nn as nn

from stability.config import ModelConfig
from stability.model.attention import ATTENTION_IMPLS, Attention
from stability.model.parts import MLP, GRUResidual, LinearRecall, OutputHead, RMSNorm

#: norm variant -> (Pre, Peri, Post) sites carrying an RMSNorm
NORM_SITES = {
    "none": (False, False, False),
    "pre": (True, False, False),
    "peri": (True, True, False),
    "post": (False, False, True),
    "gru": (True, True, False),
}
OUTER_NORMS = ("post", "gru")


def _flip_rows(t: torch.Tensor) -> torch.Tensor:
    """Reverse the first spatial axis of a (B, *spatial, C) tensor (``ModelConfig.flip_rows``)."""
    return t.flip(1)


def _norms(present: bool, count: int, width: int, eps: float) -> Optional[nn.ModuleList]:
    return nn.ModuleList(RMSNorm(width, eps) for _ in range(count)) if present else None


class DepthwiseConv(nn.Module):
    """x + DWConv(x): a depth-wise convolution (one kernel per channel, zero padding, with bias) over the spatial
    axes of a (B, *spatial, d) state, 1-D for sequences and 2-D for boards (FPRM App. C). Samples stay
    independent and it works under torch.func."""

    def __init__(self, width: int, kernel: int, spatial_ndim: int):
        super().__init__()
        conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[spatial_ndim]
        self.dw = conv(width, width, kernel, padding=kernel // 2, groups=width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(x.movedim(-1, 1)).movedim(1, -1)
        return x + y


class Block(nn.Module):
    """The two sublayers (attention F_1, MLP F_2) with their norms and residuals.

    With ``share_norms`` (the release's choice) one Pre, one Peri and one Post instance, and one GRU cell, serve
    both sublayers; otherwise each sublayer has its own (the paper's φ1, φ2).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.width
        self.attn = Attention(d, cfg.heads, cfg.spatial_ndim, cfg.attention_window, cfg.rope_base,
                              cfg.qk_norm, cfg.norm_eps, cfg.window_edges, cfg.rope_precision)
        self.mlp = MLP(d, cfg.mlp_ratio)
        has_pre, has_peri, has_post = NORM_SITES[cfg.norm]
        n = 1 if cfg.share_norms else 2
        self.pre_norm = _norms(has_pre, n, d, cfg.norm_eps)
        self.peri_norm = _norms(has_peri, n, d, cfg.norm_eps)
        self.post_norm = _norms(has_post, n, d, cfg.norm_eps)
        # like the norms, one GRU cell serves both sublayers unless share_norms is off: that is what reproduces
        # the paper's parameter counts (App. B.1.2: 17.8M for the 15-block GRU baseline; see tests/model/test_model.py)
        self.gru = nn.ModuleList(GRUResidual(d) for _ in range(n)) if cfg.norm == "gru" else None
        self.residual_scale = cfg.residual_scale

    @staticmethod
    def _site(norms: Optional[nn.ModuleList], s: int, u: torch.Tensor) -> torch.Tensor:
        return u if norms is None else norms[min(s, len(norms)) - 1](u)

    def pre(self, s: int, u: torch.Tensor) -> torch.Tensor:
        return self._site(self.pre_norm, s, u)

    def h(self, s: int, v: torch.Tensor) -> torch.Tensor:
        return self._site(self.peri_norm, s, self.attn(v) if s == 1 else self.mlp(v))

    def residual(self, s: int, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """u + v; (1 − β)·u + β·v with residual scaling β; or the GRU cell."""
        if self.gru is not None:
            return self.gru[min(s, len(self.gru)) - 1](u, v)
        if self.residual_scale is None:
            return u + v
        return (1.0 - self.residual_scale) * u + self.residual_scale * v

    def phi(self, s: int, u: torch.Tensor) -> torch.Tensor:
        return self._site(self.post_norm, s, u)

    def sublayer(self, s: int, u: torch.Tensor) -> torch.Tensor:
        """u ← φ_s(R_s(u, h_s(pre_s(u)))): one sublayer without recall."""
        return self.phi(s, self.residual(s, u, self.h(s, self.pre(s, u))))


class LoopedTransformer(nn.Module):
    """Single-layer looped transformer with recall none / external / internal (Section 5, App. B.1.2).

    Public API: ``embed(inputs) -> x0``, ``initial_state(x0) -> e``, ``step(x, x0) -> x``,
    ``readout(x) -> logits``, ``forward(inputs, iterations) -> logits at every iteration``.
    States are laid out (B, *spatial, d).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.recall == "fixed":
            raise ValueError("recall 'fixed' is the FixedDepthTransformer; use build_model")
        self.config = cfg
        self.recall, self.norm, self.width = cfg.recall, cfg.norm, cfg.width
        self.input = nn.Linear(cfg.in_channels, cfg.width)
        self.recall_map = LinearRecall(cfg.width) if cfg.recall != "none" else None
        self.block = Block(cfg)
        self.head = OutputHead(cfg.width, cfg.out_channels, cfg.norm_eps)
        # created last so that the other parameters are initialised exactly as without it
        self.latent_conv = DepthwiseConv(cfg.width, cfg.conv, cfg.spatial_ndim) if cfg.conv is not None else None
        self.damping = cfg.damping

    # ---- attention implementation -------------------------------------------------------------
    @property
    def attention_impl(self) -> str:
        return self.block.attn.impl

    @attention_impl.setter
    def attention_impl(self, impl: str) -> None:
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention_impl {impl!r}; allowed: {', '.join(ATTENTION_IMPLS)}")
        self.block.attn.impl = impl

    # ---- named parts ----------------------------------------------------------------------------
    @property
    def has_outer_norm(self) -> bool:
        """Def. 3.4: φ ≠ I (post-norm, or the GRU residual)."""
        return self.norm in OUTER_NORMS

    @property
    def W_x(self) -> Optional[torch.Tensor]:
        """∂g/∂x = W_x (App. B.3), shape (d, d); None without recall."""
        return None if self.recall_map is None else self.recall_map.x.weight

    @property
    def W_0(self) -> Optional[torch.Tensor]:
        """∂g/∂x0 = W_0, shape (d, d); None without recall."""
        return None if self.recall_map is None else self.recall_map.x0.weight

    def g(self, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """Recall map g(x, x0) (Defs. 5.1 / 5.2); the identity in x for autonomous models."""
        return x if self.recall_map is None else self.recall_map(x, x0)

    def pre(self, s: int, u: torch.Tensor) -> torch.Tensor:
        return self.block.pre(s, u)

    def h(self, s: int, v: torch.Tensor) -> torch.Tensor:
        return self.block.h(s, v)

    def residual(self, s: int, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.block.residual(s, u, v)

    def phi(self, s: int, u: torch.Tensor) -> torch.Tensor:
        return self.block.phi(s, u)

    def pre1(self, u):
        return self.pre(1, u)

    def pre2(self, u):
        return self.pre(2, u)

    def h1(self, v):
        return self.h(1, v)

    def h2(self, v):
        return self.h(2, v)

    def phi1(self, u):
        return self.phi(1, u)

    def phi2(self, u):
        return self.phi(2, u)

    def conv(self, x: torch.Tensor) -> torch.Tensor:
        """The latent convolution at the start of each loop, x + DWConv(x) (FPRM App. C); x itself when off."""
        return x if self.latent_conv is None else self.latent_conv(x)

    @property
    def variant_options(self) -> dict:
        """The Fixed-Point Reasoner options in use (damping, residual_scale, conv); empty for the paper's map."""
        cfg = self.config
        out = {"damping": cfg.damping} if cfg.damping != 1.0 else {}
        out.update({name: getattr(cfg, name) for name in ("residual_scale", "conv") if getattr(cfg, name) is not None})
        return out

    # ---- the loop map ---------------------------------------------------------------------------
    def step(self, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """One iteration x_{t+1} = f(x_t, x0): Def. 5.1 (external), Def. 5.2 (internal), Def. 3.2 (none);
        with damping η < 1 the damped map (1 − η)·x + η·f(x, x0) of FPRM App. A.3."""
        fx = self.undamped_step(x, x0)
        if self.damping == 1.0:
            return fx
        return (1.0 - self.damping) * x + self.damping * fx

    def undamped_step(self, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        """f(x, x0) before damping: the composition of the named parts (module docstring), after ``conv``."""
        x = self.conv(x)
        if self.recall == "external":
            u = self.g(x, x0)
            z = self.phi(1, self.residual(1, u, self.h(1, self.pre(1, u))))
            return self.phi(2, self.residual(2, z, self.h(2, self.pre(2, z))))
        if self.recall == "internal":
            z = self.phi(1, self.residual(1, x, self.h(1, self.g(self.pre(1, x), x0))))
            return self.phi(2, self.residual(2, z, self.h(2, self.g(self.pre(2, z), x0))))
        z = self.phi(1, self.residual(1, x, self.h(1, self.pre(1, x))))
        return self.phi(2, self.residual(2, z, self.h(2, self.pre(2, z))))

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        """x0 = Linear(C_in → d)(inputs), no normalisation (docs/release-differences.md); with ``flip_rows``
        the inputs' first spatial axis is reversed first (a release chess checkpoint's layout)."""
        return self.input(_flip_rows(inputs) if self.config.flip_rows else inputs)

    def initial_state(self, x0: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """The first iterate e (Def. 3.1): x0 itself (default), zeros, or Gaussian noise of std ``noise_std``."""
        kind = self.config.initial_state
        if kind == "x0":
            return x0
        if kind == "zeros":
            return torch.zeros_like(x0)
        noise = torch.randn(x0.shape, generator=generator, device=x0.device if generator is None else generator.device,
                            dtype=x0.dtype)
        return noise.to(x0.device) * self.config.noise_std

    def readout(self, x: torch.Tensor) -> torch.Tensor:
        """Logits per position, (B, *spatial, C_out), in the task's layout (flipped back with ``flip_rows``)."""
        logits = self.head(x)
        return _flip_rows(logits) if self.config.flip_rows else logits

    def trajectory(self, inputs: torch.Tensor, iterations: int,
                   e: Optional[torch.Tensor] = None) -> Iterator[torch.Tensor]:
        """Yield x_1 … x_T (x_1 = f(e, x0)) without storing them."""
        x0 = self.embed(inputs)
        x = self.initial_state(x0) if e is None else e
        for _ in range(iterations):
            x = self.step(x, x0)
            yield x

    def forward(self, inputs: torch.Tensor, iterations: int) -> torch.Tensor:
        """Logits after every iteration, shape (iterations, B, *spatial, C_out)."""
        return torch.stack([self.readout(x) for x in self.trajectory(inputs, iterations)])


class FixedDepthTransformer(nn.Module):
    """The fixed-depth baseline: ``depth`` separately parameterised blocks of the same norm variant, no
    recall, run once. ``forward(inputs, iterations)`` repeats its one output so that it can be scored like a
    looped model (the release's code re-runs the stack at every "iteration"; its grid scores the baseline at
    iteration 1 only: docs/release-differences.md); it has no loop map, so the fixed-point analysis does not
    apply to it."""

    recall = "fixed"

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.norm, self.width = cfg.norm, cfg.width
        self.input = nn.Linear(cfg.in_channels, cfg.width)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        self.head = OutputHead(cfg.width, cfg.out_channels, cfg.norm_eps)

    @property
    def attention_impl(self) -> str:
        return self.blocks[0].attn.impl

    @attention_impl.setter
    def attention_impl(self, impl: str) -> None:
        if impl not in ATTENTION_IMPLS:
            raise ValueError(f"attention_impl {impl!r}; allowed: {', '.join(ATTENTION_IMPLS)}")
        for b in self.blocks:
            b.attn.impl = impl

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.input(_flip_rows(inputs) if self.config.flip_rows else inputs)

    def readout(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.head(x)
        return _flip_rows(logits) if self.config.flip_rows else logits

    def features(self, inputs: torch.Tensor) -> torch.Tensor:
        u = self.embed(inputs)
        for block in self.blocks:
            u = block.sublayer(2, block.sublayer(1, u))
        return u

    def forward(self, inputs: torch.Tensor, iterations: int = 1) -> torch.Tensor:
        logits = self.readout(self.features(inputs))
        return logits.unsqueeze(0).expand(iterations, *logits.shape)


def build_model(cfg: ModelConfig) -> nn.Module:
    """The model a ModelConfig describes: LoopedTransformer, or FixedDepthTransformer for recall 'fixed'."""
    return FixedDepthTransformer(cfg) if cfg.recall == "fixed" else LoopedTransformer(cfg)
