"""The geometry stage's continued solves are the toolkit's one solver (issue 34, "one of each"): the radius search
and its single-t solves run :func:`stability.solvers.solve` (preset CONTINUED, row-wise), and give the radii, the
reasons, the counts and the plane pictures the separate Picard loop of continuation.py gave, bit for bit (the plane's ρ, LAPACK's dense eigenvalues, to 1e-13 across CPUs).

The reference numbers below were computed by that loop (``picard_rows`` and ``continuation`` of commit fb361af)
on the same inputs: a diagonal linear recall map with inputs ≠ 0 (diverged cells, ρ-decided radii and their
certification), a tanh recall map (stalled and cycling cells) and a small looped transformer whose parameters are
drawn from a seeded generator (a cycle in the search itself).
"""

import torch

from stability.analysis.closed_form_regions import DiagonalRecall
from stability.analysis.geometry import measure
from stability.numerics import Linearisation, spectral_radius
from stability.solvers import solve


class TanhRecall(torch.nn.Module):
    """x ↦ 1.5·tanh(W x) + x0 as a LoopedModel."""

    def __init__(self, W):
        super().__init__()
        self.W = torch.nn.Parameter(torch.as_tensor(W, dtype=torch.float64).clone())

    def embed(self, inputs):
        return inputs

    def initial_state(self, x0, generator=None):
        return x0

    def step(self, x, x0):
        return torch.tanh(x @ self.W.T) * 1.5 + x0

    def readout(self, x):
        return torch.stack([x, -x], dim=-1)


def geometry(model, inputs, *, directions=4, plane=7, tol=1e-6, max_iter=300):
    x0 = model.embed(inputs)
    sol = solve(model.step, model.initial_state(x0), x0, tol=tol, max_iter=max_iter)
    rho = spectral_radius(Linearisation(model.step, sol.x_best, x0)).rho.tolist()
    attracting = [s == "converged" and r < 1 for s, r in zip(sol.status, rho)]
    return measure(model, inputs, sol.x_best, x0, attracting, rho, samples=list(range(inputs.shape[0])),
                   directions=directions, group_directions=0, certify=4, plane=plane, tol=tol, max_iter=max_iter,
                   seed=0).to_dict()


N = None
DIAG = {
    "radii": [[0.8226284754383119, 0.2088547564854828, 0.8698237104163928, 0.8698237104163928, 1.0,
               0.2953652291878999, 1.0, 0.2708511093873786],
              [0.9197265956535406, 0.24837156241469688, 0.9724924724660731, 0.9197265956535406, 1.0,
               0.35125043207465995, 1.0, 0.32209806638985095]],
    "reasons": [["max-iterations"] * 4 + ["t_max", "max-iterations", "t_max", "max-iterations"],
                ["rho"] * 4 + ["t_max", "rho", "t_max", "rho"]],
    "certified": [[False] * 8, [True] * 4 + [False] * 4],
    "counts": {"radii": 16, "rounds": 1588, "evaluations": 135, "rho_products": 468, "certified_rho": 8,
               "map_calls": 1613, "reopened": 0},
    "plane_rho": [[N, N, 0.8625888203581772, N, N, N, N], [N, N, 0.9294994613452726, 0.8598197706164328, N, N, N],
                  [N, N, N, 0.733089359012904, 0.866149199678687, N, N],
                  [N, N, N, 0.8000000000000003, 0.6862393143704691, 0.8724786287409382, N],
                  [N, N, N, 0.8669106409870962, 0.6035898976676312, 0.6925687434327223, 0.8788080578031914],
                  [N, N, N, 0.9338212819741907, 0.7994848192085248, 0.8349475941844247, 0.8704103691603232],
                  [N] * 7],
    "plane_status": [["diverged", "stalled", "converged", "stalled", "stalled", "diverged", "diverged"],
                     ["diverged", "stalled", "converged", "converged", "stalled", "stalled", "diverged"],
                     ["diverged", "stalled", "max-iterations", "converged", "converged", "stalled", "stalled"],
                     ["diverged", "diverged", "stalled", "converged", "converged", "converged", "stalled"],
                     ["diverged", "diverged", "stalled", "converged", "converged", "converged", "converged"],
                     ["diverged", "diverged", "stalled", "converged", "converged", "converged", "converged"],
                     ["diverged", "diverged", "stalled", "max-iterations", "stalled", "stalled", "stalled"]],
}
TANH = {
    "radii": [[0.9724924724660731, 1.0, 0.766082624558859, 1.0, 1.0, 1.0, 1.0, 0.4555154539026767],
              [0.9724924724660731, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.5417022187747572],
              [0.9724924724660731, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.4555154539026767]],
    "reasons": [["max-iterations", "t_max", "max-iterations", "t_max", "t_max", "t_max", "t_max", "max-iterations"],
                ["max-iterations"] + ["t_max"] * 6 + ["max-iterations"],
                ["max-iterations"] + ["t_max"] * 6 + ["max-iterations"]],
    "counts": {"radii": 24, "rounds": 988, "evaluations": 199, "rho_products": 950, "certified_rho": 0,
               "map_calls": 1008, "reopened": 0},
    "plane_rho": [[0.8452394109495879, 0.8568303186247294, 0.830802079116058, 0.821263428179171, 0.8584516079670903,
                   N, N],
                  [0.5832158933054506, 0.6314834385282815, 0.6077259000497743, 0.6260113033369654,
                   0.7756263025210142, N, N],
                  [0.8694867666076332, 0.7584964074599558, 0.4863216622589118, 0.5087333180435145,
                   0.5708561188910041, 0.876311297723124, N],
                  [0.9388185180262577, 0.7438461137036418, 0.6768033350599152, 0.6490587856900084,
                   0.5114652109376984, 0.7603897294625328, N],
                  [0.8819733777131802, 0.7471730998845241, 0.7975968946511461, 0.8137791651172881,
                   0.6749997306170697, 0.8861418503505782, N],
                  [0.6578442685343683, 0.6726014745051998, 0.7899802096138223, 0.9147325766965471,
                   0.8109072537921275, N, N],
                  [0.7207296280729006, 0.629853087138062, 0.7693255977542124, N, N, N, N]],
    "plane_status": [["converged"] * 5 + ["stalled", "cycle"], ["converged"] * 5 + ["stalled"] * 2,
                     ["converged"] * 6 + ["stalled"], ["converged"] * 6 + ["stalled"],
                     ["converged"] * 6 + ["stalled"], ["converged"] * 5 + ["stalled"] * 2,
                     ["converged"] * 3 + ["stalled"] * 4],
}


