"""Sweeps (stability/sweep): grids, records, claims, tables and figures."""
