"""Any attention works (issue 33, B): a model of one's own built on ``nn.MultiheadAttention`` or on
``F.scaled_dot_product_attention`` gets the whole analysis (torch's fused CPU attention kernel has no forward-mode
and no double-backward derivative; the analysis runs every model under ``differentiable_attention``, SDPA's math
backend), with ρ(J*) and Prop. 5 checked against dense references (``torch.autograd.functional.jacobian``, numpy's
eigvals and solve); and a model whose ``step`` still cannot be differentiated is refused by ``check_model`` in one
line naming the transform, exit 2 on the command line, before any work.
"""

import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import stability
from stability.analysis.fixed_point import analysis_model
from stability.analysis.options import DEFAULT_STAGES, AnalysisOptions
from stability.errors import StabilityError
from stability.protocols import check_model

L, D = 6, 8  # tokens, width
FAST = dict(max_iter=60, iterations=4, probes=2, eig_precision="float64", eig_tol=1e-8)


class MHALoop(nn.Module):
    """x' = x/2 + tanh(MHA(x, x, x) + B x0)/2 with torch's nn.MultiheadAttention."""

    def __init__(self, d=D, heads=2, classes=3):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.B, self.out = nn.Linear(1, d), nn.Linear(d, d), nn.Linear(d, classes)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)

    def embed(self, inputs):
        return self.inp(inputs)

    def initial_state(self, x0, generator=None):
        return x0

    def attend(self, x):
        return self.attn(x, x, x, need_weights=False)[0]

    def step(self, x, x0):
        return 0.5 * x + 0.5 * torch.tanh(self.attend(x) + self.B(x0))

    def readout(self, x):
        return self.out(x)


class SDPALoop(MHALoop):
    """The same loop with its attention written on F.scaled_dot_product_attention (two heads)."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)

    def attend(self, x):
        q, k, v = (t.unflatten(-1, (2, D // 2)).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).flatten(-2)


class NoForwardMode(torch.autograd.Function):
    """tanh with a backward but no jvp: forward-mode AD of it fails."""

    @staticmethod
    def forward(x):
        return torch.tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


class NoJvpLoop(MHALoop):
    def step(self, x, x0):
        return 0.5 * x + 0.5 * NoForwardMode.apply(self.attend(x) + self.B(x0))


def bits(B, seed=0):
    return torch.randint(0, 2, (B, L, 1), generator=torch.Generator().manual_seed(seed)).double()


def dense(fn, x):
    """The dense Jacobian of one sample's map, n × n, by torch.autograd.functional.jacobian (reverse mode, torch's
    default attention kernels: independent of the analysis' route and backend)."""
    J = torch.autograd.functional.jacobian(fn, x)
    return J.reshape(x.numel(), -1).numpy()


