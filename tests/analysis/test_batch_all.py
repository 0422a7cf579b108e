"""``AnalysisOptions.batch`` (``--batch auto|all``, issue 35): ``all`` runs the stages on all samples at once with
the eigensolver's restarts batched, as on a GPU, here on the CPU. Its numbers agree with the CPU default's (the
per-sample path, which ``auto`` keeps) to the eigensolver's tolerance and with dense references, with the same
statuses and flags; ``auto`` on the CPU is the per-sample path."""

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from stability.analysis.options import AnalysisOptions
from stability.analysis.pipeline import analyze_split
from stability.cli import build_parser
from stability.config import TaskConfig
from stability.tasks import make_task
from tests.analysis.test_few_samples import L, _contractive_model


def dense_rho(model, x, x0) -> float:
    """ρ of ∂step/∂x at one sample by the dense autograd Jacobian and numpy's eigvals (the reference)."""
    J = torch.func.jacrev(lambda t: model.step(t.unsqueeze(0), x0.unsqueeze(0))[0])(x)
    n = x.numel()
    return float(np.abs(np.linalg.eigvals(J.reshape(n, n).numpy())).max())


@pytest.mark.parametrize("precision,tol", [("mixed", 1e-6), ("float64", 1e-10)])
def test_batch_all_agrees_with_the_per_sample_default_and_the_dense_reference_on_the_matrix_free_route(precision,
                                                                                                      tol):
    task = make_task(TaskConfig(name="prefix-sums", train_size=4, val_size=4, hard_size=2, train_length=L,
                                hard_length=8))
    m = _contractive_model()
    base = dict(samples=4, tol=1e-10, max_iter=80, iterations=5, probes=2, eig_tol=tol, eig_precision=precision,
                stages=("reachability", "rho", "prop4"))
    with pytest.MonkeyPatch.context() as mp:  # the matrix-free routes at this size
        mp.setattr("stability.numerics.spectra.DENSE_MAX", 8)
        mp.setattr("stability.numerics.spectra.DENSE_KRYLOV_MAX", 8)
        auto = analyze_split(m, task, "val", AnalysisOptions(**base))
        every = analyze_split(m, task, "val", AnalysisOptions(**base, batch="all"))
    a, e = auto.to_dict(), every.to_dict()
    assert a["fixed_point"]["status"] == e["fixed_point"]["status"] == ["converged"] * 4
    assert a["jacobian"]["method"].startswith("Krylov–Schur on Jᵀ (torch, 1 sample(s) per batch;")
    assert e["jacobian"]["method"].startswith("Krylov–Schur on Jᵀ (torch, 4 sample(s) per batch, restarts batched;")
    assert e["jacobian"]["eigen_converged"] == a["jacobian"]["eigen_converged"] == [True] * 4
    rho_a, rho_e = np.array(a["jacobian"]["spectral_radius"]), np.array(e["jacobian"]["spectral_radius"])
    ref = np.array([dense_rho(m, every.x_star[b], every.x0[b]) for b in range(4)])
    assert np.all(np.abs(rho_e - rho_a) <= tol * rho_a) and np.all(np.abs(rho_e - ref) <= tol * ref)
    assert np.allclose(e["jacobian"]["sigma_max"], a["jacobian"]["sigma_max"], rtol=tol)
    assert np.allclose(e["prop4"]["rho_M"], a["prop4"]["rho_M"], rtol=tol)


def test_batch_is_a_flag_of_analyze_and_auto_by_default():
    args = build_parser("analyze").parse_args(["analyze", "ckpt.pt", "--batch", "all"])
    assert args.batch == "all" and AnalysisOptions().batch == "auto"
    assert AnalysisOptions().eig_restart == "auto" and AnalysisOptions(batch="all").eig_restart == "batched"
    assert AnalysisOptions().eig_chunk(32, "cpu") == 1 and AnalysisOptions().eig_chunk(32, "cuda") == 32
    assert AnalysisOptions(batch="all").eig_chunk(32, "cpu") == 32
    assert AnalysisOptions(batch="all", eig_batch=4).eig_chunk(32, "cpu") == 4
    with pytest.raises(Exception, match="batch"):
        AnalysisOptions(batch="some")


