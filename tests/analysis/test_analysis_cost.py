"""What an analysis will cost and how much is left (stability/analysis/cost.py): the power-law prediction, the line
said before a long analysis, and the stage-by-stage time left, rescaled by the stages already run."""

import sys

import pytest
import torch

from stability import AnalysisOptions
from stability.analysis import cost, pipeline, progress
from stability.analysis.options import ANALYZE_STAGES
from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
from analysis_scaling import build  # noqa: E402  (benchmarks/: the paper's architecture, untrained)


def test_the_prediction_grows_as_each_stages_fitted_power_of_the_state_size():
    one, two = cost.predict(1000, 8, cost.COSTS), cost.predict(2000, 8, cost.COSTS)
    for stage, (a, b, unit, product) in cost.COSTS.items():
        assert two[stage] == pytest.approx(one[stage] * 2.0 ** b)
        if unit == "sample":  # linear in the samples; Prop. 5 and ρ(W_x) are one unit
            assert cost.predict(1000, 16, [stage])[stage] == pytest.approx(2 * one[stage])
    # the geometry stage: its samples plus one (the search's own cost), 1 + 1 by default
    assert cost.predict(1000, 8, ["geometry"], geometry_samples=3)["geometry"] == pytest.approx(2 * one["geometry"])


def test_the_forecast_is_said_only_above_its_threshold_and_says_how_to_shorten_it():
    stages = list(ANALYZE_STAGES)  # what `stability analyze` runs (the opt-in stages not)
    assert cost.forecast(256, (8, 32), 4, 1, stages, workers=1, threads=1) is None  # a small analysis: quiet
    line = cost.forecast(20736, (81, 256), 32, 2, stages, workers=2, threads=1)
    assert line.startswith("analysis: 2 split(s) × 32 samples, state 81 × 256 (n = 20,736), 10 stages: about ")
    assert "--samples 8" in line and "--device cuda" in line
    assert "--only rho,prop4,rho_wx,prop5,input,a8,repelling,accuracy (all but geometry, about " in line
    assert cost.forecast(20736, (81, 256), 32, 2, stages, workers=2, threads=1, device="cuda") is None


def test_clock_says_seconds_minutes_and_hours_as_people_do():
    assert [cost.clock(s) for s in (4.4, 89, 150, 3600 + 5 * 60)] == ["4 s", "89 s", "2 min", "1 h 05 min"]


def test_time_left_is_the_rest_of_the_prediction_rescaled_by_the_stages_so_far(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress.time, "perf_counter", lambda: now[0])
    lines = []
    p = cost.Progress("val", {"rho": 10.0, "prop4": 10.0, "input": 20.0}, lines.append, quiet_below=0, every=5)
    p.begin("rho")
    assert lines[-1] == "val: rho (1/3), about 10 s; about 40 s left in val"
    now[0] = 4.0
    p.tick(1, 4)  # 4 s since the last line is under ``every``: silent
    assert len(lines) == 1
    now[0] = 6.0
    p.tick(2, 4)
    assert lines[-1] == "val: rho 2/4 samples, about 6 s left in this stage"
    now[0] = 20.0  # rho took 20 s against 10 predicted: the rest is predicted twice as long
    p.end("rho")
    p.begin("prop4")
    assert lines[-1] == "val: prop4 (2/3), about 20 s; about 60 s left in val"
    assert p.left() == pytest.approx(60.0)


def test_a_short_split_stays_quiet():
    lines = []
    p = cost.Progress("val", {"rho": 1.0, "prop4": 1.0}, lines.append)  # predicted 2 s: under quiet_below
    p.begin("rho")
    p.tick(1, 2)
    p.end("rho")
    assert lines == []


