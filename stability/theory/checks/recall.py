"""The two-sublayer recall model (Defs. 5.1, 5.2) in torch, batched over instances, and the checks of Prop. 4
(M assembled from the parts; attraction iff ρ(M) < 1) and App. A.7 (the Jacobians with outer norms).

:class:`ToyRecall`: linear recall g(x, x0) = W_x x + b_x + W_0 x0 + b_0, tanh-MLP sublayers h1, h2 and optional
RMSNorm outer norms φ1, φ2, with external (Def. 5.1) or internal (Def. 5.2) placement. It does not import the
toolkit's transformer: these checks are about the mathematics (docs/theory.md).
"""

from __future__ import annotations

import math

from .registry import verifier


def _mv(A, x):
    return (A @ x.unsqueeze(-1)).squeeze(-1)


class ToyRecall:
    """g(x, x0) = W_x x + b_x + W_0 x0 + b_0; h_i(u) = B_i tanh(A_i u + c_i) + e_i; φ_i = RMSNorm with gain or I.

    All parameters carry a leading instance axis (n, ...); every method works on x of shape (n, d) and, through
    ``torch.func`` transforms over single instances, on (d,). ``step(x, x0)`` is the loop map f of Def. 5.1
    (``placement="external"``) or Def. 5.2 (``"internal"``).
    """

    def __init__(self, params: dict, placement: str, norm: bool = False, eps: float = 1e-6):
        self.p, self.placement, self.norm, self.eps = params, placement, norm, eps

    @staticmethod
    def random(gen, n: int, d: int, *, wx_scale, h_scale, norm: bool = False, placement: str = "external"):
        import torch

        dt = torch.float64

        def r(*shape):
            return torch.randn(*shape, generator=gen, dtype=dt)

        wx = torch.as_tensor(wx_scale, dtype=dt).reshape(-1, 1, 1)
        hs = torch.as_tensor(h_scale, dtype=dt).reshape(-1, 1, 1)
        p = dict(W_x=wx * r(n, d, d) / math.sqrt(d), b_x=0.1 * r(n, d), W_0=r(n, d, d) / math.sqrt(d),
                 b_0=0.1 * r(n, d),
                 A1=r(n, 2 * d, d) / math.sqrt(d), c1=0.1 * r(n, 2 * d), B1=hs * r(n, d, 2 * d) / math.sqrt(2 * d),
                 e1=0.1 * r(n, d),
                 A2=r(n, 2 * d, d) / math.sqrt(d), c2=0.1 * r(n, 2 * d), B2=hs * r(n, d, 2 * d) / math.sqrt(2 * d),
                 e2=0.1 * r(n, d),
                 gain1=1 + 0.1 * r(n, d), gain2=1 + 0.1 * r(n, d))
        return ToyRecall(p, placement, norm)

    # named parts, as the paper writes them -------------------------------------------------------------------
    def g(self, p, x, x0):
        return _mv(p["W_x"], x) + p["b_x"] + _mv(p["W_0"], x0) + p["b_0"]

    def h1(self, p, u):
        import torch

        return _mv(p["B1"], torch.tanh(_mv(p["A1"], u) + p["c1"])) + p["e1"]

    def h2(self, p, u):
        import torch

        return _mv(p["B2"], torch.tanh(_mv(p["A2"], u) + p["c2"])) + p["e2"]

    def _rms(self, gain, u):
        """RMSNorm with a learned gain: gain · u / sqrt(mean(u²) + eps)."""
        import torch

        return gain * u * torch.rsqrt((u * u).mean(-1, keepdim=True) + self.eps)

    def phi1(self, p, u):
        return self._rms(p["gain1"], u) if self.norm else u

    def phi2(self, p, u):
        return self._rms(p["gain2"], u) if self.norm else u

    def parts(self, p, x, x0):
        """The intermediate values of one step: z̃, z, x̃ and the arguments of h1, h2."""
        if self.placement == "external":
            u = self.g(p, x, x0)
            zt = u + self.h1(p, u)
            z = self.phi1(p, zt)
            xt = z + self.h2(p, z)
            return dict(h1_arg=u, zt=zt, z=z, h2_arg=z, xt=xt)
        u = self.g(p, x, x0)
        zt = x + self.h1(p, u)
        z = self.phi1(p, zt)
        v = self.g(p, z, x0)
        xt = z + self.h2(p, v)
        return dict(h1_arg=u, zt=zt, z=z, h2_arg=v, xt=xt)

    def step_p(self, p, x, x0):
        """f(x, x0) = φ2(x̃) with the parameters ``p`` passed explicitly (for ``torch.func``)."""
        return self.phi2(p, self.parts(p, x, x0)["xt"])

    def step(self, x, x0):
        """One loop step of every instance: x (n, d), x0 (n, d) → (n, d)."""
        return self.step_p(self.p, x, x0)

    def single(self, i: int) -> dict:
        """The parameters of instance ``i`` (no instance axis)."""
        return {k: v[i] for k, v in self.p.items()}

    def align_sublayers(self, gen, kappa, noise, u=None) -> None:
        """Set B_i = -κ (S_i A_i W_x)⁺ + noise·R_i, so that h_i' ∂g/∂x = -κ I + noise at the argument u.

        S_i = diag(tanh'(A_i u + c_i)) (identity when ``u`` is None). Internal recall is stable only in a narrow
        region (Fig. 5); this places its factors I + h_i' ∂g/∂x ≈ (1 - κ) I on either side of it at will.
        """
        import torch

        p = self.p
        kappa = torch.as_tensor(kappa, dtype=p["W_x"].dtype).reshape(-1, 1, 1)
        noise = torch.as_tensor(noise, dtype=p["W_x"].dtype).reshape(-1, 1, 1)
        for i in ("1", "2"):
            A, c = p["A" + i], p["c" + i]
            S = torch.ones_like(c) if u is None else 1 - torch.tanh(_mv(A, u) + c) ** 2
            K = S.unsqueeze(-1) * A @ p["W_x"]
            R = torch.randn(p["B" + i].shape, generator=gen, dtype=A.dtype) / math.sqrt(A.shape[-2])
            p["B" + i] = -kappa * torch.linalg.pinv(K) + noise * R

    def place_fixed_point(self, x_star, x0):
        """Shift e2 (and, for internal recall, e1) so that x* is a fixed point for input x0 (no outer norm).

        External: x* = z* + h2(z*) fixes e2. Internal: h1(g(x*, x0)) = 0 fixes e1 (so z* = x*), then
        h2(g(z*, x0)) = 0 fixes e2 — the fixed-point conditions stated in Sec. 5.2.
        """
        p = self.p
        if self.norm:
            raise ValueError("place_fixed_point assumes φ = identity")
        if self.placement == "external":
            pr = self.parts(p, x_star, x0)
            p["e2"] = p["e2"] + (x_star - pr["xt"])
        else:
            u = self.g(p, x_star, x0)  # = g(z*, x0) too, since z* = x* once h1(u) = 0
            p["e1"] = p["e1"] - self.h1(p, u)
            p["e2"] = p["e2"] - self.h2(p, u)


