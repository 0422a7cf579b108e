"""The check records and their registry: a :class:`Verifier` states a property, its ``run`` gives a :class:`Check`.

Check modules register their properties with :func:`verifier`; the registry keeps them in the order the package
imports them (the order of ``stability verify``'s table).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable

RELATIONS = {"<=": lambda m, t: m <= t, ">=": lambda m, t: m >= t}


@dataclass
class Check:
    """One verified statement: ``passed`` iff ``measured <relation> tolerance`` (a NaN never passes)."""

    name: str
    source: str
    statement: str
    instance: str
    measured: float
    relation: str
    tolerance: float
    passed: bool
    variant: str = "paper"

    def to_dict(self) -> dict:
        """A JSON-ready dict (a non-finite number becomes None)."""
        d = asdict(self)
        for key in ("measured", "tolerance"):
            if not math.isfinite(d[key]):
                d[key] = None
        return d


@dataclass(frozen=True)
class Verifier:
    """A registered property: ``measure(seed, wrong) -> (instance description, measured value)``."""

    name: str
    source: str
    statement: str
    relation: str
    tolerance: float
    wrong: str
    measure: Callable
    needs: str | None = None  #: the optional package the measurement imports (``stability verify`` checks it first)

    def run(self, seed: int = 0, wrong: bool = False) -> Check:
        """Measure the property; an exception inside the measurement becomes a failed check, never a traceback."""
        tolerance = self.tolerance
        try:
            instance, measured = self.measure(seed, wrong)
            measured = float(measured)
        except Exception as exc:  # noqa: BLE001 - a failing measurement is a failed check, reported as one row
            instance, measured = f"measurement raised {type(exc).__name__}: {exc}", float("nan")
        passed = bool(math.isfinite(measured) and RELATIONS[self.relation](measured, tolerance))
        statement = self.statement if not wrong else f"[wrong variant: {self.wrong}] {self.statement}"
        return Check(self.name, self.source, statement, instance, measured, self.relation, tolerance, passed,
                     "wrong" if wrong else "paper")


VERIFIERS: dict[str, Verifier] = {}

_SYMBOL = {"<=": "≤", ">=": "≥"}


def format_value(x: float) -> str:
    """A measured value or tolerance as printed in the table: 3 significant digits, scientific below 1e-3."""
    return "nan" if x != x else f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"


def format_row(check: Check) -> str:
    """One line of ``stability verify``: status, name, measured vs tolerance, the statement with its source, the
    instance."""
    status = "PASS" if check.passed else "FAIL"
    return (f"{status}  {check.name:44s} {format_value(check.measured):>9s} {_SYMBOL[check.relation]} "
            f"{format_value(check.tolerance):<7s} {check.source}: {check.statement}  [{check.instance}]")


def format_listing(v: Verifier) -> str:
    """One line of ``stability verify --list``: name, relation and tolerance, statement, its wrong variant."""
    return (f"{v.name:44s} {_SYMBOL[v.relation]} {format_value(v.tolerance):<8s} {v.source}: {v.statement}  "
            f"[wrong variant: {v.wrong}]")


def verifier(name: str, source: str, statement: str, *, tolerance: float, relation: str = "<=", wrong: str,
             needs: str | None = None):
    """Register ``measure(seed, wrong)`` as the check ``name`` (``needs``: an optional package it imports)."""

    def deco(fn):
        VERIFIERS[name] = Verifier(name, source, statement, relation, tolerance, wrong, fn, needs)
        return fn

    return deco


def run_checks(names=None, seed: int = 0, wrong: bool = False) -> list[Check]:
    """Run the named checks (all when ``names`` is None) in registry order."""
    chosen = list(VERIFIERS) if not names else list(names)
    unknown = [n for n in chosen if n not in VERIFIERS]
    if unknown:
        raise KeyError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(VERIFIERS)}")
    return [VERIFIERS[n].run(seed=seed, wrong=wrong) for n in chosen]
