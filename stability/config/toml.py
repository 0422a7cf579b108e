"""A run file's TOML tables: each section's options, unknown keys and misplaced method options refused in one line;
reading a TOML file."""

from __future__ import annotations

from typing import Any

from stability.config.messages import method_option_message
from stability.config.train import OPTION_METHOD, SECTIONS, TrainConfig
from stability.errors import ConfigError


#: the keys of a method table (``[train.method]``): its name and the options of the methods
METHOD_KEYS = ("name", *OPTION_METHOD)


def option_names(section: str) -> list[str]:
    """The keys of a section in a TOML file: the schema's fields (``train.method`` is a table: :data:`METHOD_KEYS`)."""
    return list(SECTIONS[section].model_fields)


def section_options(section: str, table: Any, where: str) -> dict:
    """The options of one TOML section, unknown keys refused (``where`` names the table in the error); a method's
    options live in the ``method`` table of ``train`` (``[train.method]``, with its ``name``)."""
    if section not in SECTIONS:
        raise ConfigError(f"{where}: unknown section {section!r}; allowed: {', '.join(SECTIONS)}")
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: expected a table of options")
    options = dict(table)
    if section == "train":
        misplaced = next((m for m in (method_option_message(k, TrainConfig) for k in options) if m), None)
        if misplaced:
            raise ConfigError(f"{where}: {misplaced}")
    _unknown(where, options, option_names(section))
    if section == "train" and "method" in options:
        if not isinstance(options["method"], dict):
            raise ConfigError(f"{where}.method: expected a table (name = \"...\" and the method's options), got "
                              f"{options['method']!r}")
        _unknown(f"{where}.method", options["method"], METHOD_KEYS)
    return options


def _unknown(where: str, data: dict, allowed) -> None:
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")


def parse_toml(path, where: str) -> dict:
    """The TOML file ``path`` as a dict; content that is not TOML text is one ConfigError line starting ``where``
    (run files here, grid files in stability/sweep/grid.py)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML ({exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{where}: not a text file") from None


def read_toml(path) -> dict:
    """A run file (``stability train --config run.toml``): tables ``[model]``, ``[task]``, ``[train]`` and
    ``[train.method]``, as ``{section: {option: value}}`` (``train``'s ``method`` a dict); one ConfigError line on
    bad content."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--config {path}: no such file" if not path.exists() else f"--config {path}: not a file")
    data = parse_toml(path, f"--config {path}")
    _unknown(f"--config {path}", data, SECTIONS)
    return {s: section_options(s, t, f"--config {path}: [{s}]") for s, t in data.items()}
