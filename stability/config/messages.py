"""One-line errors: pydantic's ValidationError as one :class:`~stability.errors.ConfigError` line naming the place
(``ModelConfig.width: 0 is outside [1, inf]``, or by its path from a file's root: ``claim 'c'.a.norm[0]``), what
is wrong and what is allowed (:func:`message`, the base's one translator); a training method's option given where
it does not belong (:func:`method_option_message`)."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, Optional, Union

from pydantic import BaseModel, ValidationError

from stability.config.fields import limits, unwrap
from stability.errors import ConfigError


@dataclass
class Methods:
    """The training methods as the messages name them: the train table that holds one (``table``) and each method's
    table by name (``classes``). :mod:`stability.config.train` tells them where it defines the tables (they are
    built on the base these messages serve, so this module cannot import them)."""

    table: Optional[type] = None
    classes: dict = field(default_factory=dict)

    @property
    def names(self) -> tuple:
        return tuple(self.classes)

    @property
    def options(self) -> dict:
        """option name -> the method that has it."""
        return {o: m for m, c in self.classes.items() for o in c.model_fields if o != "name"}


#: the training methods (:class:`Methods`), filled by stability.config.train
METHODS_KNOWN = Methods()


def _walk(cls: type, loc: tuple) -> tuple[str, Optional[str], Any, tuple]:
    """(config class name, field name or None, FieldInfo or None, the rest of loc) of a pydantic error location."""
    name, info = None, None
    loc = tuple(loc)
    while loc:
        key = loc[0]
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or key not in cls.model_fields:
            break
        info = cls.model_fields[key]
        name = key
        loc = loc[1:]
        tp = unwrap(info.annotation)
        if isinstance(tp, type) and issubclass(tp, BaseModel) and loc:
            cls, name, info = tp, None, None
        elif typing.get_origin(tp) is Union and loc and loc[0] in METHODS_KNOWN.classes:
            cls, name, info, loc = METHODS_KNOWN.classes[loc[0]], None, None, loc[1:]
        else:
            break
    owner = getattr(cls, "owner_name", None) or getattr(cls, "__name__", str(cls))
    return owner, name, info, loc


_EXPECTED = {"int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
             "bool_type": "true or false", "bool_parsing": "true or false", "float_type": "a number",
             "float_parsing": "a number", "finite_number": "a finite number", "string_type": "a string",
             "tuple_type": "a list", "list_type": "a list", "model_type": "a table of options",
             "model_attributes_type": "a table of options", "dict_type": "a table of options",
             "none_required": "null"}
_RANGES = ("greater_than", "greater_than_equal", "less_than_equal", "less_than")


def _models(tp: Any) -> list:
    """The model classes an annotation may hold (through Optional, Union, list, tuple, dict values)."""
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _models(typing.get_args(tp)[0])
    if origin in (Union, list, tuple, dict) or str(origin) == "types.UnionType":
        args = typing.get_args(tp)[1:] if origin is dict else typing.get_args(tp)
        return [m for a in args for m in _models(a)]
    return [tp] if isinstance(tp, type) and issubclass(tp, BaseModel) else []


def _path(cls: type, loc: tuple, data: Any) -> tuple[str, Optional[type], Any]:
    """A path-style location (``claim 'id'.a.norm[0]``, ``analysis.val.samples``): the keys from the root, a list
    item by its ``id`` where it has one, else its index; the model class reached at its end (None past a model)
    and the FieldInfo when ``loc`` ends at a field. Keys that are neither fields nor dict keys (pydantic's
    union-member tags) are skipped."""
    parts: list[str] = []
    node, info = data, None
    current: Optional[type] = cls
    in_dict = False
    for key in loc:
        if in_dict:  # a key of a table of models (a split of the record's analysis)
            parts.append(str(key))
            node, info, in_dict = node.get(key) if isinstance(node, dict) else None, None, False
            continue
        if isinstance(key, int):
            item = node[key] if isinstance(node, list) and 0 <= key < len(node) else None
            ident = item.get("id") if isinstance(item, dict) else None
            if parts:
                parts[-1] += f" {ident!r}" if isinstance(ident, str) else f"[{key}]"
            node, info = item, None
            continue
        if current is None or key not in current.model_fields:
            continue
        parts.append(str(key))
        info = current.model_fields[key]
        tp = unwrap(info.annotation)
        in_dict = typing.get_origin(tp) is dict
        models = _models(tp)
        current = models[0] if models else None
        node = node.get(key) if isinstance(node, dict) else None
    return ".".join(parts), current, info


def _place(cls: type, loc: tuple, data: Any) -> tuple[str, Any]:
    """(where, FieldInfo or None) of an error location in ``cls``'s style (``_Config.error_style``)."""
    if getattr(cls, "error_style", "owner") == "path":
        where, _, info = _path(cls, loc, data)
        return where, info
    owner, name, info, _ = _walk(cls, loc)
    return (f"{owner}.{name}" if name else owner), info


def _at(where: str, text: str) -> str:
    return f"{where}: {text}" if where else text


