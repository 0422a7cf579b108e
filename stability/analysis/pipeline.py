"""The analysis of a batch of inputs, of a task's split and of a checkpoint: the stages in the registry's order
(:mod:`stability.analysis.stages`) on one :class:`~stability.analysis.fixed_point.AtFixedPoint`, gathered into
one :class:`~stability.analysis.results.Analysis`.

* :func:`analyze`: ``stability.analyze``, the one entry: a :class:`~stability.protocols.LoopedModel` with inputs,
  a :class:`~stability.stored.Loaded` (``stability.load``) or a checkpoint's path;
* :func:`analyze_model`: a model of one's own on a batch of inputs (argmax scoring: it has no task);
* :func:`analyze_loaded`: each split of a loaded checkpoint, scored by its task, in this process;
* :func:`analyze_checkpoint`: each split of a checkpoint file, side by side on the CPU
  (:mod:`stability.analysis.pool`); what ``stability analyze CKPT`` runs;
* :func:`analyze_split`: the first ``options.samples`` samples of a task's split, scored by the task;
* :func:`run_stages`: ``options.stages`` on one batch of inputs of the analysis copy of a model.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Optional

import torch

from stability.analysis.cost import Progress, forecast, predict, scale
from stability.analysis.fixed_point import AtFixedPoint, analysis_model
from stability.analysis.options import AnalysisOptions
from stability.analysis.pool import parallel_splits
from stability.analysis.results import Analysis, SplitResult
from stability.analysis.stages.registry import FEW_SAMPLE_STAGES, stage
from stability.checkpoint import load
from stability.config import resolve_device
from stability.errors import StabilityError
from stability.numerics import Linearisation
from stability.protocols import check_contract, check_model, differentiable_attention, is_looped
from stability.stored import Loaded


def run_stages(model, inputs: torch.Tensor, targets: Optional[torch.Tensor], options: AnalysisOptions, *,
               score: Optional[Callable] = None, split: str = "inputs", log=None) -> SplitResult:
    """Run ``options.stages``, in order, on one batch of inputs at its fixed point (:class:`AtFixedPoint`: x0 =
    embed(inputs), e = initial_state(x0) seeded by ``options.seed``). ``model`` is the analysis copy
    (:func:`~stability.analysis.fixed_point.analysis_model`); ``score(logits, targets) -> (correct,
    position_accuracy)`` defaults to :func:`~stability.analysis.accuracy.argmax_score`. Every model call runs under
    :func:`~stability.protocols.differentiable_attention` (SDPA's math backend, no nn.MultiheadAttention fast path),
    so that a model built on torch's attention can be differentiated by jvp and double backward."""
    with differentiable_attention():
        return _run_stages(model, inputs, targets, options, score=score, split=split, log=log)


def _run_stages(model, inputs: torch.Tensor, targets: Optional[torch.Tensor], options: AnalysisOptions, *,
                score: Optional[Callable], split: str, log) -> SplitResult:
    say = log or (lambda msg: None)
    param = next(iter(model.parameters()), None)
    dtype = param.dtype if param is not None else torch.float64
    dev = param.device if param is not None else torch.device(options.device)
    inputs = inputs.to(dev, dtype) if inputs.is_floating_point() else inputs.to(dev)
    if targets is not None:
        targets = targets.to(dev)
    with torch.no_grad():
        at = AtFixedPoint.of(model, inputs, generator=torch.Generator(device=dev).manual_seed(options.seed),
                             options=options, inputs=inputs, targets=targets, score=score, log=say, split=split)
    n, N = int(at.e[0].numel()), int(at.x0.shape[0])
    K = options.measured(n, N)  # the samples the per-sample stages measure (AtFixedPoint.few says the same)
    at.progress = progress = Progress(split, predicted(at, options), say)
    out = SplitResult(split=split, samples=N, state_shape=list(at.e.shape[1:]), stages=options.stages,
                        options=options, model=type(model).__name__)
    for name in options.stages:
        t = time.perf_counter()
        progress.begin(name)
        out.results[name] = stage(name).run(at)
        progress.end(name)
        out.timings[name] = time.perf_counter() - t
    few = [s for s in FEW_SAMPLE_STAGES if s in options.stages]
    if K < N and few:  # said in the JSON and the report: which stages measured the first K samples only, and why
        out.measured_samples = {"stages": few, "samples": K, "of": N, "n": n, "above": options.few_samples_above,
                                "why": f"n = {n:,} > {options.few_samples_above:,}: the stages whose cost is per "
                                       f"sample measure the first {K} (--few-samples 0: all)"}
    out.x0, out.x_star = at.x0, at.x_star
    return out


def product_seconds(f: Callable, e: torch.Tensor, x0: torch.Tensor, reps: int = 5) -> float:
    """Seconds of one J-product (a JVP of the loop map ``f``) of the batch ``e`` at ``e``, on its device:
    the fastest of ``reps`` after one warm-up (the device synchronised around each; the fastest: a busy machine's
    pauses only lengthen a product; no random numbers drawn). The
    map is called once plainly first: what a model caches on its first call must not be a forward-AD tensor."""
    f(e, x0)
    lin = Linearisation(f, e, x0)
    v = torch.ones_like(e)
    sync = torch.cuda.synchronize if e.device.type == "cuda" else (lambda: None)
    times = []
    for _ in range(reps + 1):
        sync()
        t = time.perf_counter()
        lin.J(v)
        sync()
        times.append(time.perf_counter() - t)
    return min(times[1:])


def predicted(at: AtFixedPoint, options: AnalysisOptions) -> dict:
    """The split's predicted seconds per stage (:func:`~stability.analysis.cost.predict`), rescaled to this
    device by its measured J-products (:func:`~stability.analysis.cost.scale`, :func:`product_seconds`): of the
    whole batch and of one sample. A stage that works a sample at a time is rescaled by one sample's product; one
    that steps the whole batch (the solves) by the batch's product plus one sample's, per sample: a step of the
    batch costs its product and a fixed part that does not shrink with the batch (about one sample's product;
    benchmarks/RESULTS.md, "Forecast of each stage after the refit")."""
    n, N = int(at.e[0].numel()), int(at.x0.shape[0])
    K = options.measured(n, N)
    with torch.no_grad():
        one = product_seconds(at.f, at.e[:1], at.x0[:1], reps=20)  # ~1 ms each: more of them, less noise
        batch = one if N == 1 else product_seconds(at.f, at.e, at.x0)
    return predict(n, N, options.stages, geometry_samples=options.geometry_count(n, N), few=K,
                   factor={"batch": scale(n, N, batch + one), "one": scale(n, 1, one)},
                   eig_batched=options.eig_chunk(K, at.e.device.type) > 1,
                   batched_path=options.batched_path(at.e.device.type))


def analyze_split(model, task, split: str, options: AnalysisOptions, *, log=None) -> SplitResult:
    """The stages on the first ``options.samples`` samples of a task's ``split``, in task order, scored by the
    task. ``model`` must be the analysis copy (:func:`~stability.analysis.fixed_point.analysis_model`)."""
    inputs, targets = task.dataset(split)
    N = min(options.samples, inputs.shape[0])
    if N < options.samples:
        # said, not clamped silently: the report then describes N samples, not the number asked for
        print(f"{split}: the split has {N} samples; analysing all {N} (asked for {options.samples})",
              file=sys.stderr)
    return run_stages(model, inputs[:N], targets[:N], options, score=task.score, split=split, log=log)


def analyze(source, inputs: Optional[torch.Tensor] = None, targets: Optional[torch.Tensor] = None,
            options: Optional[AnalysisOptions] = None, *, splits=None, log=None, release_config=None) -> Analysis:
    """The whole analysis (``stability.analyze``) of

    * a :class:`~stability.protocols.LoopedModel` on ``inputs`` (and ``targets`` for the accuracy, scored by
      argmax over the last axis of ``readout``): :func:`analyze_model`, one split named ``"inputs"``;
    * a :class:`~stability.stored.Loaded` (``stability.load``): :func:`analyze_loaded`;
    * a checkpoint's path: :func:`analyze_checkpoint`, what ``stability analyze CKPT`` runs.

    The last two analyse ``splits`` (default val and hard) of the checkpoint's task, scored by the task's own
    ``score``, with the run's A.8 noise std unless ``options`` give one. ``options``: what runs
    (:class:`~stability.analysis.options.AnalysisOptions`). Returns an :class:`Analysis`."""
    import os

    checkpoint = isinstance(source, (str, os.PathLike, Loaded))
    if checkpoint and (inputs is not None or targets is not None):
        raise StabilityError("inputs and targets go with a model; a checkpoint is analysed on its task's splits "
                             "(splits=...); for inputs of one's own, pass its .model")
    if not checkpoint and (splits is not None or release_config is not None):
        raise StabilityError("splits and release_config go with a checkpoint (a path or stability.load's result); "
                             "a model is analysed on its inputs")
    splits = ("val", "hard") if splits is None else splits
    if isinstance(source, Loaded):
        return analyze_loaded(source, splits=splits, options=AnalysisOptions() if options is None else options,
                              log=log)
    if checkpoint:
        return analyze_checkpoint(source, splits=splits, options=AnalysisOptions() if options is None else options,
                                  log=log, release_config=release_config)
    if inputs is None:
        raise StabilityError(f"analysing a {type(source).__name__} needs its inputs: stability.analyze(model, inputs)")
    return analyze_model(source, inputs, targets, options, log=log)


def analyze_model(model, inputs: torch.Tensor, targets: Optional[torch.Tensor] = None,
                  options: Optional[AnalysisOptions] = None, *, source: Optional[dict] = None, log=None) -> Analysis:
    """The whole analysis of any :class:`~stability.protocols.LoopedModel` on ``inputs`` (all of them, or the first
    ``options.samples`` when options are given); accuracy, per position and whole answer (argmax over the last
    axis of ``readout``), when ``targets`` are given. The model is checked against the contract first
    (:func:`~stability.protocols.check_model`) and analysed as a float64 copy. ``source``: what the JSON says was
    analysed (default ``{"model": its class name}``). One split, named ``"inputs"``."""
    if options is None:
        options = AnalysisOptions(samples=int(inputs.shape[0]) if isinstance(inputs, torch.Tensor) else 1)
    options = _on_device(options)
    check_contract(model)
    if not isinstance(model, torch.nn.Module):
        raise StabilityError(f"{type(model).__name__} must be a torch.nn.Module (the analysis runs on a float64 "
                             f"copy of its parameters)")
    check_finite_weights(model, type(model).__name__)
    m = analysis_model(model, torch.float64, options.device)
    check_model(m, inputs, targets)
    N = min(options.samples, int(inputs.shape[0]))
    split = run_stages(m, inputs[:N], None if targets is None else targets[:N], options, log=log)
    return Analysis(options=options, splits={split.split: split}, source=source or {"model": split.model})


#: elements per piece of :func:`_all_finite` (torch.isfinite of a whole tensor allocates a copy of it: a 65,536-token
#: embedding's 277 MB in float64)
_FINITE_PIECE = 1 << 20


def _all_finite(t: torch.Tensor) -> bool:
    """torch.isfinite(t).all(), a million elements at a time (its temporaries one piece, not the tensor)."""
    flat = t.detach().reshape(-1)
    return all(bool(torch.isfinite(piece).all()) for piece in flat.split(_FINITE_PIECE))


def check_finite_weights(model, what: str) -> None:
    """Refuse, in one line naming them, a model whose parameters or buffers hold NaN or ±inf, before any work.

    Refused rather than warned about: every iterate of such a map is NaN from the first step on, so each stage
    would spend its whole budget to report "diverged" everywhere, numbers that look like a finding about the model
    (no fixed point) and are only the arithmetic of NaN; the inputs of ``--inputs`` are refused the same way. The
    trainer never writes such a checkpoint (a diverged run keeps its last good one): it comes from elsewhere."""
    bad = [name for name, t in model.state_dict().items()
           if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) and not _all_finite(t)]
    if bad:
        names = ", ".join(bad[:4]) + (f" and {len(bad) - 4} more" if len(bad) > 4 else "")
        raise StabilityError(f"{what}: non-finite weights (NaN or inf) in {len(bad)} of "
                             f"{len(model.state_dict())} tensors: {names}; the loop map gives NaN from the first "
                             "iteration, so there is nothing to analyse (train again, or use an earlier checkpoint)")


