"""The map f (stability/model): the looped transformer, its Fixed-Point Reasoner options, the release import."""
