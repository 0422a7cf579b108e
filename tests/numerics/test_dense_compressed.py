"""The compressed dense Jacobian (forward-mode columns, positions coloured by the outputs they reach) and the
per-matrix dense spectra: each against an independent reference (``torch.func.jacrev`` per sample, LAPACK
``eigvals`` / ``svdvals``)."""

import numpy as np
import pytest
import torch

import stability.numerics.jacobian as jac
from stability.analysis.fixed_point import analysis_model
from stability.analysis.options import AnalysisOptions
from stability.analysis.pipeline import run_stages
from stability.analysis.recall import RecallMatrixOperator
from stability.config import ModelConfig
from stability.model import build_model
from stability.numerics import Linearisation, sigma_max, spectral_radius
from stability.numerics.jacobian import colour_positions, position_pattern
from stability.solvers import solve

L = 16  # tokens: with a window of 5 a position reaches 5 outputs, so 5 colours serve 16 positions


def local_model(window=5, seed=0):
    torch.manual_seed(seed)
    m = analysis_model(build_model(ModelConfig(recall="external", norm="pre", width=8, heads=2,
                                               attention_window=window)))
    with torch.no_grad():
        m.block.attn.out.weight.mul_(0.3)
        m.block.mlp.proj.weight.mul_(0.3)
        m.recall_map.x.weight.mul_(0.3)
    return m


