"""Issue 27 item 4: the search for repelling fixed points (stage ``repelling``) and the initial iterate's two
questions apart, local (App. A.8) and global (basins), on hand-built maps whose fixed points are known in closed
form or by an independent scalar computation (numpy, bisection), through the LoopedModel contract."""

import math

import numpy as np
import pytest
import torch
from torch import nn

import stability
from stability.analysis.options import DEFAULT_STAGES, STAGES, AnalysisOptions
from stability.analysis.stages.repelling import search
from stability.errors import StabilityError
from stability.sweep.runner import analysis_summary

A = np.array([[1.5, 0.3], [0.0, 0.5]])  # ρ(A) = 1.5: the one fixed point of x ↦ A x + x0 repels


class LinearMap(nn.Module):
    """x_{t+1} = A x_t + x0 on a state (B, 2, 1): the one fixed point x* = (I − A)⁻¹ x0, with J = A everywhere."""

    def __init__(self, A):
        super().__init__()
        self.A = nn.Parameter(torch.as_tensor(A, dtype=torch.float64), requires_grad=False)

    def embed(self, inputs):
        return inputs.to(self.A.dtype)

    def initial_state(self, x0, generator=None):
        return x0

    def step(self, x, x0):
        return (x.squeeze(-1) @ self.A.T).unsqueeze(-1) + x0

    def readout(self, x):
        return torch.cat([x, -x], -1)


class TwoBasins(nn.Module):
    """x_{t+1} = tanh(2 x_t + c) per coordinate (autonomous, c = 0.1): three fixed points per coordinate, two
    attracting (x⁻ < 0 < x⁺) and a repelling one r between them; Picard from x goes to x⁺ if x > r, to x⁻ if x < r."""

    def __init__(self, c=0.1):
        super().__init__()
        self.c = nn.Parameter(torch.tensor(c, dtype=torch.float64), requires_grad=False)

    def embed(self, inputs):
        return inputs.to(self.c.dtype)

    def initial_state(self, x0, generator=None):
        return x0

    def step(self, x, x0):
        return torch.tanh(2 * x + self.c) + 0 * x0

    def readout(self, x):
        return torch.cat([x, -x], -1)


def scalar_roots(c=0.1):
    """The three roots of tanh(2x + c) = x by bisection (the independent reference), in increasing order."""
    g = lambda x: math.tanh(2 * x + c) - x  # noqa: E731

    def bisect(lo, hi):
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            lo, hi = (mid, hi) if g(lo) * g(mid) > 0 else (lo, mid)
        return 0.5 * (lo + hi)

    return bisect(-2.0, -0.5), bisect(-0.5, 0.0), bisect(0.5, 2.0)


def test_picard_cannot_reach_a_repelling_fixed_point_but_the_search_finds_it_with_rho_above_one():
    m = LinearMap(A)
    inputs = torch.tensor([[[1.0], [2.0]], [[-0.5], [0.25]], [[3.0], [-1.0]]], dtype=torch.float64)
    o = AnalysisOptions(samples=3, stages=("rho", "repelling"), max_iter=200, tol=1e-8)
    a = stability.analyze(m, inputs, options=o)
    block = a["inputs"]
    assert block["fixed_point"]["converged_fraction"] == 0.0  # plain iteration diverges from every start
    rep = block["repelling"]
    rho_ref = float(np.abs(np.linalg.eigvals(A)).max())
    assert rep["searched"] == 3 and rep["samples_with_repelling"] == 3 and rep["samples_ran_out"] == 0
    assert rep["roots"] == [1, 1, 1] and rep["repelling"] == [1, 1, 1] and rep["attracting"] == [0, 0, 0]
    for b in range(3):
        assert rep["rho"][b][0] == pytest.approx(rho_ref, rel=1e-10)
        x_ref = np.linalg.solve(np.eye(2) - A, inputs[b, :, 0].numpy())  # (I − A) x* = x0
        got = a.splits["inputs"].results["repelling"].points[b][0][:, 0].numpy()
        np.testing.assert_allclose(got, x_ref, rtol=1e-6, atol=1e-8)
    v = block["verdict"]
    assert v["numbers"]["repelling_found"] == 3 and v["numbers"]["repelling_searched"] == 3
    assert "repelling fixed point (ρ(J) > 1) found on 3 of 3 samples by 4 root-finder starts per sample" in \
        v["reasons"]["reachable"]


