"""The forecast ``stability train`` prints before it starts: how long the whole run will take, training and the
final evaluation, and, when that is long on a CPU, how to shrink it.

The training part is measured: one batch of the run's method, timed on copies of the model and its optimizer (the
run's own model, optimizer and random streams are untouched, so the forecast changes no number of the run). The
progressive loss draws its depth n + k per batch; the timed batch takes the expected draw (n = (T − 1)/2 without
gradient, k = (T + 3)/4 with), so one batch stands for the epoch's average. A batch larger than
:data:`TIMED_SAMPLES` is timed on that many samples and scaled linearly. The evaluation part is
:func:`~stability.train.loop.estimate_eval_seconds` (two loop steps timed, extrapolated), for the final evaluation
and for the periodic ones (``eval_every``). Not counted: the training-accuracy and monitor callbacks, and
``--compile``'s compilation. How close it comes: benchmarks/RESULTS.md, "Train forecast".
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Optional

import torch

#: a whole run forecast longer than this on a CPU comes with how to shrink it
LONG_RUN_S = 15 * 60.0
#: the most samples the timed batch has (a larger batch is timed on these and scaled linearly)
TIMED_SAMPLES = 128


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``1 h 05 min``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    h, m = divmod(int(round(seconds / 60)), 60)
    return f"{h} h {m:02d} min"


@dataclass
class Forecast:
    """A run's forecast: ``epochs`` still to train of ``batches`` batches at ``batch_s`` seconds each, the final
    evaluation (split -> seconds, ``eval_sizes`` split -> samples, at ``test_iterations``), ``periodic_s`` the
    periodic evaluations in all, on ``device`` (a type: cpu, cuda)."""

    epochs: int
    batches: int
    batch_s: float
    eval_s: dict = field(default_factory=dict)
    eval_sizes: dict = field(default_factory=dict)
    test_iterations: int = 0
    periodic_s: float = 0.0
    device: str = "cpu"

    @classmethod
    def of(cls, cfg, *, train_samples: int, batch_s: float, eval_sizes: dict, eval_step_s: dict,
           start_epoch: int = 0, final: bool = True, device: str = "cpu") -> "Forecast":
        """The forecast of a run of TrainConfig ``cfg`` on ``train_samples`` training samples from epoch
        ``start_epoch`` on, from ``batch_s`` seconds a batch and ``eval_step_s`` (split -> seconds of one loop step
        over the whole split, ``eval_sizes`` split -> samples); ``final``: the final evaluation is still to run."""
        out = cls(epochs=cfg.epochs - start_epoch, batches=-(-train_samples // cfg.batch_size), batch_s=batch_s,
                  test_iterations=cfg.test_iterations, device=device)
        if final:
            out.eval_s = {s: t * cfg.test_iterations for s, t in eval_step_s.items()}
            out.eval_sizes = dict(eval_sizes)
        if cfg.eval_every:
            count = sum(1 for e in range(start_epoch, cfg.epochs) if (e + 1) % cfg.eval_every == 0
                        and e + 1 < cfg.epochs)
            out.periodic_s = count * sum(eval_step_s.values()) * cfg.eval_iterations
        return out

    @property
    def training_s(self) -> float:
        return self.epochs * self.batches * self.batch_s + self.periodic_s

    @property
    def total_s(self) -> float:
        return self.training_s + sum(self.eval_s.values())

    def line(self) -> str:
        """The forecast, one line."""
        train = (f"{self.epochs} epochs × {self.batches} batches at {self.batch_s:.3g} s a batch ≈ "
                 f"{duration(self.training_s)} of training")
        if self.periodic_s:
            train += " (periodic evaluations included)"
        if not self.eval_s:
            return f"forecast: {train}: about {duration(self.total_s)} on {self.device}"
        sizes = " + ".join(f"{n:,} {s}" for s, n in self.eval_sizes.items())
        return (f"forecast: {train}, then the final evaluation ({sizes} samples × {self.test_iterations} "
                f"iterations) ≈ {duration(sum(self.eval_s.values()))}: about {duration(self.total_s)} in all on "
                f"{self.device}")

    def hint(self) -> Optional[str]:
        """How to shrink a run forecast longer than :data:`LONG_RUN_S` on a CPU (None otherwise)."""
        if self.device != "cpu" or self.total_s <= LONG_RUN_S:
            return None
        return (f"this is a long run for a CPU (> {duration(LONG_RUN_S)}); to shrink it: --preset cpu (the demo's "
                "size, a few minutes), fewer --epochs, or a smaller final evaluation (--test-iterations 100 "
                "--hard-size 1000; prefix sums: --hard-length 64)")


def expected_depth(T: int) -> tuple[int, int]:
    """The progressive loss's expected (n, k) at depth T, rounded: n uniform on 0..T−1, k uniform on 1..T−n."""
    return round((T - 1) / 2), max(1, round((T + 3) / 4))


def time_batch(ctx, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Seconds one batch of ``ctx``'s method takes, timed on copies of its model and optimizer under a forked
    random state (the run is untouched): a warm-up batch, then the timed one, scaled to ``ctx.cfg.batch_size``
    samples; the progressive loss at :func:`expected_depth`."""
    from stability.protocols import is_looped
    from stability.train.loop import BatchContext, make_optimizer, progressive_loss, train_batch

    cfg, device = ctx.cfg, inputs.device
    b = min(cfg.batch_size, TIMED_SAMPLES, inputs.shape[0])
    xb, yb = inputs[:b], targets[:b]
    params = copy.deepcopy(ctx.params)  # uncompiled: --compile's compilation is not counted
    c = BatchContext(model=params, params=params, task=ctx.task, cfg=cfg,
                     gen=torch.Generator().set_state(ctx.gen.get_state()), optimizer=make_optimizer(params, cfg),
                     autocast=ctx.autocast, where=ctx.where)

    def one(n: Optional[int] = None, k: Optional[int] = None) -> float:
        t0 = time.perf_counter()
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


def forecast(ctx, inputs: torch.Tensor, targets: torch.Tensor, *, start_epoch: int, final: bool,
             device: torch.device, bf16: bool) -> Forecast:
    """The run's :class:`Forecast` from epoch ``start_epoch`` on (``final``: the final evaluation is still to run),
    measured under a forked random state: the run draws the same numbers as without it."""

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):  # the run's streams untouched
        return _forecast(ctx, inputs, targets, start_epoch=start_epoch, final=final, device=device, bf16=bf16)


def _forecast(ctx, inputs, targets, *, start_epoch: int, final: bool, device: torch.device, bf16: bool) -> Forecast:
    from stability.train.loop import estimate_eval_seconds

    cfg, task = ctx.cfg, ctx.task
    splits = ("val", "hard")
    return Forecast.of(cfg, train_samples=int(inputs.shape[0]), start_epoch=start_epoch, final=final,
                       batch_s=time_batch(ctx, inputs, targets) if start_epoch < cfg.epochs else 0.0,
                       eval_sizes={s: int(task.dataset(s)[0].shape[0]) for s in splits},
                       eval_step_s={s: estimate_eval_seconds(ctx.params, task, s, 1, batch_size=cfg.eval_batch_size,
                                                             device=device, bf16=bf16) for s in splits},
                       device=device.type)
