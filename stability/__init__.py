"""stability: train looped (weight-tied) transformers and test whether their fixed points can be trusted.

The public API (docs/python-api.md), the same objects as their home modules':

* ``load(path)``: a checkpoint of this toolkit or of the paper's release (``.model``, ``.config``, ``.task``);
* ``analyze(source, ...)``: the whole fixed-point analysis of a :class:`LoopedModel` on inputs, of a loaded
  checkpoint or of a checkpoint's path (the last two on the task's splits, scored by the task);
* ``Analysis``: what ``analyze`` returns (``to_json()``, ``summary()``, ``plot(dir)``, ``write_json(path)``);
* ``AnalysisOptions``: what ``analyze`` runs; ``solve``: the fixed-point solvers;
* ``LoopedModel``: the model contract; ``check_model``: a model checked against it.

``import stability`` stays light: torch is imported when one of these is first used.
"""

__version__ = "0.1.0"

import os as _os

if _os.environ.get("STABILITY_REPRODUCIBLE") == "1":  # a pinned process (stability.hardware): oneDNN off, 1 thread
    from stability.hardware import apply_in_process as _pin

    _pin()


def load(path, *, device: str = "cpu", release_config=None):
    """Load a checkpoint: returns a :class:`stability.checkpoint.Loaded` (``.model``, ``.config``, ``.task``).

    Also opens the paper's release checkpoints (``RUN_DIR/model_best.pth``; ``release_config``: its Hydra
    config when it is not at ``RUN_DIR/.hydra/config.yaml``), imported with the release's semantics, and a Hugging
    Face ``save_pretrained`` directory of a looped language model (``.model``: its adapter, :mod:`stability.lm`)."""
    import os

    if isinstance(path, (str, os.PathLike)) and os.path.isfile(os.path.join(path, "config.json")):
        # a Hugging Face save_pretrained directory (a looped language model): stability.lm loads and adapts it
        from stability.errors import CheckpointError
        from stability.lm.pretrained import load_pretrained

        if release_config is not None:
            raise CheckpointError(f"release_config {release_config}: {path} is a Hugging Face model directory")
        return load_pretrained(path, device=device)
    # lazy: torch; this module imports without it
    from stability.checkpoint import load as _load

    return _load(path, device=device, release_config=release_config)


def analyze(source, inputs=None, targets=None, options=None, *, splits=None, log=None, release_config=None):
    """The whole analysis (reachability, ρ(J*), Props. 4–5, App. A.8, accuracy; geometry when asked for) of

    * ``analyze(model, inputs, targets=None, options=None)``: any :class:`~stability.protocols.LoopedModel` on a
      batch of inputs (accuracy when ``targets`` are given: argmax over the last axis of ``readout``), or
    * ``analyze(stability.load(path))`` / ``analyze(path)``: a checkpoint on its task's ``splits`` (default
      ``("val", "hard")``), scored by the task's own ``score``, as ``stability analyze CKPT`` does.

    ``options``: :class:`~stability.config.AnalysisOptions` (e.g. ``stages=("rho",)``);
    ``log``: a callable for progress lines. Returns an :class:`~stability.analysis.results.Analysis`, read like the
    JSON it writes (``a["val"]["jacobian"]["spectral_radius"]``). A looped language model (a save_pretrained
    directory, its ``stability.load`` or an adapter) on token ids is :func:`stability.lm.analyze_lm`."""
    # lazy: torch; this module imports without it
    from stability.lm.analyze import analyze_lm, is_lm_source

    if is_lm_source(source):  # a looped language model (stability.lm): token ids, scored per token
        if splits is not None or release_config is not None:
            # kept out of the package's namespace (stability.__all__), as the other names of its functions
            from stability.errors import StabilityError

            raise StabilityError("splits and release_config do not apply to a language model: it is analysed on "
                                 "token ids (inputs)")
        return analyze_lm(source, inputs, targets=targets, options=options, log=log)
    # lazy: torch; this module imports without it
    from stability.analysis.pipeline import analyze as _analyze

    return _analyze(source, inputs, targets, options, splits=splits, log=log, release_config=release_config)


#: the public names loaded on first use (``import stability`` stays light: no torch until one is touched)
_LAZY = {
    "Analysis": "stability.analysis.results",  # what `analyze` returns: to_json, summary, plot, write_json
    "AnalysisOptions": "stability.config",  # what `analyze` runs: stages, samples, solver, ...
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