def test_an_attracting_map_gives_no_repelling_root_and_the_verdict_says_by_how_many_starts():
    B = np.array([[0.5, 0.3], [0.0, -0.4]])  # ρ = 0.5: the one fixed point attracts
    m = LinearMap(B)
    inputs = torch.tensor([[[1.0], [2.0]], [[-0.5], [0.25]]], dtype=torch.float64)
    o = AnalysisOptions(samples=2, stages=("rho", "repelling"), max_iter=200, tol=1e-10, repelling_starts=5)
    block = stability.analyze(m, inputs, options=o)["inputs"]
    rep = block["repelling"]
    assert rep["samples_with_repelling"] == 0 and rep["roots"] == [1, 1] and rep["attracting"] == [1, 1]
    assert rep["rho"][0][0] == pytest.approx(0.5, rel=1e-10) and rep["starts"] == 6
    assert ("no repelling fixed point found by 6 root-finder starts per sample (2 samples)"
            in block["verdict"]["reasons"]["reachable"])


def test_the_verdict_does_not_claim_none_repelling_when_the_search_did_not_run():
    m = LinearMap(np.array([[0.5, 0.0], [0.0, 0.5]]))
    inputs = torch.ones(2, 2, 1, dtype=torch.float64)
    block = stability.analyze(m, inputs, options=AnalysisOptions(samples=2, stages=("rho",)))["inputs"]
    reason = block["verdict"]["reasons"]["reachable"]
    assert block["repelling"] is None and "no repelling" not in reason and "not searched" in reason
    assert block["verdict"]["numbers"]["repelling_found"] is None


def test_the_search_reuses_rho_at_the_picard_fixed_point_and_finds_the_repelling_middle_root():
    """On the two-basin map in one dimension, x_best at the attracting root x⁺: ρ there is the one given; the starts
    are x⁺ ± s (|δ| = s · max(|x⁺|, 1), the sign ξ's), and s = 1.06 puts x⁺ − s next to the middle root r, which
    Broyden reaches and which is classified repelling with ρ = f'(r) = 2(1 − r²), as x⁻'s ρ is 2(1 − x⁻²)."""
    lo, r, hi = scalar_roots()
    m = TwoBasins()
    x = torch.full((1, 1, 1), hi, dtype=torch.float64)
    x0 = torch.zeros_like(x)
    got = search(m.step, x, x0, starts=8, scale=1.06, budget=60, tol=1e-10, rho_at_best=[123.0], seed=3)
    rhos = dict(zip([round(float(p.flatten()[0]), 6) for p in got.points[0]], got.rho[0]))
    assert rhos[round(hi, 6)] == 123.0  # the root that is x_best itself: stage rho's value, not recomputed
    assert round(r, 6) in rhos and rhos[round(r, 6)] == pytest.approx(2 * (1 - r * r), rel=1e-8)
    assert got.repelling[0] >= 1 and got.roots[0] == len(rhos)
    if round(lo, 6) in rhos:
        assert rhos[round(lo, 6)] == pytest.approx(2 * (1 - lo * lo), rel=1e-8)


