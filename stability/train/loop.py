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
"""

from __future__ import annotations

import copy
import csv
import io
import math
import os
import sys
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from stability import __version__, hardware
from stability.analysis.accuracy import accuracy_curve
from stability.analysis.fixed_point import FixedPoint
from stability.atomic import check_writable, json_text, write_text
from stability.config import RunConfig, TrainConfig, changes, resolve_device, to_dict
from stability.errors import CheckpointError, ConfigError, DivergenceError
from stability.model import build_model
from stability.protocols import is_looped
from stability.tasks import Task, make_task
from stability import checkpoint as ckpt
from stability.train.deep_supervision import deep_supervision_batch
from stability.train.forecast import TIMED_SAMPLES, Forecast, duration, expected_depth
from stability.train.implicit import implicit_batch

EpochCallback = Callable[[torch.nn.Module, Task, dict], None]


# ---- schedule, optimiser ------------------------------------------------------------------------
def lr_factor(epoch: int, cfg: TrainConfig) -> float:
    """LR multiplier for 0-based ``epoch``: warm-up 1 − exp(−(e+1)/10) for e < warmup_epochs, then 1;
    ×cooldown_factor from epoch ⌊cooldown_at · epochs⌋ on (epoch 60 of 100 in the paper)."""
    f = 1.0 - math.exp(-(epoch + 1) / 10.0) if epoch < cfg.warmup_epochs else 1.0
    if epoch >= cooldown_epoch(cfg):
        f *= cfg.cooldown_factor
    return f


def cooldown_epoch(cfg: TrainConfig) -> int:
    """The first (0-based) epoch of the cooldown: ⌊cooldown_at · epochs⌋."""
    return int(cfg.cooldown_at * cfg.epochs)


def schedule_peak(cfg: TrainConfig) -> tuple[float, int]:
    """(largest LR factor over the run, the 0-based epoch where it is first reached), in O(log epochs) time and
    constant memory: the factor never decreases within the epochs before the cooldown, nor within those from it
    on, so each part peaks at its last epoch, first reached where a bisection finds it."""
    best = (-1.0, 0)
    cut = min(cooldown_epoch(cfg), cfg.epochs)
    for start, stop in ((0, cut), (cut, cfg.epochs)):
        if start >= stop:
            continue
        peak = lr_factor(stop - 1, cfg)
        lo, hi = start, stop - 1  # the first epoch of [start, stop) whose factor is the part's peak
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if lr_factor(mid, cfg) >= peak else (mid + 1, hi)
        if peak > best[0]:
            best = (peak, lo)
    return best


def schedule_warning(cfg: TrainConfig) -> Optional[str]:
    """A one-line warning when the schedule never reaches the requested learning rate, else None.

    With the paper's 9-epoch warm-up and cooldown at 60 %, a short run cools down before its warm-up is over:
    ``--lr 3e-3 --epochs 6`` peaks at 7.8e-4 (in epoch 3)."""
    peak, at = schedule_peak(cfg)
    if peak >= 1.0 - 1e-12:
        return None
    why = f"the warm-up lasts {cfg.warmup_epochs} of the {cfg.epochs} epochs"
    if cooldown_epoch(cfg) < min(cfg.warmup_epochs, cfg.epochs):
        why += f" and the cooldown (×{cfg.cooldown_factor:g}) starts at epoch {cooldown_epoch(cfg) + 1} of {cfg.epochs}"
    return (f"the learning rate {cfg.lr:g} is never reached: {why}, so it peaks at {cfg.lr * peak:.2g} in epoch "
            f"{at + 1}; lower --warmup-epochs, raise --cooldown-at or train more --epochs")


def decay_exempt(model: torch.nn.Module, rule: str) -> set:
    """Names of the parameters that escape weight decay (TrainConfig.decay_exempt; docs/release-differences.md).

    norms: every bias and norm gain (tensors of fewer than 2 dimensions). release: the same except the output
    head's RMSNorm gain, which the release decays (its name-based rule does not catch ``head.0.weight``)."""
    exempt = {n for n, p in model.named_parameters() if p.ndim < 2}
    head_norm = getattr(getattr(model, "head", None), "norm", None)
    if rule == "release" and isinstance(head_norm, torch.nn.Module):
        exempt -= {f"head.norm.{n}" for n, _ in head_norm.named_parameters()}
    return exempt


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW (App. B.1.2): weight decay on all parameters but those ``decay_exempt`` names (cfg.decay_exempt).
    torch's fused kernel (plain IEEE arithmetic, the same bits on any CPU when pinned), or with the ``mkl-vml``
    kernel set its foreach one (stability/hardware.py, "Kernel sets")."""
    exempt = decay_exempt(model, cfg.decay_exempt)
    decay = [p for n, p in model.named_parameters() if n not in exempt]
    no_decay = [p for n, p in model.named_parameters() if n in exempt]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = hardware.kernels() == "ieee"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.adam_eps, fused=fused or None)


# ---- losses -------------------------------------------------------------------------------------
def progressive_loss(model, task: Task, inputs: torch.Tensor, targets: torch.Tensor, n: int, k: int,
                     alpha: float, iterations: int) -> torch.Tensor:
    """Progressive loss: n iterations without gradient from e, detach, k iterations with gradient
    (x0 recomputed with gradient); loss = (1 − α)·CE(output after T) + α·CE(output after n + k).

    With n = 0 the k iterations start from e itself, so gradient also reaches e (= x0 by default)."""
    x0 = model.embed(inputs)
    x = model.initial_state(x0)
    if n > 0:
        with torch.no_grad():
            for _ in range(n):
                x = model.step(x, x0)
        x = x.detach()
    for _ in range(k):
        x = model.step(x, x0)
    loss = task.loss(model.readout(x), targets)
    if alpha < 1.0:
        xT = model.initial_state(x0)
        for _ in range(iterations):
            xT = model.step(xT, x0)
        loss = (1.0 - alpha) * task.loss(model.readout(xT), targets) + alpha * loss
    return loss


def training_loss(model, task: Task, inputs, targets, cfg: TrainConfig, gen: torch.Generator) -> torch.Tensor:
    """The progressive loss of one batch with (n, k) drawn from ``gen``; the fixed-depth baseline is trained
    on its one output."""
    if not is_looped(model):
        return task.loss(model(inputs, 1)[0], targets)
    T = cfg.iterations
    n = int(torch.randint(0, T, (1,), generator=gen))
    k = int(torch.randint(1, T - n + 1, (1,), generator=gen))
    return progressive_loss(model, task, inputs, targets, n, k, cfg.method.alpha, T)


@dataclass
class BatchContext:
    """What a training method needs for one batch. ``model`` may be a compiled wrapper of ``params``."""

    model: object
    params: torch.nn.Module
    task: Task
    cfg: TrainConfig
    gen: torch.Generator
    optimizer: torch.optim.Optimizer
    autocast: Callable
    where: Callable[[str], str]
    stats: dict = field(default_factory=dict)  # per-epoch statistics a method keeps (name -> obj with summary())

    def optimize(self, loss: torch.Tensor) -> None:
        """One optimizer step on ``loss``: non-finite checks, gradient clipping, AdamW."""
        if not torch.isfinite(loss):
            raise DivergenceError(self.where("loss"))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params.parameters(), self.cfg.grad_clip)
        if not torch.isfinite(norm):
            raise DivergenceError(self.where("gradient"))
        self.optimizer.step()


def progressive_batch(ctx: BatchContext, inputs, targets) -> tuple[float, int]:
    """One optimizer step on the progressive loss; returns (loss, optimizer steps taken)."""
    with ctx.autocast():
        loss = training_loss(ctx.model, ctx.task, inputs, targets, ctx.cfg, ctx.gen)
    ctx.optimize(loss)
    return loss.item(), 1


#: training method -> batch function (ctx, inputs, targets) -> (mean loss, optimizer steps)
METHODS: dict[str, Callable] = {"progressive": progressive_batch, "deep-supervision": deep_supervision_batch,
                                "implicit": implicit_batch}


def train_batch(ctx: BatchContext, inputs, targets) -> tuple[float, int]:
    return METHODS[ctx.cfg.method.name](ctx, inputs, targets)


# ---- evaluation ---------------------------------------------------------------------------------
def _bar(progress, total: int, desc: str, unit: str, **kw):
    """A tqdm bar on stderr, disabled when ``progress`` is falsy."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not progress, file=sys.stderr, dynamic_ncols=True,
                leave=kw.pop("leave", False), **kw)