def test_batch_all_gives_every_stage_the_per_sample_paths_statuses_and_values_on_the_matrix_free_route():
    """Every stage with ``--batch all`` (the eigensolver's restarts batched in rho, prop4, repelling and geometry;
    the basins and the repelling roots told apart for all samples at once) against the CPU default: statuses,
    counts and decisions identical, ρ values to the eigensolver's tolerance, the rest equal."""
    task = make_task(TaskConfig(name="prefix-sums", train_size=4, val_size=4, hard_size=2, train_length=L,
                                hard_length=8))
    m = _contractive_model()
    tol = 1e-10
    base = dict(samples=4, tol=1e-10, max_iter=80, iterations=5, probes=2, eig_tol=tol, eig_precision="float64",
                stages=("reachability", "rho", "prop4", "prop5", "input", "a8", "repelling", "geometry"),
                geometry_directions=2, geometry_samples=2, geometry_group_directions=0, geometry_certify=2,
                geometry_plane=3, repelling_starts=2, repelling_budget=40)
    with pytest.MonkeyPatch.context() as mp:  # the matrix-free routes at this size
        mp.setattr("stability.numerics.spectra.DENSE_MAX", 8)
        mp.setattr("stability.numerics.spectra.DENSE_KRYLOV_MAX", 8)
        a = analyze_split(m, task, "val", AnalysisOptions(**base)).to_dict()
        e = analyze_split(m, task, "val", AnalysisOptions(**base, batch="all")).to_dict()
    assert a["fixed_point"]["status"] == e["fixed_point"]["status"] == ["converged"] * 4
    assert a["fixed_point"]["residual"] == e["fixed_point"]["residual"]
    assert a["input_dependence"] == e["input_dependence"] and a["prop5"] == e["prop5"]
    ra, re_ = a["repelling"], e["repelling"]
    for k in ("roots", "repelling", "attracting", "marginal", "ran_out", "start_status", "nfe", "searched"):
        assert ra[k] == re_[k], k
    assert ra["roots_total"] >= 4  # at least x* itself per sample; ρ at the others from one batched eigensolve
    for rs_a, rs_e in zip(ra["rho"], re_["rho"]):
        assert np.allclose(rs_e, rs_a, rtol=10 * tol, atol=0)
    ia, ie = a["initial_iterate"], e["initial_iterate"]
    assert ia == ie and ia["global"]["compared"] == 4 and ia["global"]["basins"] == [1] * 4
    ga, ge = a["geometry"], e["geometry"]
    assert ga["samples"] == ge["samples"] and ga["reasons"] == ge["reasons"]
    assert ga["attracting_at_theta"] == ge["attracting_at_theta"] == [True, True]
    assert np.allclose(np.array(ge["radii"], dtype=float), np.array(ga["radii"], dtype=float), rtol=1e-9)
    assert ga["plane"]["status"] == ge["plane"]["status"]
    assert np.allclose(np.array(ge["plane"]["rho"], dtype=float), np.array(ga["plane"]["rho"], dtype=float),
                       rtol=1e-6, equal_nan=True)  # None: the cell's solve failed, in both


