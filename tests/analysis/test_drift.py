"""Issue 38: the drifting status of stage reachability (stability/analysis/drift.py), on hand-built maps whose
iterates numpy computes independently: a state whose norm grows without bound is named drifting, a contractive map
still converges, a period-2 orbit is still a cycle, and without ``AnalysisOptions.drift`` nothing changes."""

import numpy as np
import pytest
import torch
from torch import nn

import stability
from stability.analysis.drift import DRIFT_POWER, growth_power
from stability.analysis.options import AnalysisOptions
from stability.stats import DRIFTING
from stability.sweep.record import SplitSummary

X0 = np.array([[1.0, -2.0, 0.5], [0.3, 0.1, -1.0]])  # two inputs, a state of 3


class Affine(nn.Module):
    """x_{t+1} = a x_t + x0 per coordinate, from e = s · x0: a = 0.5 contracts to 2 x0, a = 1 moves by x0 a step
    (‖x_t‖ ∝ t), a = 1.01 grows by 1 % a step, a = −1 closes a period-2 orbit {s x0, (1 − s) x0}."""

    def __init__(self, a, s=1.0):
        super().__init__()
        self.a, self.s = a, s

    def embed(self, inputs):
        return inputs.to(torch.float64)

    def initial_state(self, x0, generator=None):
        return self.s * x0

    def step(self, x, x0):
        return self.a * x + x0

    def readout(self, x):
        return torch.stack([x, -x], -1)


def _reference_power(a, s, T):
    """The slope of log ‖x_t‖₂ on log t over t = T … 2T by numpy's polyfit, the iterates by numpy (x_0 = s x0)."""
    out = []
    for x0 in X0:
        x, norms = s * x0, []
        for t in range(2 * T + 1):
            if t >= T:
                norms.append(np.linalg.norm(x))
            x = a * x + x0
        t = np.arange(T, 2 * T + 1, dtype=float)
        out.append(np.polyfit(np.log(t), np.log(norms), 1)[0])
    return out


def _analyze(a, s=1.0, T=300, drift=True):
    o = AnalysisOptions(samples=2, stages=("reachability",), tol=1e-10, max_iter=T, drift=drift)
    return stability.analyze(Affine(a, s), torch.tensor(X0), options=o)["inputs"]["fixed_point"]


@pytest.mark.parametrize("a, local", [(1.0, (300 / 301, 600 / 601)), (1.01, (300 * np.log(1.01), 600 * np.log(1.01)))])
def test_a_state_growing_without_bound_is_drifting_at_the_growth_power_numpy_fits(a, local):
    """x ↦ x + x0 (additive drift: ‖x_t‖ ∝ t + 1) and x ↦ 1.01 x + x0 (ρ = 1.01 > 1: d ln‖x_t‖/d ln t ≈ t ln 1.01,
    3 to 6 over the window): never converged, never diverged past the solver's bound within T = 300, and the power
    fitted over [T, 2T] is numpy's to 1e-9, between the local powers at the window's ends."""
    block = _analyze(a)
    assert block["status"] == [DRIFTING, DRIFTING] and block["status_counts"][DRIFTING] == 2
    assert block["converged_fraction"] == 0.0
    ref = _reference_power(a, 1.0, 300)
    np.testing.assert_allclose(block["drift"]["power"], ref, rtol=1e-9)
    assert block["drift"]["threshold"] == DRIFT_POWER and block["drift"]["window"] == 300
    assert min(ref) >= DRIFT_POWER and all(local[0] - 1e-3 <= p <= local[1] + 1e-3 for p in ref)


def test_a_contractive_map_still_converges_and_is_not_tested():
    block = _analyze(0.5)
    assert block["status"] == ["converged", "converged"] and block["drift"]["power"] == [None, None]
    assert DRIFTING not in block["status_counts"]


def test_a_period_two_orbit_is_still_a_cycle_and_its_bounded_norm_is_far_below_the_threshold():
    """x ↦ −x + x0 from e = 2 x0: the orbit {2 x0, −x0}; the solver finds period 2 (stalled), which the test leaves
    alone, and the growth power of its alternating norm (numpy's fit) is near 0."""
    block = _analyze(-1.0, s=2.0)
    assert block["status"] == ["stalled", "stalled"] and block["period"] == [2, 2]
    assert block["cycles"] == {"2": 2} and block["drift"]["power"] == [None, None]
    x0 = torch.tensor(X0)
    p = growth_power(Affine(-1.0).step, 2 * x0, x0, 300, 300).tolist()  # x_300 = 2 x0 (t even)
    np.testing.assert_allclose(p, _reference_power(-1.0, 2.0, 300), rtol=1e-9, atol=1e-12)
    assert max(abs(v) for v in p) < 0.01 < DRIFT_POWER


def test_a_norm_that_turns_non_finite_inside_the_window_is_drifting():
    x0 = torch.ones(1, 2, dtype=torch.float64)
    p = growth_power(lambda x, x0: x * 1e200 + x0, x0, x0, 10, 10)
    assert p.tolist() == [float("inf")]


def test_without_the_option_the_statuses_and_the_options_are_those_written_before_it():
    """Off by default: the solver's statuses as they were (every committed record's), no drift block, and the
    options' JSON without the key (the demo's and every analysis' shape)."""
    assert AnalysisOptions().drift is False and "drift" not in AnalysisOptions().to_dict()
    assert AnalysisOptions(drift=True).to_dict()["drift"] is True
    assert AnalysisOptions(**AnalysisOptions(drift=True).to_dict()) == AnalysisOptions(drift=True)
    for a in (1.0, 1.01):
        block = _analyze(a, drift=False)
        assert DRIFTING not in block["status"] and set(block["status"]) <= {"max-iterations", "stalled"}
        assert "drift" not in block and DRIFTING not in block["status_counts"]


def test_a_sweep_record_holds_the_drifting_count_of_the_headline():
    o = AnalysisOptions(samples=2, stages=("reachability",), tol=1e-10, max_iter=300, drift=True)
    head = stability.analyze(Affine(1.0), torch.tensor(X0), options=o).headline()["inputs"]
    assert SplitSummary(**head).to_dict()["status_counts"][DRIFTING] == 2 == head["status_counts"][DRIFTING]
