"""The geometry stage (stability/analysis/geometry.py, radii.py, perturbation.py) against independent references.

* Closed forms: a linear recall map with a diagonal weight (stable iff every |a_i| < 1) and the single-layer
  external / internal models of Figure 5 (regions of stability/theory/regions.py): every radius equals the
  analytic first exit of the ray to the bisection accuracy, and a model whose x* has ρ(J*) ≥ 1 gets radius 0.
* Table 3's ranking: the stage's anisotropy is larger for internal recall's region than for external's.
* A tiny trained checkpoint: radii positive and finite where x* attracts, 0 where it does not; the parameters are
  perturbed through functional_call (the model is left as it was); groups by the contract's parts.
* The verdict: three axes, geometry NOT MEASURED where the stage did not run; an analysis JSON of schema 2 (the
  verdict with "independent of e") is still read by `stability compare` and shown by the report.
"""

import json
import math

import numpy as np
import pytest
import torch

from tests.conftest import ROOT, run_cli
from stability.analysis.closed_form_regions import DiagonalRecall, Figure5Model, diagonal_radius, figure5_radius
from stability.analysis.geometry import anisotropy
from stability.analysis.options import DEFAULT_STAGES, STAGES, AnalysisOptions
from stability.analysis.perturbation import loop_parameters, random_directions
from stability.analysis.pipeline import analyze
from stability.analysis.radii import ESTIMATE_TOL, T_MAX
from stability.analysis.verdict import verdict

ACC = 0.01  # the bisection accuracy of the closed-form checks: hi/lo ≤ 1.01, the radius √(lo·hi) within 0.5 %


def stage(model, inputs, **kw):
    kw = {"geometry_group_directions": 0, **kw}
    return analyze(model, inputs, options=AnalysisOptions(samples=int(inputs.shape[0]), stages=("geometry",),
                                                          **kw))["inputs"]["geometry"]


def closed(values, cap=T_MAX):
    return [min(v, cap) for v in values]


def assert_radii(got, want, acc=ACC):
    for g, w in zip(got, want):
        if w >= T_MAX:  # censored: the ray stays inside up to T_MAX
            assert g == T_MAX
        else:
            assert abs(g - w) <= acc * w, (g, w)


def test_diagonal_recall_radii_equal_the_closed_form():
    a = [0.5, -0.3, 0.8, 0.1]
    m = DiagonalRecall(a)
    geo = stage(m, torch.zeros(1, 4, dtype=torch.float64), geometry_directions=6, geometry_accuracy=ACC)
    D = random_directions({"a": m.a.detach()}, 6, 0)["a"].numpy()
    want = closed([diagonal_radius(a, s * D[j]) for j in range(6) for s in (1, -1)])
    assert geo["attracting_at_theta"] == [True]
    assert_radii(geo["radii"][0], want)
    assert all(r in ("rho", "t_max") for r in geo["reasons"][0])  # x* = 0 throughout: ρ alone decides
    # the first radii that ρ decided are certified at both ends by stage rho's routine (dense LAPACK here)
    assert geo["counts"]["certified_rho"] >= 2 and sum(geo["certified"][0]) >= 1
    assert geo["estimate_gap_max"] is not None and geo["estimate_gap_max"] < 1e-6  # n = 4: the estimate is exact
    assert torch.equal(m.a.detach(), torch.tensor(a, dtype=torch.float64))  # perturbed by functional_call only


@pytest.mark.parametrize("placement, theta", [("external", (0.5, -1.0)), ("external", (-1.5, -0.6)),
                                              ("internal", (0.5, -2.0)), ("internal", (-1.0, 1.0))])
