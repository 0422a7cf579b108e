"""The schema's fields: the largest value of each kind of count, a field with its help text, flag and bounds
(:func:`_f`), and what a field says of itself (:func:`field_extra`, :func:`limits`, :func:`bounds`, :func:`unwrap`).
Read by every table of the schema, by the one-line messages and by the command line's flags."""

from __future__ import annotations

import typing
from typing import Annotated, Any, Optional, Union

from pydantic import Field

# The largest value of each kind of count (issue 33): a value past them cannot finish (memory or time) and would
# otherwise fail late, or grow memory without a word; every count of the schema has one of them as its `le` bound,
# so a run file, a grid (its dry run too) and a flag are refused before anything is allocated. Each is far above
# any run this toolkit has made (the paper's: 100 epochs, 40,000 samples, 512 bits, width 512, 500 iterations).
MAX_EPOCHS = 100_000  # epochs, warm-up, evaluation and monitor periods
MAX_SAMPLES = 10_000_000  # dataset sizes, batch sizes, sample counts
MAX_ITERATIONS = 1_000_000  # loop iterations, solver and adjoint budgets
MAX_BITS = 65_536  # prefix-sums string lengths
MAX_WIDTH = 65_536  # model width
MAX_PROBES = 1024  # random probes (Hutchinson's error is ~3 % at 1024), history lengths, heads
MAX_DIRECTIONS = 10_000  # the geometry stage's directions, certified radii, the repelling stage's starts
MAX_SEED = 2**63 - 1  # torch's generators take 64-bit seeds
MAX_WORKERS = 1024  # processes side by side (a sweep's workers or GPUs, the analysis' split processes)


def _f(default: Any, help: str, *, metavar: Optional[str] = None, flag: Optional[str] = None, derived: bool = False,
       why: Optional[str] = None, **bounds: Any) -> Any:
    """A schema field: default, help text, CLI metavar / flag name (default: ``--field-name``), bounds (ge, le).
    ``derived``: decided by the task (``Task.model_options``) or the release import, so no flag sets it. ``why``:
    the reason for the upper bound, said when a flag passes it (:func:`stability.commands._types.check_maxima`)."""
    extra = {k: v for k, v in (("metavar", metavar), ("flag", flag), ("derived", derived or None), ("why", why))
             if v is not None}
    return Field(default, description=help, json_schema_extra=extra or None, **bounds)


def _list_to_tuple(value: Any) -> Any:
    """TOML and JSON give lists where a field is a tuple."""
    return tuple(value) if isinstance(value, list) else value


def field_extra(info) -> dict:
    """A field's ``json_schema_extra``: ``metavar``, ``flag``, ``derived`` where given."""
    return dict(info.json_schema_extra or {})


def limits(info) -> dict:
    """A field's bounds by kind: ``{"gt": 0.0, "lt": 1.0}`` (``gt``/``ge`` below, ``lt``/``le`` above)."""
    return {k: getattr(m, k) for m in info.metadata for k in ("gt", "ge", "lt", "le")
            if getattr(m, k, None) is not None}


def bounds(info) -> tuple[Optional[float], Optional[float]]:
    """(lower, upper) bound of a field (None: unbounded)."""
    lo = hi = None
    for m in info.metadata:
        lo = getattr(m, "ge", lo)
        hi = getattr(m, "le", hi)
    return lo, hi


def unwrap(tp: Any) -> Any:
    """``Optional[X]`` / ``Annotated[X, ...]`` → X."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin is Union and type(None) in typing.get_args(tp):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return tp
            tp = args[0]
        else:
            return tp
