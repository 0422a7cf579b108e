"""stability: train looped (weight-tied) transformers and test whether their fixed points can be trusted.

``stability.load(path)`` opens a checkpoint written by the trainer and returns its model, config and task.
"""

__version__ = "0.1.0"


def load(path, *, device: str = "cpu"):
    """Load a checkpoint: returns a :class:`stability.train.checkpoint.Loaded` (``.model``, ``.config``, ``.task``)."""
    from stability.train.checkpoint import load as _load

    return _load(path, device=device)


__all__ = ["__version__", "load"]