def test_the_basins_told_apart_at_once_equal_the_clusters_of_each_sample_alone():
    """initial_iterate.global_dependence computes every sample's links on the device at once; the reference is
    stats.distinct_clusters on each sample's converged starts (the metric's definition), and the distance the
    largest relative L∞ gap between two converged starts, by numpy."""
    from stability.analysis.initial_iterate import global_dependence
    from stability.stats import distinct_clusters

    g = torch.Generator().manual_seed(3)
    B, tol, eps = 6, 1e-3, 1e-8
    a = torch.randn(B, 5, generator=g, dtype=torch.float64)
    b = a + 1e-6 * torch.randn(B, 5, generator=g, dtype=torch.float64)  # the same basin as a
    c = a.clone()
    c[::2] += 1.0  # another basin on the even samples
    c[1, 0] = float("nan")  # no link from a non-finite point
    conv = [torch.ones(B, dtype=torch.bool), torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.bool),
            torch.tensor([1, 1, 1, 1, 0, 1], dtype=torch.bool)]
    got = global_dependence(["e", "x0", "zeros"], [a, b, c], conv, tol=tol, eps=eps)
    for s in range(B):
        pts = [x[s].numpy() for x, k in zip((a, b, c), conv) if k[s]]
        assert got["basins"][s] == distinct_clusters(np.stack(pts), atol=eps, rtol=tol)[0]
        gaps = [np.abs(p - q).max() / (max(np.abs(p).max(), np.abs(q).max()) + eps)
                for i, p in enumerate(pts) for q in pts[i + 1:]]
        assert got["distance"][s] == pytest.approx(max(gaps), rel=1e-15, nan_ok=True)
    assert got["basins"] == [2, 2, 2, 1, 1, 1] and got["converged_starts"] == [3, 3, 2, 3, 2, 3]


@pytest.mark.parametrize("method", ["broyden", "anderson", "picard"])
def test_a_solver_with_batched_rows_takes_the_per_row_paths_iterations_to_rounding(method):
    """Solve.batched (the GPU's path; --batch all): the best iterates are kept without a host sync, and Broyden's
    rows leave the batch and are compressed by one batched operation. Against the per-row path on a map whose samples converge at different evaluations, with a memory
    small enough that the bases are compressed: the same statuses and evaluations, x* to rounding, and x* a fixed
    point (the residual ‖f(x*) − x*‖∞ recomputed)."""
    from stability.solvers import solve

    g = torch.Generator().manual_seed(5)
    n, B = 24, 6
    W = torch.randn(n, n, generator=g, dtype=torch.float64) / n ** 0.5
    gain = torch.linspace(0.5, 1.4, B, dtype=torch.float64)[:, None]  # from contractive to a little expansive

    def f(x, x0):  # x0 carries each row's gain in its first column: the solver restricts x0 to the running rows
        return torch.tanh(x0[:, :1] * (x @ W.T)) + x0[:, 1:]

    x0 = torch.cat([gain, torch.randn(B, n, generator=g, dtype=torch.float64)], 1)
    kw = dict(method=method, tol=1e-9, max_iter=400, memory=4, max_period=0, certify_rho=False)
    if method == "picard":
        x0[:, :1] = 0.6 * gain  # contractive for plain iteration
    rows = solve(f, torch.zeros(B, n, dtype=torch.float64), x0, **kw, batched=False)
    once = solve(f, torch.zeros(B, n, dtype=torch.float64), x0, **kw, batched=True)
    assert once.status == rows.status == ["converged"] * B
    assert once.nfe.tolist() == rows.nfe.tolist() and len(set(rows.nfe.tolist())) > 2  # rows end at their own times
    assert once.info == rows.info and (method != "broyden" or rows.info["compressions"] > 0)
    conv = once.converged
    assert torch.allclose(once.x_best[conv], rows.x_best[conv], rtol=0, atol=1e-12)
    assert float((f(once.x_best[conv], x0[conv]) - once.x_best[conv]).abs().max()) <= 1e-8


def _rows_map(B: int, n: int = 24):
    """A map whose rows converge at their own evaluations (x0's first column: each row's gain), and its x0."""
    g = torch.Generator().manual_seed(5)
    W = torch.randn(n, n, generator=g, dtype=torch.float64) / n ** 0.5
    gain = torch.linspace(0.5, 1.4, B, dtype=torch.float64)[:, None]

    def f(x, x0):
        return torch.tanh(x0[:, :1] * (x @ W.T)) + x0[:, 1:]

    return f, torch.cat([gain, torch.randn(B, n, generator=g, dtype=torch.float64)], 1)


