"""The Fixed-Point Reasoner options of the loop map: damping, pre-norm with residual scaling, depth-wise
convolutions on the latent. Off by default (the paper's map is unchanged)."""

import pytest
import torch
from torch.func import jacrev, jvp, vmap

from stability.config import ModelConfig
from stability.model import build_model
from stability.solvers import solve


def tiny(**kw):
    torch.manual_seed(0)
    opts = dict(recall="external", norm="pre", width=16, heads=2, attention_window=5)
    opts.update(kw)
    return build_model(ModelConfig(**opts)).double().eval()


def state(model, shape=(2, 7)):
    x0 = model.embed(torch.randn(*shape, model.config.in_channels, dtype=torch.double))
    return torch.randn_like(x0), x0


def test_options_are_off_by_default_and_leave_the_map_unchanged():
    plain = tiny()
    assert plain.variant_options == {} and plain.latent_conv is None
    x, x0 = state(plain)
    assert torch.equal(plain.step(x, x0), plain.undamped_step(x, x0))
    assert torch.equal(plain.conv(x), x)
    # the options add no parameters except the convolution's, and leave the others' initial values unchanged
    conv = tiny(conv=3, damping=0.5, residual_scale=0.5)
    extra = {k for k in conv.state_dict()} - {k for k in plain.state_dict()}
    assert extra == {"latent_conv.dw.weight", "latent_conv.dw.bias"}
    for k, v in plain.state_dict().items():
        assert torch.equal(v, conv.state_dict()[k])


def test_damped_step_has_the_same_fixed_points_and_jacobian_one_minus_eta_plus_eta_J():
    """FPRM App. A.3: g_η = (1 − η) z + η f(z) has the fixed points of f and Jacobian (1 − η) I + η J."""
    eta = 0.4
    damped, plain = tiny(damping=eta), tiny()
    x, x0 = state(plain)
    t = torch.randn_like(x)
    _, Jd = jvp(lambda a: damped.step(a, x0), (x,), (t,))
    _, J = jvp(lambda a: plain.step(a, x0), (x,), (t,))
    assert torch.allclose(Jd, (1 - eta) * t + eta * J, atol=1e-12)
    sol = solve(damped.step, x0, x0, method="picard", tol=1e-12, max_iter=500, max_period=0)
    assert all(s == "converged" for s in sol.status)
    x_star = sol.x_last
    assert (plain.step(x_star, x0) - x_star).abs().max() < 1e-9


def test_residual_scaling_is_the_named_residual_and_keeps_the_state_bounded():
    """FPRM Thm. 1 / App. B: R(u, v) = (1 − β)u + βv; with pre-norm the sublayer sees a normalised input, so
    the state stays bounded where the unscaled pre-norm state grows."""
    beta = 0.5
    scaled, plain = tiny(recall="none", residual_scale=beta), tiny(recall="none")
    u, v = torch.randn(3, 16, dtype=torch.double), torch.randn(3, 16, dtype=torch.double)
    assert torch.allclose(scaled.residual(1, u, v), (1 - beta) * u + beta * v)
    assert torch.equal(plain.residual(1, u, v), u + v)
    x, x0 = state(plain)
    norms = {}
    with torch.no_grad():
        for name, m in (("scaled", scaled), ("plain", plain)):
            s, peak = x, []
            for _ in range(200):
                s = m.step(s, x0)
                peak.append(float(s.norm(dim=-1).max()))
            norms[name] = peak
    assert max(norms["scaled"][100:]) <= 1.01 * max(norms["scaled"][:100])  # bounded
    assert norms["plain"][-1] > 3 * norms["scaled"][-1]


@pytest.mark.parametrize("spatial,shape", [(1, (2, 9)), (2, (2, 5, 5))])
def test_latent_convolution_is_depthwise_local_and_works_under_torch_func(spatial, shape):
    model = tiny(conv=3, spatial_ndim=spatial, attention_window=5 if spatial == 1 else None)
    x, x0 = state(model, shape)
    y = model.conv(x)
    x2 = x.clone()
    centre = (0,) + tuple(n // 2 for n in shape[1:])
    x2[centre + (3,)] += 1.0
    changed = (model.conv(x2) - y).abs() > 1e-12
    # only channel 3 changes (depth-wise), only within the 3-neighbourhood of the centre, only in sample 0
    assert changed[..., [c for c in range(16) if c != 3]].sum() == 0
    where = changed[..., 3].nonzero()
    assert where[:, 0].eq(0).all()
    assert (where[:, 1:] - torch.tensor(centre[1:])).abs().max() == 1
    assert changed[..., 3].sum() == 3 ** spatial
    # and the step x ↦ f(conv(x)) stays pure and batch-independent: vmap(jacrev) per sample = the batch Jacobian
    per = lambda a, b: model.step(a[None], b[None])[0]  # noqa: E731
    n = x[0].numel()
    J = vmap(jacrev(per))(x, x0).reshape(2, n, n)
    full = jacrev(lambda a: model.step(a, x0))(x).reshape(2, n, 2, n)
    assert torch.allclose(J[1], full[1, :, 1], atol=1e-12) and full[0, :, 1].abs().max() == 0
