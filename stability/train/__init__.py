"""Training: the progressive-loss trainer and self-describing checkpoints."""

from stability.train.loop import TrainResult, evaluate, train

__all__ = ["TrainResult", "evaluate", "train"]
