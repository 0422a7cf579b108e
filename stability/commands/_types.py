"""argparse types of the command line: numbers that refuse NaN and ±inf, counts, device names.

A wrong value is an ``argparse.ArgumentTypeError``: one line ``stability CMD: error: argument --X: expected ...``
and exit 2 (see :class:`stability.cli._Parser`).
"""

from __future__ import annotations

import argparse
import math


def _number(kind, text: str, ok, what: str):
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """argparse type: an integer ≥ 1."""
    return _number(int, text, lambda v: v >= 1, "a positive integer")


def nonneg_int(text: str) -> int:
    """argparse type: an integer ≥ 0."""
    return _number(int, text, lambda v: v >= 0, "a non-negative integer")


def _finite(v: float) -> bool:
    return math.isfinite(v)


def finite_float(text: str) -> float:
    """argparse type: a finite number (NaN and ±inf refused)."""
    return _number(float, text, _finite, "a finite number")


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    return _number(float, text, lambda v: _finite(v) and v > 0, "a positive number")


def nonneg_float(text: str) -> float:
    """argparse type: a finite number ≥ 0."""
    return _number(float, text, lambda v: _finite(v) and v >= 0, "a non-negative number")


def unit_float(text: str) -> float:
    """argparse type: a number in [0, 1] (a fraction, a weight)."""
    return _number(float, text, lambda v: _finite(v) and 0 <= v <= 1, "a number in [0, 1]")


def device_name(text: str) -> str:
    """argparse type: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether it exists is checked before the work)."""
    from stability.config import is_device_name

    if not is_device_name(text):
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {text!r}")
    return text