def _on_device(options: AnalysisOptions) -> AnalysisOptions:
    """The options with ``device`` resolved (``auto`` → cpu or cuda; a CUDA device that is not here: one line),
    so that the JSON records where the analysis ran."""
    return options.replace(device=str(resolve_device(options.device)))


def analyze_loaded(loaded, *, splits=("val", "hard"), options: AnalysisOptions = AnalysisOptions(),
                   log=None) -> Analysis:
    """Each split of a checkpoint loaded by ``stability.load``, scored by its task, one after the other in this
    process (its model as it is now is the one analysed); the numbers of :func:`analyze_checkpoint` on the file it
    was loaded from."""
    return _checkpoint_splits(loaded, loaded.path, tuple(splits), _on_device(options), log, pool=False)


def analyze_checkpoint(path, *, splits=("val", "hard"), options: AnalysisOptions = AnalysisOptions(),
                       log=None, release_config=None) -> Analysis:
    """Load a checkpoint of this toolkit (or a release checkpoint, ``release_config``: its Hydra config) and
    analyse each split, scored by its task; on the CPU the splits run side by side, one process each that loads
    the file again (``options.workers``; the numbers do not depend on it: tests/analysis/test_parallel_splits.py)."""
    options = _on_device(options)
    loaded = load(path, device=options.device, release_config=release_config)
    return _checkpoint_splits(loaded, path, tuple(splits), options, log, pool=True, release_config=release_config)