def batched_jacobian(fn, argnum, *args):
    """Per-instance Jacobian of fn(p, a, b) w.r.t. argument ``argnum`` (vmap of jacrev over the instance axis)."""
    from torch.func import jacrev, vmap

    return vmap(jacrev(fn, argnums=argnum))(*args)


def _toy_instances(seed: int, placement: str, n: int = 24, d: int = 5):
    """Recall models with a constructed fixed point x*; W_x and h scales spread so ρ(M) falls on both sides of 1."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1000 + (0 if placement == "external" else 1))
    wx = 0.3 + 1.4 * torch.rand(n, generator=gen, dtype=torch.float64)
    hs = 0.2 + 1.6 * torch.rand(n, generator=gen, dtype=torch.float64)
    model = ToyRecall.random(gen, n, d, wx_scale=wx, h_scale=hs, placement=placement)
    x_star = 0.5 * torch.randn(n, d, generator=gen, dtype=torch.float64)
    x0 = torch.randn(n, d, generator=gen, dtype=torch.float64)
    if placement == "internal":  # random h almost never lands in internal recall's narrow stable region
        kappa = 0.2 + 1.6 * torch.rand(n, generator=gen, dtype=torch.float64)
        noise = 2.5 * torch.rand(n, generator=gen, dtype=torch.float64)
        model.align_sublayers(gen, kappa, noise, u=model.g(model.p, x_star, x0))
    model.place_fixed_point(x_star, x0)
    return model, x_star, x0, gen


def assemble_M(model: ToyRecall, x_star, x0):
    """Prop. 4's M from the parts' Jacobians: M_ext = (I + dh2/dz)(I + dh1/dg) ∂g/∂x,
    M_int = (I + dh2/dg(z) ∂g(z)/∂z)(I + dh1/dg(x) ∂g(x)/∂x)."""
    import torch

    p = model.p
    pr = model.parts(p, x_star, x0)
    eye = torch.eye(x_star.shape[-1], dtype=x_star.dtype)
    H1 = batched_jacobian(model.h1, 1, p, pr["h1_arg"])
    H2 = batched_jacobian(model.h2, 1, p, pr["h2_arg"])
    G_x = batched_jacobian(model.g, 1, p, x_star, x0)
    if model.placement == "external":
        return (eye + H2) @ (eye + H1) @ G_x, (H1, H2, G_x)
    G_z = batched_jacobian(model.g, 1, p, pr["z"], x0)
    return (eye + H2 @ G_z) @ (eye + H1 @ G_x), (H1, H2, G_x, G_z)


def _prop4_assembly(seed, wrong, placement):
    model, x_star, x0, _ = _toy_instances(seed, placement, n=8)
    M, parts = assemble_M(model, x_star, x0)
    if wrong:
        import torch

        eye = torch.eye(x_star.shape[-1], dtype=x_star.dtype)
        if placement == "external":
            H1, H2, G_x = parts
            M = G_x @ (eye + H1) @ (eye + H2)
        else:
            H1, H2, G_x, G_z = parts
            M = (eye + H1 @ G_x) @ (eye + H2 @ G_z)
    J = batched_jacobian(model.step_p, 1, model.p, x_star, x0)
    err = ((M - J).flatten(1).norm(dim=1) / J.flatten(1).norm(dim=1)).max().item()
    residual = (model.step(x_star, x0) - x_star).norm(dim=1).max().item()
    return f"8 toy {placement}-recall models, d = 5, tanh-MLP h1/h2, fixed-point residual {residual:.1e}", err


@verifier("prop4_M_ext_equals_autograd", "Prop. 4 (external)",
          "M_ext = (I + dh2/dz)(I + dh1/dg) ∂g/∂x assembled from parts equals the autograd Jacobian of f at x*: "
          "max relative error", tolerance=1e-10, wrong="the factors in reverse order, ∂g/∂x (I + dh1/dg)(I + dh2/dz)")
def _prop4_ext(seed, wrong):
    return _prop4_assembly(seed, wrong, "external")


@verifier("prop4_M_int_equals_autograd", "Prop. 4 (internal)",
          "M_int = (I + dh2/dg ∂g(z*)/∂z)(I + dh1/dg ∂g(x*)/∂x) assembled from parts equals the autograd Jacobian "
          "of f at x*: max relative error", tolerance=1e-10, wrong="the two sublayer factors swapped")
def _prop4_int(seed, wrong):
    return _prop4_assembly(seed, wrong, "internal")


def _prop4_attraction(seed, wrong, placement):
    """Observed attraction of x* under iteration vs. the prediction ρ(M) < 1 (wrong variant: ρ(W_x) < 1)."""
    import torch

    model, x_star, x0, gen = _toy_instances(seed, placement)
    M, _ = assemble_M(model, x_star, x0)
    rho_M = torch.linalg.eigvals(M).abs().amax(1)
    rho_W = torch.linalg.eigvals(model.p["W_x"]).abs().amax(1)
    delta = torch.randn(x_star.shape, generator=gen, dtype=x_star.dtype)
    x = x_star + 1e-7 * delta / delta.norm(dim=1, keepdim=True)
    escaped = torch.zeros(len(x), dtype=torch.bool)
    for _ in range(500):
        x = model.step(x, x0)
        dist = (x - x_star).norm(dim=1)
        escaped |= dist > 1e-3
        x = torch.where((dist > 1e-2)[:, None], x_star + 1e-2 * (x - x_star) / dist[:, None], x)  # stay local
    attracted = ~escaped & ((x - x_star).norm(dim=1) < 1e-10)
    decided = (rho_M - 1).abs() > 0.05  # ρ(M) = 1 is non-hyperbolic: Prop. 4 says nothing there
    predicted = (rho_W < 1) if wrong else (rho_M < 1)
    mismatches = int(((predicted != attracted) & decided).sum())
    n_in, n_out = int((decided & (rho_M < 1)).sum()), int((decided & (rho_M > 1)).sum())
    if min(n_in, n_out) < 3:
        raise ArithmeticError(f"instances do not straddle ρ(M) = 1 ({n_in} below, {n_out} above)")
    rule = "ρ(W_x) < 1" if wrong else "ρ(M) < 1"
    return (f"24 toy {placement}-recall models, d = 5: {n_in} with ρ(M) < 0.95, {n_out} with ρ(M) > 1.05, "
            f"{int((rho_W < 1).sum())} with ρ(W_x) < 1; 500 steps from 1e-7; prediction {rule}"), mismatches


@verifier("prop4_external_attracts_iff_rho_M_below_1", "Prop. 4 (external)",
          "a fixed point of external recall (no outer norm) attracts iff ρ(M_ext) < 1: mismatches between "
          "prediction and iteration", tolerance=0, wrong="predict attraction from ρ(W_x) < 1 alone")
def _prop4_attr_ext(seed, wrong):
    return _prop4_attraction(seed, wrong, "external")


@verifier("prop4_internal_attracts_iff_rho_M_below_1", "Prop. 4 (internal)",
          "a fixed point of internal recall (no outer norm) attracts iff ρ(M_int) < 1: mismatches between "
          "prediction and iteration", tolerance=0, wrong="predict attraction from ρ(W_x) < 1 alone")
def _prop4_attr_int(seed, wrong):
    return _prop4_attraction(seed, wrong, "internal")


def _a7_forms(seed, wrong, placement):
    """App. A.7 with RMSNorm outer norms: both Jacobians assembled from parts vs autograd, at a random point."""
    import torch

    gen = torch.Generator().manual_seed(seed * 1000 + 7)
    n, d = 6, 5
    model = ToyRecall.random(gen, n, d, wx_scale=torch.ones(n), h_scale=torch.ones(n), norm=True,
                             placement=placement)
    p = model.p
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    x0 = torch.randn(n, d, generator=gen, dtype=torch.float64)
    pr = model.parts(p, x, x0)
    eye = torch.eye(d, dtype=x.dtype)
    P1 = batched_jacobian(model.phi1, 1, p, pr["zt"])
    P2 = batched_jacobian(model.phi2, 1, p, pr["xt"])
    H1 = batched_jacobian(model.h1, 1, p, pr["h1_arg"])
    H2 = batched_jacobian(model.h2, 1, p, pr["h2_arg"])
    G_x = batched_jacobian(model.g, 1, p, x, x0)
    G_x0 = batched_jacobian(model.g, 2, p, x, x0)
    if placement == "external":
        if wrong:  # the outer-norm Jacobians in swapped places
            dx = P1 @ (eye + H2) @ P2 @ (eye + H1) @ G_x
            dx0 = P1 @ (eye + H2) @ P2 @ (eye + H1) @ G_x0
        else:
            dx = P2 @ (eye + H2) @ P1 @ (eye + H1) @ G_x
            dx0 = P2 @ (eye + H2) @ P1 @ (eye + H1) @ G_x0
    else:
        G_z = batched_jacobian(model.g, 1, p, pr["z"], x0)
        G_z0 = batched_jacobian(model.g, 2, p, pr["z"], x0)
        dx = P2 @ (eye + H2 @ G_z) @ P1 @ (eye + H1 @ G_x)
        # App. A.7.1 prints dh1 at g(z, x0) here; the definition gives dh2 at g(z, x0)
        first = batched_jacobian(model.h1, 1, p, pr["h2_arg"]) if wrong else H2
        dx0 = P2 @ (first @ G_z0 + (eye + H2 @ G_z) @ P1 @ H1 @ G_x0)
    J_x = batched_jacobian(model.step_p, 1, p, x, x0)
    J_x0 = batched_jacobian(model.step_p, 2, p, x, x0)

    def rel(a, b):
        return ((a - b).flatten(1).norm(dim=1) / b.flatten(1).norm(dim=1)).max().item()

    return (f"6 toy {placement}-recall models with RMSNorm φ1, φ2 (learned gain), d = {d}, random x, x0; "
            "both ∂x_t/∂x_(t-1) and ∂x_t/∂x0", max(rel(dx, J_x), rel(dx0, J_x0)))


@verifier("a7_external_jacobians", "App. A.7 (external)",
          "∂x_t/∂x_(t-1) = φ2'(I + h2')φ1'(I + h1')∂g/∂x and ∂x_t/∂x0 = φ2'(I + h2')φ1'(I + h1')∂g/∂x0 match "
          "autograd: max relative error", tolerance=1e-10, wrong="the outer-norm Jacobians φ1', φ2' swapped")
def _a7_ext(seed, wrong):
    return _a7_forms(seed, wrong, "external")


@verifier("a7_internal_jacobians", "App. A.7 (internal)",
          "∂x_t/∂x_(t-1) = φ2'(I + h2'g_z)φ1'(I + h1'g_x) and ∂x_t/∂x0 = φ2'(h2'(g(z)) ∂g(z)/∂x0 + (I + h2'g_z)φ1' "
          "h1' ∂g(x)/∂x0) match autograd: max relative error", tolerance=1e-10,
          wrong="∂x_t/∂x0 as App. A.7.1 prints it, with dh1(g(z, x0))/dg in place of dh2(g(z, x0))/dg")
def _a7_int(seed, wrong):
    return _a7_forms(seed, wrong, "internal")
