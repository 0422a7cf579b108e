"""The Krylov–Schur eigensolver with its restarts batched (``restart="batched"``, the GPU's path; issue 35), run on
the CPU: ρ to the solver's tolerance against the known spectra, numpy's dense eigenvalues and the per-sample path
(statuses identical), its thick restart against scipy's ordered real Schur form, and its host syncs and torch ops
per restart independent of the batch size."""

import numpy as np
import pytest
import scipy.linalg as sla
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import stability.numerics.eigen_batched as eb
from stability.numerics import Linearisation, sigma_max, spectral_radius
from stability.numerics.eigen import krylov_schur
from tests.numerics.test_analysis_operators import _clustered as clustered_pairs
from tests.numerics.test_analysis_operators import per_sample
from tests.numerics.test_analysis_operators import as_map
from tests.numerics.test_krylov_schur import clustered_batch, random_batch

D64 = torch.float64
TOL = 1e-10


def known_spectrum(B=4, n=90, seed=11):
    """Non-normal matrices P D P⁻¹ whose spectrum is set: a complex pair of modulus 0.95 leading a real 0.94 and a
    pair of 0.93, over a random bulk scaled to 0.8. Returns the matrices and their exact ρ (0.95)."""
    g = torch.Generator().manual_seed(seed)
    mats = []
    for b in range(B):
        blocks = []
        for r, ang in ((0.95, 0.7 + 0.1 * b), (0.93, 2.0)):
            blocks.append(torch.tensor([[r * np.cos(ang), -r * np.sin(ang)], [r * np.sin(ang), r * np.cos(ang)]],
                                       dtype=D64))
        bulk = torch.randn(n - 5, n - 5, generator=g, dtype=D64)
        bulk = bulk / torch.linalg.eigvals(bulk).abs().max() * 0.8
        D = torch.block_diag(blocks[0], torch.tensor([[0.94]], dtype=D64), blocks[1], bulk)
        P = torch.eye(n, dtype=D64) + 0.4 * torch.randn(n, n, generator=g, dtype=D64) / n ** 0.5
        mats.append(P @ D @ torch.linalg.inv(P))
    return torch.stack(mats), np.full(B, 0.95)


def jordan_batch(B=3, n=100, seed=3):
    """A 3 × 3 Jordan block at 0.9 (defective: its Ritz values split by ~eps^(1/3)) over a bulk below 0.7."""
    g = torch.Generator().manual_seed(seed)
    mats = []
    for _ in range(B):
        D = torch.zeros(n, n, dtype=D64)
        D[:3, :3] = torch.tensor([[0.9, 1, 0], [0, 0.9, 1], [0, 0, 0.9]], dtype=D64)
        bulk = torch.randn(n - 3, n - 3, generator=g, dtype=D64)
        D[3:, 3:] = bulk / torch.linalg.eigvals(bulk).abs().max() * 0.7
        P = torch.eye(n, dtype=D64) + 0.3 * torch.randn(n, n, generator=g, dtype=D64) / n ** 0.5
        mats.append(P @ D @ torch.linalg.inv(P))
    return torch.stack(mats)


def numpy_rho(A):
    return np.abs(np.linalg.eigvals(A.numpy())).max(axis=1)


FAMILIES = {"random": lambda: random_batch(B=6), "clustered": lambda: clustered_batch(B=4),
            "complex pairs": lambda: clustered_pairs()[0], "known": lambda: known_spectrum()[0]}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("product", ["forward", "transpose"])
def test_batched_restarts_give_rho_to_the_tolerance_of_numpy_and_of_the_per_sample_path(family, product):
    A = FAMILIES[family]()
    opts = dict(route="krylov", product=product, krylov=30, tol=TOL, restarts=300)
    batched = spectral_radius(as_map(A), restart="batched", **opts)
    alone = spectral_radius(as_map(A), restart="per-sample", **opts)
    ref = numpy_rho(A)
    assert np.all(np.abs(batched.rho.numpy() - ref) <= TOL * ref)
    assert np.all(np.abs(batched.rho.numpy() - alone.rho.numpy()) <= TOL * ref)
    assert torch.equal(batched.ritz_residual < TOL, alone.ritz_residual < TOL)
    assert (batched.ritz_residual < TOL).all()
    # the leading eigenvalues too (a conjugate pair comes back as a pair)
    top = np.sort(np.abs(np.linalg.eigvals(A.numpy())), axis=1)[:, ::-1][:, :2]
    assert np.allclose(batched.eigenvalues[:, :2].abs().numpy(), top, rtol=1e-7)
    if family == "known":
        assert np.allclose(batched.rho.numpy(), 0.95, rtol=TOL)


