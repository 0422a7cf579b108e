"""Per-token statistics: ρ of each diagonal block of J* against the dense Jacobian (numpy's eigvals over the real
tokens: max token ρ = ρ(J*) for a causal map), the block-triangular structure checked (a map that reads later
tokens is flagged), per-token convergence with pads left out, and a padded batch giving the per-token numbers of
its unpadded sequences."""

import numpy as np
import pytest
import torch

from stability.lm import pack, token_convergence, token_spectra
from stability.lm.huginn import tiny
from stability.solvers import solve
from tests.lm.conftest import T, float64, ids, padded_mask


def huginn(contractive=True, **sizes):
    """The reference model, its state's weight in the adapter scaled so that the loop contracts (fast to x*)."""
    m = float64(tiny(vocab_size=48, **sizes))
    if contractive:
        with torch.no_grad():
            m.adapter.weight[:, :m.cfg.hidden] *= 0.3
    return m


def dense_rho(model, x, x0, b):
    """ρ of the dense J* of sample b over the real tokens' dynamic channels (torch.func.jacfwd, numpy eigvals)."""
    D, real = model.dynamic_channels, model.token_mask(x0)[b]
    xs, x0b = x[b:b + 1], x0[b:b + 1]

    def f(c):
        full = torch.cat([c.reshape(1, T, D), xs[..., D:]], dim=-1)
        return model.step(full, x0b)[..., :D].reshape(-1)

    J = torch.func.jacfwd(f)(xs[..., :D].reshape(-1)).reshape(T, D, T, D)[real][:, :, real]
    n = int(real.sum()) * D
    return float(np.abs(np.linalg.eigvals(J.reshape(n, n).numpy())).max())


def fixed_point(model, inputs):
    x0 = model.embed(inputs)
    res = solve(model.step, model.initial_state(x0), x0, tol=1e-12, max_iter=400)
    return x0, res.x_best


def test_token_rho_is_the_dense_spectral_radius_for_huginn():
    m = huginn(contractive=False)
    x0, xs = fixed_point(m, pack(ids(), padded_mask()))
    spec = token_spectra(m, xs, x0)
    assert spec.exact.all() and float(spec.acausal.max()) == 0.0
    for b in range(3):
        assert spec.rho[b] == pytest.approx(dense_rho(m, xs, x0, b), abs=3e-8)
        assert spec.token_rho[b, spec.bottleneck[b]] == spec.rho[b]
    assert torch.isnan(spec.token_rho[0, :3]).all() and torch.isnan(spec.token_rho[1, T - 2:]).all()


def test_token_rho_is_the_dense_spectral_radius_for_the_hf_adapters():
    pytest.importorskip("transformers")
    from stability.lm import HrmTextAdapter, InklingLoopAdapter
    from tests.lm.conftest import hrm_model, inkling_model

    for a in (InklingLoopAdapter(inkling_model()), HrmTextAdapter(hrm_model())):
        m = float64(a)
        x0 = m.embed(pack(ids(2), padded_mask(2)))
        x = m.step(m.step(m.initial_state(x0), x0), x0)  # J at any point: x* need not exist (HRM here)
        spec = token_spectra(m, x, x0)
        assert spec.exact.all()
        for b in range(2):
            assert spec.rho[b] == pytest.approx(dense_rho(m, x, x0, b), abs=3e-8)


class Acausal(torch.nn.Module):
    """x' = tanh(W x + x shifted one token back in time, i.e. token t reads token t+1) + x0: not causal."""

    dynamic_channels = 4

    def __init__(self):
        super().__init__()
        self.W = torch.nn.Parameter(0.3 * torch.randn(4, 4, generator=torch.Generator().manual_seed(0),
                                                      dtype=torch.float64))

    def step(self, x, x0):
        ahead = torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)
        return torch.tanh(x @ self.W.T + 0.5 * ahead) + x0


def test_a_map_reading_later_tokens_is_flagged_not_exact():
    m = Acausal()
    x0 = torch.randn(2, 5, 4, dtype=torch.float64)
    spec = token_spectra(m, torch.zeros_like(x0), x0)
    assert not spec.exact.any() and float(spec.acausal.min()) == pytest.approx(0.5)
    assert not token_spectra(m, torch.zeros_like(x0), x0, method="krylov").exact.any()


def test_the_matrix_free_route_gives_the_blocks_rho():
    m = huginn(contractive=False)
    x0, xs = fixed_point(m, pack(ids(), padded_mask()))
    blocks = token_spectra(m, xs, x0, method="blocks")
    krylov = token_spectra(m, xs, x0, method="krylov")
    assert torch.equal(blocks.token_rho.isnan(), krylov.token_rho.isnan()) and krylov.exact.all()
    assert torch.allclose(blocks.token_rho.nan_to_num(), krylov.token_rho.nan_to_num(), rtol=0, atol=1e-9)
    assert torch.equal(blocks.bottleneck, krylov.bottleneck)


def test_the_matrix_free_route_is_the_same_in_any_run_of_positions_and_on_prefixes():
    """Runs of 1, 3 or all positions per product, on each run's prefix (a causal model) or on the whole sequence,
    give the blocks' ρ: the chunking bounds memory and the prefix halves the work without changing a number."""
    m = huginn(contractive=False)
    x0, xs = fixed_point(m, pack(ids(), padded_mask()))
    blocks = token_spectra(m, xs, x0, method="blocks").token_rho.nan_to_num()
    for positions in (1, 3, T):
        for causal in (True, False):
            m.causal = causal
            krylov = token_spectra(m, xs, x0, method="krylov", positions=positions)
            assert krylov.exact.all(), (positions, causal)
            assert torch.allclose(krylov.token_rho.nan_to_num(), blocks, rtol=0, atol=1e-9), (positions, causal)


