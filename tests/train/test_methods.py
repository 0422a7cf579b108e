"""The training methods: deep supervision with truncated BPTT (FPRM) and equilibrium training with an implicit
backward (Attractor Models), their gradients against references, Jacobian regularisation, option validation."""

import pytest
import torch
from torch.func import jacrev, vmap

from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from stability.errors import ConfigError
from stability.model import build_model
from stability.solvers import residual, solve
from stability.tasks import make_task
from stability.train.deep_supervision import deep_supervision_batch, segments
from stability.train.implicit import adjoint_solve, implicit_loss
from stability.train.loop import METHODS, BatchContext


def tiny(**kw):
    torch.manual_seed(0)
    opts = dict(recall="external", norm="pre", width=16, heads=2, attention_window=5)
    opts.update(kw)
    return build_model(ModelConfig(**opts)).double()


class Float64Loss:
    """The task with its cross-entropy taken in float64 (the task's own loss casts logits to float32), for
    finite differences."""

    def __init__(self, task):
        self.task = task

    def loss(self, logits, targets):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def data(n=6, bits=6, seed=0):
    task = make_task(TaskConfig(train_size=n, val_size=2, train_length=bits, seed=seed))
    x, y = task.dataset("train")
    return Float64Loss(task), x.double(), y


class Recorder(torch.optim.SGD):
    """lr 0: parameters stay put; every step's gradients are kept (one entry per optimizer step)."""

    def __init__(self, params):
        super().__init__(params, lr=0.0)
        self.grads = []

    def step(self, closure=None):
        self.grads.append([p.grad.clone() if p.grad is not None else None
                           for g in self.param_groups for p in g["params"]])


def context(model, task, cfg):
    import contextlib

    return BatchContext(model=model, params=model, task=task, cfg=cfg, gen=torch.Generator().manual_seed(0),
                        optimizer=Recorder(model.parameters()), autocast=contextlib.nullcontext,
                        where=lambda what: what)


def flat_grad(model):
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()])


# ---- options ---------------------------------------------------------------------------------------------------
def test_the_three_methods_are_registered():
    assert set(METHODS) == {"progressive", "deep-supervision", "implicit"}


#: a bad training option, and the field and reason its one-line error must name
BAD_TRAIN_OPTIONS = [
    (dict(bptt_steps=3), r"TrainConfig\.bptt_steps: an option of the deep-supervision method; it goes in the method "
                         r"table"),
    (dict(method={"name": "progressive", "jac_reg": 0.1}),
     r"TrainConfig\.jac_reg: only the implicit method uses it, not progressive"),
    (dict(method={"name": "implicit", "halt_tol": 0.2}),
     r"TrainConfig\.halt_tol: only the deep-supervision method uses it, not implicit"),
    (dict(method={"name": "deep-supervision", "alpha": 0.5}),
     r"TrainConfig\.alpha: only the progressive method uses it, not deep-supervision"),
    (dict(method={"name": "deep-supervision", "solver_tol": 1e-2}),
     r"TrainConfig\.solver_tol: only the implicit method uses it, not deep-supervision"),
    (dict(method={"name": "implicit", "implicit_backward": "one-step", "backward_iterations": 10}),
     r"TrainConfig\.backward_iterations: the one-step backward solves no linear system"),
    (dict(method={"name": "implicit", "jac_reg_probes": 2}),
     r"TrainConfig\.jac_reg_probes: Jacobian regularisation is off"),
    (dict(method={"name": "deep-supervision", "bptt_steps": 5, "supervision_interval": 4}),
     r"TrainConfig\.supervision_interval: T_sup = 4 must be at least bptt_steps k = 5"),
    (dict(method={"name": "implicit", "solver_tol": 0.0}), r"TrainConfig\.solver_tol: a tolerance must be positive"),
    (dict(method={"name": "implicit", "anderson_memory": 0}),
     r"TrainConfig\.anderson_memory: 0 is outside \[1, 1024\]"),
    (dict(method={"name": "implicit"}, compile=True), r"TrainConfig\.compile: not with method implicit"),
]
#: a bad model option, and the field and reason its one-line error must name
BAD_MODEL_OPTIONS = [
    (dict(damping=0.0), r"ModelConfig\.damping: η must be in \(0, 1\]"),
    (dict(damping=1.5), r"ModelConfig\.damping: 1\.5 is outside \[0\.0, 1\.0\]"),
    (dict(residual_scale=0.5, norm="gru"), r"ModelConfig\.residual_scale: the GRU residual has no additive residual"),
    (dict(conv=4), r"ModelConfig\.conv: the kernel size must be odd"),
    (dict(recall="fixed", residual_scale=0.5),
     r"ModelConfig: residual_scale: options of the loop map; the fixed-depth baseline \(recall fixed\) has none"),
]