def test_the_default_restart_is_the_per_sample_path_on_the_cpu_bit_for_bit():
    A = clustered_batch(B=3)
    opts = dict(route="krylov", product="forward", krylov=30, tol=TOL, restarts=300)
    default, alone = spectral_radius(as_map(A), **opts), spectral_radius(as_map(A), restart="per-sample", **opts)
    assert torch.equal(default.rho, alone.rho) and torch.equal(default.products, alone.products)
    assert eb.restart_mode("auto", "cpu") == "per-sample" and eb.restart_mode("auto", "cuda") == "batched"


def test_a_batched_sample_iterates_as_if_alone_and_finished_samples_leave_the_batch_without_a_per_sample_loop():
    A, _ = clustered_pairs(batch=3)
    B, n = A.shape[0], A.shape[1]
    start = torch.randn(B, n, generator=torch.Generator().manual_seed(2), dtype=D64)
    opts = dict(route="krylov", product="forward", krylov=30, tol=1e-9, restart="batched")
    from tests.numerics.test_analysis_operators import Counted

    Counted.calls = []
    batch = spectral_radius(per_sample(A), start=start, **opts)
    calls = Counted.calls
    for b in range(B):
        alone = spectral_radius(per_sample(A[b:b + 1]), start=start[b:b + 1], **opts)
        assert int(batch.products[b]) == int(alone.products[0])
        assert abs(float(batch.rho[b]) - float(alone.rho[0])) < 1e-12
    assert len(set(batch.products.tolist())) > 1 and calls and all(len(c) < B for c in calls)
    assert batch.matvecs == int(batch.products.sum())


def test_the_batched_restart_keeps_the_invariant_subspace_of_scipys_ordered_schur_form():
    """Every sample's kept basis Q spans the invariant subspace of the p eigenvalues of largest modulus of its
    G = H[:s, :s] (scipy's ordered real Schur vectors: the principal angles vanish), a conjugate pair is never
    split, and M = Qᵀ G Q has exactly those eigenvalues; the samples' basis sizes s differ (padding)."""
    g = torch.Generator().manual_seed(4)
    a, m, want = 12, 24, 9
    Hh = torch.triu(torch.randn(a, m + 1, m, generator=g, dtype=D64), diagonal=-1)
    s = torch.tensor([24, 23, 22, 24, 20, 24, 23, 24, 21, 24, 24, 22])
    plan = eb.ritz_plan(Hh, s, torch.zeros(a, dtype=torch.bool), want=want, nev=3, tol=1e-300, last=False,
                        slack=100.0)
    assert not plan.done.any() and not plan.bad.any()
    assert set(plan.p.tolist()) <= {want, want + 1} and (plan.p == want + 1).any()
    for r in range(a):
        n_, p = int(s[r]), int(plan.p[r])
        G = Hh[r, :n_, :n_].numpy()
        theta = np.linalg.eigvals(G)
        theta = theta[np.argsort(-np.abs(theta), kind="stable")]
        thr = np.abs(theta[p - 1]) * (1 - 1e-9)
        _, Z, sdim = sla.schur(G, output="real", sort=lambda re, im: np.hypot(re, im) >= thr)
        assert sdim == p  # the pair rule: p is where scipy's ordered form ends a block
        Q = plan.Q[r, :n_, :p].numpy()
        assert np.allclose(Q.T @ Q, np.eye(p), atol=1e-13) and not plan.Q[r, n_:].any()
        assert np.max(sla.subspace_angles(Q, Z[:, :p])) < 1e-11
        kept = np.sort_complex(np.linalg.eigvals(plan.M[r, :p, :p].numpy()))
        assert np.allclose(kept, np.sort_complex(theta[:p]), atol=1e-12)
        assert np.allclose(plan.theta[r, :n_].numpy(), theta, atol=1e-12)


