"""Numerical checks of the theory the toolkit rests on: one :class:`Check` per property, run by ``stability verify``.

Each verifier states a property of the paper (Props. 1–5, Lemma 1, Apps. A.3–A.8, B.2) or of the two excerpts
(Fixed-Point Reasoners "FPRM": residual bound, damping bound of A.3, truncated-Neumann error of A.4; Attractor
Models: Corollary 1, the implicit gradient of eq. 8, the barrier of B.3.3), measures it on random or constructed
instances, and compares the measurement with a stated tolerance. Each can fail: ``wrong=True`` swaps in a
deliberately wrong claim or a non-generic instance (described in ``Verifier.wrong``), which the tests show is
rejected. Symbolic derivations (:mod:`.symbolic`) and the exact projection of App. B.2 (:mod:`.regions`) appear as
checks too, so ``stability verify`` prints the whole account in one table.

Instances are small (d ≤ 16) and float64. Recall maps are a self-contained two-sublayer model (:class:`ToyRecall`):
linear recall g(x, x0) = W_x x + b_x + W_0 x0 + b_0, tanh-MLP sublayers h1, h2, and optional RMSNorm outer norms φ1,
φ2, with external (Def. 5.1) and internal (Def. 5.2) placement.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from typing import Callable

import numpy as np

# ----------------------------------------------------------------------------------------------------------------
# Records and registry
# ----------------------------------------------------------------------------------------------------------------

RELATIONS = {"<=": lambda m, t: m <= t, ">=": lambda m, t: m >= t}


@dataclass
class Check:
    """One verified statement: ``passed`` iff ``measured <relation> tolerance`` (a NaN never passes)."""

    name: str
    source: str
    statement: str
    instance: str
    measured: float
    relation: str
    tolerance: float
    passed: bool
    variant: str = "paper"

    def to_dict(self) -> dict:
        """A JSON-ready dict (a non-finite number becomes None)."""
        d = asdict(self)
        for key in ("measured", "tolerance"):
            if not math.isfinite(d[key]):
                d[key] = None
        return d


@dataclass(frozen=True)
class Verifier:
    """A registered property: ``measure(seed, wrong) -> (instance description, measured value)``."""

    name: str
    source: str
    statement: str
    relation: str
    tolerance: float
    wrong: str
    measure: Callable

    def run(self, seed: int = 0, wrong: bool = False) -> Check:
        """Measure the property; an exception inside the measurement becomes a failed check, never a traceback."""
        tolerance = self.tolerance
        try:
            instance, measured = self.measure(seed, wrong)
            measured = float(measured)
        except Exception as exc:  # noqa: BLE001 - a failing measurement is a failed check, reported as one row
            instance, measured = f"measurement raised {type(exc).__name__}: {exc}", float("nan")
        passed = bool(math.isfinite(measured) and RELATIONS[self.relation](measured, tolerance))
        statement = self.statement if not wrong else f"[wrong variant: {self.wrong}] {self.statement}"
        return Check(self.name, self.source, statement, instance, measured, self.relation, tolerance, passed,
                     "wrong" if wrong else "paper")


VERIFIERS: dict[str, Verifier] = {}


def verifier(name: str, source: str, statement: str, *, tolerance: float, relation: str = "<=", wrong: str):
    """Register ``measure(seed, wrong)`` as the check ``name``."""

    def deco(fn):
        VERIFIERS[name] = Verifier(name, source, statement, relation, tolerance, wrong, fn)
        return fn

    return deco


def run_checks(names=None, seed: int = 0, wrong: bool = False) -> list[Check]:
    """Run the named checks (all when ``names`` is None) in registry order."""
    chosen = list(VERIFIERS) if not names else list(names)
    unknown = [n for n in chosen if n not in VERIFIERS]
    if unknown:
        raise KeyError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(VERIFIERS)}")
    return [VERIFIERS[n].run(seed=seed, wrong=wrong) for n in chosen]


# ----------------------------------------------------------------------------------------------------------------
# Numpy helpers: tanh maps with a prescribed fixed point and Jacobian, batched Newton
# ----------------------------------------------------------------------------------------------------------------


def _rng(seed: int, salt: int) -> np.random.Generator:
    return np.random.default_rng([seed, salt])


def real_matrix_with_spectrum(rng: np.random.Generator, eigenvalues, spread: float = 0.5) -> np.ndarray:
    """A real non-normal matrix V Λ V⁻¹ with the given spectrum (a complex value brings its conjugate: a 2×2 block)."""
    from scipy.linalg import block_diag

    blocks = []
    for lam in map(complex, eigenvalues):
        blocks.append([[lam.real]] if lam.imag == 0 else [[lam.real, -abs(lam.imag)], [abs(lam.imag), lam.real]])
    L = block_diag(*blocks)
    n = len(L)
    V = np.eye(n) + spread * rng.normal(size=(n, n)) / np.sqrt(n)
    return V @ L @ np.linalg.inv(V)


class TanhMap:
    """The autonomous map f(x) = tanh(W x + b), batched over leading axes of x."""

    def __init__(self, W: np.ndarray, b: np.ndarray):
        self.W, self.b = W, b

    @classmethod
    def with_fixed_point(cls, x_star: np.ndarray, J: np.ndarray) -> "TanhMap":
        """The tanh map with fixed point x* and Jacobian J there: W = D⁻¹ J, b = artanh(x*) - W x*, D = 1 - x*²."""
        W = J / (1.0 - x_star ** 2)[:, None]
        return cls(W, np.arctanh(x_star) - W @ x_star)

    @classmethod
    def around(cls, x_star: np.ndarray, J: np.ndarray) -> tuple["TanhMap", np.ndarray]:
        """:meth:`with_fixed_point`, and its fixed point re-solved by Newton to the last bit (artanh rounds)."""
        m = cls.with_fixed_point(x_star, J)
        X, res = newton_fixed_points(m, m.jac, x_star[None], iters=5)
        if res[0] > 1e-14:
            raise ArithmeticError(f"constructed fixed point has residual {res[0]:.1e}")
        return m, X[0]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.tanh(x @ self.W.T + self.b)

    def jac(self, x: np.ndarray) -> np.ndarray:
        s = 1.0 - np.tanh(x @ self.W.T + self.b) ** 2
        return s[..., :, None] * self.W


def newton_fixed_points(f, jac, X: np.ndarray, iters: int = 60, bound: float = 1e3):
    """Batched Gauss–Newton on F(x) = f(x) - x (pseudo-inverse steps, so singular Jacobians do not stop it)."""
    d = X.shape[-1]
    eye = np.eye(d)
    for _ in range(iters):
        F = f(X) - X
        step = np.einsum("nij,nj->ni", np.linalg.pinv(jac(X) - eye), F)
        X = np.clip(np.nan_to_num(X - step), -bound, bound)
    return X, np.linalg.norm(f(X) - X, axis=-1)


def distinct_points(P: np.ndarray, tol: float = 1e-7) -> int:
    """Number of clusters of points closer than ``tol`` (connected components of the tol-graph)."""
    if len(P) == 0:
        return 0
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    tree = cKDTree(P)
    return int(connected_components(tree.sparse_distance_matrix(tree, tol, output_type="coo_matrix"),
                                    directed=False)[0])


@lru_cache(maxsize=8)
def _prop12_maps(seed: int, wrong: bool, n_maps: int = 4, d: int = 3):
    """Random smooth autonomous maps f(x) = tanh(W x + b) (strong symmetric W: several fixed points each), or,
    for the wrong variant, the non-generic f(x) = x - u tanh(uᵀx), whose fixed points fill the plane uᵀx = 0."""
    rng = _rng(seed, 1)
    maps = []
    for _ in range(n_maps):
        if wrong:
            u = rng.normal(size=d)
            u /= np.linalg.norm(u)
            f = (lambda X, u=u: X - np.tanh(X @ u)[..., None] * u)
            jac = (lambda X, u=u: np.eye(d) - (1 - np.tanh(X @ u) ** 2)[..., None, None] * np.outer(u, u))
        else:
            A = rng.normal(size=(d, d))
            m = TanhMap(3.0 * (A + A.T) / np.sqrt(2 * d), 0.2 * rng.normal(size=d))
            f, jac = m, m.jac
        starts = rng.uniform(-1.2, 1.2, size=(300, d))
        X, res = newton_fixed_points(f, jac, starts)
        ok = res < 1e-12
        maps.append((X[ok], jac(X[ok]), int(ok.sum())))
    return maps


@verifier("prop1_no_unit_eigenvalue", "Prop. 1",
          "for almost all θ, J_f(x*) has no eigenvalue 1 at any fixed point: min over fixed points of min_i |λ_i - 1|",
          relation=">=", tolerance=1e-6,
          wrong="the non-generic map f(x) = x - u tanh(uᵀx) (θ in the null set Prop. 1 excludes)")
def _prop1(seed, wrong):
    maps = _prop12_maps(seed, wrong)
    gap = min(float(np.min(np.abs(np.linalg.eigvals(J) - 1))) for _, J, n in maps if n)
    counts = [distinct_points(X) for X, _, _ in maps]
    kind = "x - u tanh(uᵀx)" if wrong else "tanh(Wx + b), symmetric W, ‖W‖≈2-4"
    return f"f(x) = {kind}, d = 3, 4 maps × 300 Newton starts; distinct fixed points per map {counts}", gap


@verifier("prop2_isolated_fixed_points", "Prop. 2",
          "fixed points form a 0-dimensional set: distinct fixed points found / converged Newton starts stays small",
          tolerance=0.1, wrong="the non-generic map f(x) = x - u tanh(uᵀx), whose fixed points form a plane")
def _prop2(seed, wrong):
    maps = _prop12_maps(seed, wrong)
    ratios = [distinct_points(X) / n for X, _, n in maps if n]
    counts = [distinct_points(X) for X, _, _ in maps]
    return (f"4 maps, d = 3, 300 starts each; distinct {counts} of converged {[n for _, _, n in maps]} "
            "(clusters at 1e-7)", max(ratios))


# ----------------------------------------------------------------------------------------------------------------
# Prop. 3 and App. A.3–A.4: autonomous maps near a fixed point
# ----------------------------------------------------------------------------------------------------------------


def _orbit_jacobian(m: TanhMap, x0: np.ndarray, T: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """x_T and the products dx_t/dx0 (t = 0..T) along the orbit of an autonomous map (chain rule)."""
    x, P = x0, np.eye(len(x0))
    products = [P]
    for _ in range(T):
        P = m.jac(x) @ P
        x = m(x)
        products.append(P)
    return x, products


@verifier("prop3_chain_rule", "Prop. 3 / App. A.3",
          "after convergence at K, dx_T/dx0 = J_f(x*)^(T-K) A with A = dx_K/dx0: relative error vs autograd",
          tolerance=1e-9, wrong="the factors in the other order, A J^(T-K)")
def _prop3(seed, wrong):
    import torch

    rng = _rng(seed, 3)
    d, T = 4, 160
    m, x_star = TanhMap.around(rng.uniform(-0.6, 0.6, size=d), real_matrix_with_spectrum(rng, [0.7, -0.5, 0.3 + 0.4j]))
    x0 = x_star + 0.01 * rng.normal(size=d)
    W, b = torch.tensor(m.W), torch.tensor(m.b)

    def unrolled(x, steps):
        for _ in range(steps):
            x = torch.tanh(W @ x + b)
        return x

    x, K = x0.copy(), 0
    while np.linalg.norm(x - x_star) > 1e-15 and K < T - 20:
        x, K = m(x), K + 1
    if K >= T - 20:
        raise ArithmeticError("no convergence to 1e-15 before T - 20")
    from torch.func import jacrev

    lhs = jacrev(lambda v: unrolled(v, T))(torch.tensor(x0)).numpy()
    A = jacrev(lambda v: unrolled(v, K))(torch.tensor(x0)).numpy()
    Jp = np.linalg.matrix_power(m.jac(x_star), T - K)
    rhs = A @ Jp if wrong else Jp @ A
    err = np.linalg.norm(lhs - rhs) / np.linalg.norm(lhs)
    return f"f = tanh(Wx + b), d = {d}, ρ(J*) = 0.7, converged at K = {K}, T = {T}", err


@verifier("a4_case1_vanishing_input_gradient", "Prop. 3 / App. A.4 case 1",
          "ρ(J*) < 1: ‖dx_T/dx0‖ decays at rate ρ(J*) (Gelfand); |(‖P_400‖/‖P_200‖)^(1/200) - claimed rate|",
          tolerance=0.02, wrong="claimed rate ‖J*‖₂ instead of ρ(J*) (non-normal J*)")
def _a4_case1(seed, wrong):
    rng = _rng(seed, 4)
    d = 4
    J = real_matrix_with_spectrum(rng, [0.8, -0.6, 0.5j + 0.2], spread=0.8)
    m, x_star = TanhMap.around(rng.uniform(-0.6, 0.6, size=d), J)
    _, P = _orbit_jacobian(m, x_star + 1e-4 * rng.normal(size=d), 400)
    rate = (np.linalg.norm(P[400], 2) / np.linalg.norm(P[200], 2)) ** (1 / 200)
    rho, norm = max(abs(np.linalg.eigvals(J))), np.linalg.norm(J, 2)
    claimed = norm if wrong else rho
    return (f"f = tanh(Wx + b), d = {d}, ρ(J*) = {rho:.3f}, ‖J*‖₂ = {norm:.3f}; measured rate {rate:.4f}, "
            f"‖dx_400/dx0‖ = {np.linalg.norm(P[400], 2):.1e}", abs(rate - claimed))


@verifier("a4_case2_unreachable", "Prop. 3 / App. A.4 case 2",
          "ρ(J*) > 1: almost every start near x* leaves its neighbourhood; share of 200 starts at 1e-8 that escape",
          relation=">=", tolerance=0.99, wrong="the same claim for a fixed point with ρ(J*) < 1")
def _a4_case2(seed, wrong):
    rng = _rng(seed, 5)
    d = 4
    spectrum = [0.9, 0.5, -0.3, 0.2] if wrong else [1.25, 0.5, -0.3, 0.2]
    m, x_star = TanhMap.around(rng.uniform(-0.6, 0.6, size=d), real_matrix_with_spectrum(rng, spectrum))
    delta = rng.normal(size=(200, d))
    X = x_star + 1e-8 * delta / np.linalg.norm(delta, axis=1, keepdims=True)
    escaped = np.zeros(200, bool)
    for _ in range(300):
        X = m(X)
        escaped |= np.linalg.norm(X - x_star, axis=1) > 1e-3
    return f"f = tanh(Wx + b), d = {d}, spectrum of J* {spectrum}, 300 steps, escape radius 1e-3", escaped.mean()


def _fixed_point_sensitivity(m: TanhMap, x_star: np.ndarray, h: float) -> np.ndarray:
    """dx*/db by central differences: re-solve the fixed point of tanh(W x + b ± h e_k) by Newton from x*."""
    d = len(x_star)
    cols = []
    for k in range(d):
        sols = []
        for s in (+1, -1):
            b = m.b.copy()
            b[k] += s * h
            mk = TanhMap(m.W, b)
            X, res = newton_fixed_points(mk, mk.jac, x_star[None], iters=30)
            if res[0] > 1e-13:
                raise ArithmeticError(f"Newton residual {res[0]:.1e}")
            sols.append(X[0])
        cols.append((sols[0] - sols[1]) / (2 * h))
    return np.stack(cols, axis=1)


@verifier("a4_case3_exploding_parameter_gradient", "Prop. 3 / App. A.4 case 3",
          "ρ(J*) → 1⁻ through an eigenvalue → +1: ‖dx*/db‖ ∝ 1/(1 - ρ); |log-log slope - 1| (dx*/db by finite "
          "differences of re-solved fixed points)", tolerance=0.1,
          wrong="ρ(J*) → 1⁻ through an eigenvalue → -1 (the paper's case 3 does not separate the two)")
def _a4_case3(seed, wrong):
    rng = _rng(seed, 6)
    d = 3
    x_star = rng.uniform(-0.5, 0.5, size=d)
    V = np.eye(d) + 0.4 * rng.normal(size=(d, d)) / np.sqrt(d)
    gaps = np.array([1e-1, 1e-2, 1e-3, 1e-4])
    norms = []
    for gap in gaps:
        lead = -(1 - gap) if wrong else 1 - gap
        m = TanhMap.with_fixed_point(x_star, V @ np.diag([lead, 0.4, -0.2]) @ np.linalg.inv(V))
        norms.append(np.linalg.norm(_fixed_point_sensitivity(m, x_star, h=1e-5 * gap), 2))
    slope = np.polyfit(np.log(1 / gaps), np.log(norms), 1)[0]
    lead = "-(1 - s)" if wrong else "1 - s"
    return (f"tanh map, d = {d}, eigenvalues ({lead}, 0.4, -0.2), s = 1e-1..1e-4; ‖dx*/db‖ = "
            f"{', '.join(f'{v:.3g}' for v in norms)}; slope {slope:.3f}", abs(slope - 1))


# ----------------------------------------------------------------------------------------------------------------
# The two-sublayer recall model (Defs. 5.1, 5.2) in torch, batched over instances
# ----------------------------------------------------------------------------------------------------------------


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


@dataclass
class StableToy:
    """A toy recall model in its stable regime: the orbit from e converges to x* with ρ(J*) < ``RHO_MAX``."""

    model: ToyRecall
    p: dict
    x0: object
    e: object
    x_star: object
    J: object  # ∂f/∂x at x*
    B: object  # ∂f/∂x0 at x*
    rho: float


RHO_MAX = 0.8


def _stable_toy(seed: int, placement: str, norm: bool = True, tries: int = 20) -> StableToy:
    """Draw toy recall models until one meets the hypothesis of Prop. 5 / App. A.8: the orbit from e converges
    (residual < 1e-10 after 300 steps) to a fixed point with ρ(J*) < 0.8."""
    import torch
    from torch.func import jacrev

    gen = torch.Generator().manual_seed(seed * 1000 + (11 if placement == "external" else 12))
    d = 5
    eye = torch.eye(d, dtype=torch.float64)
    for _ in range(tries):
        model = ToyRecall.random(gen, 1, d, wx_scale=torch.tensor([0.5]), h_scale=torch.tensor([0.3]), norm=norm,
                                 placement=placement)
        if placement == "internal":  # near-linear tanh and h_i' ∂g/∂x ≈ -0.5 I: a contractive internal model
            for i in ("1", "2"):
                model.p["A" + i] = 0.1 * model.p["A" + i]
            model.align_sublayers(gen, 0.5, 0.3)
        p = model.single(0)
        x0 = torch.randn(d, generator=gen, dtype=torch.float64)
        e = torch.randn(d, generator=gen, dtype=torch.float64)
        x = _unrolled(model, p, 300)(e, x0)
        if not torch.isfinite(x).all() or (model.step_p(p, x, x0) - x).norm() > 1e-10:
            continue
        for _ in range(3):  # Newton polish
            J = jacrev(model.step_p, argnums=1)(p, x, x0)
            x = x - torch.linalg.solve(J - eye, model.step_p(p, x, x0) - x)
        J = jacrev(model.step_p, argnums=1)(p, x, x0)
        rho = torch.linalg.eigvals(J).abs().max().item()
        if rho < RHO_MAX:
            return StableToy(model, p, x0, e, x, J, jacrev(model.step_p, argnums=2)(p, x, x0), rho)
    raise ArithmeticError(f"no stable {placement} toy model in {tries} draws")


def _unrolled(model, p, T):
    def run(e, x0):
        x = e
        for _ in range(T):
            x = model.step_p(p, x, x0)
        return x

    return run


def _prop5_errors(seed, wrong, Ts, placement):
    """Relative errors of dx_T/dx0 (autograd through T steps from the fixed start e) against the claimed limit."""
    import torch
    from torch.func import jacrev

    t = _stable_toy(seed, placement)
    eye = torch.eye(len(t.x_star), dtype=t.x_star.dtype)
    limit = t.B if wrong else torch.linalg.solve(eye - t.J, t.B)
    errs = []
    for T in Ts:
        dxT = jacrev(_unrolled(t.model, t.p, T), argnums=1)(t.e, t.x0)
        errs.append(((dxT - limit).norm() / limit.norm()).item())
    return errs, t.rho


@verifier("prop5_input_gradient_limit", "Prop. 5 / App. A.6",
          "ρ(J*) < 1: lim_T dx_T/dx0 = (I - J*)⁻¹ ∂f/∂x0 (external and internal recall): max relative error at "
          "T = 150", tolerance=1e-10, wrong="the limit claimed to be ∂f/∂x0 alone (no (I - J*)⁻¹)")
def _prop5_limit(seed, wrong):
    errs, rhos = zip(*(_prop5_errors(seed, wrong, [150], placement) for placement in ("external", "internal")))
    return (f"toy external / internal recall with RMSNorm φ, d = 5, ρ(J*) = {rhos[0]:.3f} / {rhos[1]:.3f}, "
            f"fixed start e", max(e[0] for e in errs))


@verifier("prop5_error_decays_with_T", "Prop. 5 / App. A.6",
          "the error ‖dx_T/dx0 - (I - J*)⁻¹∂f/∂x0‖ decays geometrically at about ρ(J*): (rate fitted over T = 2..40, "
          "errors above 1e-12) - ρ(J*)", tolerance=0.1, wrong="the limit claimed to be ∂f/∂x0 alone")
def _prop5_decay(seed, wrong):
    Ts = np.array([2, 4, 8, 12, 16, 24, 32, 40])
    errs, rho = _prop5_errors(seed, wrong, Ts.tolist(), "external")
    errs = np.array(errs)
    keep = errs > 1e-12
    if keep.sum() < 3:
        raise ArithmeticError("fewer than three errors above the floating-point floor")
    rate = float(np.exp(np.polyfit(Ts[keep], np.log(errs[keep]), 1)[0]))
    return (f"toy external recall with RMSNorm φ, d = 5, ρ(J*) = {rho:.3f}, fitted rate {rate:.3f}; errors "
            f"{', '.join(f'{v:.1e}' for v in errs)} at T = {Ts.tolist()}", rate - rho)


@verifier("a8_initial_iterate_forgotten", "App. A.8",
          "in the stable regime dx_T/de → 0 (both recall placements, RMSNorm φ): max ‖dx_T/de‖_F at T = 100",
          tolerance=1e-8, wrong="the same claim for dx_T/dx0, which Prop. 5 says stays finite and non-zero")
def _a8(seed, wrong):
    from torch.func import jacrev

    worst, rhos = [], []
    for placement in ("external", "internal"):
        t = _stable_toy(seed, placement)
        rhos.append(t.rho)
        dxT = jacrev(_unrolled(t.model, t.p, 100), argnums=1 if wrong else 0)(t.e, t.x0)
        worst.append(dxT.norm().item())  # Frobenius norm
    return (f"toy external / internal recall with RMSNorm φ, d = 5, ρ(J*) = {rhos[0]:.2f} / {rhos[1]:.2f}, T = 100; "
            f"‖·‖_F = {', '.join(f'{v:.1e}' for v in worst)}", max(worst))


# ----------------------------------------------------------------------------------------------------------------
# Lemma 1 and the two excerpts
# ----------------------------------------------------------------------------------------------------------------


@verifier("lemma1_telescoping_product", "Lemma 1 (App. A.6)",
          "∏A_i - B^K = Σ_i (∏_{j<i} A_j)(A_i - B)B^(K-i) for random matrices: max relative error",
          tolerance=1e-12, wrong="the B-power on the left, Σ_i B^(K-i)(A_i - B)∏_{j<i} A_j")
def _lemma1(seed, wrong):
    rng = _rng(seed, 10)
    worst = 0.0
    for K in range(1, 7):
        d = 4
        A = rng.normal(size=(K, d, d))
        B = rng.normal(size=(d, d))
        lhs = np.linalg.multi_dot([*A, np.eye(d)]) - np.linalg.matrix_power(B, K)
        rhs = np.zeros((d, d))
        prefix = np.eye(d)
        for i in range(K):
            tail = np.linalg.matrix_power(B, K - 1 - i)
            rhs += (tail @ (A[i] - B) @ prefix) if wrong else (prefix @ (A[i] - B) @ tail)
            prefix = prefix @ A[i]
        worst = max(worst, np.linalg.norm(lhs - rhs) / np.linalg.norm(lhs))
    return "K = 1..6, d = 4, Gaussian A_i, B", worst


def _contraction_instances(seed: int, salt: int, d: int = 8):
    """A tight instance (W = L·orthogonal, near the linear regime of tanh) and a generic random one."""
    rng = _rng(seed, salt)
    Q, _ = np.linalg.qr(rng.normal(size=(d, d)))
    W_rand = rng.normal(size=(d, d))
    return rng, [("tight", Q, 1e-3), ("random", W_rand / np.linalg.norm(W_rand, 2), 0.5)]


@verifier("fprm_residual_bound", "FPRM (contraction residual bound)",
          "f(z; x) = F(α₂z + β₂x) with Lip(F) = λ_f, α₂λ_f < 1: ‖f(z_i) - z_i‖ ≤ (α₂λ_f)^i ‖f(z_0) - z_0‖: "
          "max ratio lhs/rhs", tolerance=1 + 1e-9, wrong="the faster rate (α₂λ_f)^(2i)")
def _fprm_residual(seed, wrong):
    rng, instances = _contraction_instances(seed, 11)
    alpha2, beta2, lam_f = 0.9, 1.0, 1.0
    q = alpha2 * lam_f
    worst = 0.0
    for _, W, scale in instances:
        x = scale * rng.normal(size=W.shape[0])
        c = scale * rng.normal(size=W.shape[0])

        def f(z, W=W, x=x, c=c):
            return np.tanh(W @ (alpha2 * z + beta2 * x) + c)  # ‖W‖₂ = λ_f = 1, tanh is 1-Lipschitz

        z = scale * rng.normal(size=W.shape[0])
        r0 = np.linalg.norm(f(z) - z)
        for i in range(60):
            bound = (q ** (2 * i) if wrong else q ** i) * r0
            if bound < 1e-12 * max(1.0, r0):
                break
            worst = max(worst, np.linalg.norm(f(z) - z) / bound)
            z = f(z)
    return f"F = tanh(W·+c), ‖W‖₂ = 1, α₂ = {alpha2}, β₂ = {beta2}, d = 8; tight and random instances", worst


@verifier("fprm_damping_eta0", "FPRM App. A.3 (damping)",
          "Re λ_i < 1: the damped map (1-η)z + ηf(z) attracts for η < η₀ = min{1, min_i 2(1-Re λ_i)/|λ_i-1|²} and "
          "not for η slightly above η₀ (when η₀ < 1): mismatches over η/η₀ ∈ {0.5, 0.9, 0.97, 1.03, 1.1, 1.5}",
          tolerance=0, wrong="η₀ without the factor 2")
def _fprm_damping(seed, wrong):
    rng = _rng(seed, 12)
    d = 4
    spectrum = [-1.5, 0.5 + 1.2j, 0.3]  # Re λ < 1 but ρ > 1: the undamped iteration is repelled
    J = real_matrix_with_spectrum(rng, spectrum)
    lam = np.linalg.eigvals(J)
    eta0 = min(1.0, float(np.min((1 if wrong else 2) * (1 - lam.real) / np.abs(lam - 1) ** 2)))
    m, x_star = TanhMap.around(rng.uniform(-0.5, 0.5, size=d), J)
    factors = np.array([0.5, 0.9, 0.97, 1.03, 1.1, 1.5])
    etas = np.repeat(factors * eta0, 20)[:, None]
    delta = rng.normal(size=(len(etas), d))
    Z = x_star + 1e-7 * delta / np.linalg.norm(delta, axis=1, keepdims=True)
    escaped = np.zeros(len(etas), bool)
    for _ in range(4000):
        Z = (1 - etas) * Z + etas * m(Z)
        dist = np.linalg.norm(Z - x_star, axis=1)
        escaped |= dist > 1e-3
        Z = np.where((dist > 1e-2)[:, None], x_star + 1e-2 * (Z - x_star) / dist[:, None], Z)
    attracted = ~escaped & (np.linalg.norm(Z - x_star, axis=1) < 1e-9)
    predicted = np.repeat(factors < 1, 20)
    mismatches = int(np.sum(predicted != attracted))
    return (f"tanh map with J* spectrum {spectrum} (+conj), d = {d}, η₀ = {eta0:.4f}; 20 starts at 1e-7 per η, "
            "4000 steps", mismatches)


@verifier("fprm_neumann_truncation", "FPRM App. A.4 (truncated BPTT)",
          "‖J‖₂ = σ < 1: ‖(I - J)⁻¹ - Σ_{j<k} J^j‖_F ≤ √D σ^k/(1 - σ) for k = 1..30: max ratio lhs/rhs",
          tolerance=1 + 1e-9, wrong="the bound without √D")
def _fprm_neumann(seed, wrong):
    rng = _rng(seed, 13)
    D, sigma = 16, 0.8
    A = rng.normal(size=(D, D))
    Js = [sigma * np.eye(D), sigma * A / np.linalg.norm(A, 2)]
    worst = 0.0
    for J in Js:
        exact = np.linalg.inv(np.eye(D) - J)
        partial, power = np.zeros((D, D)), np.eye(D)
        for k in range(1, 31):
            partial += power
            power = power @ J
            bound = (1 if wrong else np.sqrt(D)) * sigma ** k / (1 - sigma)
            worst = max(worst, np.linalg.norm(exact - partial) / bound)
    return f"D = {D}, σ = {sigma}: J = σI (the bound is tight) and a random J scaled to ‖J‖₂ = σ", worst


@verifier("attractor_corollary1", "Attractor Models, Corollary 1",
          "F with Lipschitz constant L < 1: ‖y_T - y*‖ ≤ L^T ‖E(x) - y*‖ for T = 0..: max ratio lhs/rhs",
          tolerance=1 + 1e-9, wrong="the spectral radius ρ(J_F(y*)) in place of L (non-normal J_F)")
def _attractor_cor1(seed, wrong):
    rng = _rng(seed, 14)
    d = 6
    N = np.triu(rng.normal(size=(d, d)), 1)
    W = 0.3 * np.eye(d) + N  # non-normal: ρ(W) = 0.3, ‖W‖₂ larger
    W *= 0.9 / np.linalg.norm(W, 2)
    U, x, E = rng.normal(size=(d, d)), rng.normal(size=d), rng.normal(size=d)
    m = TanhMap(W, U @ x)
    y_star, res = newton_fixed_points(m, m.jac, E[None], iters=50)
    y_star = y_star[0]
    L = np.linalg.norm(W, 2)  # tanh is 1-Lipschitz, so Lip(F) ≤ ‖W‖₂
    rate = max(abs(np.linalg.eigvals(m.jac(y_star)))) if wrong else L
    y, worst = E.copy(), 0.0
    e0 = np.linalg.norm(E - y_star)
    for T in range(200):
        bound = rate ** T * e0
        if bound < 1e-12:
            break
        worst = max(worst, np.linalg.norm(y - y_star) / bound)
        y = m(y)
    return f"F(y) = tanh(Wy + Ux), d = {d}, L = ‖W‖₂ = {L:.2f}, ρ(J_F(y*)) = {rate if wrong else '<L'}", worst


@verifier("attractor_implicit_gradient_eq8", "Attractor Models eq. 8 / Prop. 3 (A.4)",
          "∂y*/∂θ = (I - J_F(y*))⁻¹ ∂f/∂θ matches central finite differences of re-solved fixed points: "
          "relative error", tolerance=1e-6, wrong="(I + J_F)⁻¹ in place of (I - J_F)⁻¹")
def _attractor_eq8(seed, wrong):
    rng = _rng(seed, 15)
    d = 5
    W = rng.normal(size=(d, d))
    W *= 0.8 / max(abs(np.linalg.eigvals(W)))
    b, ux = 0.3 * rng.normal(size=d), rng.normal(size=d)

    def solve(W, b, y):
        m = TanhMap(W, b + ux)
        Y, res = newton_fixed_points(m, m.jac, y[None], iters=8 if y.any() else 40)
        if res[0] > 1e-13:
            raise ArithmeticError(f"Newton residual {res[0]:.1e}")
        return Y[0]

    y_star = solve(W, b, np.zeros(d))
    S = 1 - np.tanh(W @ y_star + b + ux) ** 2
    J = S[:, None] * W  # ∂f/∂y
    P = np.concatenate([np.kron(np.diag(S), y_star[None, :]), np.diag(S)], axis=1)  # ∂f/∂(vec_row W, b)
    eye = np.eye(d)
    implicit = np.linalg.solve(eye + J if wrong else eye - J, P)
    h = 1e-6
    fd = np.zeros_like(implicit)
    for k in range(d * d + d):
        cols = []
        for sign in (+1, -1):
            Wk, bk = W.copy(), b.copy()
            if k < d * d:
                Wk[k // d, k % d] += sign * h
            else:
                bk[k - d * d] += sign * h
            cols.append(solve(Wk, bk, y_star))
        fd[:, k] = (cols[0] - cols[1]) / (2 * h)
    err = np.linalg.norm(implicit - fd) / np.linalg.norm(fd)
    return f"f(y; θ) = tanh(Wy + b + Ux), θ = (W, b): {d * d + d} parameters, d = {d}, ρ(W) = 0.8, h = {h}", err


@verifier("attractor_inverse_blowup", "Attractor Models B.3.3",
          "‖(I - J)⁻¹‖₂ ~ dist(1, σ(J))⁻¹ as an eigenvalue of J → 1: |log-log slope - claimed exponent (-1)|",
          tolerance=0.05, wrong="the claimed exponent -2")
def _attractor_blowup(seed, wrong):
    rng = _rng(seed, 16)
    gaps = np.array([1e-1, 1e-2, 1e-3, 1e-4, 1e-5])
    V = np.eye(6) + 0.5 * rng.normal(size=(6, 6)) / np.sqrt(6)
    Vi = np.linalg.inv(V)
    norms, lower_ok = [], True
    for s in gaps:
        J = np.real(V @ np.diag([1 - s, 0.5, -0.4, 0.2, -0.9, 0.1]) @ Vi)
        lam = np.linalg.eigvals(J)
        dist = float(np.min(np.abs(1 - lam)))
        n = np.linalg.norm(np.linalg.inv(np.eye(6) - J), 2)
        lower_ok &= n >= 1 / dist * (1 - 1e-9)  # ‖(I - J)⁻¹‖ ≥ ρ((I - J)⁻¹) = 1/dist always
        norms.append(n)
    slope = np.polyfit(np.log(gaps), np.log(norms), 1)[0]
    claimed = -2.0 if wrong else -1.0
    if not lower_ok:
        raise ArithmeticError("‖(I - J)⁻¹‖ < 1/dist(1, σ(J))")
    return (f"J = V diag(1 - s, …) V⁻¹, d = 6, s = 1e-1..1e-5; slope {slope:.3f}; ‖(I-J)⁻¹‖ ≥ 1/dist holds",
            abs(slope - claimed))


# ----------------------------------------------------------------------------------------------------------------
# Symbolic derivations and the exact projection, as rows of the same table
# ----------------------------------------------------------------------------------------------------------------


@verifier("sym_a7_jacobians", "App. A.7 (sympy)",
          "the four Jacobian forms derived from Defs. 5.1/5.2 (non-commuting symbols) equal App. A.7's, with "
          "internal ∂x_t/∂x0 read as dh2(g(z, x0))/dg: terms left in derived - paper", tolerance=0,
          wrong="App. A.7.1's internal ∂x_t/∂x0 exactly as printed (dh1(g(z, x0))/dg)")
def _sym_a7(seed, wrong):
    from stability.theory import symbolic

    counts = symbolic.compare_a7(symbolic.paper_a7() if wrong else symbolic.corrected_a7())
    return "chain rule on φ2∘(id + h2)∘φ1∘(id + h1)∘g and the internal composition; " + str(counts), \
        sum(counts.values())


@verifier("sym_prop4_M", "Prop. 4 / App. A.5 (sympy)",
          "with φ1 = φ2 = I the derived Jacobians reduce to M_ext = (I + h2')(I + h1')g_x and "
          "M_int = (I + h2'g_z)(I + h1'g_x): terms left", tolerance=0, wrong="M_ext with the factors reversed")
def _sym_prop4(seed, wrong):
    from stability.theory import symbolic

    paper = symbolic.paper_prop4()
    if wrong:
        paper["M_ext"] = symbolic.G_x * (1 + symbolic.H1) * (1 + symbolic.H2_z)
    derived = symbolic.derive_prop4()
    counts = {k: symbolic.difference_terms(derived[k], paper[k]) for k in paper}
    return f"non-commuting symbols; {counts}", sum(counts.values())


@verifier("sym_fig5_single_layer", "Figure 5 (sympy)",
          "single layer, J_g and J_h sharing a generic eigenbasis: V⁻¹MV is diagonal with (1 + λ_h)λ_g (external) "
          "and 1 + λ_gλ_h (internal): forms that differ from Fig. 5's labels", tolerance=0,
          wrong="the labels swapped between external and internal")
def _sym_fig5(seed, wrong):
    import sympy as sp

    from stability.theory import symbolic

    derived, claims = symbolic.single_layer_conditions(), symbolic.figure5_claims()
    if wrong:
        claims = {"external": claims["internal"], "internal": claims["external"]}
    bad = sum(sp.simplify(derived[k] - claims[k]) != 0 for k in derived)
    two = {k: symbolic.shared_eigenvector_eigenvalues(k, 2)[0] for k in ("external", "internal")}
    return f"2×2 generic V; two sublayers give {two}", bad


@verifier("sym_fig5_regions", "Figure 5 / App. B.2 (sympy)",
          "over the reals |1 + t| ≤ 1 ⟺ t ∈ [-2, 0] and |s| ≤ 1 ⟺ s ∈ [-1, 1], the bands regions.py projects "
          "onto: largest endpoint discrepancy", tolerance=0, wrong="the internal band taken as [-1, 1]")
def _sym_regions(seed, wrong):
    from stability.theory import regions, symbolic

    derived = symbolic.region_intervals()
    used = {"internal": (regions.INTERNAL_LO, regions.INTERNAL_HI),
            "external": (regions.EXTERNAL_LO, regions.EXTERNAL_HI)}
    if wrong:
        used["internal"] = (-1.0, 1.0)
    gap = max(abs(a - b) for k in derived for a, b in zip(derived[k], used[k]))
    return f"solveset over ℝ: {derived}", gap


@verifier("sym_damping_eta0", "FPRM App. A.3 (sympy)",
          "|1 + η(λ-1)|² - 1 = η(|λ-1|²η - 2(1-Re λ)): stable iff 0 < η < 2(1-Re λ)/|λ-1|²: terms left in "
          "derived - FPRM bound", tolerance=0, wrong="the bound (1 - Re λ)/|λ - 1|²")
def _sym_damping(seed, wrong):
    import sympy as sp

    from stability.theory import symbolic

    d = symbolic.damping_bound()
    claim = symbolic.fprm_eta_bound() / (2 if wrong else 1)
    left = sp.simplify(d["eta_max"] - claim)
    positive_leading = sp.simplify(d["leading"] - ((d["a"] - 1) ** 2 + d["b"] ** 2)) == 0
    if not positive_leading:
        raise ArithmeticError("leading coefficient is not |λ - 1|²")
    return f"λ = a + ib, η > 0; factored excess {d['excess']}", 0 if left == 0 else len(sp.Add.make_args(left))


@verifier("b2_exact_projection", "App. B.2 (Table 3)",
          "the exact projection onto each closed region is never farther than a dense search over its boundary "
          "(2×10⁵ points per curve) and lies in the region: max(d_exact - d_dense, violation)", tolerance=1e-9,
          wrong="internal points with x·y > 0 sent to the x-axis only (a boundary parametrised as y = f(x))")
def _b2_projection(seed, wrong):
    from stability.theory import regions

    rng = _rng(seed, 17)
    P = rng.normal(0, 3, size=(400, 2))
    u = np.geomspace(1e-3, 1e3, 100_000)
    u = np.concatenate([-u[::-1], u])
    axis = np.linspace(-40, 40, 200_001)
    curves = {
        "internal": [np.c_[axis, 0 * axis], np.c_[0 * axis, axis], np.c_[u, -2 / u]],
        "external": [np.c_[u, 1 / u - 1], np.c_[u, -1 / u - 1]],
    }
    worst = -np.inf
    for name, project in regions.PROJECTIONS.items():
        px, py = project(P[:, 0], P[:, 1])
        if wrong and name == "internal":
            above = P[:, 0] * P[:, 1] > 0
            px, py = np.where(above, P[:, 0], px), np.where(above, 0.0, py)
        d_exact = np.hypot(px - P[:, 0], py - P[:, 1])
        from scipy.spatial import cKDTree

        tree = cKDTree(np.concatenate(curves[name]))
        d_dense, _ = tree.query(P)
        outside = ~(regions.stable_internal(P[:, 0], P[:, 1], closed=True) if name == "internal"
                    else regions.stable_external(P[:, 0], P[:, 1], closed=True))
        eig = regions.internal_eigenvalue(px, py) if name == "internal" else regions.external_eigenvalue(px, py)
        violation = float(np.max(np.abs(eig)) - 1)
        worst = max(worst, float(np.max((d_exact - d_dense)[outside])), violation)
    return "400 points of N(0, 3²I₂); quartic roots by batched companion eigenvalues", worst