def _option_id(value):
    return ",".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else "message"


@pytest.mark.parametrize("kw, message", BAD_TRAIN_OPTIONS, ids=_option_id)
def test_a_bad_training_option_is_refused_naming_the_field_and_the_reason(kw, message):
    with pytest.raises(ConfigError, match=message):
        TrainConfig(**kw)


@pytest.mark.parametrize("kw, message", BAD_MODEL_OPTIONS, ids=_option_id)
def test_a_bad_model_option_is_refused_naming_the_field_and_the_reason(kw, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**kw)


def test_a_method_that_needs_a_loop_is_refused_for_the_fixed_depth_baseline():
    with pytest.raises(ConfigError, match="fixed-depth"):
        RunConfig(model=ModelConfig(recall="fixed"), train=TrainConfig(method={"name": "deep-supervision"}))


def test_a_method_accepts_its_defaults_and_explicit_values_of_its_own_options():
    ds = TrainConfig(method={"name": "deep-supervision", "bptt_steps": 3, "supervision_interval": 6,
                             "halt_tol": 0.05})
    assert (ds.method.bptt_steps, ds.method.supervision_interval, ds.method.halt_tol) == (3, 6, 0.05)
    imp = TrainConfig(method={"name": "implicit", "implicit_backward": "neumann", "backward_iterations": 50,
                              "jac_reg": 1.0, "jac_reg_probes": 2})
    m = imp.method
    assert (m.implicit_backward, m.backward_iterations, m.jac_reg, m.jac_reg_probes) == ("neumann", 50, 1.0, 2)


def test_segments_cover_the_iteration_cap_with_the_last_k_iterations_differentiated():
    cfg = TrainConfig(method={"name": "deep-supervision", "bptt_steps": 2, "supervision_interval": 4},
                      iterations=10)
    assert segments(cfg) == [(2, 2), (2, 2), (0, 2)]
    short = TrainConfig(method={"name": "deep-supervision", "bptt_steps": 3}, iterations=7)
    assert segments(short) == [(0, 3), (0, 3), (0, 1)]


# ---- deep supervision ------------------------------------------------------------------------------------------
def test_deep_supervision_backpropagates_each_segment_through_its_last_k_iterations_and_drops_converged_samples():
    model = tiny()
    task, x, y = data(n=8)
    free, k = 1, 2  # T_sup = 3, k = 2, two segments
    # reference, parameters fixed: segment 1 from e = x0, segment 2 from the detached state of the samples whose
    # residual after segment 1 is still ≥ τ
    x0 = model.embed(x)
    with torch.no_grad():
        s = model.step(x0, x0)
    s = s.detach()
    for _ in range(k):
        prev, s = s, model.step(s, x0)
    r1 = residual(s.detach(), prev.detach())
    srt = r1.sort().values
    tau = float(srt[3] + srt[4]) / 2  # half of the samples stop after the first segment
    keep = r1 >= tau
    assert 0 < keep.sum() < len(keep)
    model.zero_grad()
    task.loss(model.readout(s), y).backward()
    ref1 = flat_grad(model)
    # gradient also reaches e = x0 in the first segment: the embedding gets a gradient
    assert model.input.weight.grad.abs().max() > 0
    model.zero_grad()
    x0k = model.embed(x[keep])
    with torch.no_grad():
        s2 = model.step(s.detach()[keep], x0k)
    for _ in range(k):
        s2 = model.step(s2, x0k)
    loss2 = task.loss(model.readout(s2), y[keep])
    loss2.backward()
    ref2 = flat_grad(model)

    cfg = TrainConfig(method={"name": "deep-supervision", "bptt_steps": k, "supervision_interval": k + free,
                              "halt_tol": tau}, iterations=6, grad_clip=1e9)
    ctx = context(model, task, cfg)
    loss, steps = deep_supervision_batch(ctx, x, y)
    assert steps == 2 and len(ctx.optimizer.grads) == 2
    got = [torch.cat([g.flatten() for g in grads]) for grads in ctx.optimizer.grads]
    assert torch.allclose(got[0], ref1, atol=1e-12)
    assert torch.allclose(got[1], ref2, atol=1e-12)
    assert not torch.allclose(got[0], got[1])