def test_the_prefix_route_still_flags_a_map_reading_later_tokens():
    m = Acausal()
    m.causal = True  # declared causal, but it is not: the products on each prefix still see token t in f_{t-1}
    x0 = torch.randn(2, 5, 4, dtype=torch.float64)
    spec = token_spectra(m, torch.zeros_like(x0), x0, method="krylov", positions=2)
    assert not spec.exact.any() and float(spec.acausal.min()) > 0


def test_per_token_convergence_leaves_pads_out():
    m = huginn()
    inputs = pack(ids(), padded_mask())
    x0 = m.embed(inputs)
    tc = token_convergence(m, x0, m.initial_state(x0), max_iter=120, tol=1e-10)
    assert tc.status[0][:3] == ["pad"] * 3 and tc.status[1][T - 2:] == ["pad"] * 2
    assert bool(torch.isnan(tc.residuals[0, :3]).all())
    real = tc.mask
    assert bool((tc.steps[real] > 0).all()) and bool((tc.steps[~real] == -1).all())
    assert all(s == "converged" for row, mr in zip(tc.status, real.tolist()) for s, r in zip(row, mr) if r)
    assert bool(tc.sequence_converged().all())
    d = tc.to_dict()
    assert d["status_counts"]["pad"] == 5 and d["converged_tokens"] == 1.0
    # a token's residual is its own: the slowest token has the most steps
    b = 2
    assert int(tc.steps[b, tc.slowest()[b]]) == int(tc.steps[b].max())


def padded_and_alone(m, side, spectra=True):
    """(per-token numbers of a padded batch of two sequences, of the short one alone, of the long one alone, where
    the short one's real tokens are in the batch)."""
    full = ids(2, seed=3)
    n = T - 3  # real tokens of the short sequence
    mask = torch.ones(2, T, dtype=torch.long)
    short = full[1, :n]
    padded = full.clone()
    if side == "left":
        mask[1, :3] = 0
        padded[1, 3:] = short
    else:
        mask[1, n:] = 0
        padded[1, :n] = short
    where = slice(3, T) if side == "left" else slice(0, n)

    def numbers(inputs):
        x0 = m.embed(inputs)
        tc = token_convergence(m, x0, m.initial_state(x0), max_iter=80, tol=1e-9)
        return tc, token_spectra(m, fixed_point(m, inputs)[1], x0) if spectra else None

    return numbers(pack(padded, mask)), numbers(pack(short[None])), numbers(pack(full[:1])), where


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_padded_batch_gives_the_per_token_numbers_of_the_unpadded_sequences(side):
    """Huginn from the zero start (its random start is drawn per batch position, so it differs between batches)."""
    (tc_p, sp_p), (tc_1, sp_1), (tc_f, sp_f), where = padded_and_alone(huginn(init_std=0.0), side)
    assert torch.equal(tc_p.steps[1, where], tc_1.steps[0]) and torch.equal(tc_p.steps[0], tc_f.steps[0])
    assert torch.allclose(tc_p.residuals[1, where], tc_1.residuals[0], rtol=1e-6, atol=1e-13)
    assert torch.allclose(sp_p.token_rho[1, where], sp_1.token_rho[0], rtol=0, atol=1e-10)
    assert torch.allclose(sp_p.token_rho[0], sp_f.token_rho[0], rtol=0, atol=1e-10)


def test_a_padded_batch_gives_the_per_token_numbers_of_the_unpadded_sequences_for_hrm():
    pytest.importorskip("transformers")
    from stability.lm import HrmTextAdapter
    from tests.lm.conftest import hrm_model

    m = float64(HrmTextAdapter(hrm_model()))
    (tc_p, _), (tc_1, _), (tc_f, _), where = padded_and_alone(m, "right", spectra=False)
    assert torch.allclose(tc_p.residuals[1, where], tc_1.residuals[0], rtol=1e-6, atol=1e-13)
    assert torch.allclose(tc_p.residuals[0], tc_f.residuals[0], rtol=1e-6, atol=1e-13)


def test_a_prefix_lm_block_reads_later_tokens_and_its_rho_is_the_dense_one():
    """HRM-Text with token_type_ids: inside the bidirectional block token t reads t+1 (``acausal`` > 0, found from
    the products, not assumed), the batch is not causal, and ``analyze_lm`` takes ρ(J*) by stage rho (the whole J*)
    instead of the per-token maximum: equal to the dense J's ρ."""
    pytest.importorskip("transformers")
    from stability.config import AnalysisOptions
    from stability.lm import HrmTextAdapter, analyze_lm
    from tests.lm.conftest import hrm_model

    m = float64(HrmTextAdapter(hrm_model()))
    x, tt = ids(2), torch.zeros(2, T, dtype=torch.long)
    tt[:, :4] = 1
    inputs = pack(x, token_type_ids=tt)
    x0 = m.embed(inputs)
    xk = m.step(m.step(m.initial_state(x0), x0), x0)
    spec = token_spectra(m, xk, x0, method="blocks")
    assert not m.causal_at(x0) and not spec.exact.any() and float(spec.acausal.min()) > 1e-6
    opts = AnalysisOptions(samples=2, stages=("reachability", "rho"), max_iter=60, iterations=4, tol=1e-9)
    a = analyze_lm(m, x, token_type_ids=tt, options=opts, lm_stages=("tokens",))
    assert a["lm"]["causal"] is False and "token_rho" not in a["lm"]
    split = a.analysis.splits[next(iter(a.analysis.splits))]
    for b in range(2):
        got = float(split.results["rho"].spectrum.rho[b])
        assert got == pytest.approx(dense_rho(m, split.x_star, split.x0, b), abs=1e-7)