def point(m, n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    x0 = m.embed(torch.randint(0, 2, (n, L, 1), generator=g).double() - 0.5)
    return solve(m.step, x0, x0, tol=1e-12, max_iter=300).x_best, x0


def jacrev(f, x, x0):
    n = x[0].numel()
    return torch.stack([torch.func.jacrev(lambda p: f(p.unsqueeze(0), x0[b:b + 1])[0])(x[b]).reshape(n, n)
                        for b in range(x.shape[0])])


def test_positions_of_a_local_window_reach_only_their_neighbours_and_take_five_colours():
    m = local_model()
    x, x0 = point(m)
    pattern = position_pattern(m.step, x, x0, c=16)
    reach = [set(torch.nonzero(pattern[p]).flatten().tolist()) for p in range(L)]
    assert reach[8] == {6, 7, 8, 9, 10}  # the window of 5 around 8: queries 6..10 see key 8
    # at the ends the windows shift inward (every query sees 5 keys), so key 4 is seen by queries 0..6
    assert reach[0] == {0, 1, 2} and reach[4] == set(range(7)) and all(len(r) == 5 for r in reach[5:11])
    colours = colour_positions(pattern)
    assert len(colours) == 5 and sorted(sum(colours, [])) == list(range(L))
    for members in colours:  # no output is reached by two members of a colour
        for i, p in enumerate(members):
            for q in members[i + 1:]:
                assert not (pattern[p] & pattern[q]).any()


def test_compressed_jacobian_equals_jacrev_with_a_third_of_the_products(monkeypatch):
    m = local_model()
    x, x0 = point(m)
    tangents = []
    real = torch.func.vmap

    def counting(fn, *args, **kwargs):  # each vmapped forward-mode pass: count its tangents
        batched = real(fn, *args, **kwargs)
        return lambda T: tangents.append(T.shape[0]) or batched(T)

    monkeypatch.setattr(torch.func, "vmap", counting)
    J = Linearisation(m.step, x, x0).dense()
    monkeypatch.setattr(torch.func, "vmap", real)
    n = x[0].numel()
    assert (J - jacrev(m.step, x, x0)).abs().max() <= 1e-12
    # L pattern probes, then 5 colours x 8 features, against n = 128 columns uncompressed
    assert tangents == [L, 5 * 8] and sum(tangents) < n / 2
    cols = Linearisation(m.step, x, x0).dense(route="columns")
    rows = Linearisation(m.step, x, x0).dense(route="rows")
    assert (cols - J).abs().max() <= 1e-12 and (rows - J).abs().max() <= 1e-12


def test_a_wrong_pattern_fails_the_certificate_and_the_full_columns_are_taken(monkeypatch):
    m = local_model()
    x, x0 = point(m)
    # pretend every position reaches only itself: one colour for all, which mixes every column
    monkeypatch.setattr(jac, "position_pattern", lambda f, xx, xx0, c, linear=False: torch.eye(L, dtype=torch.bool))
    J = Linearisation(m.step, x, x0).dense()
    assert (J - jacrev(m.step, x, x0)).abs().max() <= 1e-12


def test_full_attention_is_not_compressed_and_still_exact():
    m = local_model(window=None)
    x, x0 = point(m)
    assert position_pattern(m.step, x, x0, c=16).all()
    assert (Linearisation(m.step, x, x0).dense() - jacrev(m.step, x, x0)).abs().max() <= 1e-12


class _NoForwardMode(torch.autograd.Function):
    """tanh with a backward (reverse mode, vmap) but no forward-mode rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return torch.tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return g * (1 - y * y)


def test_a_map_without_forward_mode_takes_the_rows_by_reverse_mode():
    W = torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 0.3
    f = lambda x, x0: _NoForwardMode.apply(x @ W + x0)  # noqa: E731
    x = torch.randn(4, 3, 6, dtype=torch.float64)
    x0 = torch.randn(4, 3, 6, dtype=torch.float64)
    with pytest.raises(Exception):
        Linearisation(f, x, x0).dense(route="columns")
    assert (Linearisation(f, x, x0).dense() - jacrev(f, x, x0)).abs().max() <= 1e-14


def test_prop4_M_columns_of_the_linear_map_equal_its_reverse_mode_rows():
    m = local_model()
    x, x0 = point(m)
    M_map = RecallMatrixOperator(m, x, x0).linear_map()
    M = M_map.dense()
    rows = M_map.dense(route="rows")
    assert (M - rows).abs().max() <= 1e-12
    assert (M - jacrev(m.step, x, x0)).abs().max() <= 1e-12  # Prop. 4: M_ext = J at x*


@pytest.mark.parametrize("n", [40, 200])
def test_dense_sigma_max_equals_the_largest_singular_value(n):
    A = torch.randn(5, n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(n))
    ref = torch.linalg.svdvals(A)[:, 0]
    assert ((sigma_max(A) - ref).abs() / ref).max() <= 1e-13


def test_the_dense_krylov_route_on_the_cpu_matches_lapack_to_its_tolerance():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(4, 150, 150, dtype=torch.float64, generator=g) / 150 ** 0.5
    A[:, 0, 0] += 2.0  # a leading eigenvalue near 2, separated from the disc of radius ~1
    spec = spectral_radius(A, route="dense-krylov", k=4, tol=1e-8)
    sig = sigma_max(A, route="dense-krylov")
    exact = torch.linalg.eigvals(A).abs().max(dim=1).values
    assert ((spec.rho - exact).abs() / exact).max() <= 1e-7
    assert (spec.ritz_residual < 1e-8).all()
    assert ((sig - torch.linalg.svdvals(A)[:, 0]).abs()).max() <= 1e-12
    assert spec.eigenvalues.shape == (4, 4) and (spec.products > 0).all()


def test_a8_solves_from_zeros_and_noise_in_one_batch_as_if_solved_apart():
    m = local_model()
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 2, (4, L, 1), generator=g).double() - 0.5
    o = AnalysisOptions(samples=4, stages=("a8",), tol=1e-8, max_iter=200)
    a8 = run_stages(m, inputs, None, o).to_dict()["initial_iterate"]
    x0 = m.embed(inputs)
    std = 1.0 if o.noise_std is None else float(o.noise_std)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(o.seed), dtype=torch.float64) * std
    ref = {k: solve(m.step, s, x0, method=o.solver, tol=o.tol, max_iter=o.max_iter)
           for k, s in {"x0": x0, "zeros": torch.zeros_like(x0), "noise": noise}.items()}
    assert a8["converged_fraction"] == {k: float(r.converged.double().mean()) for k, r in ref.items()}
    from stability.analysis.initial_iterate import fixed_point_distance

    dist = fixed_point_distance([r.x_best for r in ref.values()])
    assert a8["converged_fraction"]["noise"] == 1.0
    got = torch.tensor(a8["fixed_point_distance"], dtype=torch.float64)
    assert (got - dist).abs().max() <= 1e-12