def test_analyze_says_its_forecast_and_each_stages_time_left_on_stderr_and_quiet_silences_them(small_checkpoint,
                                                                                              monkeypatch):
    from tests.conftest import run_cli

    ckpt = small_checkpoint
    # a tiny analysis is predicted to take well under a minute: predict 100 s for each stage after reachability
    monkeypatch.setattr(cost, "COSTS", {"reachability": (0.0, 0.0, "one", "batch"), "rho": (100.0, 0.0, "one", "eig"),
                                        "prop5": (100.0, 0.0, "one", "one")})
    monkeypatch.setattr(pipeline, "scale", lambda n, samples, seconds: 1.0)  # this machine as fast as the fit's
    args = ("analyze", ckpt, "--split", "val", "--samples", "2", "--only", "rho,prop5", "--workers", "1")
    err = run_cli(*args, env={"OMP_NUM_THREADS": "1"}).stderr
    assert "analysis: 1 split(s) × 2 samples, state 32 × 16 (n = 512), 3 stages: about " in err
    assert "about 3 min on 1 CPU thread(s) (predicted)" in err
    assert "val: rho (2/3), about 2 min; about 3 min left in val" in err
    assert run_cli(*args, "--quiet", env={"OMP_NUM_THREADS": "1"}).stderr == ""


def test_the_device_scale_is_the_measured_product_over_the_fits_product_for_the_batch():
    a, b = cost.PRODUCT
    assert cost.scale(2000, 4, 4 * a * 2.0 ** b) == pytest.approx(1.0)
    assert cost.scale(2000, 400, 4 * a * 2.0 ** b) == pytest.approx(0.01)  # a GPU: 100 × the batch, same time
    one = cost.predict(2000, 8, cost.COSTS)
    fast = cost.predict(2000, 8, cost.COSTS, threads=4, factor=0.05)  # the measurement counted the threads
    assert all(fast[k] == pytest.approx(0.05 * one[k]) for k in one)


def test_each_stage_is_rescaled_by_the_product_its_work_is_made_of():
    """One sample's product for the stages that work a sample at a time (ρ's eigensolver on the CPU's default,
    Prop. 5, geometry), the batch's for the solves' stages, and the batch's for ρ where the eigensolver batches."""
    fit = cost.predict(2000, 8, cost.COSTS)
    got = cost.predict(2000, 8, cost.COSTS, factor={"batch": 3.0, "one": 0.5})
    for stage, (a, b, unit, product) in cost.COSTS.items():
        assert got[stage] == pytest.approx(fit[stage] * (0.5 if product in ("one", "eig") else 3.0))
    batched = cost.predict(2000, 8, ["rho"], factor={"batch": 3.0, "one": 0.5}, eig_batched=True)
    assert batched["rho"] == pytest.approx(3.0 * fit["rho"])


def test_the_forecast_covers_the_stages_run_and_scales_with_the_measured_products(monkeypatch):
    """A small analysis (chess shape 8 × 8 × 32, 2 samples, default stages): the prediction names exactly the
    stages that then run, and is the fit's prediction times the measured J-product of each stage's kind over the
    fit's (one sample's; the batch's plus one sample's, a step of the batch: a device twice as slow is predicted
    twice as long). Untimed: how close the forecast comes to the clock is a benchmark's question
    (benchmarks/RESULTS.md), not a unit test's on a shared machine."""
    seen, predicted, unit = [], pipeline.predicted, [1e-3]
    # a product of b samples takes b units of time (a device whose batch costs what its samples do)
    monkeypatch.setattr(pipeline, "product_seconds", lambda f, e, x0, reps=5: unit[0] * e.shape[0])
    monkeypatch.setattr(pipeline, "predicted", lambda at, options: seen.append(predicted(at, options)) or seen[-1])
    model, inputs = build("chess", 32, (8, 8), 0.5, 2)
    options = AnalysisOptions(samples=2)
    split = pipeline.run_stages(model, inputs, None, options, split="inputs")
    assert set(seen[0]) == set(split.timings)
    n, N = 8 * 8 * 32, 2
    fit = cost.predict(n, N, options.stages, geometry_samples=options.geometry_count(n, N), few=options.measured(n, N))
    product = cost.PRODUCT[0] * (n / 1000.0) ** cost.PRODUCT[1]  # one sample's product on the fit's machine
    for stage, seconds in seen[0].items():
        kind = cost.COSTS[stage][3]
        measured = 1e-3 if kind in ("one", "eig") else (2e-3 + 1e-3) / N  # per sample: one's; the batch's + one's
        assert seconds == pytest.approx(fit[stage] * measured / product)
    unit[0] = 2e-3
    pipeline.run_stages(model, inputs, None, options, split="inputs")
    assert seen[1] == pytest.approx({k: 2 * v for k, v in seen[0].items()})


