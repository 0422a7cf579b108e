"""The trainer: progressive loss (Bansal et al. 2022; App. B.1.2), AdamW, the release's LR schedule,
evaluation of accuracy against iteration count, and resumable, atomic checkpoints.

Deterministic on the CPU: the model is initialised from ``torch.manual_seed(seed)``; data order and the
progressive loss's (n, k) draws come from one ``torch.Generator`` whose state is checkpointed every epoch, so a
killed run resumed with ``resume=True`` ends with bitwise the same weights as an uninterrupted one.

A finished (or killed) run can be *extended*: resume it with a larger ``epochs`` and nothing else changed. The
epochs already trained stay as they were; every later epoch takes the learning rate of the new, longer schedule
(:func:`lr_factor` with the new total: the cooldown point ⌊cooldown_at · epochs⌋ is recomputed from it), and
the data order and the progressive loss's draws continue from the checkpointed generator, exactly as an
uninterrupted run of the new length would draw them. So the extended run is bitwise equal to one trained to the
new length in one go exactly when the two schedules agree on the epochs already trained (no cooldown had begun:
``cooldown_at = 1``) and no evaluation drew random numbers (initial state ``x0`` or ``zeros``). Otherwise the
first epochs keep the old run's learning rates (a run that had entered its cooldown goes back up to the peak
until the new cooldown point) and only the epochs from the old end on follow the new schedule. The final
evaluation is redone at the new end (docs/training.md); the old last epoch's record has no
periodic evaluation (``eval_every``), since that epoch had the final one instead.

Besides the JSONL metrics (``run.metrics.jsonl``), every checkpoint gets ``run.metrics.csv`` (one row per epoch,
nested values flattened to ``eval.val.accuracy_last`` etc.) and, after the final evaluation, ``run.accuracy.csv``
(accuracy against iteration, one column per split); ``tensorboard=DIR`` also logs the same scalars to TensorBoard.

This module is the orchestration: the run's state (:class:`_Run`), its start or resume, an epoch, the run, and what
it announces. Its parts: :mod:`~stability.train.schedule` (the learning rate, the progressive loss's draws),
:mod:`~stability.train.step` (the optimizer, the losses, one batch of a method), :mod:`~stability.train.evaluation`
(accuracy against iteration) and :mod:`~stability.train.files` (the metrics files, the random state, the lock).
Their names used before the split are importable from here as well.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from stability import __version__, hardware
from stability import checkpoint as ckpt
from stability.atomic import check_writable
from stability.config import RunConfig, TrainConfig, changes, resolve_device, to_dict
from stability.errors import CheckpointError, ConfigError, Terminated
from stability.model import build_model
from stability.protocols import is_looped
from stability.tasks import Task, make_task
from stability.train.evaluation import estimate_eval_seconds, evaluate, progress_bar, summary
from stability.train.files import (TensorBoard, accuracy_csv_path, csv_path, flatten, lock_path, metrics_path,
                                   rng_state, run_lock, set_rng_state, write_metrics)
from stability.train.forecast import Forecast, duration
from stability.train.monitor import StabilityMonitor
from stability.train.schedule import cooldown_epoch, draw_depths, lr_factor, schedule_peak, schedule_warning
from stability.train.step import (METHODS, BatchContext, CompiledModel, decay_exempt, diverged, make_optimizer,
                                  progressive_batch, progressive_loss, time_batch, train_batch, training_loss)

__all__ = [  # the names of this module before its parts were split out, still importable from here
    "EXIT_DIVERGED", "METHODS", "BatchContext", "CompiledModel", "EpochCallback", "TrainResult", "accuracy_csv_path",
    "check_resumable", "cooldown_epoch", "csv_path", "decay_exempt", "draw_depths", "estimate_eval_seconds",
    "evaluate", "flatten", "forecast_run", "lock_path", "lr_factor", "make_optimizer", "metrics_path",
    "progressive_batch", "progressive_loss", "run_lock", "schedule_peak", "schedule_warning", "sigterm_unwinds",
    "time_batch", "train", "train_batch", "training_loss"]

#: the private names ensemble training reads (stability/train/ensemble.py), under their names of before the split
_bar, _summary, _diverged, _write_metrics, _rng_state, _set_rng_state = (
    progress_bar, summary, diverged, write_metrics, rng_state, set_rng_state)

EpochCallback = Callable[[torch.nn.Module, Task, dict], None]


@dataclass
class TrainResult:
    path: Path
    epochs: int
    history: list
    final: Optional[dict]


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)



#: the exit status of ``stability train`` when the run diverged (a non-finite loss or gradient): a result of the
#: run, not a usage error (2) — the last good checkpoint is kept
EXIT_DIVERGED = 3


def train(config: RunConfig, out: Path | str, *, resume: bool = False, progress: bool = True,
          callbacks: tuple[EpochCallback, ...] = (), tensorboard: Path | str | None = None) -> TrainResult:
    """Train ``config`` and write the checkpoint ``out`` after every epoch (atomically).

    ``resume=True`` continues from ``out`` if it exists; its config must equal ``config``, except that
    ``config.train.epochs`` may be larger (the run is extended: see the module docstring for what then holds).
    A non-finite loss or gradient raises DivergenceError and leaves the last good checkpoint in place.
    ``callbacks`` are called after each epoch with (model, task, record) and may add entries to the epoch's
    record. ``progress`` shows bars on stderr (batches of the run, each evaluation's batches × iterations).
    ``tensorboard``: a directory to log the per-epoch scalars to (needs the ``tensorboard`` package).
    The output locations are checked before anything is built: a mistake costs nothing. The run holds
    :func:`run_lock` on ``out`` throughout: a second run on the same ``out`` is refused while the first is alive.
    """
    out = Path(out)
    for path in (out, metrics_path(out), csv_path(out), accuracy_csv_path(out)):
        check_writable(path, "file", "checkpoint" if path == out else "metrics file")
    if tensorboard is not None:
        check_writable(tensorboard, "dir", "--tensorboard")
    with sigterm_unwinds(), run_lock(out):
        return _train(config, out, resume=resume, progress=progress, callbacks=callbacks, tensorboard=tensorboard)



@contextmanager
def sigterm_unwinds():
    """While training, SIGTERM (``kill``, a scheduler's stop, the sweep stopping its workers) ends the run as
    Ctrl-C does: it raises :class:`~stability.errors.Terminated` (a ``KeyboardInterrupt``) where the run is, so the
    lock file is removed, an atomic write in progress leaves no temporary file, and the checkpoint of the last
    finished epoch stays for ``--resume`` (the checkpoint is written after every epoch; nothing else is kept,
    as on SIGINT). The previous handler is back afterwards; outside the main thread (where Python cannot set
    handlers) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum, frame):
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@dataclass
class _Run:
    """One training run's state between epochs: what :func:`_train` checkpoints after each."""

    config: RunConfig
    out: Path
    device: torch.device
    use_bf16: bool
    task: Task
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    gen: torch.Generator
    history: list = field(default_factory=list)
    final: Optional[dict] = None
    start_epoch: int = 0
    step: int = 0
    signature: Optional[dict] = None  # what computed these weights (stability.hardware)
    ensemble: Optional[dict] = None  # a member of an ensemble run (stability.train.ensemble): its note

    def save(self, epoch: int) -> None:
        """The checkpoint after ``epoch`` epochs, and the metrics files."""
        cfg = self.config.train
        ckpt.atomic_save({
            "format": ckpt.FORMAT,
            "schema_version": ckpt.SCHEMA_VERSION,
            "package_version": __version__,
            "torch_version": str(torch.__version__),
            "hardware": self.signature,
            "config": to_dict(self.config),
            "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "schedule": {"base_lr": cfg.lr, "epoch": epoch, "lr": cfg.lr * lr_factor(min(epoch, cfg.epochs - 1), cfg)},
            "rng": rng_state(self.gen),
            "epoch": epoch,
            "step": self.step,
            "history": self.history,
            "final": self.final,
            **({"ensemble": self.ensemble} if self.ensemble is not None else {}),
        }, self.out)
        write_metrics(metrics_path(self.out), self.history, self.final)


def _start(config: RunConfig, out: Path, *, resume: bool, progress: bool) -> _Run:
    """The run's model, optimizer and generator, seeded, or as the checkpoint ``out`` left them (``resume``)."""
    if out.exists() and not resume:
        raise CheckpointError(f"{out} exists; pass --resume to continue it or choose another --out")
    cfg = config.train
    device = resolve_device(cfg.device)
    if hardware.pinned() and (device.type != "cpu" or cfg.compile):
        raise ConfigError("--reproducible pins the CPU's kernels only: it covers neither CUDA nor --compile "
                          "(which generates code for this CPU); use --device cpu without --compile")
    task = make_task(config.task)
    model_cfg = config.model.replace(**task.model_options())
    if model_cfg != config.model:
        config = config.replace(model=model_cfg)

    torch.manual_seed(cfg.seed)
    model = build_model(config.model).to(device)
    optimizer = make_optimizer(model, cfg)
    run = _Run(config=config, out=out, device=device, use_bf16=cfg.bf16 and device.type == "cuda", task=task,
               model=model, optimizer=optimizer, gen=torch.Generator().manual_seed(cfg.seed))
    if resume and out.exists():
        obj = ckpt.read(out)
        stored = ckpt.run_config(obj, out)
        done = int(obj["epoch"])
        check_resumable(stored, config, done, out)
        model.load_state_dict(obj["model"])
        optimizer.load_state_dict(obj["optimizer"])
        set_rng_state(obj["rng"], run.gen)
        run.start_epoch, run.step = done, int(obj["step"])
        run.history, run.final = list(obj["history"]), obj.get("final")
        if cfg.epochs != stored.train.epochs:
            run.final = None  # evaluated again at the new end
            _say(progress, f"extending {out} from {stored.train.epochs} to {cfg.epochs} epochs: epochs "
                           f"{done + 1}..{cfg.epochs} follow the {cfg.epochs}-epoch schedule (cooldown from epoch "
                           f"{cooldown_epoch(cfg) + 1})")
        else:
            _say(progress, f"resuming {out} at epoch {run.start_epoch}/{cfg.epochs}")
    return run


def _epoch(run: _Run, epoch: int, inputs, targets, step_model, bar, progress: bool) -> dict:
    """One epoch of training on ``inputs`` (its batches through ``step_model``) and its record: loss, lr, speed,
    the methods' statistics and the evaluations the config asks for."""
    cfg, model, device, use_bf16, task = run.config.train, run.model, run.device, run.use_bf16, run.task
    N = inputs.shape[0]
    lr = cfg.lr * lr_factor(epoch, cfg)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    model.train()
    t0 = time.perf_counter()
    perm = torch.randperm(N, generator=run.gen).to(device)
    total, count = 0.0, 0
    epoch_stats: dict = {}
    for i in range(0, N, cfg.batch_size):
        idx = perm[i:i + cfg.batch_size]
        ctx = BatchContext(model=step_model, params=model, task=task, cfg=cfg, gen=run.gen, optimizer=run.optimizer,
                           autocast=lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                                                           enabled=use_bf16),
                           where=lambda what, _e=epoch, _s=run.step: diverged(what, _e, _s, run.out),
                           stats=epoch_stats)
        loss_value, steps = train_batch(ctx, inputs[idx], targets[idx])
        run.step += steps
        total += loss_value * idx.numel()
        count += idx.numel()
        bar.update(1)
        bar.set_postfix_str(f"epoch {epoch + 1}/{cfg.epochs}, loss {total / count:.4f}, lr {lr:.2e}", refresh=False)
    seconds = time.perf_counter() - t0
    record = {"epoch": epoch + 1, "step": run.step, "loss": total / count, "lr": lr, "seconds": seconds,
              "samples_per_s": count / seconds}
    record.update({name: acc.summary() for name, acc in epoch_stats.items()})
    if cfg.train_accuracy_samples:  # the fit at the training depth, on inputs the model was trained on
        fit = evaluate(model, task, "train", cfg.iterations, limit=cfg.train_accuracy_samples,
                       batch_size=cfg.eval_batch_size, device=device, bf16=use_bf16)
        record["train_accuracy"] = fit["accuracy"][-1]
    if cfg.eval_every and (epoch + 1) % cfg.eval_every == 0 and epoch + 1 < cfg.epochs:
        record["eval"] = {s: summary(evaluate(model, task, s, cfg.eval_iterations,
                                               batch_size=cfg.eval_batch_size, device=device, bf16=use_bf16,
                                               progress=progress and f"epoch {epoch + 1} eval"))
                          for s in ("val", "hard")}
    return record


