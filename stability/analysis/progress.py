"""Stage-by-stage progress of one split with the time left (issue 25), and durations as people say them.

:class:`Progress` rescales the rest of a split's prediction (:func:`stability.analysis.cost.predict`) by how the
stages so far compared with theirs, so the time left it reports follows the machine it runs on. Below the stage
registry (``AtFixedPoint.progress`` is one), so it imports nothing of the analysis.
"""

from __future__ import annotations

import time
from typing import Callable


def clock(seconds: float) -> str:
    """``seconds`` as people say it: "40 s", "3 min", "1 h 05 min"."""
    s = int(round(seconds))
    if s < 90:
        return f"{s} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


class Progress:
    """Stage-by-stage progress of one split with the time left: the prediction of the stages still to run,
    rescaled by the ratio of the elapsed time to the prediction of the stages done. ``log`` hears one line per
    stage (when the split is predicted to take over ``quiet_below`` s) and, inside a long stage, one line at most
    every ``every`` s from :meth:`tick`."""

    def __init__(self, split: str, predicted: dict, log: Callable, *, quiet_below: float = 20.0,
                 every: float = 10.0):
        self.split, self.predicted, self.log = split, dict(predicted), log
        self.loud = sum(predicted.values()) >= quiet_below
        self.every = every
        self.done_predicted = self.done_actual = 0.0
        self.stage, self.started, self.last = None, 0.0, 0.0
        self.finished: set = set()

    def _scale(self) -> float:
        return self.done_actual / self.done_predicted if self.done_predicted > 1.0 else 1.0

    def left(self) -> float:
        """Seconds left in this split: the rest of the prediction, rescaled."""
        rest = sum(v for k, v in self.predicted.items() if k not in self.finished)
        return rest * self._scale()

    def begin(self, stage: str) -> None:
        self.stage, self.started = stage, time.perf_counter()
        self.last = self.started
        if self.loud and self.predicted.get(stage, 0.0) * self._scale() >= 2.0:
            names = list(self.predicted)
            self.log(f"{self.split}: {stage} ({names.index(stage) + 1}/{len(names)}), about "
                     f"{clock(self.predicted[stage] * self._scale())}; about {clock(self.left())} left in "
                     f"{self.split}")

    def end(self, stage: str) -> None:
        self.finished.add(stage)
        self.done_predicted += self.predicted.get(stage, 0.0)
        self.done_actual += time.perf_counter() - self.started

    def tick(self, done: int, total: int, what: str = "samples") -> None:
        """Inside a stage: ``done`` of ``total`` units finished; a line with this stage's time left, at most every
        ``every`` seconds."""
        now = time.perf_counter()
        if not self.loud or done <= 0 or done >= total or now - self.last < self.every:
            return
        self.last = now
        rest = (now - self.started) / done * (total - done)
        self.log(f"{self.split}: {self.stage} {done}/{total} {what}, about {clock(rest)} left in this stage")
