"""Figure 5's regions and the exact projection of App. B.2 (Table 3), checked against brute force."""

import json

import numpy as np
import pytest
from scipy.spatial import cKDTree

from stability.theory import regions

INSIDE = {
    "internal": lambda x, y: regions.stable_internal(x, y, closed=True),
    "external": lambda x, y: regions.stable_external(x, y, closed=True),
}


@pytest.mark.parametrize("name", ["internal", "external"])
def test_projection_is_never_farther_than_a_dense_grid_of_region_points(name):
    """Brute force independent of any boundary reasoning: every in-region point of a 0.02-grid over [-8.5, 8.5]²."""
    h, lim = 0.02, 8.5
    g = np.arange(-lim, lim + h / 2, h)
    X, Y = (a.ravel() for a in np.meshgrid(g, g))
    keep = INSIDE[name](X, Y)
    tree = cKDTree(np.c_[X[keep], Y[keep]])
    P = np.random.default_rng(1).uniform(-4, 4, size=(1500, 2))  # nearest region points lie within the grid box
    px, py = regions.PROJECTIONS[name](P[:, 0], P[:, 1])
    d_exact = np.hypot(px - P[:, 0], py - P[:, 1])
    d_grid, _ = tree.query(P)
    assert np.all(d_exact <= d_grid + 1e-12)  # no in-region point is nearer than the exact projection
    assert np.all(d_exact >= d_grid - h * np.sqrt(2))  # and the grid finds one within its resolution


@pytest.mark.parametrize("name", ["internal", "external"])
def test_projection_of_the_experiments_draws_matches_a_dense_boundary_search(name):
    """The σ = 4 draws of Table 3 against 4·10⁵ log-spaced samples of each hyperbola (and 2.5·10⁵ of each axis)."""
    x, y = regions.draw(4.0)
    x, y = x[:3000], y[:3000]
    u = np.geomspace(1e-3, 1e3, 100_000)
    u = np.concatenate([-u[::-1], u])
    line = np.linspace(-25, 25, 250_001)  # the draws have |coordinate| < 20
    # each hyperbola u·v = c sampled both as (u, c/u) and as (c/v, v): fine where it is flat and where it is steep
    curves = {"internal": [np.c_[line, 0 * line], np.c_[0 * line, line], np.c_[u, -2 / u], np.c_[-2 / u, u]],
              "external": [np.c_[u, 1 / u - 1], np.c_[u, -1 / u - 1], np.c_[1 / u, u - 1], np.c_[-1 / u, u - 1]]}[name]
    outside = ~INSIDE[name](x, y)
    d_dense, _ = cKDTree(np.concatenate(curves)).query(np.c_[x, y])
    px, py = regions.PROJECTIONS[name](x, y)
    d_exact = np.hypot(px - x, py - y)
    assert outside.sum() > 2000
    assert np.all(d_exact[outside] <= d_dense[outside] + 1e-12)  # exact never loses to a sampled boundary point
    assert np.max((d_dense - d_exact)[outside]) < 2e-3  # and the samples come as close as their spacing allows


def test_nearest_point_on_a_hyperbola_solves_the_quartic_and_is_orthogonal():
    rng = np.random.default_rng(2)
    a, b = rng.normal(0, 3, size=(2, 500))
    c = rng.choice([-2.0, -1.0, 1.0, 3.0], size=500)
    u, v = regions.nearest_on_hyperbola(a, b, c)
    assert np.allclose(u * v, c, rtol=1e-12)
    quartic = u ** 4 - a * u ** 3 + b * c * u - c ** 2
    assert np.max(np.abs(quartic) / (1 + np.abs(u) ** 4 + np.abs(a * u ** 3))) < 1e-11
    # (u - a, v - b) is normal to the curve, whose tangent is (1, -c/u²)
    assert np.max(np.abs((u - a) - (v - b) * c / u ** 2) / (1 + np.hypot(u - a, v - b))) < 1e-9


@pytest.mark.parametrize("name", ["internal", "external"])
def test_points_inside_stay_and_projecting_twice_changes_nothing(name):
    x, y = np.random.default_rng(3).normal(0, 2, size=(2, 5000))
    inside = INSIDE[name](x, y)
    px, py = regions.PROJECTIONS[name](x, y)
    assert np.array_equal(px[inside], x[inside]) and np.array_equal(py[inside], y[inside])
    qx, qy = regions.PROJECTIONS[name](px, py)
    assert np.allclose(qx, px, atol=1e-12) and np.allclose(qy, py, atol=1e-12)


