"""The numerics that used to be written several times now have one home each: one median
(:mod:`stability.stats`), one (I − J) solver (:mod:`stability.numerics.gmres`), one accuracy-vs-iteration routine, one
distinct-fixed-point routine. Each test checks that every caller gives the same number, against numpy/scipy."""

import numpy as np
import pytest
import torch

from stability import stats


def test_median_is_the_mean_of_the_two_middle_values_for_an_even_count():
    vals = [0.9, 0.1, 0.5, 0.7, float("nan"), None, float("inf")]
    assert stats.median(vals) == pytest.approx(np.median([0.9, 0.1, 0.5, 0.7]))  # 0.6, not 0.7 (upper middle)
    assert stats.median([3.0, 1.0, 2.0]) == 2.0
    assert stats.median([None, float("nan")]) is None
    assert stats.median(torch.tensor([4.0, 1.0, 3.0, 2.0])) == 2.5


def _block(rho_J, rho_M, status):
    """One split of an analyze report, built by the analysis' own result classes where they exist."""
    from stability.analysis.stages.rho import JacobianSpectra
    from stability.numerics import Spectrum

    n = len(status)
    spectrum = Spectrum(rho=torch.tensor(rho_J, dtype=torch.float64),
                        eigenvalues=torch.zeros(n, 0, dtype=torch.cdouble),
                        ritz_residual=torch.zeros(n, dtype=torch.float64), matvecs=0)
    jac = JacobianSpectra(method="dense", spectrum=spectrum, sigma=torch.tensor(rho_J, dtype=torch.float64) * 1.5,
                          eigen_flags=torch.ones(n, dtype=torch.bool),
                          converged=[s == "converged" for s in status]).to_dict()
    fp = {"status": status, "status_counts": {s: status.count(s) for s in set(status)},
          "converged_fraction": status.count("converged") / n, "solver": "picard", "tol": 1e-5, "max_iter": 10,
          "nfe_median": 4.0, "residual_median": 1e-6, "distinct_fixed_points": 1}
    p4 = {"applicable": True, "form": "external", "rho_M": rho_M, "max_abs_diff_vs_autograd": 0.0}
    return {"split": "val", "samples": n, "state_shape": [n, 2, 4], "fixed_point": fp, "jacobian": jac, "prop4": p4}


def test_sweep_record_medians_equal_the_analyze_report_for_an_even_count():
    from stability.analysis.report import split_table
    from stability.sweep.runner import analysis_summary

    status = ["converged", "converged", "max-iterations", "converged", "converged"]  # 4 converged: even count
    rho_J = [0.2, 0.8, 3.0, 0.4, 0.6]
    rho_M = [0.25, 0.85, 3.1, 0.45, 0.65]
    report = {"splits": ["val"], "val": _block(rho_J, rho_M, status)}
    summary = analysis_summary(report)["val"]
    conv = [i for i, s in enumerate(status) if s == "converged"]
    assert summary["rho_J_median"] == pytest.approx(np.median([rho_J[i] for i in conv]))  # 0.5
    assert summary["rho_M_median"] == pytest.approx(np.median([rho_M[i] for i in conv]))  # 0.55, not the upper 0.65
    table = split_table(report["val"])
    row = next(line for line in table.splitlines() if "ρ(M) median" in line)
    assert f"{summary['rho_M_median']:.4g}" in row
    row = next(line for line in table.splitlines() if "ρ(J*) median" in line)
    assert f"{summary['rho_J_median']:.4g}" in row


def test_solver_summary_nfe_median_is_the_true_median_for_an_even_batch():
    from stability.solvers import SolveResult

    x = torch.zeros(4, 2)
    res = SolveResult(x_last=x, x_best=x, residuals=torch.zeros(4, 1),
                      best_residual=torch.tensor([1e-6, 4e-6, 2e-6, float("nan")], dtype=torch.float64),
                      nfe=torch.tensor([3, 9, 5, 7]), status=["converged"] * 4, period=torch.zeros(4, dtype=torch.long))
    out = res.summary()
    assert out["nfe_median"] == np.median([3, 9, 5, 7]) == 6.0  # torch.median would give the lower middle, 5
    assert out["residual_median"] == pytest.approx(np.median([1e-6, 4e-6, 2e-6]))


def _tiny_model(dtype=torch.float32):
    from stability.config import ModelConfig, TaskConfig
    from stability.model import build_model
    from stability.tasks import make_task

    task = make_task(TaskConfig(train_size=40, val_size=24, hard_size=8, train_length=7, hard_length=9))
    torch.manual_seed(0)
    model = build_model(ModelConfig(recall="external", norm="pre", width=16, heads=2, **task.model_options()))
    model.attention_impl = "math"
    return model.to(dtype).eval(), task


