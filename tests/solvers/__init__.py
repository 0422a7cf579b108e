"""The fixed-point solvers (stability/solvers.py)."""