def test_deep_supervision_stops_early_when_every_sample_has_converged():
    model = tiny()
    task, x, y = data()
    cfg = TrainConfig(method={"name": "deep-supervision", "bptt_steps": 2, "halt_tol": 1e3}, iterations=30,
                      grad_clip=1e9)
    loss, steps = deep_supervision_batch(context(model, task, cfg), x, y)
    assert steps == 1 and loss > 0  # every residual is below τ after the first segment


# ---- implicit --------------------------------------------------------------------------------------------------
def test_adjoint_solve_by_krylov_and_neumann_solves_each_samples_transposed_system():
    torch.manual_seed(0)
    B, n = 3, 24
    M = torch.randn(B, n, n, dtype=torch.double) * 0.1  # ρ ≈ 0.5: both converge
    b = torch.randn(B, n, dtype=torch.double)
    ref = torch.linalg.solve(torch.eye(n, dtype=torch.double) - M.transpose(1, 2), b)
    JT = lambda v: torch.einsum("bji,bj->bi", M, v)  # noqa: E731  (Jᵀ v per sample)
    u, info = adjoint_solve(JT, b, "krylov", tol=1e-11, max_iter=60)
    assert torch.allclose(u, ref, atol=1e-9) and float(info.residual.max()) < 1e-10
    u, info = adjoint_solve(JT, b, "neumann", tol=1e-13, max_iter=200)
    assert torch.allclose(u, ref, atol=1e-10) and float(info.residual.max()) <= 1e-13
    # GMRES needs far fewer products than the Neumann series
    assert adjoint_solve(JT, b, "krylov", tol=1e-8, max_iter=60)[1].matvecs < adjoint_solve(
        JT, b, "neumann", tol=1e-8, max_iter=200)[1].matvecs
    with pytest.raises(ValueError, match="unknown implicit backward"):
        adjoint_solve(JT, b, "lu")


IMPLICIT = dict(method={"name": "implicit", "solver_tol": 1e-13, "backward_tol": 1e-12, "backward_iterations": 200},
                iterations=400)


def implicit_value(model, task, x, y, **options):
    """The implicit loss with the method options of IMPLICIT, ``options`` on top."""
    cfg = TrainConfig(**{**IMPLICIT, "method": {**IMPLICIT["method"], **options}})
    return implicit_loss(model, task, x, y, cfg)


@pytest.mark.parametrize("backward", ["krylov", "neumann"])
def test_implicit_gradient_matches_finite_differences(backward):
    """Attractor Models eq. (8): the IFT gradient of L(x*(θ)) equals the directional derivative of the loss at the
    re-solved fixed point, θ ± h·d (float64, all parameters, the embedding included)."""
    model = tiny()
    task, x, y = data(n=3)
    record = {}
    cfg = TrainConfig(**{**IMPLICIT, "method": {**IMPLICIT["method"], "implicit_backward": backward}})
    loss = implicit_loss(model, task, x, y, cfg, record=record)
    model.zero_grad()
    loss.backward()
    g = flat_grad(model)
    assert record["forward"]["converged_fraction"] == 1.0
    (adjoint,) = record["adjoint"]  # one adjoint solve, to its tolerance
    assert float(adjoint.residual.max()) < 1e-11
    gen = torch.Generator().manual_seed(1)
    d = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in model.parameters()]
    h = 1e-5
    vals = []
    with torch.no_grad():
        for sign in (1, -1):
            for p, dp in zip(model.parameters(), d):
                p.add_(sign * h * dp)
            vals.append(float(implicit_value(model, task, x, y)))
            for p, dp in zip(model.parameters(), d):
                p.sub_(sign * h * dp)
    fd = (vals[0] - vals[1]) / (2 * h)
    ana = float(g @ torch.cat([dp.flatten() for dp in d]))
    assert abs(ana - fd) <= 1e-6 * abs(fd) + 1e-9, (ana, fd)