def test_trainer_evaluation_and_analysis_accuracy_curve_are_one_routine():
    from stability.analysis.accuracy import accuracy_vs_iteration
    from stability.train.loop import evaluate

    model, task = _tiny_model()
    T = 6
    ev = evaluate(model, task, "val", T, batch_size=10)
    inputs, targets = task.dataset("val")
    with torch.no_grad():
        x0 = model.embed(inputs)
        curve = accuracy_vs_iteration(model, task, x0, model.initial_state(x0), targets, T, batch_size=7)
        # the reference: the model's own trajectory, scored by the task, in one batch
        ref_acc, ref_pos = [], []
        for x in model.trajectory(inputs, T):
            ok, pa = task.score(model.readout(x), targets)
            ref_acc.append(float(ok.double().mean()))
            ref_pos.append(float(pa.double().mean()))
    assert ev["n"] == len(inputs) and ev["iterations"] == curve.iterations == list(range(1, T + 1))
    assert ev["accuracy"] == curve.accuracy == pytest.approx(ref_acc, abs=1e-12)
    assert ev["position_accuracy"] == pytest.approx(curve.position_accuracy, abs=1e-12)
    assert curve.position_accuracy == pytest.approx(ref_pos, abs=1e-12)


def _clustered_points(seed=0, d=5):
    """Four well-separated centres (|coordinates| ~ 1), each with 3–6 copies jittered by ≤ 1e-9, shuffled."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(4, d))
    sizes = [3, 6, 4, 5]
    pts = np.concatenate([c + rng.uniform(-1e-9, 1e-9, size=(k, d)) for c, k in zip(centres, sizes)])
    truth = np.repeat(np.arange(4), sizes)
    order = rng.permutation(len(pts))
    return pts[order], truth[order]


def _same_partition(labels, truth):
    pairs = {(int(a), int(b)) for a, b in zip(labels, truth)}
    return len(pairs) == len(set(labels)) == len(set(truth.tolist()))


def test_both_distinct_point_counts_agree_on_a_set_with_known_clusters():
    from stability.analysis.reachability import distinct_fixed_points
    from stability.theory.checks.instances import distinct_points

    pts, truth = _clustered_points()
    count, labels = distinct_fixed_points(torch.tensor(pts), tol=1e-6, eps=0.0)
    assert count == distinct_points(pts, tol=1e-6) == 4
    assert _same_partition(labels, truth)
    # a tolerance below the jitter splits every copy; the two callers still agree
    assert distinct_fixed_points(torch.tensor(pts), tol=1e-13, eps=0.0)[0] == distinct_points(pts, 1e-13) == len(pts)
    # the mask: only the samples inside are counted and labelled
    mask = torch.tensor(truth != 2)
    count, labels = distinct_fixed_points(torch.tensor(pts), mask, tol=1e-6, eps=0.0)
    assert count == 3 and all((lab == -1) == (t == 2) for lab, t in zip(labels, truth))


def test_distinct_clusters_is_single_linkage_in_the_max_norm_independent_of_order():
    from scipy.cluster.hierarchy import fcluster, linkage

    # a chain 0 — 0.6 — 1.2 with atol 0.7: one cluster (greedy from the first point would make two)
    chain = np.array([[0.0, 0.0], [0.6, 0.1], [1.2, 0.0]])
    assert stats.distinct_clusters(chain, atol=0.7) == (1, [0, 0, 0])
    assert stats.distinct_clusters(chain[::-1], atol=0.7)[0] == 1
    # against scipy's single-linkage clustering in the Chebyshev metric, cut at the same distance
    rng = np.random.default_rng(3)
    P = rng.uniform(size=(60, 3))
    for atol in (0.02, 0.08, 0.2):
        ref = fcluster(linkage(P, method="single", metric="chebyshev"), t=atol, criterion="distance")
        count, labels = stats.distinct_clusters(P, atol=atol)
        assert count == len(set(ref)) and _same_partition(labels, ref)
    # relative tolerance: 1000 and 1000.5 are one point at rtol 1e-3, 1 and 1.5 are not; NaN rows stand alone
    assert stats.distinct_clusters(np.array([[1000.0], [1000.5], [1.0], [1.5], [np.nan]]), rtol=1e-3)[0] == 4


def test_stage_rho_prop4_and_rho_W_x_keep_their_spectra_in_the_one_spectrum_type():
    """One spectrum type (issue 34): stage rho's ρ(J*), Prop. 4's ρ(M) (J's own rows where M = J) and ρ(W_x) are
    each a numerics Spectrum, which says the route that computed it; the JSON lists are its values."""
    from stability.analysis.options import AnalysisOptions
    from stability.analysis.pipeline import analyze_model
    from stability.analysis.recall import rho_W_x
    from stability.config import ModelConfig
    from stability.model.looped import LoopedTransformer
    from stability.numerics import Spectrum

    torch.manual_seed(0)
    model = LoopedTransformer(ModelConfig(width=8, heads=2, norm="pre", in_channels=1, out_channels=2))
    inputs = torch.randint(0, 2, (3, 5, 1)).float()
    split = analyze_model(model, inputs, options=AnalysisOptions(samples=3, stages=("rho", "prop4", "rho_wx"))).splits[
        "inputs"]
    rho, prop4 = split.results["rho"], split.results["prop4"]
    assert isinstance(rho.spectrum, Spectrum) and rho.spectrum.route == ("dense", 3)
    assert isinstance(prop4.spectra, Spectrum) and prop4.spectra_of_J == 3  # M = J entry by entry: J's spectra
    assert prop4.rho_M == rho.rhos and prop4.to_dict()["eigenvalues"] == rho.to_dict()["eigenvalues"]
    w = rho_W_x(model)
    assert isinstance(w, Spectrum) and len(w) == 1 and split.results["rho_wx"].rho_Wx == float(w.rho[0])