class _HostSyncs(TorchFunctionMode):
    """Counts the calls that make the host wait for the device on a GPU (benchmarks/launch_bound.py's list)."""

    NAMES = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"}

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, "__name__", "") in self.NAMES
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("method", ["broyden", "anderson"])
def test_batched_refused_proposals_restart_the_rows_as_the_per_row_path(method):
    """Solve.batched with the safeguard firing at most evaluations (restart factor 1.1): the refused rows' Picard
    steps taken by torch.where, their histories cleared at the next evaluation's host sync, give the per-row
    path's restarts, evaluations and statuses, and x* to rounding (issue 35); clearing the refused rows' histories
    (Broyden's count of basis vectors left read on the host) rides on that sync: about one a evaluation in all."""
    from stability.solvers import solve

    B = 6
    f, x0 = _rows_map(B)
    kw = dict(method=method, tol=1e-9, max_iter=400, memory=4, max_period=0, certify_rho=False, restart_factor=1.1)
    rows = solve(f, torch.zeros(B, 24, dtype=torch.float64), x0, **kw, batched=False)
    counter = _HostSyncs()
    with counter:
        once = solve(f, torch.zeros(B, 24, dtype=torch.float64), x0, **kw, batched=True)
    assert sum(rows.info["restarts"]) > 300  # the safeguard fired, at most evaluations of two rows
    assert counter.count <= int(once.nfe.max()) + 4 * B + 8, counter.count
    assert once.status == rows.status and once.status.count("converged") == 4
    assert once.nfe.tolist() == rows.nfe.tolist() and once.info == rows.info
    assert torch.allclose(once.x_best, rows.x_best, rtol=0, atol=1e-12)


@pytest.mark.parametrize("method", ["broyden", "anderson", "picard"])
def test_a_batched_solve_syncs_with_the_host_once_per_evaluation(method):
    """Solve.batched (the GPU's path): the calls that wait for the device (item, tolist, bool of a tensor, …)
    number at most one per evaluation of the slowest row, plus a few for each row that ends and for the
    result (issue 35: no host sync inside an iteration but the row-exit test)."""
    from stability.solvers import solve

    B = 6
    f, x0 = _rows_map(B)
    if method == "picard":
        x0[:, :1] *= 0.6  # contractive for plain iteration
    counter = _HostSyncs()
    with counter:
        once = solve(f, torch.zeros(B, 24, dtype=torch.float64), x0, method=method, tol=1e-9, max_iter=400,
                     memory=4, max_period=0, certify_rho=False, batched=True)
    assert once.status == ["converged"] * B
    evaluations = int(once.nfe.max())
    assert counter.count <= evaluations + 4 * B + 8, (counter.count, evaluations)


def test_rows_leaving_a_batched_broyden_solve_wait_for_no_host_sync(monkeypatch):
    """Solve.batched, Broyden with refused proposals (the rows' histories of unequal length): a row that ends
    leaves the batch without the host reading anything (issue 35: the histories' longest length stays an upper
    bound), and the solve keeps the per-row path's statuses, evaluations and x* to rounding."""
    from stability import solvers
    from stability.solvers import solve

    B = 6
    f, x0 = _rows_map(B)
    kw = dict(method="broyden", tol=1e-9, max_iter=400, memory=4, max_period=0, certify_rho=False,
              restart_factor=1.1)
    keep, leaving = solvers._Broyden.keep, []

    def counted(self, mask):
        counter = _HostSyncs()
        with counter:
            keep(self, mask)
        leaving.append((counter.count, self.uniform))
    rows = solve(f, torch.zeros(B, 24, dtype=torch.float64), x0, **kw, batched=False)
    monkeypatch.setattr(solvers._Broyden, "keep", counted)
    once = solve(f, torch.zeros(B, 24, dtype=torch.float64), x0, **kw, batched=True)
    assert len(leaving) >= 3 and not all(u for _, u in leaving)  # rows left with histories of unequal length
    assert [c for c, _ in leaving] == [0] * len(leaving)
    assert once.status == rows.status and once.nfe.tolist() == rows.nfe.tolist()
    assert torch.allclose(once.x_best, rows.x_best, rtol=0, atol=1e-12)