def test_different_starts_reach_different_basins_while_the_local_a8_sensitivity_is_zero():
    lo, r, hi = scalar_roots()
    m = TwoBasins()
    L = 3
    inputs = torch.stack([torch.full((L, 1), -1.0), torch.full((L, 1), 1.0),
                          torch.tensor([[-0.5], [0.7], [0.2]])]).double()
    o = AnalysisOptions(samples=3, stages=("a8",), max_iter=300, tol=1e-10, noise_std=1.0)
    block = stability.analyze(m, inputs, options=o)["inputs"]
    a8 = block["initial_iterate"]
    glo, loc = a8["global"], a8["local"]
    # the reference: each coordinate of each start ends at hi if it starts above r, at lo below (monotone map)
    noise = torch.randn((3, L, 1), generator=torch.Generator().manual_seed(o.seed), dtype=torch.float64) * 1.0
    starts = {"e": inputs, "zeros": torch.zeros_like(inputs), "noise": noise}
    ends = {k: np.where(v.numpy() > r, hi, lo) for k, v in starts.items()}
    ref = []
    for b in range(3):
        pts = [ends[k][b].ravel() for k in starts]
        ref.append(max(np.abs(p - q).max() / max(np.abs(p).max(), np.abs(q).max())
                       for i, p in enumerate(pts) for q in pts[i + 1:]))
    assert glo["starts"] == ["e (= x0)", "zeros", "noise"] and glo["converged_starts"] == [3, 3, 3]
    np.testing.assert_allclose(glo["distance"], ref, rtol=1e-6, atol=1e-9)
    tol = glo["tol"]
    assert tol == pytest.approx(1e-3)
    assert glo["compared"] == 3 and glo["differ"] == sum(d > tol for d in ref) >= 2
    assert glo["basins"] == [len({tuple(ends[k][b].ravel()) for k in starts}) for b in range(3)]
    assert glo["basins"][0] >= 2  # e → lo everywhere, zeros → hi everywhere (c > 0)
    # locally, A.8 holds at every attracting root: ‖dx_T/de·u‖ ≤ max|f'|^T → 0
    assert loc["measured"] == 3 and loc["exceed"] == 0 and loc["max"] < 1e-12 and loc["T"] == 300
    v = block["verdict"]
    assert v["from_every_start"] == "no" and v["numbers"]["e_global_differ"] == glo["differ"]
    assert v["numbers"]["e_local_exceed"] == 0
    text = v["reasons"]["from_every_start"]
    assert "global (basins)" in text and "local (A.8)" in text and "0 of 3 converged samples" in text


def test_a_start_that_did_not_converge_is_not_counted_as_a_different_basin():
    from stability.analysis.initial_iterate import global_dependence

    x = torch.tensor([[1.0, 2.0], [1.0, 2.0]], dtype=torch.float64)
    far = x + 5.0
    conv = [torch.tensor([True, True]), torch.tensor([True, False]), torch.tensor([False, False])]
    out = global_dependence(["e", "zeros", "noise"], [x, far, far], conv, tol=1e-3)
    assert out["distance"][0] == pytest.approx(5.0 / 7.0) and out["distance"][1] is None
    assert out["compared"] == 1 and out["differ"] == 1 and out["basins"] == [2, 1]


def test_the_json_the_text_report_and_the_sweep_record_carry_the_new_numbers():
    m = TwoBasins()
    inputs = torch.stack([torch.full((3, 1), -1.0), torch.full((3, 1), 1.0)]).double()
    o = AnalysisOptions(samples=2, max_iter=200, tol=1e-8)
    assert "repelling" in o.stages and "repelling" in DEFAULT_STAGES and "repelling" in STAGES
    a = stability.analyze(m, inputs, options=o)
    report = a.to_json()
    block = report["inputs"]
    for key in ("searched", "samples_with_repelling", "samples_ran_out", "roots", "repelling", "attracting",
                "marginal", "rho", "ran_out", "start_status", "budget", "perturbation_scale", "starts", "margin"):
        assert key in block["repelling"], key
    assert {"local", "global"} <= set(block["initial_iterate"]) and "repelling" in block["timings"]
    text = a.summary()
    assert "x* across starts (global)" in text and "x* sensitivity to e (local)" in text
    assert "repelling fixed points" in text
    s = analysis_summary(report)["inputs"]
    for key in ("repelling_found", "repelling_searched", "repelling_starts", "repelling_budget", "repelling_ran_out",
                "e_local_exceed", "e_local_measured", "e_local_threshold", "e_global_differ", "e_global_compared",
                "e_global_tol", "fixed_point_distance_max", "dxT_de_norm_last"):
        assert key in s, key
    assert s["repelling_searched"] == 2 and s["e_local_measured"] == 2 and s["e_global_compared"] == 2


def test_the_search_options_are_checked():
    with pytest.raises(StabilityError):
        AnalysisOptions(repelling_scale=0.0)
    with pytest.raises(StabilityError):
        AnalysisOptions(repelling_budget=0)
    with pytest.raises(StabilityError):
        AnalysisOptions(repelling_starts=-1)
    assert AnalysisOptions(repelling_starts=0).repelling_starts == 0
