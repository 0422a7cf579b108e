"""The training-time stability monitor: its quantities agree with the analysis core, it is logged every k epochs
without changing training, and its plot against epoch is drawn from a checkpoint."""

import numpy as np
import pytest
import torch

import stability
from tests.reference_numerics import JacobianOperator, dense_rho, implicit_input_jvp
from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from stability.errors import StabilityError
from stability.model import build_model
from stability.analysis.monitor import MONITOR_KEYS, input_gradient_norms
from stability.analysis.prop5 import implicit_input_jvp_batched
from stability.solvers import solve
from stability.train.monitor import StabilityMonitor
from stability.tasks import make_task

TASK = TaskConfig(train_size=100, val_size=20, hard_size=20, train_length=7, hard_length=9)


def small_model(recall="external", norm="pre", dtype=torch.float64):
    task = make_task(TASK)
    torch.manual_seed(0)
    model = build_model(ModelConfig(recall=recall, norm=norm, width=16, heads=2, **task.model_options()))
    model.attention_impl = "math"
    return model.to(dtype).eval(), task


def test_batched_implicit_input_gradient_matches_gmres_per_sample():
    model, task = small_model()
    x0 = model.embed(task.dataset("val")[0][:2].double()).detach()
    x_star = solve(model.step, x0, x0, tol=1e-12, max_iter=2000).x_last
    u = torch.randn(x0.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    sol = implicit_input_jvp_batched(model.step, x_star, x0, u, tol=1e-11, max_iter=2000, method="neumann")
    assert bool((sol.residual <= 1e-11).all())
    for b in range(2):
        ref, _ = implicit_input_jvp(model.step, x_star[b], x0[b], u[b])  # scipy GMRES, one sample at a time
        assert float((sol.x[b] - ref).norm() / ref.norm()) < 1e-7
    # the monitor's Hutchinson estimate with one probe is ‖(dx*/dx0) u‖ for the generator's first direction
    norms, ok = input_gradient_norms(model.step, x_star, x0, probes=1, seed=1, tol=1e-11, max_iter=2000)
    assert bool(ok.all())
    ref = torch.stack([implicit_input_jvp(model.step, x_star[b], x0[b], u[b])[0].norm() for b in range(2)])
    assert torch.allclose(norms, ref.double(), rtol=1e-7)


@pytest.mark.parametrize("recall, norm", [("internal", "post"), ("external", "gru")])
def test_monitor_quantities_agree_with_the_analysis_core(recall, norm):
    model, task = small_model(recall, norm)
    monitor = StabilityMonitor(task, samples=4, tol=1e-9, max_iter=2000, krylov=40, restarts=5, probes=8)
    out = monitor.measure(model)
    assert set(MONITOR_KEYS) <= set(out)
    x0 = model.embed(task.dataset("val")[0][:4].double()).detach()
    res = solve(model.step, x0, x0, tol=1e-9, max_iter=2000)
    assert out["converged_fraction"] == float(res.converged.double().mean()) == 1.0
    rhos, frob = [], []
    for b in range(4):
        J = JacobianOperator(model.step, res.x_last[b], x0[b]).dense()
        Jx0 = JacobianOperator(model.step, res.x_last[b], x0[b], wrt="x0").dense()
        rhos.append(dense_rho(J))
        frob.append(float(torch.linalg.matrix_norm(torch.linalg.solve(torch.eye(J.shape[0], dtype=J.dtype) - J, Jx0))))
    assert abs(out["rho_J_median"] - float(np.median(rhos))) < 1e-6
    assert abs(out["rho_Wx"] - float(np.abs(np.linalg.eigvals(model.W_x.detach().numpy())).max())) < 1e-9
    # Hutchinson's estimate (8 probes) of the exact ‖dx*/dx0‖_F = ‖(I − J*)⁻¹ ∂f/∂x0‖_F (Prop. 5)
    assert abs(out["input_grad_norm_median"] / float(np.median(frob)) - 1) < 0.35


def test_the_monitor_rho_is_the_analysis_spectral_radius_at_x_last_with_its_preset():
    """The monitor calls the analysis' one spectral_radius with its cheap preset (x_last of the Picard solve,
    forward-mode products, a short basis): the same numbers bit for bit, and within its Ritz tolerance of the
    dense spectrum."""
    from stability.analysis.monitor import RHO_PRESET, measure
    from stability.numerics import Linearisation, spectral_radius
    from stability.stats import median

    model, task = small_model("internal", "post", dtype=torch.float32)
    inputs = task.dataset("val")[0][:5].float()
    out = measure(model, inputs, max_iter=200, tol=1e-4, krylov=20, restarts=2, seed=3)
    with torch.no_grad():
        x0 = model.embed(inputs)
        res = solve(model.step, x0, x0, method="picard", tol=1e-4, max_iter=200)
        conv = res.converged
        rho = spectral_radius(Linearisation(model.step, res.x_last[conv], x0[conv]), krylov=20, restarts=2, seed=3,
                              **RHO_PRESET).rho
    assert out["rho_J_median"] == median(rho.tolist()) and out["rho_J_max"] == float(rho.max())
    dense = [dense_rho(JacobianOperator(model.double().step, res.x_last[b].double(), x0[b].double()).dense())
             for b in conv.nonzero().flatten().tolist()]
    assert np.allclose(rho.double().numpy(), dense, rtol=1e-3)


def test_monitor_logs_every_k_epochs_without_changing_training(tmp_path):
    base = RunConfig(model=ModelConfig(recall="external", norm="pre", width=16, heads=2), task=TASK,
                     train=TrainConfig(epochs=4, batch_size=25, iterations=4, warmup_epochs=1, test_iterations=6,
                                       device="cpu", lr=3e-3))
    monitored = base.replace(train=base.train.replace(monitor_every=2, monitor_samples=3))
    from stability.train.loop import train

    plain = train(base, tmp_path / "plain.pt", progress=False)
    logged = train(monitored, tmp_path / "monitored.pt", progress=False)
    assert [("monitor" in r) for r in logged.history] == [False, True, False, True]
    for r in logged.history[1::2]:
        m = r["monitor"]
        assert m["samples"] == 3 and 0.0 <= m["converged_fraction"] <= 1.0 and m["rho_Wx"] > 0
    a, b = stability.load(tmp_path / "plain.pt").model, stability.load(tmp_path / "monitored.pt").model
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))
    assert plain.final["val"]["accuracy"] == logged.final["val"]["accuracy"]

    import matplotlib

    matplotlib.use("Agg")
    from stability.sweep.figures import run_figures

    paths = run_figures(tmp_path / "monitored.pt", tmp_path / "figs")
    assert [p.name for p in paths] == ["monitor_monitored.png", "monitor_monitored.pdf"]
    assert paths[0].read_bytes()[:4] == b"\x89PNG" and paths[0].stat().st_size > 5000
    with pytest.raises(StabilityError, match="no stability-monitor records.*--monitor-every"):
        run_figures(tmp_path / "plain.pt", tmp_path / "figs")
    # through the CLI: stability figures --run CKPT
    from tests.conftest import run_cli

    proc = run_cli("figures", "--run", tmp_path / "monitored.pt", "--only", "run", "--out", tmp_path / "cli")
    assert "monitor_monitored.png" in proc.stdout
    bad = run_cli("figures", "--run", tmp_path / "plain.pt", "--only", "run", "--out", tmp_path / "cli", check=False)
    assert bad.returncode == 2 and "--monitor-every" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_monitor_refuses_the_fixed_depth_baseline_and_works_on_a_model_that_is_not_ours():
    task = make_task(TASK)
    fixed = build_model(ModelConfig(recall="fixed", norm="pre", width=16, heads=2, depth=2, **task.model_options()))
    with pytest.raises(ValueError, match="no loop map"):
        StabilityMonitor(task, samples=2).measure(fixed)

    class Contraction(torch.nn.Module):  # x ↦ A x + x0 with ρ(A) = 0.5: x* = (I − A)⁻¹ x0
        def __init__(self):
            super().__init__()
            self.A = torch.nn.Parameter(torch.diag(torch.tensor([0.5, -0.25, 0.1])))

        def embed(self, inputs):
            return inputs

        def step(self, x, x0):
            return x @ self.A.T + x0

    out = StabilityMonitor(None, samples=5, tol=1e-7, probes=512).measure(Contraction(), torch.randn(5, 2, 3))
    assert out["converged_fraction"] == 1.0 and abs(out["rho_J_median"] - 0.5) < 1e-4 and out["rho_Wx"] is None
    # dx*/dx0 = (I − A)⁻¹ acting per token on 2 tokens: ‖·‖_F² = 2 Σ 1/(1 − a)²
    exact = float(np.sqrt(2 * sum(1 / (1 - a) ** 2 for a in (0.5, -0.25, 0.1))))
    assert abs(out["input_grad_norm_median"] / exact - 1) < 0.1