def test_figure5_radii_equal_the_closed_form(placement, theta):
    """(The search brackets on the grid T_START·√2^k: a window of instability narrower than that factor, which
    internal recall's band has along some rays, is stepped over; these points' rays leave their region once.)"""
    m = Figure5Model(placement, *theta)
    geo = stage(m, torch.zeros(1, 1, dtype=torch.float64), geometry_directions=8, geometry_accuracy=ACC)
    D = random_directions({"theta": m.theta.detach()}, 8, 0)["theta"].numpy()
    want = closed([figure5_radius(placement, theta, s * D[j]) for j in range(8) for s in (1, -1)])
    assert_radii(geo["radii"][0], want)


def test_a_fixed_point_with_rho_at_least_one_has_radius_zero():
    m = Figure5Model("internal", 0.5, 1.0)  # J* = 1 + 0.5 = 1.5: x* = 0 is a fixed point, but repelling
    geo = stage(m, torch.zeros(1, 1, dtype=torch.float64), geometry_directions=4)
    assert geo["attracting_at_theta"] == [False] and geo["rho_at_theta"][0] == pytest.approx(1.5)
    assert geo["radii"] == [[0.0] * 8] and geo["summary"]["unstable_t0"] == 1.0


def test_anisotropy_ranks_internal_above_external_as_table_3():
    """Table 3 (App. B.2): internal recall's stable region is the more anisotropic. Points of N(0, I₂) inside each
    region (regions.draw, σ = 1, the first 40 of each); the stage's log-IQR and log max/min of the radii, median
    over the points, are larger for internal, and so are the closed form's (the reference)."""
    from stability.theory import regions

    x, y = regions.draw(1.0, 2000, 0)
    med = {}
    for placement, inside in (("external", regions.stable_external), ("internal", regions.stable_internal)):
        pts = np.nonzero(inside(x, y))[0][:40]
        stats, ref = [], []
        for i in pts:
            th = (float(x[i]), float(y[i]))
            m = Figure5Model(placement, *th)
            geo = stage(m, torch.zeros(1, 1, dtype=torch.float64), geometry_directions=8)
            stats.append(geo["per_sample"][0])
            D = random_directions({"theta": m.theta.detach()}, 8, 0)["theta"].numpy()
            ref.append(anisotropy(closed([figure5_radius(placement, th, s * D[j]) for j in range(8)
                                          for s in (1, -1)])))
        med[placement] = {k: np.median([s[k] for s in stats]) for k in ("log_iqr", "log_range")}
        med[placement + " closed form"] = {k: np.median([s[k] for s in ref]) for k in ("log_iqr", "log_range")}
    for k in ("log_iqr", "log_range"):
        assert med["internal"][k] > med["external"][k], med
        assert med["internal closed form"][k] > med["external closed form"][k], med


class NoVmap(DiagonalRecall):
    """A map whose code vmap cannot batch (a Python float of a tensor): the stage runs it one row at a time."""

    def step(self, x, x0):
        float(self.a.detach().sum())
        return self.a * x + x0


def test_a_map_that_does_not_vmap_gives_the_same_radii():
    a = [0.5, -0.3, 0.8, 0.1]
    base = stage(DiagonalRecall(a), torch.zeros(1, 4, dtype=torch.float64), geometry_directions=2)
    slow = stage(NoVmap(a), torch.zeros(1, 4, dtype=torch.float64), geometry_directions=2)
    assert slow["evaluation"].startswith("one row at a time") and base["evaluation"] == "vmap over rows"
    assert slow["radii"] == base["radii"]


# ---- a trained checkpoint ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("geometry") / "tiny.pt"
    run_cli("train", "--task", "prefix-sums", "--width", "16", "--heads", "2", "--epochs", "2", "--train-size", "64",
            "--val-size", "8", "--hard-size", "8", "--hard-length", "16", "--test-iterations", "20", "--out", out,
            "--quiet", env={"OMP_NUM_THREADS": "1"})
    return out