@torch.no_grad()
def estimate_eval_seconds(model, task: Task, split: str, iterations: int, *, batch_size: int = 1000,
                          device: torch.device | str = "cpu", bf16: bool = False) -> float:
    """Seconds :func:`evaluate` will take, extrapolated from timing two loop steps on one (smaller) batch."""
    device = torch.device(device)
    inputs, _ = task.dataset(split)
    N = inputs.shape[0]
    b = min(batch_size, N, 256)
    xb = inputs[:b].to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
            if not is_looped(model):
                t0 = time.perf_counter()
                model(xb, 1)
                return (time.perf_counter() - t0) * N / b
            x0 = model.embed(xb)
            x = model.step(model.initial_state(x0), x0)  # warm-up
            t0 = time.perf_counter()
            for _ in range(2):
                x = model.step(x, x0)
                model.readout(x)
            per_step = (time.perf_counter() - t0) / 2
    finally:
        model.train(was_training)
    return per_step * iterations * N / b



@torch.no_grad()
def evaluate(model, task: Task, split: str, iterations: int, *, batch_size: int = 1000,
             device: torch.device | str = "cpu", bf16: bool = False, limit: Optional[int] = None,
             progress: bool | str = False) -> dict:
    """Whole-answer and per-position accuracy after every iteration 1..``iterations`` on ``split``.

    Returns {split, n, iterations: [1..T], accuracy: [...], position_accuracy: [...]}. The states are never
    stored, so T = 500 on 512-bit inputs costs memory for one batch only. ``progress`` (True or a label) shows a
    bar over batches × iterations on stderr."""
    device = torch.device(device)
    inputs, targets = task.dataset(split)
    if limit is not None:
        inputs, targets = inputs[:limit], targets[:limit]
    N = inputs.shape[0]
    correct = torch.zeros(iterations, dtype=torch.float64)
    positions = torch.zeros(iterations, dtype=torch.float64)
    was_training, impl = model.training, model.attention_impl
    model.eval()
    model.attention_impl = "math" if getattr(task, "attention_window", None) else "sdpa"
    batches = -(-N // batch_size)
    steps = batches * (1 if not is_looped(model) else iterations)
    bar = _bar(progress, steps, f"{progress if isinstance(progress, str) else 'eval'} {split}", "it")

    def autocast():
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16)

    def looped_batches():  # x0 and e made per batch, under the same autocast as the iteration
        for i in range(0, N, batch_size):
            xb, yb = inputs[i:i + batch_size].to(device), targets[i:i + batch_size].to(device)
            with torch.no_grad(), autocast():
                fp = FixedPoint.of(model, xb)  # x0 and e as the analysis builds them (e as training draws it)
            yield fp.x0, fp.e, yb

    try:
        if is_looped(model):  # the analysis' own accuracy-vs-iteration routine
            curve = accuracy_curve(model, task, looped_batches(), iterations, context=autocast,
                                   on_step=lambda: bar.update(1))
            accuracy, position_accuracy = curve.accuracy, curve.position_accuracy
        else:
            for i in range(0, N, batch_size):
                xb, yb = inputs[i:i + batch_size].to(device), targets[i:i + batch_size].to(device)
                with autocast():
                    c, p = task.score(model(xb, 1)[0].float(), yb)
                correct += c.sum().item()
                positions += p.sum().item()
                bar.update(1)
            accuracy, position_accuracy = (correct / N).tolist(), (positions / N).tolist()
    finally:
        bar.close()
        model.attention_impl = impl
        model.train(was_training)
    return {
        "split": split,
        "n": N,
        "iterations": list(range(1, iterations + 1)),
        "accuracy": accuracy,
        "position_accuracy": position_accuracy,
    }


