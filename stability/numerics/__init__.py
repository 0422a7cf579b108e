"""The numerics of the fixed point x* = f(x*, x0): where ρ(J*), σ_max(J*) and the (I − J)⁻¹ solves live.

=====================================  ==================================================  ================
what (paper)                           call                                                module
=====================================  ==================================================  ================
J = ∂f/∂x, K = ∂f/∂x0 at x* (batched)  ``Linearisation(f, x_star, x0)``: J·v, Jᵀ·v, dense  :mod:`.jacobian`
ρ(J*) (Props. 3–4, App. A.4)           ``spectral_radius(J, route=...)`` → ``Spectrum``    :mod:`.spectra`
σ_max(J*) = ‖J*‖₂                      ``sigma_max(J, route=...)``                         :mod:`.spectra`
(I − J)⁻¹ b, (I − J)⁻ᵀ b (Prop. 5)     ``solve_I_minus_J(J.J, b)`` (GMRES, Neumann)        :mod:`.gmres`
the Krylov–Schur eigensolver           ``krylov_schur`` (what the Krylov routes run)       :mod:`.eigen`
a correctly rounded √ (any CPU)        ``exact.sqrt(t)``                                   :mod:`.exact`
=====================================  ==================================================  ================

Everything here works on a batch of independent samples at once (``step`` keeps samples independent), in torch, on
the CPU or a GPU; the analysis stages, the training monitor, the solvers' ``repelling`` check and implicit
training all call these four entry points, each with its own preset. The per-sample scipy routes (ARPACK, scipy's
GMRES on a matrix-free ``LinearOperator``) are the tests' independent references (tests/reference_numerics.py).
"""

from stability.numerics import exact
from stability.numerics.gmres import IJSolve, solve_I_minus_J
from stability.numerics.jacobian import Linearisation
from stability.numerics.spectra import Spectrum, route_for, sigma_max, spectral_radius

__all__ = ["IJSolve", "Linearisation", "Spectrum", "exact", "route_for", "sigma_max", "solve_I_minus_J",
           "spectral_radius"]
