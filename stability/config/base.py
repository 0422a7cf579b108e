"""The project's one config base (:class:`_Config`: frozen, unknown keys refused, strict types, finite numbers, one
:class:`~stability.errors.ConfigError` line on any bad value) and its plain-dict form; the part of a record read
back from a file (:class:`RecordPart`); devices by name; a config's options by their dotted path (:func:`dotted`,
:func:`changes`)."""

from __future__ import annotations

import typing
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, ValidationError

from stability.config.messages import message
from stability.errors import ConfigError

Device = Literal["auto", "cpu", "cuda"]


def is_device_name(name: str) -> bool:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether that device exists is checked where it is used)."""
    return name in typing.get_args(Device) or (name.startswith("cuda:") and name[5:].isdigit())


def resolve_device(name: str):
    """The ``torch.device`` a device name means: ``auto`` (cuda when available), ``cpu``, ``cuda`` or ``cuda:N``;
    a CUDA device that is not here is refused with one line naming the ones that are (every command's
    ``--device``)."""
    import torch  # lazy: torch; the schema imports without it

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not is_device_name(name):
        raise ConfigError(f"device {name!r}: expected auto, cpu, cuda or cuda:N")
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"device {name}: no CUDA device is available here; use --device cpu")
        if device.index is not None and device.index >= count:
            raise ConfigError(f"device {name}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return device


class _Config(BaseModel):
    """Base: frozen, unknown keys refused, strict types (no str → number, no bool → int), finite numbers; one-line
    :class:`ConfigError` on any bad value. ``error_style``: how that line names the place: ``owner``
    (``ModelConfig.width``: the innermost table's class and the field; the run's options) or ``path`` (the keys
    from the root, list items by their ``id`` or index: ``claim 'c'.a.norm[0]``; the claims file, the sweep
    record)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)
    error_style: typing.ClassVar[Literal["owner", "path"]] = "owner"

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(message(type(self), exc, data)) from None

    # pydantic validates a nested table without calling this __init__, so the outermost one translates the error
    # with its whole location (a claim's place in the claims file, a split's in a record)
    __init__.__pydantic_base_init__ = True  # type: ignore[attr-defined]

    def to_dict(self) -> dict:
        return to_dict(self)

    def replace(self, **changes: Any):
        return from_dict(type(self), {**to_dict(self), **changes})


#: a measured number as a record holds it: an int stays an int and a float a float (strict: no bool, no str), so
#: the JSON written back is the JSON read
Real = Union[int, float]


class RecordPart(_Config):
    """A table of a record read back from a file (the sweep record, a split's headline block): errors name their
    place by its path from the record's root; :meth:`to_dict` keeps the keys that were given, in the schema's order
    (a key a record predates stays absent)."""

    error_style: typing.ClassVar[Literal["owner", "path"]] = "path"

    def to_dict(self) -> dict:
        return self.model_dump(exclude_unset=True)


def _plain(v: Any) -> Any:
    if isinstance(v, BaseModel):
        return to_dict(v)
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    return v


def to_dict(cfg: Any) -> dict:
    """Plain nested dict (lists, not tuples) that ``torch.load(weights_only=True)`` and JSON accept."""
    return {name: _plain(getattr(cfg, name)) for name in type(cfg).model_fields}


def shortest_e(v: float) -> str:
    """v in e-notation with the fewest significant digits that give it back: ``2.5e-03`` (not ``3e-03``)."""
    return next((t for t in (f"{v:.{d}e}" for d in range(17)) if float(t) == v), repr(v))


def short_number(v: float) -> str:
    """A rate as cell ids and file names write it: ``1e-3``, ``2.5e-3`` (not ``3e-3``)."""
    return shortest_e(v).replace("e-0", "e-").replace("e+0", "e")


def from_dict(cls, data: dict):
    """Build ``cls`` from a dict, refusing unknown keys (the error names the allowed ones)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{cls.__name__}: expected a table of options, got {data!r}")
    return cls(**data)


def dotted(config: Any) -> dict:
    """``{"section.option": value}`` of a RunConfig or any nested dict, tables joined by dots (``model.width``,
    ``train.method.name``, ``train.method.solver_tol``)."""
    out: dict = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}{k}.", v)
        elif prefix:
            out[prefix[:-1]] = value

    walk("", to_dict(config) if isinstance(config, BaseModel) else config)
    return out


def changes(a: Any, b: Any) -> list[tuple[str, Any, Any]]:
    """``(option, value in a, value in b)`` for each :func:`dotted` option whose values differ, sorted by name (an
    option only one side has: None on the other)."""
    da, db = dotted(a), dotted(b)
    return [(k, da.get(k), db.get(k)) for k in sorted(set(da) | set(db)) if da.get(k) != db.get(k)]
