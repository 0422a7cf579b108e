"""Training: the progressive-loss trainer (``loop``); checkpoints are :mod:`stability.checkpoint`."""


def __getattr__(name):
    if name in ("TrainResult", "evaluate", "train"):
        from stability.train import loop  # lazy: torch; `import stability.train` without it

        return getattr(loop, name)
    raise AttributeError(name)


__all__ = ["TrainResult", "evaluate", "train"]