def _train(config: RunConfig, out: Path, *, resume: bool, progress: bool, callbacks: tuple[EpochCallback, ...],
           tensorboard: Path | str | None) -> TrainResult:
    run = _start(config, out, resume=resume, progress=progress)
    cfg, model, task, device = run.config.train, run.model, run.task, run.device
    inputs, targets = task.dataset("train")
    inputs, targets = inputs.to(device), targets.to(device)
    N = inputs.shape[0]
    model.attention_impl = "sdpa"
    step_model = model
    if cfg.compile:
        step_model = CompiledModel(model)
    board = TensorBoard(Path(tensorboard)) if tensorboard is not None else None
    run.signature = hardware.signature()  # what computed these weights (stability.hardware)
    if cfg.monitor_every and is_looped(model):
        callbacks = (*callbacks, StabilityMonitor(task, every=cfg.monitor_every, samples=cfg.monitor_samples,
                                                  device=device))

    if progress and (run.start_epoch < cfg.epochs or run.final is None):
        _announce_run(BatchContext(model=step_model, params=model, task=task, cfg=cfg, gen=run.gen,
                                   optimizer=run.optimizer,
                                   autocast=lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                                                                   enabled=run.use_bf16),
                                   where=lambda what: diverged(what, run.start_epoch, run.step, out)),
                      inputs, targets, start_epoch=run.start_epoch, final=run.final is None, device=device,
                      bf16=run.use_bf16)
    per_epoch = -(-N // cfg.batch_size)
    bar = progress_bar(progress, cfg.epochs * per_epoch, "train", "batch", initial=run.start_epoch * per_epoch,
                       leave=True)
    try:
        for epoch in range(run.start_epoch, cfg.epochs):
            record = _epoch(run, epoch, inputs, targets, step_model, bar, progress)
            for cb in callbacks:
                cb(model, task, record)
            run.history.append(record)
            run.save(epoch + 1)
            if board is not None:
                board.epoch(record)
        bar.close()

        if run.final is None:
            _announce_final_evaluation(model, task, cfg, device, run.use_bf16)
            run.final = {s: evaluate(model, task, s, cfg.test_iterations, batch_size=cfg.eval_batch_size,
                                     device=device, bf16=run.use_bf16, progress=progress and "final eval")
                         for s in ("val", "hard")}
            run.save(cfg.epochs)
            if board is not None:
                board.final(run.final)
    finally:
        bar.close()
        if board is not None:
            board.close()
    return TrainResult(path=out, epochs=cfg.epochs, history=run.history, final=run.final)


def _announce_run(ctx: BatchContext, inputs, targets, **kw) -> None:
    """Before the first batch: the run's forecast, training and final evaluation (:mod:`stability.train.forecast`),
    and how to shrink it when long on a CPU."""
    f = forecast_run(ctx, inputs, targets, **kw)
    print(f.line(), file=sys.stderr, flush=True)
    hint = f.hint()
    if hint:
        print(hint, file=sys.stderr, flush=True)


def forecast_run(ctx, inputs: torch.Tensor, targets: torch.Tensor, *, start_epoch: int, final: bool,
                 device: torch.device, bf16: bool) -> Forecast:
    """The run's :class:`~stability.train.forecast.Forecast` from epoch ``start_epoch`` on (``final``: the final
    evaluation is still to run), measured under a forked random state: the run draws the same numbers as without
    it."""
    cfg, task, splits = ctx.cfg, ctx.task, ("val", "hard")
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # the run's streams untouched
        return Forecast.of(cfg, train_samples=int(inputs.shape[0]), start_epoch=start_epoch, final=final,
                           batch_s=time_batch(ctx, inputs, targets) if start_epoch < cfg.epochs else 0.0,
                           eval_sizes={s: int(task.dataset(s)[0].shape[0]) for s in splits},
                           eval_step_s={s: estimate_eval_seconds(ctx.params, task, s, 1, device=device, bf16=bf16,
                                                                 batch_size=cfg.eval_batch_size) for s in splits},
                           device=device.type)


#: a final evaluation expected to take longer than this is announced with its estimate
LONG_EVALUATION_S = 30.0


def _announce_final_evaluation(model, task: Task, cfg: TrainConfig, device: torch.device, bf16: bool) -> None:
    """Say up front, with an estimate and how to shorten it, when the final evaluation will take long."""
    seconds = {s: estimate_eval_seconds(model, task, s, cfg.test_iterations, batch_size=cfg.eval_batch_size,
                                        device=device, bf16=bf16) for s in ("val", "hard")}
    total = sum(seconds.values())
    if total < LONG_EVALUATION_S:
        return
    sizes = " + ".join(f"{task.dataset(s)[0].shape[0]} {s}" for s in ("val", "hard"))
    print(f"final evaluation: {sizes} samples × {cfg.test_iterations} iterations, about {duration(total)} on "
          f"{device.type} (val {duration(seconds['val'])}, hard {duration(seconds['hard'])}); to shorten it, "
          "lower --test-iterations or the split sizes (--val-size, --hard-size; prefix sums: --hard-length), "
          "e.g. --test-iterations 100 --hard-size 1000", file=sys.stderr, flush=True)


def check_resumable(stored: RunConfig, config: RunConfig, done: int, out: Path | str) -> None:
    """Refuse (one line) to resume a checkpoint of config ``stored``, trained ``done`` epochs, as ``config``:
    everything must be equal except ``train.epochs``, which may grow (extension) but not drop below ``done``."""
    extended = stored.replace(train=stored.train.replace(epochs=config.train.epochs))
    if extended != config:
        diff = "; ".join(f"{k}: checkpoint {a!r}, now {b!r}" for k, a, b in changes(extended, config))
        raise ConfigError(f"--resume: {out} was trained with a different config ({diff}); only --epochs "
                          "may change (to extend the run)")
    if config.train.epochs < done:
        raise ConfigError(f"--resume --epochs {config.train.epochs}: {out} has already trained {done} epochs; "
                          f"give at least {done}")