def prop5_reference(m, x0, T_grid, seed, iterations=400):
    """‖dx_T/dx0·u − dx*/dx0·u‖ / ‖dx*/dx0·u‖ for T in T_grid, from dense matrices: dx*/dx0 = (I − J*)⁻¹K* by
    numpy's solve at x* (iterated to rounding), dx_T/dx0·u by δ_{t+1} = J(x_t) δ_t + K(x_t) u from δ = 0 (e held
    fixed), u the seeded unit direction the analysis draws."""
    u = torch.randn(tuple(x0.shape), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    u = (u / u.norm()).flatten().numpy()
    step = lambda x, a: m.step(x.unsqueeze(0), a.unsqueeze(0))[0]  # noqa: E731
    with torch.no_grad():
        xs = [m.initial_state(x0.unsqueeze(0))[0]]
        for _ in range(iterations):
            xs.append(step(xs[-1], x0))
    x_star, n = xs[-1], x0.numel()
    w = np.linalg.solve(np.eye(n) - dense(lambda t: step(t, x0), x_star), dense(lambda a: step(x_star, a), x0) @ u)
    delta, out = np.zeros(n), []
    for t in range(max(T_grid)):
        delta = dense(lambda s: step(s, x0), xs[t]) @ delta + dense(lambda a: step(xs[t], a), x0) @ u
        if t + 1 in T_grid:
            out.append(np.linalg.norm(delta - w) / np.linalg.norm(w))
    return np.array(out)


@pytest.mark.parametrize("make", [MHALoop, SDPALoop], ids=["nn.MultiheadAttention", "sdpa"])
def test_a_model_on_torchs_attention_gets_the_whole_analysis_with_rho_and_prop5_equal_to_dense_references(make):
    model = make().eval()
    inputs = bits(3, seed=1)
    targets = torch.randint(0, 3, (3, L), generator=torch.Generator().manual_seed(2))
    check_model(model, inputs, targets)  # the model passes the contract check, differentiability included
    a = stability.analyze(model, inputs, targets, AnalysisOptions(samples=3, stages=DEFAULT_STAGES, **FAST))
    block = a["inputs"]
    assert block["fixed_point"]["converged_fraction"] == 1.0
    m, split = analysis_model(model), a.splits["inputs"]
    for b in range(3):  # ρ(J*) against the dense Jacobian's eigenvalues
        J = dense(lambda t: m.step(t.unsqueeze(0), split.x0[b:b + 1])[0], split.x_star[b])
        ref = float(np.abs(np.linalg.eigvals(J)).max())
        assert abs(block["jacobian"]["spectral_radius"][b] - ref) < 1e-7, (b, block["jacobian"], ref)
    p5 = block["prop5"]  # Prop. 5's unrolled-vs-implicit curve against the dense one
    ref = prop5_reference(m, split.x0[p5["sample"]], p5["T"], seed=0)
    assert np.allclose(p5["rel_error"], ref, rtol=1e-4, atol=1e-8), (p5["rel_error"], ref.tolist())
    assert p5["rel_error"][-1] < 1e-5
    assert all(block[k] is not None for k in ("input_dependence", "initial_iterate", "accuracy"))


def test_a_model_whose_step_breaks_jvp_is_refused_in_one_line_naming_jvp():
    with pytest.raises(StabilityError) as info:
        check_model(NoJvpLoop(), bits(2))
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith("NoJvpLoop.step cannot be differentiated by jvp (forward mode")
    with pytest.raises(StabilityError, match="cannot be differentiated by jvp"):
        stability.analyze(NoJvpLoop(), bits(2), options=AnalysisOptions(samples=2, **FAST))


def test_the_attention_backend_is_restored_after_the_analysis_and_after_a_refusal():
    before = (torch.backends.mha.get_fastpath_enabled(), torch.backends.cuda.flash_sdp_enabled(),
              torch.backends.cuda.math_sdp_enabled())
    stability.analyze(MHALoop(), bits(2), options=AnalysisOptions(samples=2, stages="rho", **FAST))
    with pytest.raises(StabilityError):
        check_model(NoJvpLoop(), bits(2))
    assert (torch.backends.mha.get_fastpath_enabled(), torch.backends.cuda.flash_sdp_enabled(),
            torch.backends.cuda.math_sdp_enabled()) == before


MODULE = '''
import torch
from torch import nn


class Fn(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return torch.tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y)


class Loop(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.inp, self.attn, self.out = nn.Linear(1, d), nn.MultiheadAttention(d, 2, batch_first=True), nn.Linear(d, 3)

    def embed(self, inputs):
        return self.inp(inputs)

    def initial_state(self, x0, generator=None):
        return x0

    def step(self, x, x0):
        return 0.5 * x + 0.5 * Fn.apply(self.attn(x, x, x, need_weights=False)[0] + x0)

    def readout(self, x):
        return self.out(x)


def make():
    return Loop()
'''


def test_the_command_line_refuses_a_model_whose_step_breaks_jvp_with_one_line_and_exit_2(tmp_path, monkeypatch,
                                                                                        capsys):
    from stability.cli import main

    name = f"nojvp_models_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    torch.save(bits(3), tmp_path / "inputs.pt")
    try:
        rc = main(["analyze", "--model", f"{name}:make", "--inputs", "inputs.pt", "--json", "out.json",
                   "--plots", "plots", "--quiet"])
    finally:
        sys.modules.pop(name, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("stability analyze: error: Loop.step cannot be differentiated by jvp")
    assert not (tmp_path / "out.json").exists() and not (tmp_path / "plots").exists()
