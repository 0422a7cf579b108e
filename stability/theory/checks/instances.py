"""Constructed instances in numpy: tanh maps with a prescribed fixed point and Jacobian, batched Newton, clusters.

Every check draws its randomness from :func:`seeded_rng` (seed, salt), so each check has its own stream.
"""

from __future__ import annotations

import numpy as np

from stability.stats import distinct_clusters


def seeded_rng(seed: int, salt: int) -> np.random.Generator:
    """The generator of one check: ``default_rng([seed, salt])``, with a salt fixed per check."""
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
    """Number of distinct points of P (N, d) up to ``tol``: the connected components of the graph linking two
    points when ‖a − b‖∞ ≤ tol (absolute, max-norm), by :func:`stability.stats.distinct_clusters`, the routine
    the analysis counts distinct fixed points with."""
    return distinct_clusters(P, atol=tol)[0]
