"""The forecast ``stability train`` prints before it starts: how long the whole run will take, training and the
final evaluation, and, when that is long on a CPU, how to shrink it.

The arithmetic lives here; the measuring, in :mod:`stability.train.loop` (``time_batch``, ``forecast_run``). The
training part is measured: one batch of the run's method, timed on copies of the model and its optimizer (the
run's own model, optimizer and random streams are untouched, so the forecast changes no number of the run). The
progressive loss draws its depth n + k per batch; the timed batch takes the expected draw (n = (T − 1)/2 without
gradient, k = (T + 3)/4 with), so one batch stands for the epoch's average. A batch larger than
:data:`TIMED_SAMPLES` is timed on that many samples and scaled linearly. The evaluation part is
:func:`~stability.train.loop.estimate_eval_seconds` (two loop steps timed, extrapolated), for the final evaluation
and for the periodic ones (``eval_every``). Not counted: the training-accuracy and monitor callbacks, and
``--compile``'s compilation. How close it comes: benchmarks/RESULTS.md, "Train forecast".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

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