def test_one_step_gradient_is_the_gradient_through_one_application_at_the_fixed_point():
    model = tiny()
    task, x, y = data(n=3)
    implicit_value(model, task, x, y, implicit_backward="one-step", backward_tol=1e-4,
                   backward_iterations=30).backward()
    one = flat_grad(model)
    model.zero_grad()
    x0 = model.embed(x)
    sol = solve(model.step, x0, x0, method="anderson", tol=1e-13, max_iter=400, max_period=0)
    task.loss(model.readout(model.step(sol.x_best.detach(), x0)), y).backward()
    assert torch.allclose(one, flat_grad(model), atol=1e-10)
    model.zero_grad()
    implicit_value(model, task, x, y).backward()  # the IFT gradient differs (ρ(J*) ≈ 0.8 here)
    assert (flat_grad(model) - one).norm() > 0.05 * one.norm()


def test_truncated_bptt_gradient_approaches_the_implicit_gradient_as_k_grows():
    """FPRM App. A.4: backpropagating k iterations from x* gives Pᵀ Σ_{j<k} (Jᵀ)ʲ δ → Pᵀ (I − J)⁻ᵀ δ."""
    model = tiny(residual_scale=0.5)
    task, x, y = data(n=3)
    implicit_value(model, task, x, y).backward()
    ift = flat_grad(model)
    x0 = model.embed(x).detach()
    x_star = solve(model.step, x0, x0, method="anderson", tol=1e-13, max_iter=400, max_period=0).x_best
    errors = []
    for k in (1, 4, 16):
        model.zero_grad()
        x0 = model.embed(x)
        s = x_star
        for _ in range(k):
            s = model.step(s, x0)
        task.loss(model.readout(s), y).backward()
        errors.append(float((flat_grad(model) - ift).norm() / ift.norm()))
    assert errors[0] > errors[1] > errors[2] and errors[2] < 1e-6, errors


def jacobian_frobenius_exact(model, x):
    """Mean over samples of ‖J_b‖_F² / n at the fixed point, from the dense Jacobian."""
    with torch.no_grad():
        x0 = model.embed(x)
        x_star = solve(model.step, x0, x0, method="anderson", tol=1e-6, max_iter=200, max_period=0).x_best
    J = vmap(jacrev(lambda a, b: model.step(a[None], b[None])[0]))(x_star, x0)
    n = x_star[0].numel()
    return float(J.detach().reshape(x.shape[0], n, n).pow(2).sum((1, 2)).mean() / n)


def test_jacobian_regularisation_lowers_the_jacobian_frobenius_norm(tmp_path):
    from stability.train.loop import train

    def run(jac_reg, name):
        cfg = RunConfig(model=ModelConfig(recall="external", norm="pre", width=16, heads=2),
                        task=TaskConfig(train_size=96, val_size=8, hard_size=8, train_length=7, hard_length=8),
                        train=TrainConfig(method={"name": "implicit", "jac_reg": jac_reg}, lr=3e-3, epochs=5,
                                          batch_size=32, iterations=30, warmup_epochs=0, device="cpu",
                                          test_iterations=2, eval_batch_size=8))
        train(cfg, tmp_path / name, progress=False)
        import stability

        loaded = stability.load(tmp_path / name)
        probe = loaded.task.dataset("val")[0]
        return jacobian_frobenius_exact(loaded.model.double(), probe.double())

    plain, regularised = run(0.0, "plain.pt"), run(10.0, "reg.pt")
    assert regularised < 0.7 * plain, (plain, regularised)
