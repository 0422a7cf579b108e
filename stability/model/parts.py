"""Building blocks of the loop map, each a pure function of its tensors (usable under torch.func).

RMSNorm (all normalisation sites, App. B.1.2), the GELU MLP, the linear recall g(x, x0) = W_x x + W_0 x0
(+ biases) of Defs. 5.1 / 5.2 and App. B.3, and the GRU residual (docs/release-differences.md). They are
written out with elementary ops rather than ``nn.RMSNorm`` / ``nn.GRUCell`` so that forward-mode AD works for
every one.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """x / sqrt(mean(x²) + eps) · gain, over the last axis (learnable gain, no bias).

    ``eps`` None (the release's ``nn.RMSNorm(d)``): the machine epsilon of the input's dtype,
    torch.finfo(x.dtype).eps (1.19e-7 in float32, 2.2e-16 in float64); a number: that constant.
    """

    def __init__(self, width: int, eps: Optional[float] = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * self.weight


class MLP(nn.Module):
    """Linear(d, r·d) → GELU → Linear(r·d, d): the second sublayer F_2."""

    def __init__(self, width: int, ratio: int):
        super().__init__()
        self.fc = nn.Linear(width, ratio * width)
        self.proj = nn.Linear(ratio * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class LinearRecall(nn.Module):
    """g(x, x0) = W_x x + b_x + W_0 x0 + b_0 (both Linear layers carry a bias, as in the release)."""

    def __init__(self, width: int):
        super().__init__()
        self.x = nn.Linear(width, width)
        self.x0 = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
        return self.x(x) + self.x0(x0)


class GRUResidual(nn.Module):
    """R(u, v) = GRUCell(input=v, hidden=u), per token: the "gru" outer normalisation (Remark 1).

    Same equations and parameter layout (gates r, z, n) as ``torch.nn.GRUCell``. Init as in the release:
    input weights Xavier-uniform, hidden weights ONE orthogonal (3d × d) matrix (orthonormal columns over all
    three gates together, weight_hhᵀ weight_hh = I), biases 0 except the update-gate (z) slice of both biases,
    set to 1, so that the state starts close to the identity residual (docs/release-differences.md).
    """

    def __init__(self, width: int):
        super().__init__()
        self.width = width
        self.weight_ih = nn.Parameter(torch.empty(3 * width, width))
        self.weight_hh = nn.Parameter(torch.empty(3 * width, width))
        self.bias_ih = nn.Parameter(torch.zeros(3 * width))
        self.bias_hh = nn.Parameter(torch.zeros(3 * width))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        d = self.width
        with torch.no_grad():
            nn.init.xavier_uniform_(self.weight_ih)
            nn.init.orthogonal_(self.weight_hh)
            self.bias_ih.zero_()
            self.bias_hh.zero_()
            self.bias_ih[d:2 * d] = 1.0
            self.bias_hh[d:2 * d] = 1.0

    def forward(self, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        gi = F.linear(v, self.weight_ih, self.bias_ih)
        gh = F.linear(u, self.weight_hh, self.bias_hh)
        i_r, i_z, i_n = gi.chunk(3, dim=-1)
        h_r, h_z, h_n = gh.chunk(3, dim=-1)
        r = torch.sigmoid(i_r + h_r)
        z = torch.sigmoid(i_z + h_z)
        n = torch.tanh(i_n + r * h_n)
        return (1 - z) * n + z * u


class OutputHead(nn.Module):
    """Per-token head: RMSNorm → Linear(d, d) → GELU → Linear(d, C_out) (docs/release-differences.md)."""

    def __init__(self, width: int, out_channels: int, eps: Optional[float]):
        super().__init__()
        self.norm = RMSNorm(width, eps)
        self.fc = nn.Linear(width, width)
        self.out = nn.Linear(width, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.fc(self.norm(x))))
