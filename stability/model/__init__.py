"""The map f: the looped transformer (Defs. 3.1–5.2) and the fixed-depth baseline."""

from stability.model.looped import FixedDepthTransformer, LoopedTransformer, build_model

__all__ = ["FixedDepthTransformer", "LoopedTransformer", "build_model"]
