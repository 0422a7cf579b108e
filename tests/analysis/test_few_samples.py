"""Large states (issue 25): above ``few_samples_above`` the stages whose cost is per sample measure the first
``few_samples`` samples only, say so, and give on those samples what the whole analysis gives; the cost
prediction counts the samples measured. Exercised on a tiny model with the threshold lowered below its n."""

import numpy as np
import pytest
import torch

from tests.reference_numerics import JacobianOperator, arpack_rho
from stability.analysis.cost import predict
from stability.analysis.fixed_point import analysis_model
from stability.analysis.options import AnalysisOptions
from stability.analysis.pipeline import analyze_split
from stability.config import ModelConfig, TaskConfig
from stability.model import build_model
from stability.tasks import make_task

L = 6  # tokens; state 6 × 16 = 96


def _contractive_model():
    torch.manual_seed(7)
    m = analysis_model(build_model(ModelConfig(recall="external", norm="post", width=16, heads=2,
                                               attention_window=5)))
    with torch.no_grad():
        for w in (m.block.attn.out.weight, m.block.mlp.proj.weight, m.recall_map.x.weight):
            w.mul_(0.3)
    return m


def test_above_the_threshold_the_per_sample_stages_measure_the_first_few_samples_as_the_whole_analysis_does():
    task = make_task(TaskConfig(name="prefix-sums", train_size=4, val_size=4, hard_size=2, train_length=L,
                                hard_length=8))
    m = _contractive_model()
    base = dict(samples=4, tol=1e-10, max_iter=80, iterations=5, probes=2, eig_tol=1e-10,
                stages=("reachability", "rho", "prop4", "input", "a8", "repelling"))
    with pytest.MonkeyPatch.context() as mp:  # the matrix-free routes at this size
        mp.setattr("stability.numerics.spectra.DENSE_MAX", 8)
        mp.setattr("stability.numerics.spectra.DENSE_KRYLOV_MAX", 8)
        few = analyze_split(m, task, "val", AnalysisOptions(**base, few_samples=2, few_samples_above=50))
        every = analyze_split(m, task, "val", AnalysisOptions(**base, few_samples=0, few_samples_above=50))
        below = analyze_split(m, task, "val", AnalysisOptions(**base, few_samples=2, few_samples_above=96))
    f, a = few.to_dict(), every.to_dict()
    assert f["fixed_point"]["status"] == ["converged"] * 4
    # stated: which stages, how many samples, why
    assert f["measured_samples"]["stages"] == ["rho", "prop4", "input", "a8", "repelling"]
    assert (f["measured_samples"]["samples"], f["measured_samples"]["of"], f["measured_samples"]["n"]) == (2, 4, 96)
    assert "measured_samples" not in a and "measured_samples" not in below.to_dict()  # all, or n not above
    # ρ(J*) of the measured samples: per-sample ARPACK's; the rest not measured
    arpack = [arpack_rho(JacobianOperator(m.step, few.x_star[b], few.x0[b], mode="vjp"), tol=1e-12,
                         transpose=True).rho for b in range(2)]
    assert np.allclose(f["jacobian"]["spectral_radius"][:2], arpack, atol=1e-6)
    assert f["jacobian"]["spectral_radius"][2:] == [None, None] and f["jacobian"]["sigma_max"][2:] == [None, None]
    assert f["prop4"]["rho_M"][2:] == [None, None]
    assert f["input_dependence"]["frobenius"][2:] == [None, None]
    # on the first two samples the same numbers as the whole analysis
    for block, key in (("jacobian", "spectral_radius"), ("jacobian", "sigma_max"), ("prop4", "rho_M"),
                       ("input_dependence", "frobenius")):
        assert np.allclose(f[block][key][:2], a[block][key][:2], rtol=1e-9), (block, key)
    assert np.allclose(f["initial_iterate"]["local"]["sensitivity"], a["initial_iterate"]["local"]["sensitivity"][:2],
                       rtol=1e-9)  # another batch, the same numbers to rounding
    assert f["initial_iterate"]["global"]["compared"] == 2 and a["initial_iterate"]["global"]["compared"] == 4
    assert f["repelling"]["searched"] == 2 and a["repelling"]["searched"] == 4


def test_the_prediction_counts_the_samples_the_few_sample_stages_measure():
    stages = ("reachability", "rho", "input", "geometry")
    capped = predict(20_736, 32, stages, few=8)
    assert capped["rho"] == pytest.approx(predict(20_736, 8, stages)["rho"])
    assert capped["input"] == pytest.approx(predict(20_736, 8, stages)["input"])
    assert capped["reachability"] == pytest.approx(predict(20_736, 32, stages)["reachability"])  # every sample
    assert capped["geometry"] == pytest.approx(predict(20_736, 32, stages)["geometry"])
