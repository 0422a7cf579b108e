"""What an analysis costs: predicted before it starts, and how much of it is left while it runs (issue 25).

The prediction is a power law per stage, seconds = a · units · (n / 1000)^b, n the state size (positions ×
width) and units what the stage's cost is counted in (its samples; one for Prop. 5; the geometry stage's samples
plus one). Each stage's work is J-products (and steps costing about as much) of one kind
(:class:`~stability.analysis.stages.base.Cost`'s ``product``): of one sample (the eigensolver's products on the
CPU's default, Prop. 5's unroll, the geometry search) or of the split's whole batch (the solves). ``a`` and ``b``
are fitted by ``python benchmarks/forecast_fit.py`` (one thread, the paper's architecture at the sudoku and
prefix-sums shapes, widths 16 … 64, 2–8 samples, every stage; benchmarks/RESULTS.md, "Forecast of each stage after
the refit"): a rough guide — a model whose solves need more iterations than the fit's costs more — said as
"about". While the analysis runs, :class:`Progress` rescales the rest of the prediction by how the stages so far
compared with theirs, so the time left it reports follows the machine it runs on.

On the device it runs on (issue 35), a split's prediction is rescaled before its first stage by :func:`scale`: the
measured seconds of a J-product of one sample, and of the split's whole batch, over what the fit's machine took
for them (:data:`PRODUCT`), each stage by the product its work is made of; a GPU, whose batched product costs a
small fraction of the CPU's per sample, is so predicted from its own speed rather than the CPU's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional, Union

from stability.analysis.progress import Progress, clock  # noqa: F401 (Progress: the split's time left)
from stability.analysis.stages.registry import FEW_SAMPLE_STAGES, REGISTRY

#: stage -> (a: seconds per unit at n = 1,000 on one thread, b: exponent in n, unit: "sample" | "one" |
#: "geometry sample", product: "batch" | "eig" | "one"): each stage's :class:`~stability.analysis.stages.base.Cost`
#: (its module's STAGE), fitted by benchmarks/forecast_fit.py on n = 640 … 5,184, one thread of this project's
#: 2-core machines beside other work (benchmarks/RESULTS.md, "Forecast of each stage after the refit")
COSTS = {s.name: (s.cost.a, s.cost.b, s.cost.unit, s.cost.product) for s in REGISTRY}
#: stage -> (a, b) on the batched path (``--batch all``, a GPU), where it differs (``Cost.batched``; fitted by
#: ``benchmarks/forecast_fit.py --batch all`` on the same seven analyses, benchmarks/RESULTS.md)
BATCHED = {s.name: s.cost.batched for s in REGISTRY if s.cost.batched is not None}

#: one J-product (a JVP of the loop map, float64) of ONE sample at n = 1,000 on one thread of the fit's machine:
#: seconds ≈ a · (n / 1000)^b. b from products timed at n = 1,280 … 10,368 (sudoku and prefix-sums shapes, 2 and 8
#: samples, one thread); a so that the rescaled prediction of four small analyses (default stages, one thread:
#: sudoku 81 × 32 and 81 × 16, prefix sums 40 × 32, chess 64 × 32; 2–8 samples) is their measured time in geometric
#: mean (2026-12-06: rescaled / measured 1.04, 0.83, 0.65, 1.77; the plain fit said 1.8–2.0×: the fit's machine,
#: loaded, ran about twice as slow as that hour's)
PRODUCT = (6.2e-4, 0.6)

#: a prediction above this many seconds is said before the analysis starts, with how to shorten it
SAY_ABOVE = 60.0


def scale(n: int, samples: int, product_seconds: float) -> float:
    """The factor from the fit's machine to this device: ``product_seconds``, the measured seconds of one J-product
    of a batch of ``samples`` samples of state size ``n``, over what the fit's machine takes for it (``samples``
    products of :data:`PRODUCT`, one thread)."""
    a, b = PRODUCT
    return product_seconds / (max(samples, 1) * a * (max(n, 1) / 1000.0) ** b)


def _units(s: str, unit: str, samples: int, geometry_samples: int, few: Optional[int]) -> int:
    """What a stage's cost is counted in (:class:`~stability.analysis.stages.base.Cost`'s ``unit``) on a split."""
    if unit == "sample":
        return min(samples, few) if few is not None and s in FEW_SAMPLE_STAGES else samples
    return geometry_samples + 1 if unit == "geometry sample" else 1


def predict(n: int, samples: int, stages, *, geometry_samples: int = 1, threads: int = 1,
            few: Optional[int] = None, factor: Union[None, float, Mapping[str, float]] = None,
            eig_batched: bool = False, batched_path: bool = False) -> dict:
    """Predicted seconds of each stage of ``stages`` on ``samples`` samples of state size ``n`` (one split).
    ``threads``: torch's threads for this split; the fit is for one, and a second thread is counted as half a
    thread more (measured speed-ups of the products at these sizes are 1.3–1.6×). ``few``: the samples the stages
    of :data:`~stability.analysis.stages.registry.FEW_SAMPLE_STAGES` measure (None: all;
    ``AnalysisOptions.measured``). ``factor``: this device's :func:`scale`, measured (then ``threads`` is not
    counted: the measurement ran on them): one number, or one per J-product kind (``"batch"``: of the split's
    batch, ``"one"``: of one sample), each stage rescaled by its ``Cost.product``'s (``"eig"``: the batch's where
    ``eig_batched``, the eigensolver batching the samples, else one sample's). ``batched_path``: the analysis
    runs the batched path (the eigensolver's restarts batched on this device: ``--batch all`` or a GPU): every
    stage takes its :data:`BATCHED` (a, b)."""
    if factor is None:
        factor = 1.0 / (1.0 + 0.5 * max(0, threads - 1))
    if not isinstance(factor, Mapping):
        factor = {"batch": factor, "one": factor}
    out = {}
    for s in stages:
        a, b, unit, product = COSTS.get(s, (0.0, 0.0, "one", "batch"))
        if batched_path and s in BATCHED:
            a, b = BATCHED[s]
        kind = ("batch" if eig_batched else "one") if product == "eig" else product
        out[s] = a * _units(s, unit, samples, geometry_samples, few) * (max(n, 1) / 1000.0) ** b * factor[kind]
    return out


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
