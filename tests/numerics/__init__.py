"""The numerics wing (stability/numerics): Jacobian operators, ρ and σ_max, Krylov–Schur, the (I − J)
solves, each against independent references (tests/reference_numerics.py)."""
