"""argparse types of the command line: numbers that refuse NaN and ±inf, counts, device names; and
:func:`schema_argument`, the one way a field of the configuration schema (stability/config/) becomes a flag of
``stability train``, ``sweep`` and ``analyze``.

A wrong value is an ``argparse.ArgumentTypeError``: one line ``stability CMD: error: argument --X: expected ...``
and exit 2 (see :class:`stability.cli._Parser`).
"""

from __future__ import annotations

import argparse
import math
import typing

from stability.config import bounds, field_extra, is_device_name, limits, unwrap
from stability.errors import ConfigError


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


def open_unit_float(text: str) -> float:
    """argparse type: a number in (0, 1) (a relative accuracy)."""
    return _number(float, text, lambda v: _finite(v) and 0 < v < 1, "a number in (0, 1)")


def device_name(text: str) -> str:
    """argparse type: ``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether it exists is checked before the work)."""
    if not is_device_name(text):
        raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {text!r}")
    return text


def auto_or_positive_int(text: str):
    """argparse type: ``auto`` (kept as the string; the command decides) or a positive integer."""
    return "auto" if text.strip().lower() == "auto" else _number(int, text, lambda v: v >= 1,
                                                                 "auto or a positive integer")


# ---- flags of the schema ------------------------------------------------------------------------------------------

def or_none(kind):
    """An optional number: ``none`` (the field's None), else ``kind``."""
    def parse(text: str):
        return None if text.lower() == "none" else kind(text)
    parse.__name__ = kind.__name__
    return parse


def pair(text: str) -> list:
    """Two finite numbers ``A,B`` (AdamW's betas)."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"expected two numbers A,B, got {text!r}")
    return [finite_float(p.strip()) for p in parts]


def default_text(value) -> str:
    """A default as a flag's help shows it: on/off, none, ``A,B``, a method's name."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None:
        return "none"
    if isinstance(value, (tuple, list)):
        return ",".join(map(str, value))
    if hasattr(value, "name"):  # the method block
        return value.name
    return str(value)


def _number_type(kind: type, lim: dict, positive: bool):
    """The argparse type of a number field from its bounds (:func:`stability.config.limits`): counts ≥ 1 or ≥ 0,
    numbers > 0, in (0, 1), in [0, 1], ≥ 0, or any finite one; ``positive``: the flag refuses 0 as well."""
    if kind is int:
        return positive_int if positive or lim.get("ge") == 1 else nonneg_int if lim.get("ge") == 0 else int
    if (lim.get("gt"), lim.get("lt")) == (0, 1):
        return open_unit_float
    if positive or lim.get("gt") == 0:
        return positive_float
    if (lim.get("ge"), lim.get("le")) == (0, 1):
        return unit_float
    return nonneg_float if lim.get("ge") == 0 else finite_float


def schema_argument(flag: str, name: str, info, *, dest: str, positive: bool = False) -> tuple[tuple, dict]:
    """argparse's (args, kwargs) of ``--flag`` setting the schema field ``name`` (its pydantic ``FieldInfo``):
    choices of a ``Literal``, ``--flag/--no-flag`` of a bool, the type of a number from its bounds (``none``
    accepted where the field is optional), metavar from the field, help ``description (default X)`` and default
    None (the caller overrides either where its command differs)."""
    tp = unwrap(info.annotation)
    optional = type(None) in typing.get_args(info.annotation)
    extra = field_extra(info)
    kw: dict = {"dest": dest, "help": f"{info.description} (default {default_text(info.default)})", "default": None}
    if tp is bool:
        kw.update(action=argparse.BooleanOptionalAction)
    elif typing.get_origin(tp) is typing.Literal:
        kw.update(choices=list(typing.get_args(tp)))
    elif tp in (int, float):
        kind = _number_type(tp, limits(info), positive)
        kw.update(type=or_none(kind) if optional else kind)
    elif typing.get_origin(tp) is tuple:
        kw.update(type=pair)
    elif name == "device":
        kw.update(type=device_name)
    if "metavar" in extra:
        kw["metavar"] = tuple(extra["metavar"]) if isinstance(extra["metavar"], list) else extra["metavar"]
    return (f"--{flag}",), kw


def check_maxima(args: argparse.Namespace, fields) -> None:
    """Refuse, in one line and before any work, a flag's count above its schema field's upper bound (the ``le`` of
    :mod:`stability.config`: ``--epochs 99999999999999999999999`` would otherwise grow memory without a word).
    ``fields``: ``(flag, dest, FieldInfo)`` of each schema flag of the command."""
    for flag, dest, info in fields:
        value = getattr(args, dest, None)
        hi = bounds(info)[1]
        if isinstance(value, int) and not isinstance(value, bool) and hi is not None and value > hi:
            why = field_extra(info).get("why")
            raise ConfigError(f"--{flag} {value}: at most {hi}" + (f" ({why})" if why else ""))
