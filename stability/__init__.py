"""stability: train looped (weight-tied) transformers and test whether their fixed points can be trusted.

``stability.load(path)`` opens a checkpoint written by the trainer and returns its model, config and task.
"""

__version__ = "0.1.0"


def load(path, *, device: str = "cpu", release_config=None):
    """Load a checkpoint: returns a :class:`stability.train.checkpoint.Loaded` (``.model``, ``.config``, ``.task``).

    Also opens the paper's release checkpoints (``RUN_DIR/model_best.pth``; ``release_config``: its Hydra
    config when it is not at ``RUN_DIR/.hydra/config.yaml``), imported with the release's semantics."""
    from stability.train.checkpoint import load as _load

    return _load(path, device=device, release_config=release_config)


__all__ = ["__version__", "load"]