def check(geo, want):
    assert geo["radii"] == want["radii"]
    assert geo["reasons"] == want["reasons"]
    assert geo["counts"] == want["counts"]
    if "certified" in want:
        assert geo["certified"] == want["certified"]
    got, ref = geo["plane"]["rho"], want["plane_rho"]
    assert [[v is None for v in r] for r in got] == [[v is None for v in r] for r in ref]
    # the plane's ρ is LAPACK's dense eigenvalues, whose last bits differ between CPUs (an AMD EPYC made the
    # references; an Intel Xeon differs by up to 4e-16): equal to 1e-13 relative, the rest above bit for bit
    assert all(abs(a - b) <= 1e-13 * abs(b) for r, q in zip(got, ref) for a, b in zip(r, q) if b is not None)
    assert geo["plane"]["status"] == want["plane_status"]


def test_continued_solves_through_solvers_solve_give_the_old_radii_counts_and_planes_of_a_diagonal_map():
    inputs = torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    check(geometry(DiagonalRecall([0.5, -0.3, 0.8, 0.1]), inputs), DIAG)


def test_continued_solves_through_solvers_solve_give_the_old_radii_counts_and_planes_of_a_tanh_map():
    g = torch.Generator().manual_seed(3)
    W = torch.randn(5, 5, generator=g, dtype=torch.float64) * 0.3
    check(geometry(TanhRecall(W), torch.randn(3, 5, generator=g, dtype=torch.float64) * 0.5), TANH)


def test_continued_solves_through_solvers_solve_give_the_old_radii_of_a_looped_transformer():
    from stability.analysis.fixed_point import analysis_model
    from stability.config import ModelConfig
    from stability.model.looped import LoopedTransformer

    model = LoopedTransformer(ModelConfig(width=8, heads=2, norm="post", recall="external", in_channels=1,
                                          out_channels=2))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.38)
    inputs = torch.randint(0, 2, (2, 6, 1), generator=g).double()
    geo = geometry(analysis_model(model), inputs, directions=3, plane=0, tol=1e-5, max_iter=200)
    assert geo["radii"] == [[0.8698237104163928, 1.0, 0.1354255546936893, 1.0, 1.0, 0.2953652291878999],
                            [1.0, 1.0, 0.1354255546936893, 1.0, 1.0, 0.2953652291878999]]
    assert geo["reasons"] == [["cycle", "t_max", "max-iterations", "t_max", "t_max", "max-iterations"],
                              ["t_max", "t_max", "max-iterations", "t_max", "t_max", "max-iterations"]]
    assert geo["counts"] == {"radii": 12, "rounds": 788, "evaluations": 88, "rho_products": 1569,
                             "certified_rho": 0, "map_calls": 829, "reopened": 0}