def test_a_near_defective_restart_falls_back_to_the_ordered_schur_form_and_agrees_with_the_per_sample_path(
        monkeypatch):
    A = jordan_batch()
    fell = []
    fallback = eb.schur_fallback
    monkeypatch.setattr(eb, "schur_fallback", lambda plan, rows, *a: (fell.extend(rows), fallback(plan, rows, *a)))
    opts = dict(route="krylov", product="forward", krylov=30, tol=TOL, restarts=100)
    checked = spectral_radius(as_map(A), restart="batched", **opts)
    monkeypatch.setattr(eb, "CHECK_EVERY", 0)  # at restarts only, where the per-sample path looks too
    batched = spectral_radius(as_map(A), restart="batched", **opts)
    alone = spectral_radius(as_map(A), restart="per-sample", **opts)
    assert fell  # the eigenvector basis of the split Jordan block missed DEFECT_MAX
    # a defective eigenvalue of a 3 × 3 block is known to (its residual)^(1/3) only: every path is off by no more
    for spec in (checked, batched, alone):
        assert ((spec.rho - 0.9).abs() <= spec.ritz_residual ** (1 / 3)).all() and (spec.ritz_residual < TOL).all()
    assert np.allclose(batched.rho.numpy(), alone.rho.numpy(), rtol=1e-6)
    # the checks between restarts stop a sample nearer where it converged, never later
    assert (checked.products <= batched.products).all() and (checked.products < batched.products).any()


def test_sigma_max_and_certified_mixed_precision_take_the_batched_restart_too():
    A, rhos = clustered_pairs(batch=3)
    svd = np.linalg.svd(A.numpy(), compute_uv=False)[:, 0]
    assert np.allclose(sigma_max(as_map(A), route="krylov", tol=1e-12, restart="batched").numpy(), svd, rtol=1e-9)
    opts = dict(route="krylov", product="forward", krylov=30, tol=1e-6, restarts=200, restart="batched")
    wrong = A + 1e-3 * torch.randn(A.shape, generator=torch.Generator().manual_seed(9), dtype=D64)
    spec = spectral_radius(as_map(A), fast=as_map(wrong), **opts)  # wrong fast products: redone exactly
    assert np.allclose(spec.rho.numpy(), rhos, rtol=1e-6) and (spec.ritz_residual < 1e-6).all()
    mixed = spectral_radius(as_map(A), fast=as_map(A.float(), torch.float32), **opts)
    assert np.allclose(mixed.rho.numpy(), rhos, rtol=1e-6) and (mixed.ritz_residual < 1e-6).all()


def test_a_non_finite_sample_gets_nan_and_leaves_the_others_intact_in_the_batched_restart():
    A, rhos = clustered_pairs(batch=3)
    A[1] = float("nan")
    spec = spectral_radius(as_map(A), route="krylov", product="forward", krylov=30, restarts=200, tol=1e-9,
                           restart="batched")
    assert torch.isnan(spec.rho[1]) and not bool(spec.ritz_residual[1] < 1)
    assert abs(float(spec.rho[0]) - rhos[0]) < 1e-9 and abs(float(spec.rho[2]) - rhos[2]) < 1e-9


def test_an_invariant_start_breaks_down_and_finishes_with_the_exact_eigenvalue():
    """A start vector in an invariant subspace: the basis breaks down (v = 0) and the sample finishes at the next
    restart with the subspace's exact eigenvalue, its product count that of the breakdown, as on the per-sample
    path."""
    A, _ = known_spectrum(B=2, n=40)
    n = A.shape[1]
    vals, vecs = torch.linalg.eig(A)
    start = torch.stack([vecs[b, :, (vals[b] - 0.94).abs().argmin()].real for b in range(2)])  # a real eigenvector
    out = {r: krylov_schur(lambda V: torch.bmm(A, V.unsqueeze(2)).squeeze(2), (2, n), start=start, krylov=20,
                           tol=TOL, restart=r) for r in ("batched", "per-sample")}
    for r, spec in out.items():
        assert np.allclose(spec.rho.numpy(), 0.94, rtol=1e-12), r
        assert spec.products.tolist() == [1, 1], r