def test_outside_points_land_on_the_level_set_they_crossed():
    x, y = np.random.default_rng(4).normal(0, 3, size=(2, 5000))
    px, py = regions.project_internal(x, y)
    t = x * y
    assert np.all((px * py)[t > 0] == 0)  # on an axis
    assert np.allclose((px * py)[t < -2], -2, atol=1e-12)
    px, py = regions.project_external(x, y)
    s = x * (1 + y)
    assert np.allclose((px * (1 + py))[s > 1], 1, atol=1e-12)
    assert np.allclose((px * (1 + py))[s < -1], -1, atol=1e-12)


def test_band_functions_describe_exactly_the_open_stable_regions():
    rng = np.random.default_rng(5)
    x, y = rng.uniform(-10, 10, 20000), rng.uniform(-6, 6, 20000)
    for band, stable in ((regions.external_band, regions.stable_external),
                         (regions.internal_band, regions.stable_internal)):
        lo, hi = band(x)
        assert np.array_equal((lo < y) & (y < hi), stable(x, y))


def test_stability_predicates_accept_complex_eigenvalues():
    # external: a disc of radius 1/|λ_g| around λ_h = -1 (App. B.4's "ball centred at -1")
    assert regions.stable_external(4.0, -1 + 0.2j) and not regions.stable_external(4.0, -1 + 0.3j)
    assert regions.stable_internal(1.0, -1 + 0.5j) and not regions.stable_internal(1.0, 0.1j)


def test_each_sigma_uses_a_fresh_generator_seeded_zero():
    x1, y1 = regions.draw(1.0)
    x4, y4 = regions.draw(4.0)
    assert x1.shape == (10_000,)
    assert np.array_equal(x4, 4.0 * x1) and np.array_equal(y4, 4.0 * y1)
    z = np.random.default_rng(0).normal(0.0, 2.0, size=(10_000, 2))
    assert np.array_equal(regions.draw(2.0)[0], z[:, 0])


def test_log_range_and_balance_on_known_points():
    assert regions.log_range(np.e, 1.0) == pytest.approx(1.0, rel=1e-7)
    assert regions.log_range(1.0, np.e) == pytest.approx(1.0, rel=1e-7)
    assert regions.balance(2.0, -1.0) == pytest.approx(0.5, rel=1e-7)
    assert regions.balance(0.0, 0.0) == 1.0
    assert regions.log_range(1.0, 0.0) == pytest.approx(np.log(1e8), rel=1e-6)  # an axis point: set by ε


@pytest.mark.parametrize("n", [1_000, 10_000])
def test_table3_costs_one_batched_root_solve_per_boundary_level_whatever_the_number_of_draws(n, monkeypatch):
    """The projection is closed-form and batched: per σ one companion eigen-solve for the internal level xy = -2 and
    one for each external level x(1 + y) = ±1, each over exactly the draws beyond that level, for any n."""
    solved = []
    eigvals = np.linalg.eigvals

    def counting_eigvals(a):
        solved.append(len(a))
        return eigvals(a)

    monkeypatch.setattr(np.linalg, "eigvals", counting_eigvals)
    regions.anisotropy(n=n)
    expected = []
    for sigma in regions.SIGMAS:
        x, y = regions.draw(sigma, n)
        s = x * (1 + y)
        beyond = [x * y < regions.INTERNAL_LO, s > regions.EXTERNAL_HI, s < regions.EXTERNAL_LO]
        expected += [int(m.sum()) for m in beyond if m.any()]
    assert solved == expected
    assert len(solved) >= 2 * len(regions.SIGMAS)  # the external levels are crossed at every σ


def test_table3_summaries_match_a_direct_computation():
    result = regions.anisotropy(sigmas=(2.0,))
    x, y = regions.draw(2.0)
    px, py = regions.project_external(x, y)
    lr = regions.log_range(px, py)
    s = result[2.0]["external"]
    assert s.log_range_mean == pytest.approx(lr.mean(), rel=1e-12)
    assert s.log_range_se == pytest.approx(lr.std(ddof=1) / 100, rel=1e-12)
    assert s.log_range_median == pytest.approx(np.median(lr), rel=1e-12)
    assert s.projected_fraction == pytest.approx(np.mean(~regions.stable_external(x, y, closed=True)))


def test_anisotropy_json_has_sigma_then_placement_then_six_numbers():
    doc = json.loads(json.dumps(regions.anisotropy_json(regions.anisotropy())))
    assert list(doc) == ["0.5", "1", "2", "4"]
    keys = {"log_range_mean", "log_range_se", "log_range_median", "balance_mean", "balance_se", "balance_median"}
    for per in doc.values():
        assert set(per) == {"internal", "external"}
        for numbers in per.values():
            assert set(numbers) == keys
            assert 0 < numbers["balance_median"] <= 1 and numbers["log_range_se"] > 0