def test_trained_checkpoint_radii_positive_where_attracting_and_zero_elsewhere(tiny):
    import stability
    from stability.analysis.fixed_point import analysis_model
    from stability.analysis.pipeline import analyze_checkpoint

    o = AnalysisOptions(samples=4, stages=("rho", "geometry"), geometry_samples=4, geometry_directions=2,
                        geometry_group_directions=1, geometry_accuracy=0.2, max_iter=200)
    before = {k: v.clone() for k, v in stability.load(tiny).model.state_dict().items()}
    rep = analyze_checkpoint(tiny, splits=("val", "hard"), options=o).to_json()
    seen = set()
    for split in ("val", "hard"):
        b = rep[split]
        geo, fp, rho = b["geometry"], b["fixed_point"], b["jacobian"]["spectral_radius"]
        for i, s in enumerate(geo["samples"]):
            attracts = fp["status"][s] == "converged" and rho[s] < 1
            assert geo["attracting_at_theta"][i] == attracts
            seen.add(attracts)
            if attracts:
                assert all(0 < r <= T_MAX and math.isfinite(r) for r in geo["radii"][i]), geo["radii"][i]
            else:
                assert geo["radii"][i] == [0.0] * 4
        names = [g["name"] for g in geo["groups"]]
        assert {"W_x (recall weight)", "attention (h1)", "MLP (h2)", "norm gains", "embedding"} <= set(names)
        assert all(n.startswith("head.") for n in geo["outside_loop"])  # the readout cannot move x* or J*
        assert b["verdict"]["geometry"] in ("yes", "partly", "no")
    assert True in seen
    after = stability.load(tiny).model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    m = analysis_model(stability.load(tiny).model)
    assert loop_parameters(m, torch.zeros(1, 8, 1, dtype=torch.float64), torch.zeros(1, 8, 16, dtype=torch.float64),
                           torch.zeros(1, 8, 16, dtype=torch.float64))[1] == geo["outside_loop"]


