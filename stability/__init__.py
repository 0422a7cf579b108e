"""stability: train looped (weight-tied) transformers and test whether their fixed points can be trusted.

``stability.load(path)`` opens a checkpoint written by the trainer and returns its model, config and task;
``stability.analyze(model, inputs, targets=None, options=None)`` runs the whole fixed-point analysis on any model
that satisfies the :class:`stability.protocols.LoopedModel` contract (docs/python-api.md, "The model contract").
"""

__version__ = "0.1.0"

import os as _os

if _os.environ.get("STABILITY_REPRODUCIBLE") == "1":  # a pinned process (stability.hardware): oneDNN off, 1 thread
    from stability.hardware import apply_in_process as _pin

    _pin()


def load(path, *, device: str = "cpu", release_config=None):
    """Load a checkpoint: returns a :class:`stability.checkpoint.Loaded` (``.model``, ``.config``, ``.task``).

    Also opens the paper's release checkpoints (``RUN_DIR/model_best.pth``; ``release_config``: its Hydra
    config when it is not at ``RUN_DIR/.hydra/config.yaml``), imported with the release's semantics."""
    from stability.checkpoint import load as _load

    return _load(path, device=device, release_config=release_config)


def analyze(model, inputs, targets=None, options=None, *, log=None):
    """The whole analysis of a :class:`~stability.protocols.LoopedModel` on a batch of inputs (reachability,
    ρ(J*), Props. 4–5, App. A.8, accuracy when ``targets`` are given): a
    :class:`~stability.analysis.results.SplitAnalysis` with ``.to_json()``, ``.summary()`` and ``.plot(dir)``.
    ``options``: :class:`~stability.analysis.options.AnalysisOptions` (e.g. ``stages=("rho", "prop5")``)."""
    from stability.analysis.pipeline import analyze as _analyze

    return _analyze(model, inputs, targets, options, log=log)


#: the public names loaded on first use (``import stability`` stays light: no torch until one is touched)
_LAZY = {
    "AnalysisOptions": "stability.analysis.options",  # what `analyze` runs: stages, samples, solver, ...
    "solve": "stability.solvers",  # the fixed-point solvers, one signature
    "LoopedModel": "stability.protocols",  # the model contract
    "check_model": "stability.protocols",  # checks a model of one's own against the contract
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stability' has no attribute {name!r}")


__all__ = ["__version__", "analyze", "load", *_LAZY]
