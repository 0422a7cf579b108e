"""What every stage module shares: the :class:`Stage` record, :class:`NotApplicable`, the protocol of a stage's
result, and the formatting of a report row's numbers.

Torch-free, like every stage module: the readers of the analysis JSON (the report, the verdict, compare, the
sweep's record) import the stage modules without torch; a stage's ``run`` imports its computing routines when
it runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, Protocol, Union

if TYPE_CHECKING:
    from stability.analysis.fixed_point import AtFixedPoint

#: the units a stage's cost is counted in (:class:`Cost`)
UNITS = ("sample", "one", "geometry sample")
#: the J-product a stage's work is made of (:class:`Cost`): of the split's whole batch (its solves), of the
#: eigensolver's batch (``AnalysisOptions.eig_chunk``: one sample on the CPU's default, all with ``batch`` all or on
#: a GPU), or of one sample
PRODUCTS = ("batch", "eig", "one")


class StageResult(Protocol):
    """What a stage's ``run`` returns: a typed result whose ``to_dict()`` is the stage's JSON block."""

    def to_dict(self) -> dict: ...


@dataclass(frozen=True)
class Cost:
    """The stage's predicted seconds on one split, a · units · (n / 1000)^b at state size n on one thread of the
    fit's machine, rescaled to the device by its measured J-product of the kind ``product``
    (:func:`stability.analysis.cost.predict`; fitted by benchmarks/forecast_fit.py). ``unit``:
    ``"sample"`` (every analysed sample, or the first few where the stage is per sample), ``"one"`` (once a split)
    or ``"geometry sample"`` (each sample the geometry stage measures, plus one: its search's own cost);
    ``product``: one of :data:`PRODUCTS`; ``batched``: its (a, b) on the batched path (``--batch all``, a GPU: the
    eigensolver's restarts and the solvers' rows batched; fitted by ``forecast_fit.py --batch all``), None: the
    same (a, b)."""

    a: float
    b: float
    unit: str
    product: str = "batch"
    batched: Optional[tuple] = None

    def __post_init__(self):
        if self.unit not in UNITS:
            raise ValueError(f"Cost.unit {self.unit!r}: expected one of {', '.join(UNITS)}")
        if self.product not in PRODUCTS:
            raise ValueError(f"Cost.product {self.product!r}: expected one of {', '.join(PRODUCTS)}")


#: a stage's rows of a split's table (quantity, value, meaning), from its JSON block (None: the stage did not run)
#: and the split's block (what a row needs of another stage: the solver's statuses, the sample count)
Rows = Callable[[Optional[dict], dict], list]
#: a stage's headline numbers (:mod:`stability.analysis.headline`), from its JSON block and the split's block
Headline = Callable[[Optional[dict], dict], dict]


@dataclass(frozen=True)
class Stage:
    """One stage of the analysis, as the registry (:mod:`stability.analysis.stages.registry`) lists it.

    ``name``: its name in ``config.STAGES``, ``--only`` and the timings; ``key``: its block's key in a split of the
    JSON; ``per_sample``: on large states it measures the first ``few_samples`` samples only
    (``AnalysisOptions.measured``); ``cost``: its cost model; ``run``: the function from the fixed-point object
    (:class:`~stability.analysis.fixed_point.AtFixedPoint`) to its result; ``rows`` and ``headline``: what the
    report prints and the headline block holds of it, both read from its JSON block (so an analysis written by an
    earlier version reads the same way); ``what``: one line on what it measures."""

    name: str
    key: str
    per_sample: bool
    cost: Cost
    run: Callable[[AtFixedPoint], StageResult]
    rows: Rows
    headline: Headline
    what: str


@dataclass
class NotApplicable:
    """A stage that does not apply to this model (e.g. Prop. 4 without named recall parts), and why."""

    reason: str

    def to_dict(self) -> dict:
        return {"applicable": False, "reason": self.reason}


#: a stage's result where the stage may not apply to the model
OrNot = Union[StageResult, NotApplicable]


def applies(block) -> bool:
    """Whether a stage's JSON block holds a result (not None, not ``{"applicable": false, ...}``)."""
    return isinstance(block, dict) and block.get("applicable", True)


def fmt(v, spec: str = ".4g") -> str:
    """A number of a report row: "—" for None, "nan" for a non-finite float."""
    if v is None:
        return "—"
    if isinstance(v, float):
        return "nan" if not math.isfinite(v) else format(v, spec)
    return str(v)


def spread(values: list) -> str:
    """"lo … hi" of the finite values, "—" when there are none."""
    vals = sorted(v for v in values if v is not None and math.isfinite(v))
    if not vals:
        return "—"
    return f"{vals[0]:.4g} … {vals[-1]:.4g}"


def last(values):
    """The last entry of a list (the largest T of a T grid), None for an empty or missing one."""
    return values[-1] if isinstance(values, list) and values else None