class _Count(TorchFunctionMode):
    """Host syncs (as benchmarks/launch_bound.py counts them) and every torch call."""

    SYNCS = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"}

    def __init__(self):
        super().__init__()
        self.syncs = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.syncs += getattr(func, "__name__", "") in self.SYNCS
        return func(*args, **(kwargs or {}))


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _counted(B, monkeypatch):
    A = known_spectrum(B=B, n=60, seed=5)[0]
    A = A[:1].expand(B, -1, -1).contiguous()  # one operator and start B times: the same restarts whatever B
    start = torch.randn(1, A.shape[1], generator=torch.Generator().manual_seed(1), dtype=D64).expand(B, -1)
    looks = []  # the restarts and the checks between them
    plan = eb.ritz_plan
    monkeypatch.setattr(eb, "ritz_plan", lambda *a, **k: (looks.append(k.get("restart", True)), plan(*a, **k))[1])
    syncs, ops = _Count(), _Ops()
    with syncs, ops:
        spectral_radius(as_map(A), route="krylov", product="forward", krylov=40, tol=TOL, restart="batched",
                        start=start)
    assert not all(looks)  # a check between restarts was among them
    return syncs.syncs, ops.ops, len(looks)


def test_the_batched_restart_syncs_with_the_host_once_per_restart_or_check_and_its_ops_do_not_grow_with_the_batch(
        monkeypatch):
    small, large = _counted(4, monkeypatch), _counted(64, monkeypatch)
    assert small[2] == large[2] > 1  # the same number of restarts and checks
    for syncs, _, looks in (small, large):
        # per look: H to the host (the one sync on a GPU), its flags and sizes to Python (host data); at the
        # end the product counts
        assert syncs <= 2 * looks + 2
    assert large[0] == small[0] and large[1] <= 1.05 * small[1]


def cluster_below(B=8, n=120, seed=21):
    """Random contractive maps P D P⁻¹: a complex pair of modulus 0.89, three pairs clustered at 0.786–0.790 (the
    spectrum of the sample that was slowest in issue 35's 64-sample run), a bulk scaled to 0.7."""
    g = torch.Generator().manual_seed(seed)
    mats = []
    for b in range(B):
        blocks = [torch.tensor([[r * np.cos(a), -r * np.sin(a)], [r * np.sin(a), r * np.cos(a)]], dtype=D64)
                  for r, a in ((0.89, 1.3 + 0.05 * b), (0.790, 1.32), (0.7886, 1.9), (0.786, 0.4))]
        bulk = torch.randn(n - 8, n - 8, generator=g, dtype=D64)
        blocks.append(bulk / torch.linalg.eigvals(bulk).abs().max() * 0.7)
        P = torch.eye(n, dtype=D64) + 0.4 * torch.randn(n, n, generator=g, dtype=D64) / n ** 0.5
        mats.append(P @ torch.block_diag(*blocks) @ torch.linalg.inv(P))
    return torch.stack(mats)


