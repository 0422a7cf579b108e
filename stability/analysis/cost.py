"""What an analysis costs: predicted before it starts, and how much of it is left while it runs (issue 25).

The prediction is a power law per stage, seconds = a · units · (n / 1000)^b, n the state size (positions ×
width) and units the samples the stage works on (all of them; one for Prop. 5; the geometry stage's radii on its
``geometry_samples``). ``a`` and ``b`` are fitted by ``python benchmarks/analysis_scaling.py`` (one thread, the
paper's architecture at widths 32 … 256, every stage; benchmarks/RESULTS.md, "Analysis scaling"): a rough guide —
a trained model that needs more iterations than the benchmark's costs more — said as "about". While the analysis
runs, :class:`Progress` rescales the rest of the prediction by how the stages so far compared with theirs, so the
time left it reports follows the machine it runs on.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

#: stage -> (a: seconds per unit at n = 1,000 on one thread, b: exponent in n, unit: "sample" | "one");
#: fitted by benchmarks/analysis_scaling.py on n = 1,280 … 20,736, 2 samples each, one thread of this project's
#: 2-core machines beside other work (benchmarks/RESULTS.md, "Paper-size analysis")
COSTS = {
    "reachability": (0.15, 0.60, "sample"),
    "rho": (1.1, 0.60, "sample"),
    "prop4": (0.18, 0.36, "sample"),
    "rho_wx": (0.001, 0.0, "one"),
    "prop5": (1.0, 1.02, "one"),
    "input": (0.079, 1.32, "sample"),
    "a8": (0.032, 1.30, "sample"),
    # not in the fit: measured on two width-32 prefix-sums checkpoints, 4 samples, n = 256 and 1,024, one thread
    # (0.13–1.1 s a split; the ρ(J) at every distinct root found dominates where there are many)
    "repelling": (0.12, 0.8, "sample"),
    "accuracy": (0.001, 1.0, "sample"),
    "geometry": (7.8, 1.23, "one"),
}

#: a prediction above this many seconds is said before the analysis starts, with how to shorten it
SAY_ABOVE = 60.0


def predict(n: int, samples: int, stages, *, geometry_samples: int = 1, threads: int = 1,
            few: Optional[int] = None) -> dict:
    """Predicted seconds of each stage of ``stages`` on ``samples`` samples of state size ``n`` (one split).
    ``threads``: torch's threads for this split; the fit is for one, and a second thread is counted as half a
    thread more (measured speed-ups of the products at these sizes are 1.3–1.6×). ``few``: the samples the stages
    of :data:`~stability.analysis.options.FEW_SAMPLE_STAGES` measure (None: all; ``AnalysisOptions.measured``)."""
    from stability.analysis.options import FEW_SAMPLE_STAGES

    speed = 1.0 + 0.5 * max(0, threads - 1)
    out = {}
    for s in stages:
        a, b, unit = COSTS.get(s, (0.0, 0.0, "one"))
        units = samples if unit == "sample" else (geometry_samples if s == "geometry" else 1)
        if unit == "sample" and few is not None and s in FEW_SAMPLE_STAGES:
            units = min(samples, few)
        out[s] = a * units * (max(n, 1) / 1000.0) ** b / speed
    return out


def clock(seconds: float) -> str:
    """``seconds`` as people say it: "40 s", "3 min", "1 h 05 min"."""
    s = int(round(seconds))
    if s < 90:
        return f"{s} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def forecast(n: int, shape, samples: int, splits: int, stages, *, workers: int, threads: int,
             geometry_samples: int = 1, device: str = "cpu", few: Optional[int] = None) -> Optional[str]:
    """The line said before a long analysis (None when it is predicted to take under :data:`SAY_ABOVE` s): what
    it analyses, the predicted time on this machine's threads, and how to make it shorter. ``few``: as
    :func:`predict`'s (said in the line when it is below ``samples``)."""
    per_split = sum(predict(n, samples, stages, geometry_samples=geometry_samples, threads=threads,
                            few=few).values())
    total = per_split * splits / max(1, min(workers, splits))
    if device != "cpu" or total < SAY_ABOVE:
        return None
    shape = " × ".join(str(d) for d in shape)
    shorter = [f"--samples {max(1, samples // 4)}"] if samples > 4 else []
    cost = predict(n, samples, stages, geometry_samples=geometry_samples, threads=threads, few=few)
    costliest = max(cost, key=cost.get)
    rest = [s for s in stages if s not in (costliest, "reachability")]
    if rest:
        shorter.append(f"--only {','.join(rest)} (all but {costliest}, about {clock(cost[costliest])} a split)")
    shorter.append("--device cuda")
    some = (f" (ρ, Prop. 4, ‖dx*/dx0‖, A.8, repelling on {few})" if few is not None and few < samples
            else "")
    return (f"analysis: {splits} split(s) × {samples} samples{some}, state {shape} (n = {n:,}), {len(stages)} stages: "
            f"about {clock(total)} on {threads * max(1, min(workers, splits))} CPU thread(s) (predicted); "
            f"shorter: {', '.join(shorter)}")


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