def test_the_stages_costs_are_the_refit_of_the_measured_analyses_and_forecast_each_within_twice_its_time():
    """benchmarks/results-forecast-fit.json: seven analyses measured on one thread (sudoku 81 × 16 at two seeds and
    2 and 8 samples, 81 × 32, 81 × 64; prefix sums 40 × 16 and 40 × 32). Each stage's Cost is the least-squares
    power law of those runs (benchmarks/forecast_fit.py's fit, to the digits written in the stage modules), and
    predicted from each run's own measured J-products it is within 2× of the stage's measured seconds in all but
    one of the 70 (stage, run) pairs, within 2.1× in that one."""
    import json

    from forecast_fit import fit

    runs = json.loads((ROOT / "benchmarks" / "results-forecast-fit.json").read_text())["runs"]
    fitted = fit(runs)
    for stage, f in fitted.items():
        a, b, unit, product = cost.COSTS[stage]
        assert (a, b) == (pytest.approx(f["a"], rel=5e-3), pytest.approx(f["b"], abs=5e-3))
    ratios = []
    for r in runs:
        one, N = r["products_s"][0], r["samples"]
        factor = {"batch": cost.scale(r["n"], N, r["products_s"][-1] + one), "one": cost.scale(r["n"], 1, one)}
        said = cost.predict(r["n"], N, fitted, geometry_samples=r["geometry_samples"], factor=factor)
        ratios += [row["actual_s"] / said[s] for s, row in r["stages"].items()]
    assert len(ratios) == 70
    assert sum(not 0.5 <= q <= 2.0 for q in ratios) <= 1 and all(0.45 <= q <= 2.1 for q in ratios)


def test_the_batched_paths_costs_are_the_refit_of_the_batched_analyses_and_forecast_each_within_about_twice():
    """benchmarks/results-forecast-fit-batched.json: the seven analyses of the fit above with ``--batch all`` (the
    GPU's path on the CPU). Every stage's ``Cost.batched`` (but rho_wx's: one eigendecomposition of W_x, the same
    on both paths, milliseconds) is their least-squares power law (to the digits written); predicted from each
    run's own products it is within 2× of the stage's seconds in 60 of the 63 (stage, run) pairs and within 2.7× in
    all (rho, whose time follows its slowest sample's convergence, 0.40–2.66; with the per-sample cost it was
    0.26–0.36 on the sudoku 81 × 16 runs); the forecast takes it exactly on the batched path."""
    import json

    from forecast_fit import fit

    data = json.loads((ROOT / "benchmarks" / "results-forecast-fit-batched.json").read_text())
    runs = data["runs"]
    assert {r["batch"] for r in runs} == {"all"} and len(runs) == 7
    fitted = fit(runs)
    assert set(cost.BATCHED) == set(fitted) - {"rho_wx"}
    for stage, (a, b) in cost.BATCHED.items():
        assert (a, b) == (pytest.approx(fitted[stage]["a"], rel=5e-3), pytest.approx(fitted[stage]["b"], abs=5e-3))
    ratios = []
    for r in runs:
        one, N = r["products_s"][0], r["samples"]
        factor = {"batch": cost.scale(r["n"], N, r["products_s"][-1] + one), "one": cost.scale(r["n"], 1, one)}
        said = cost.predict(r["n"], N, cost.BATCHED, geometry_samples=r["geometry_samples"], factor=factor,
                            eig_batched=True, batched_path=True)
        plain = cost.predict(r["n"], N, ["rho"], factor=factor, eig_batched=True)["rho"]
        a, b = cost.BATCHED["rho"]
        assert said["rho"] == pytest.approx(a * N * (r["n"] / 1000) ** b * factor["batch"], rel=1e-12) != plain
        ratios += [r["stages"][s]["actual_s"] / said[s] for s in cost.BATCHED]
    assert len(ratios) == 63
    assert sum(not 0.5 <= q <= 2.0 for q in ratios) <= 3 and all(0.37 <= q <= 2.7 for q in ratios)


def test_the_forecast_follows_the_batched_path_exactly_where_the_eigensolver_restarts_batched():
    from stability import AnalysisOptions
    from stability.numerics.eigen_batched import restart_mode

    for batch in ("auto", "all"):
        o = AnalysisOptions(batch=batch)
        for device in ("cpu", "cuda", "mps"):
            assert o.batched_path(device) == (restart_mode(o.eig_restart, device) == "batched")