def _checkpoint_splits(loaded, path, splits: tuple, options: AnalysisOptions, log, *, pool: bool,
                       release_config=None) -> Analysis:
    """``splits`` of a loaded checkpoint (``path``: where it was loaded from), with the A.8 noise std of the run
    unless ``options`` give one; side by side in processes of :mod:`~stability.analysis.pool` when ``pool``."""
    if not is_looped(loaded.model):
        raise StabilityError(f"{path}: a fixed-depth baseline has no loop map, so it has no fixed points to analyse")
    check_finite_weights(loaded.model, str(path))
    if options.noise_std is None:
        options = options.replace(noise_std=float(getattr(loaded.config.model, "noise_std", 1.0)))
    model = analysis_model(loaded.model, torch.float64, options.device)
    out = Analysis(options=options, splits={}, checkpoint=str(path), config=loaded.config.to_dict(),
                   epoch=loaded.epoch)
    threads = torch.get_num_threads()
    workers = min(len(splits), options.workers or threads) if pool and options.device == "cpu" else 1
    _forecast(model, loaded.task, splits, options, workers, log)
    if workers <= 1:
        for split in splits:
            out.splits[split] = analyze_split(model, loaded.task, split, options, log=log)
        return out
    out.splits = parallel_splits(analyze_split, path, release_config, model, loaded.task, splits, options, workers,
                                 max(1, threads // workers), log)
    return out


def _forecast(model, task, splits: tuple, options: AnalysisOptions, workers: int, log) -> None:
    """One line on ``log``: how long the analysis of ``splits`` should take
    (:func:`~stability.analysis.cost.forecast`)."""
    if log is None:
        return
    threads = torch.get_num_threads()
    inputs, _ = task.dataset(splits[0])
    with torch.no_grad():
        x0 = model.embed(inputs[:1].to(options.device, torch.float64) if inputs.is_floating_point()
                         else inputs[:1].to(options.device))
        shape = tuple(model.initial_state(x0).shape[1:])
    n = int(torch.Size(shape).numel())
    line = forecast(n, shape, options.samples, len(splits), options.stages,
                    workers=max(1, workers), threads=max(1, threads // max(1, workers)),
                    geometry_samples=options.geometry_count(n, options.samples), device=options.device,
                    few=options.measured(n, options.samples))
    if line:
        log(line)