def message(cls: type, exc: ValidationError, data: Any = None) -> str:
    """The first error of ``exc`` as one line ``where: what is wrong; what is allowed`` (where: ``Class.field`` or,
    for a path-style model, the path from its root)."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    kind, value, ctx = first["type"], first.get("input"), first.get("ctx") or {}
    if isinstance(ctx.get("error"), ConfigError):  # a validator's ConfigError names its own place
        return str(ctx["error"])
    if kind == "extra_forbidden":
        return _unknown_message(cls, errors, data)
    where, info = _place(cls, tuple(first["loc"]), data)
    if kind == "value_error" and "error" in ctx:
        return _at(where, str(ctx["error"]))
    if kind == "missing":
        return _at(where, "missing")
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        got = ctx.get("tag", None)
        what = f"{got!r} is not allowed" if kind == "union_tag_invalid" else "the method table needs a name"
        return f"TrainConfig.method: {what}; allowed: {', '.join(METHODS_KNOWN.names)}"
    if kind == "literal_error" or kind in _EXPECTED:
        return _value_message(cls, errors, data, where, info)
    if kind == "greater_than" and "gt" in ctx and (info is None or limits(info).keys() <= {"gt"}):
        return f"{where}: {value!r} must be greater than {ctx['gt']}"
    if kind in _RANGES and info is not None:
        lim = limits(info)
        lo = ("(", lim["gt"]) if "gt" in lim else ("[", lim.get("ge", "-inf"))
        hi = (lim["lt"], ")") if "lt" in lim else (lim.get("le", "inf"), "]")
        return f"{where}: {value!r} is outside {lo[0]}{lo[1]}, {hi[0]}{hi[1]}"
    if kind in _RANGES or kind in ("too_short", "too_long", "string_pattern_mismatch"):
        return f"{where}: {value!r}: {first['msg'].lower()}"
    return _at(where, first["msg"])


def _value_message(cls: type, errors: list, data: Any, where: str, info: Any) -> str:
    """A value of the wrong kind, or not among the allowed ones: every alternative of a union that failed at the
    same place is named (``a number or 'lowest', 'middle' or 'highest'``)."""
    first = errors[0]
    kind, value = first["type"], first.get("input")
    same = [e for e in errors if _place(cls, tuple(e["loc"]), data)[0] == where]
    if kind == "literal_error" and info is not None:
        allowed = typing.get_args(unwrap(info.annotation))
        if allowed and all(isinstance(a, (str, int, float)) for a in allowed):
            return f"{where}: {value!r} is not allowed; allowed: {', '.join(map(str, allowed))}"
    options = [(e.get("ctx") or {}).get("expected", "?") if e["type"] == "literal_error" else _EXPECTED[e["type"]]
               for e in same if e["type"] == "literal_error" or e["type"] in _EXPECTED]
    if "a number" in options:  # an int-or-float value: a number
        options = [o for o in options if o != "an integer"]
        kind = "float_type" if options == ["a number"] else kind
    if kind == "literal_error" or len(set(options)) > 1:
        return f"{where}: {value!r} is not allowed; allowed: {' or '.join(dict.fromkeys(options))}"
    if where == "TrainConfig.method" and isinstance(value, str) and value in METHODS_KNOWN.classes:
        return (f"TrainConfig.method: expected a table of options, got {value!r}: a method is a table with its "
                f"name and options, {{\"name\": \"{value}\", ...}} (TOML: [train.method] name = \"{value}\")")
    return f"{where}: expected {_EXPECTED[kind]}, got {value!r}"


def _unknown_message(cls: type, errors: list, data: Any) -> str:
    """Unknown keys of one table: ``Owner: unknown key(s) a, b; allowed: ...`` (a method's option given where it
    does not belong: the line that says where it goes)."""
    parent = tuple(errors[0]["loc"][:-1])
    unknown = sorted(str(e["loc"][-1]) for e in errors if e["type"] == "extra_forbidden"
                     and tuple(e["loc"][:-1]) == parent)
    if getattr(cls, "error_style", "owner") == "path":
        where, target, _ = _path(cls, parent, data)
        allowed = ", ".join(target.model_fields) if target is not None else "?"
        return _at(where, f"unknown key(s) {', '.join(unknown)}; allowed: {allowed}")
    target = _walk_class(cls, parent)
    allowed = list(target.model_fields) if target is not None else []
    owner = getattr(target, "__name__", cls.__name__)
    misplaced = method_option_message(unknown[0], target)
    if misplaced:
        return misplaced
    if target in METHODS_KNOWN.classes.values():
        owner = f"TrainConfig.method ({target.model_fields['name'].default})"
    return f"{owner}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"


def method_option_message(key: str, table: Optional[type]) -> Optional[str]:
    """The one line for a method's option given where it does not belong: beside the other train options
    (``table`` TrainConfig), or in the table of another method; None for any other key."""
    owner = METHODS_KNOWN.options.get(key)
    if owner is None:
        return None
    if table is METHODS_KNOWN.table:
        return (f"TrainConfig.{key}: an option of the {owner} method; it goes in the method table "
                f"({{\"name\": \"{owner}\", \"{key}\": ...}}; TOML: [train.method] name = \"{owner}\")")
    if table in METHODS_KNOWN.classes.values() and key not in table.model_fields:
        name = table.model_fields["name"].default
        return f"TrainConfig.{key}: only the {owner} method uses it, not {name} (choose method {owner} to set it)"
    return None


def _walk_class(cls: type, loc: tuple) -> Optional[type]:
    """The config class at ``loc`` (a section, a method block)."""
    for key in loc:
        if key in METHODS_KNOWN.classes and cls is METHODS_KNOWN.table:
            cls = METHODS_KNOWN.classes[key]
            continue
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)) or key not in cls.model_fields:
            return None
        tp = unwrap(cls.model_fields[key].annotation)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            cls = tp
        elif key == "method":
            continue
        else:
            return None
    return cls