@pytest.mark.parametrize("family", ["cluster below", "random"])
def test_batched_rho_equals_each_samples_dense_eigenvalues_on_random_contractive_maps(family):
    """The batched path's stopping rule (the secondary pairs near ρ to slack · tol, a cluster well below ρ to
    FAR_SLACK · tol) against numpy's dense eigenvalues of each sample alone: ρ to the Ritz tolerance, the leading
    pair's eigenvalue to it too, every sample certified; and on a cluster well below ρ it stops in fewer
    products than the per-sample path's rule, whose ρ it equals to the tolerance."""
    A = cluster_below() if family == "cluster below" else random_batch(B=6)
    A = A / (1.05 * torch.from_numpy(numpy_rho(A)))[:, None, None] * 0.9  # contractive: ρ = 0.857
    opts = dict(route="krylov", k=3, tol=1e-8, krylov=30, seed=2)
    batched = spectral_radius(as_map(A), restart="batched", **opts)
    alone = spectral_radius(as_map(A), restart="per-sample", **opts)
    for b in range(A.shape[0]):
        ev = np.linalg.eigvals(A[b].numpy())
        ev = ev[np.argsort(-np.abs(ev), kind="stable")]
        assert abs(float(batched.rho[b]) - abs(ev[0])) <= 1e-8 * abs(ev[0])
        lead = complex(batched.eigenvalues[b, 0])
        assert min(abs(lead - ev[0]), abs(lead - ev[0].conjugate())) <= 1e-7 * abs(ev[0])
    assert (batched.ritz_residual < 1e-8).all() and (alone.ritz_residual < 1e-8).all()
    assert np.allclose(batched.rho.numpy(), alone.rho.numpy(), rtol=1e-8, atol=0)
    if family == "cluster below":
        assert int(batched.products.max()) < int(alone.products.max())


def test_a_check_between_restarts_stops_a_sample_within_check_every_products_of_where_it_converged(monkeypatch):
    A, _ = clustered_pairs(batch=3)
    opts = dict(route="krylov", product="forward", krylov=30, tol=1e-9, restart="batched", restarts=200)
    monkeypatch.setattr(eb, "CHECK_EVERY", 1)  # looks after every product (after the first restart, at every sample
    monkeypatch.setattr(eb, "CHECK_NEAR", float("inf"))  # its restart left): the first basis that meets the rule
    exact = spectral_radius(as_map(A), **opts)
    monkeypatch.setattr(eb, "CHECK_EVERY", 10)
    checked = spectral_radius(as_map(A), **opts)
    monkeypatch.setattr(eb, "CHECK_EVERY", 0)
    restarts_only = spectral_radius(as_map(A), **opts)
    dense = torch.from_numpy(numpy_rho(A))
    assert ((exact.products <= checked.products) & (checked.products <= exact.products + 9)).all()
    assert (checked.products <= restarts_only.products).all() and checked.matvecs < restarts_only.matvecs
    for spec in (exact, checked, restarts_only):
        assert ((spec.rho - dense).abs() / dense < 1e-7).all() and (spec.ritz_residual < 1e-9).all()


def test_the_threaded_host_eigensolve_gives_lapacks_bits_of_the_whole_batch(monkeypatch):
    G = torch.randn(40, 12, 12, generator=torch.Generator().manual_seed(4), dtype=D64)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    theta, Y = eb.eig_threads(G)
    whole = torch.linalg.eig(G)
    assert torch.equal(theta, whole[0]) and torch.equal(Y, whole[1])


def test_a_check_looks_only_at_the_samples_near_convergence_at_their_last_restart(monkeypatch):
    """Between restarts the host's eigensolve covers the samples whose measure at their last restart was within
    CHECK_NEAR · tol, none in the first cycle: its cost follows the samples near the end, not the batch."""
    A = random_batch(B=6)
    seen = []  # per look: (restart or check, the samples looked at, and at a restart the near ones it leaves)
    plan = eb.ritz_plan

    def counted(Hh, s, dead, **k):
        out = plan(Hh, s, dead, **k)
        near = (out.res < eb.CHECK_NEAR * k["tol"]) & ~out.done
        seen.append((k.get("restart", True), Hh.shape[0], int(near.sum())))
        return out
    monkeypatch.setattr(eb, "ritz_plan", counted)
    spec = spectral_radius(as_map(A), route="krylov", product="forward", krylov=40, tol=1e-9, restart="batched")
    assert seen[0][0] is True  # the first look is the first restart: no check in the first cycle
    near_left = None
    for restart, rows, near in seen:
        if not restart:
            assert 0 < rows <= near_left  # those near at the last restart (fewer once some have left)
        else:
            near_left = near
    assert any(not r for r, _, _ in seen) and (spec.ritz_residual < 1e-9).all()
    assert ((spec.rho - torch.from_numpy(numpy_rho(A))).abs() < 1e-7).all()
