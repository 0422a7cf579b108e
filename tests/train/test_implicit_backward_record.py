"""The implicit backward's record: the adjoint residual it reports is ‖(I − Jᵀ)u − δ‖/‖δ‖ of the u it returned
(checked against the dense Jacobian), the epoch's metrics carry it, and a missed tolerance warns once per epoch."""

import json

import pytest
import torch

from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from stability.solvers import solve
from stability.train.implicit import ImplicitStats, attach_implicit_gradient, backward_budget


def toy_map(n=12, B=3, seed=0):
    """f(z, x0) = tanh(z W + x0), ‖W‖₂ = 0.9 (a contraction)."""
    g = torch.Generator().manual_seed(seed)
    W = torch.randn(n, n, generator=g, dtype=torch.float64)
    W = W / torch.linalg.matrix_norm(W, 2) * 0.9
    x0 = torch.randn(B, n, generator=g, dtype=torch.float64)
    return (lambda z, x0: torch.tanh(z @ W + x0)), x0


@pytest.mark.parametrize("method,budget", [("krylov", 3), ("krylov", 60), ("neumann", 4), ("neumann", 80)])
def test_recorded_adjoint_residual_is_that_of_the_returned_solution(method, budget):
    f, x0 = toy_map()
    z = solve(f, x0, x0, tol=1e-13, max_iter=500).x_best.detach().requires_grad_()
    fz = f(z, x0)
    record, seen = [], []
    out = attach_implicit_gradient(fz, z, method, tol=1e-10, max_iter=budget, record=record)
    fz.register_hook(lambda g: seen.append(g.detach()))  # every gradient at f(z): the vjps, then u (last)
    delta = torch.randn(z.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    (out * delta).sum().backward()
    u = seen[-1]
    assert len(record) == 1
    for b in range(z.shape[0]):
        J = torch.autograd.functional.jacobian(lambda v: f(v[None], x0[b:b + 1])[0], z[b].detach())
        expect = float((u[b] - J.T @ u[b] - delta[b]).norm() / delta[b].norm())
        assert float(record[0].residual[b]) == pytest.approx(expect, rel=1e-6, abs=1e-14)
    if budget < 10:  # a small budget misses the tolerance, and the record says so
        assert float(record[0].residual.max()) > 1e-10
    else:
        assert float(record[0].residual.max()) <= 1e-10


def test_adaptive_budget_is_the_larger_cap_and_zero_keeps_the_fixed_one():
    assert backward_budget(TrainConfig(method={"name": "implicit"})) == 150
    assert backward_budget(TrainConfig(method={"name": "implicit", "backward_max_iterations": 0,
                                               "backward_iterations": 30})) == 30
    assert backward_budget(TrainConfig(method={"name": "implicit", "backward_max_iterations": 40,
                                               "backward_iterations": 70})) == 70


def test_epoch_metrics_record_the_adjoint_solve_and_a_miss_warns_once_per_epoch(tmp_path, capsys):
    from stability.train.loop import metrics_path, train

    cfg = RunConfig(model=ModelConfig(recall="external", norm="pre", width=8, heads=2),
                    task=TaskConfig(train_size=48, val_size=8, hard_size=8, train_length=6, hard_length=8),
                    train=TrainConfig(method={"name": "implicit", "backward_tol": 1e-12, "backward_iterations": 2,
                                              "backward_max_iterations": 0}, lr=1e-3, epochs=2, batch_size=16,
                                      iterations=20, warmup_epochs=0, device="cpu", test_iterations=2,
                                      eval_batch_size=8))
    out = tmp_path / "imp.pt"
    train(cfg, out, progress=False)
    err = capsys.readouterr().err
    assert err.count("implicit backward (krylov) missed its tolerance") == 2  # 3 batches per epoch, 2 epochs
    lines = [json.loads(line) for line in metrics_path(out).read_text().splitlines()]
    epochs = [rec for rec in lines if "implicit" in rec]
    assert len(epochs) == 2
    for rec in epochs:
        imp = rec["implicit"]
        assert imp["adjoint_solves"] == 3 and imp["adjoint_missed"] == 3
        assert imp["adjoint_residual_max"] > 1e-12 and imp["adjoint_residual_median"] <= imp["adjoint_residual_max"]
        assert imp["adjoint_iterations_max"] <= 3 and imp["adjoint_budget"] == 2
        assert 0.0 <= imp["forward_converged_fraction"] <= 1.0


def test_stats_without_misses_stay_quiet(capsys):
    from stability.train.implicit import AdjointInfo

    st = ImplicitStats(TrainConfig(method={"name": "implicit"}))
    st.add({"adjoint": [AdjointInfo(residual=torch.tensor([1e-6, 2e-5]), matvecs=12)]})
    st.add({"adjoint": [AdjointInfo(residual=torch.tensor([3e-5]), matvecs=20)]})
    s = st.summary()
    assert capsys.readouterr().err == ""
    assert s["adjoint_missed"] == 0 and s["adjoint_residual_max"] == pytest.approx(3e-5)
    assert s["adjoint_iterations_mean"] == 16 and s["adjoint_iterations_max"] == 20