def test_cli_three_axes_and_the_region_picture(tiny, tmp_path):
    plots, js = tmp_path / "plots", tmp_path / "a.json"
    proc = run_cli("analyze", tiny, "--only", "geometry", "--split", "val", "--samples", "2", "--max-iter", "150",
                   "--geometry-directions", "2", "--geometry-group-directions", "0", "--geometry-plane", "5",
                   "--plots", plots, "--json", js, "--quiet", env={"OMP_NUM_THREADS": "1"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("  val ")]
    assert [ln.split(":")[0].split()[-1] for ln in lines] == ["reachable", "input-dependent", "geometry"]
    assert "NOT MEASURED" in lines[1] and "median radius" in lines[2]
    assert "radius of stability" in proc.stdout and (plots / "geometry_region.png").stat().st_size > 10_000
    report = json.loads(js.read_text())
    assert report["schema_version"] == 3 and len(report["val"]["geometry"]["plane"]["rho"]) == 5
    # without the stage, geometry is NOT MEASURED and says how to run it
    proc = run_cli("analyze", tiny, "--only", "rho", "--split", "val", "--samples", "2", "--max-iter", "150",
                   "--quiet", env={"OMP_NUM_THREADS": "1"})
    geo_line = [ln for ln in proc.stdout.splitlines() if ln.startswith("  val    geometry:")][0]
    assert "NOT MEASURED" in geo_line and "--only geometry" in geo_line


# ---- the verdict, and reading old analyses ------------------------------------------------------------------------

def _geo_block(r, iqr, attracting=1, samples=1):
    return {"directions": 8, "samples": list(range(samples)), "groups": [],
            "radii": [[r] * 16] * samples, "attracting_at_theta": [i < attracting for i in range(samples)],
            "summary": {"median_radius": r, "log_iqr": iqr, "log_range": None if iqr is None else 2 * iqr, "balance": 0.5,
                        "unstable_t0": 0.0, "attracting_samples": attracting, "samples": samples}}


@pytest.mark.parametrize("r, iqr, want", [(0.5, 0.3, "yes"), (0.5, 1.5, "partly"), (0.05, 0.3, "partly"),
                                          (0.05, 1.5, "no")])
def test_verdict_geometry_thresholds(r, iqr, want):
    fp = {"converged_fraction": 1.0, "samples": 4, "status": ["converged"] * 4, "distinct_fixed_points": 4}
    v = verdict({"fixed_point": fp, "geometry": _geo_block(r, iqr)}, tol=1e-5)
    assert v.geometry == want and v.to_dict()["numbers"]["geometry_median_radius"] == r
    assert "independent_of_e" not in v.to_dict()
    assert verdict({"fixed_point": fp}, tol=1e-5).geometry == "not measured"
    assert verdict({"fixed_point": fp, "geometry": _geo_block(0.0, None, attracting=0)}, tol=1e-5).geometry == "no"


def test_geometry_is_opt_in_for_the_library_and_the_sweep():
    assert "geometry" in STAGES and "geometry" not in DEFAULT_STAGES
    assert AnalysisOptions().stages == DEFAULT_STAGES


OLD = {"format": "stability-analysis", "schema_version": 2, "checkpoint": "old.pt", "config": None, "options": {},
       "epoch": 1, "splits": ["val"],
       "val": {"split": "val", "samples": 2, "state_shape": [8, 16],
               "fixed_point": {"converged_fraction": 1.0, "status_counts": {"converged": 2}, "nfe_median": 30,
                               "residual_median": 1e-6, "status": ["converged", "converged"], "tol": 1e-5,
                               "solver": "picard", "max_iter": 500, "distinct_fixed_points": 2},
               "jacobian": {"spectral_radius_median": 0.7, "sigma_max_median": 1.2, "spectral_radius": [0.7, 0.7]},
               "verdict": {"reachable": "yes", "input_dependent": "yes", "independent_of_e": "yes",
                           "numbers": {}, "reasons": {"reachable": "100% converged"},
                           "thresholds": {"reachable_share": 0.9, "rho_margin": 0.0, "input_grad_min": 1e-3,
                                          "prop5_rel_error_max": 1e-4, "e_distance_max": 1e-3}}}}


def test_an_old_schema_2_json_is_still_compared_and_shown(tmp_path):
    from stability.analysis.report import verdict_text
    from stability.compare import compare_files

    new = json.loads(json.dumps(OLD))
    new["schema_version"] = 3
    new["val"]["geometry"] = _geo_block(0.4, 0.5)
    new["val"]["verdict"] = verdict(new["val"], tol=1e-5).to_dict()
    a, b = tmp_path / "old.json", tmp_path / "new.json"
    a.write_text(json.dumps(OLD))
    b.write_text(json.dumps(new))
    rows = {r.label: r for r in compare_files(a, b).rows}
    assert rows["ρ(J*) median"].a == rows["ρ(J*) median"].b == 0.7
    assert rows["geometry: median radius of stability"].a is None
    assert rows["geometry: median radius of stability"].b == 0.4
    proc = run_cli("compare", a, b)
    assert "geometry" in proc.stdout
    assert "independent of e" in verdict_text(OLD) and "geometry" in verdict_text(new)


def test_a_grid_can_ask_the_sweep_for_the_geometry_stage(tmp_path):
    from stability.sweep import grid as gridlib
    from stability.config import SweepSummary
    from stability.sweep.runner import analysis_summary

    assert "analyze_geometry" not in SweepSummary().to_record()  # the existing grids' records keep their shape
    opts = SweepSummary(analyze_geometry=True)
    assert SweepSummary.from_record(opts.to_record()) == opts
    assert SweepSummary.from_record(SweepSummary().to_record()) == SweepSummary()
    toml = tmp_path / "g.toml"
    toml.write_text('name = "g"\n[fixed.task]\nname = "prefix-sums"\n[axes.model]\nrecall = ["external"]\n'
                    '[summary]\nanalyze_geometry = true\n')
    assert gridlib.load(toml).summary["analyze_geometry"] is True
    report = {"splits": ["val"], "val": {"fixed_point": {}, "jacobian": {}}}
    assert not any(k.startswith("geometry") for k in analysis_summary(report)["val"])
    report["val"]["geometry"] = _geo_block(0.3, 0.4)
    assert analysis_summary(report)["val"]["geometry_median_radius"] == 0.3


# ---- which samples the geometry stage measures (issue 33) ---------------------------------------------------------

def test_by_default_the_geometry_stage_measures_up_to_four_attracting_samples():
    from stability.analysis.stages.geometry import pick_geometry_samples

    status = ["stalled", "converged", "converged", "converged", "stalled", "converged", "converged", "converged"]
    rho = [1.2, 0.5, 1.1, 0.7, None, None, 0.6, 0.4]
    filled = []

    def fill(bs):  # ρ(J*) where stage rho did not measure it
        filled.extend(bs)
        for b in bs:
            rho[b] = 0.8

    o = AnalysisOptions()
    assert o.geometry_samples == 4 and o.geometry_pick == "attracting"
    assert pick_geometry_samples(o, 100, status, rho, fill) == [1, 3, 5, 6] and filled == [5]
    # none attracts: the first sample (every radius 0), as before
    assert pick_geometry_samples(o, 100, ["stalled"] * 3, [None] * 3, lambda bs: None) == [0]
    # a large state (above few_samples_above): one sample, each costs minutes
    assert pick_geometry_samples(o, 10_000, status, rho, fill) == [1]


def test_the_sweep_measures_geometry_as_the_committed_replication_records_were_measured():
    """The replication records (rerun bit for bit by tests/e2e/test_replication.py) were measured on the first sample
    of each split: the options a replication cell's summary runs with are the ones it ran with before the library's
    default changed, field by field, and they pick sample 0 even where its x* does not attract."""
    from stability.analysis.stages.geometry import pick_geometry_samples
    from stability.config import SweepSummary
    from stability.sweep import grid as gridlib
    from stability.sweep.runner import analysis_options

    grid = gridlib.load(ROOT / "experiments" / "replication.toml")
    summary = SweepSummary(**grid.summary)
    assert summary.analyze_geometry
    cell = grid.cells[0]
    got = analysis_options(summary, cell.config.train.test_iterations, "cpu")
    before = AnalysisOptions(samples=summary.analyze_samples, max_iter=summary.analyze_max_iter,
                             stages=DEFAULT_STAGES + ("geometry",), iterations=cell.config.train.test_iterations,
                             device="cpu", workers=1, geometry_samples=1)  # the old default, 1
    assert {k: v for k, v in got.to_dict().items() if k != "geometry_pick"} == \
        {k: v for k, v in before.to_dict().items() if k != "geometry_pick"}
    assert got.geometry_pick == "first"
    assert pick_geometry_samples(got, 1280, ["stalled", "converged"], [1.3, 0.5], lambda bs: None) == [0]


def test_a_search_too_large_for_its_memory_runs_in_chunks_with_the_closed_form_radii():
    """With ``memory`` below one search's stacked parameters the directions go a chunk at a time (here one direction
    and its 2 × 2 rows per chunk: 2 samples); every radius still equals the closed form, the same draws
    (``random_directions(keep=)``) as the whole search's, whose radii it reproduces; with less memory still, one
    direction and one input a chunk."""
    from stability.analysis.geometry import measure

    a = [0.5, -0.3, 0.8, 0.1]
    m = DiagonalRecall(a)
    inputs = torch.zeros(2, 4, dtype=torch.float64)
    kw = dict(samples=[0, 1], directions=3, group_directions=0, accuracy=ACC, certify=2)
    said = []
    one_row = 4 * 8  # the loop parameters (a) in bytes: one perturbed parameter set
    chunked = measure(m, inputs, inputs, inputs, [True, True], [0.8, 0.8], memory=5 * one_row, log=said.append,
                      **kw)
    whole = measure(m, inputs, inputs, inputs, [True, True], [0.8, 0.8], **kw)
    assert any("3 directions in 3 chunks" in s for s in said)
    D = random_directions({"a": m.a.detach()}, 3, 0)["a"].numpy()
    assert torch.equal(random_directions({"a": m.a.detach()}, 3, 0, keep=[2])["a"][0], torch.from_numpy(D[2]))
    want = closed([diagonal_radius(a, s * D[j]) for j in range(3) for s in (1, -1)])
    for i in range(2):
        assert_radii(chunked.radii[i], want)
        assert chunked.radii[i] == pytest.approx(whole.radii[i], rel=ACC)
    assert sum(sum(c) for c in chunked.certified) == sum(sum(c) for c in whole.certified) == 2
    # below one direction's rows over both samples (2 · 2 + 1 sets): one direction and one sample a chunk
    said.clear()
    single = measure(m, inputs, inputs, inputs, [True, True], [0.8, 0.8], memory=3 * one_row, log=said.append, **kw)
    assert any("3 directions in 6 chunks" in s for s in said)
    for i in range(2):
        assert_radii(single.radii[i], want)
    # below even that (3 sets): the directions applied in place, each row alone, θ* put back bit for bit
    said.clear()
    before = m.a.detach().clone()
    moved = measure(m, inputs, inputs, inputs, [True, True], [0.8, 0.8], memory=2 * one_row, log=said.append, **kw)
    assert any("3 directions applied in place, 12 rows one at a time" in s for s in said), said
    assert moved.evaluation.startswith("in place") and torch.equal(m.a.detach(), before)
    for i in range(2):
        assert_radii(moved.radii[i], want)
    assert sum(sum(c) for c in moved.certified) == 2


def _transformer():
    """A small looped transformer of the bundled trainer's (float64, external recall, post-norm) and its x*."""
    from stability.analysis.fixed_point import analysis_model
    from stability.config import ModelConfig
    from stability.model import build_model

    torch.manual_seed(0)
    m = analysis_model(build_model(ModelConfig(width=16, heads=2, recall="external", norm="post")))
    inputs = torch.randint(0, 2, (2, 6, 1)).double()
    x0 = m.embed(inputs).detach()
    x = m.initial_state(x0)
    for _ in range(300):
        x = m.step(x, x0).detach()
    return m, inputs, x, x0


def test_a_row_applied_in_place_is_the_familys_row_bit_for_bit_and_theta_comes_back():
    """InPlace writes θ* + t·sign·D (and the plane's θ* + a·D1 + b·D2) into the model's own parameters: its maps
    equal Family's one-row-at-a-time maps bit for bit (x0 with them: the embedding moves), its kept θ* is float32
    where the float64 parameter holds float32 values, and close() puts every parameter back bit for bit."""
    from stability.analysis.in_place import InPlace, Theta, direction_state
    from stability.analysis.perturbation import Family

    m, inputs, x, x0 = _transformer()
    with torch.no_grad():  # the float64 copy of a float32 model holds float32 values (kept in float32); one that
        m.block.mlp.fc.weight.add_(1e-12 * torch.randn_like(m.block.mlp.fc.weight))  # does not: kept in float64
    names, _, _ = loop_parameters(m, inputs[:1], x[:1], x0[:1])
    before = {k: v.detach().clone() for k, v in m.named_parameters()}
    base = {k: v.detach() for k, v in m.named_parameters() if k in names}
    specs = [("all", 1, 7, None, 3), ("attention", 0, 1007, [k for k in names if "attn" in k], 1)]
    dirs = {k: torch.cat([random_directions(base, 3, 7, keep=[1])[k],
                          random_directions(base, 1, 1007, specs[1][3])[k]]) for k in base}
    theta = Theta(m, names, torch.float64)
    assert theta.kept["input.weight"].dtype == torch.float32 and theta.kept["block.mlp.fc.weight"].dtype == torch.float64
    gen = torch.Generator().manual_seed(7)
    gen.set_state(direction_state(base, 1, 7))
    assert torch.equal(torch.randn(3, generator=gen, dtype=torch.float64), torch.randn(
        3, generator=torch.Generator().manual_seed(7).set_state(direction_state(base, 1, 7)), dtype=torch.float64))
    rows = dict(row_dir=torch.tensor([0, 1, 0]), row_sign=torch.tensor([1.0, -1.0, -1.0], dtype=torch.float64))
    inp, xs, x0s = inputs[[0, 1, 1]], x[[0, 1, 1]], x0[[0, 1, 1]]
    fam = Family(m, base, dirs, inp, x0s, **rows)
    fam.vmap = False
    here = InPlace(m, theta, specs, inp, x0s, **rows)
    fam.set_t(torch.arange(3), torch.tensor([0.05, 0.2, 0.1], dtype=torch.float64))
    for r in (0, 1, 2, 0):
        idx = torch.tensor([r])
        here.set_t(idx, fam.t[idx])
        assert torch.equal(here.x0[r], fam.x0[r])
        assert torch.equal(here.step(xs[idx], idx), fam.step(xs[idx], idx))
    with pytest.raises(ValueError, match="one row at a time"):
        here.step(xs[:2], torch.tensor([0, 1]))
    here.close()
    assert all(torch.equal(v, before[k]) for k, v in m.named_parameters())
    coef = torch.tensor([[0.1, -0.2], [0.0, 0.3]], dtype=torch.float64)
    plane = InPlace(m, theta, specs, inp[:2], x0s[:2], coef=coef)
    flat = Family(m, base, dirs, inp[:2], x0s[:2], coef=coef)
    flat.vmap = False
    for r in (1, 0):
        idx = torch.tensor([r])
        assert torch.allclose(plane.step(xs[idx], idx), flat.step(xs[idx], idx), rtol=0, atol=1e-13)
        assert torch.allclose(plane.x0[r], flat.x0[r], rtol=0, atol=1e-13)
    plane.close()
    assert all(torch.equal(v, before[k]) for k, v in m.named_parameters())


def test_a_transformers_radii_and_plane_in_place_equal_the_stacked_searchs():
    """The geometry stage of a looped transformer with its directions applied in place (memory below three
    parameter sets) gives the stacked search's radii (each row's search is its own: to the eigensolver's starts),
    the plane picture's statuses and ρ, and leaves the model's parameters bit for bit as they were."""
    from stability.analysis.geometry import measure

    m, inputs, x, x0 = _transformer()
    before = {k: v.detach().clone() for k, v in m.named_parameters()}
    kw = dict(samples=[0], directions=2, group_directions=0, accuracy=0.2, certify=2, plane=3, tol=1e-9,
              max_iter=400)
    said = []
    here = measure(m, inputs, x, x0, [True, True], [0.5, 0.5], memory=0, log=said.append, **kw)
    stacked = measure(m, inputs, x, x0, [True, True], [0.5, 0.5], **kw)
    assert any("applied in place" in s for s in said) and here.evaluation.startswith("in place")
    assert stacked.evaluation == "vmap over rows"
    assert all(torch.equal(v, before[k]) for k, v in m.named_parameters())
    assert len(here.radii[0]) == 4 and here.radii[0] == pytest.approx(stacked.radii[0], rel=0.2)
    assert here.reasons[0] == stacked.reasons[0] and sum(here.certified[0]) == sum(stacked.certified[0])
    assert here.plane["status"] == stacked.plane["status"]
    flat = lambda p: [v for row in p["rho"] for v in row]  # noqa: E731
    # ρ: the search's estimate (Ritz residual ESTIMATE_TOL, random starts drawn per batch): to that tolerance
    assert flat(here.plane) == pytest.approx(flat(stacked.plane), abs=2 * ESTIMATE_TOL)