# ---- the run ------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    path: Path
    epochs: int
    history: list
    final: Optional[dict]


def metrics_path(path: Path) -> Path:
    """The JSONL metrics file beside a checkpoint: run.pt -> run.metrics.jsonl."""
    return path.with_name(path.stem + ".metrics.jsonl")


def csv_path(path: Path) -> Path:
    """The per-epoch CSV beside a checkpoint: run.pt -> run.metrics.csv."""
    return path.with_name(path.stem + ".metrics.csv")


def accuracy_csv_path(path: Path) -> Path:
    """The final accuracy-against-iteration CSV beside a checkpoint: run.pt -> run.accuracy.csv."""
    return path.with_name(path.stem + ".accuracy.csv")


def flatten(record: dict, prefix: str = "") -> dict:
    """Scalars of a nested record as {"eval.val.accuracy_last": ...}; lists (accuracy curves) are left out."""
    out = {}
    for k, v in record.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (bool, int, float)) or v is None:
            out[key] = v
    return out


def _csv_text(rows: list[dict]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    return buf.getvalue()


def _accuracy_rows(final: dict) -> list[dict]:
    splits = [s for s in ("val", "hard") if s in final]
    T = max(len(final[s]["accuracy"]) for s in splits)
    rows = []
    for t in range(T):
        row = {"iteration": t + 1}
        for s in splits:
            acc, pos = final[s]["accuracy"], final[s]["position_accuracy"]
            row[f"{s}_accuracy"] = acc[t] if t < len(acc) else None
            row[f"{s}_position_accuracy"] = pos[t] if t < len(pos) else None
        rows.append(row)
    return rows


def _write_metrics(path: Path, history: list, final: Optional[dict]) -> None:
    """JSONL (one record per epoch, then the final evaluation) and the same per-epoch scalars as CSV."""
    lines = [json_text(rec) for rec in history] + ([json_text({"final": final})] if final is not None else [])
    write_text(path, "".join(line + "\n" for line in lines))
    ckpt_path = path.with_name(path.name[: -len(".metrics.jsonl")] + ".pt")
    write_text(csv_path(ckpt_path), _csv_text([flatten(rec) for rec in history]))
    if final is not None:
        write_text(accuracy_csv_path(ckpt_path), _csv_text(_accuracy_rows(final)))


class _TensorBoard:
    """Per-epoch scalars (and the final accuracy curves) to TensorBoard; needs the ``tensorboard`` package."""

    def __init__(self, logdir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("--tensorboard: the tensorboard package is not installed "
                              "(pip install tensorboard), or leave --tensorboard out") from None
        self.writer = SummaryWriter(log_dir=str(logdir))

    def epoch(self, record: dict) -> None:
        for key, value in flatten(record).items():
            if key not in ("epoch", "step") and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key.replace(".", "/"), value, global_step=record["epoch"])
        self.writer.flush()

    def final(self, final: dict) -> None:
        for row in _accuracy_rows(final):
            for key, value in row.items():
                if key != "iteration" and value is not None:
                    self.writer.add_scalar(f"final/{key}", value, global_step=row["iteration"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _rng_state(gen: torch.Generator) -> dict:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "data": gen.get_state(),
    }


def _set_rng_state(state: dict, gen: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    gen.set_state(state["data"])


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


#: the exit status of ``stability train`` when the run diverged (a non-finite loss or gradient): a result of the
#: run, not a usage error (2) — the last good checkpoint is kept
EXIT_DIVERGED = 3


def lock_path(out: Path | str) -> Path:
    """The lock file a run holds while it writes ``out``: run.pt -> .run.pt.lock beside it."""
    out = Path(out)
    return out.with_name(f".{out.name}.lock")


def _lock_holder(fh) -> str:
    """The pid written in a lock file another process holds (it writes it just after locking)."""
    for _ in range(20):
        fh.seek(0)
        text = fh.read().strip()
        if text.isdigit():
            return text
        time.sleep(0.05)
    return "unknown"


@contextmanager
def run_lock(out: Path | str):
    """Hold an exclusive lock on the run writing ``out`` (``fcntl.flock`` on :func:`lock_path`, as the sweep locks
    its cells), with this process's pid in the lock file; a second run on the same ``out`` is refused with one line
    naming the first's pid. The lock file is removed when the run ends (a run killed with SIGKILL leaves it, and
    the kernel has released its lock: the next run takes it over)."""
    import fcntl

    from stability.atomic import _make_parents, _remove_empty

    path = lock_path(out)
    created = _make_parents(path.parent)
    try:
        while True:
            fh = open(path, "a+")
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _lock_holder(fh)
                fh.close()
                raise CheckpointError(f"--out {out}: another training run (pid {pid}) is writing it; wait for it "
                                      "to end, or choose another --out") from None
            try:
                same = os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            fh.close()  # its holder removed the file as we opened it: lock the file that is there now
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}\n")
            fh.flush()
            yield path
        finally:
            with suppress(OSError):
                os.unlink(path)  # while still holding the lock
            fh.close()
    finally:
        _remove_empty(created)


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
    import signal
    import threading

    from stability.errors import Terminated

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
            "rng": _rng_state(self.gen),
            "epoch": epoch,
            "step": self.step,
            "history": self.history,
            "final": self.final,
            **({"ensemble": self.ensemble} if self.ensemble is not None else {}),
        }, self.out)
        _write_metrics(metrics_path(self.out), self.history, self.final)


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
        _set_rng_state(obj["rng"], run.gen)
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
                           where=lambda what, _e=epoch, _s=run.step: _diverged(what, _e, _s, run.out),
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
        record["eval"] = {s: _summary(evaluate(model, task, s, cfg.eval_iterations,
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
    board = _TensorBoard(Path(tensorboard)) if tensorboard is not None else None
    run.signature = hardware.signature()  # what computed these weights (stability.hardware)
    if cfg.monitor_every and is_looped(model):
        from stability.train.monitor import StabilityMonitor

        callbacks = (*callbacks, StabilityMonitor(task, every=cfg.monitor_every, samples=cfg.monitor_samples,
                                                  device=device))

    if progress and (run.start_epoch < cfg.epochs or run.final is None):
        _announce_run(BatchContext(model=step_model, params=model, task=task, cfg=cfg, gen=run.gen,
                                   optimizer=run.optimizer,
                                   autocast=lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                                                                   enabled=run.use_bf16),
                                   where=lambda what: _diverged(what, run.start_epoch, run.step, out)),
                      inputs, targets, start_epoch=run.start_epoch, final=run.final is None, device=device,
                      bf16=run.use_bf16)
    per_epoch = -(-N // cfg.batch_size)
    bar = _bar(progress, cfg.epochs * per_epoch, "train", "batch", initial=run.start_epoch * per_epoch, leave=True)
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


# ---- the forecast (stability.train.forecast) ---------------------------------------------------------------
def time_batch(ctx, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Seconds one batch of ``ctx``'s method takes, timed on copies of its model and optimizer under a forked
    random state (the run is untouched): a warm-up batch, then the timed one, scaled to ``ctx.cfg.batch_size``
    samples; the progressive loss at :func:`expected_depth`."""
    cfg, device = ctx.cfg, inputs.device
    b = min(cfg.batch_size, TIMED_SAMPLES, inputs.shape[0])
    xb, yb = inputs[:b], targets[:b]
    params = copy.deepcopy(ctx.params)  # uncompiled: --compile's compilation is not counted
    c = BatchContext(model=params, params=params, task=ctx.task, cfg=cfg,
                     gen=torch.Generator().set_state(ctx.gen.get_state()), optimizer=make_optimizer(params, cfg),
                     autocast=ctx.autocast, where=ctx.where)

    def one(n: Optional[int] = None, k: Optional[int] = None) -> float:
        t0 = time.perf_counter()
        with suppress(DivergenceError):  # the copy's divergence is the run's to report, when it happens there
            if cfg.method.name == "progressive" and n is not None and is_looped(params):
                with c.autocast():
                    loss = progressive_loss(c.model, c.task, xb, yb, n, k, cfg.method.alpha, cfg.iterations)
                c.optimize(loss)
            else:
                train_batch(c, xb, yb)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    one(0, 1)  # warm-up: first-call allocations, lazy initialisation
    return one(*expected_depth(cfg.iterations)) * cfg.batch_size / b


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


def _summary(ev: dict) -> dict:
    acc = ev["accuracy"]
    return {"iterations": len(acc), "accuracy_last": acc[-1], "accuracy_best": max(acc),
            "accuracy": acc}


def _diverged(what: str, epoch: int, step: int, out: Path) -> str:
    kept = f"the last good checkpoint {out} is kept" if out.exists() else "no checkpoint was written"
    return f"non-finite {what} at epoch {epoch + 1}, step {step + 1}: training stopped; {kept}"


class CompiledModel:
    """The model with ``step`` replaced by its torch.compile'd version (the release compiles the block): what
    ``train.compile = true`` trains; every other attribute and the call are the wrapped model's."""

    def __init__(self, model):
        self._model = model
        self.step = torch.compile(model.step, dynamic=False)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        return self._model(*args, **kwargs)
