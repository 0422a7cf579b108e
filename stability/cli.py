"""The ``stability`` command line: argument parsing only; each command calls one function of a room.

Each command lives in a module exposing ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Errors the toolkit raises (:class:`~stability.errors.StabilityError`) become one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys

COMMANDS = {
    "demo": "stability.demo",
    "train": "stability.train.command",
    "analyze": "stability.analysis.command",
    "verify": "stability.theory.verify_command",
    "figures": "stability.figures_command",
    "data": "stability.tasks.command",
    "sweep": "stability.sweep.command",
    "tables": "stability.sweep.tables_command",
    "halt": "stability.halting",
    "import": "stability.release_command",
    "compare": "stability.compare_command",
}


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


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (usage stays available through --help)."""

    def error(self, message: str):  # noqa: D102
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only`` set, just that command's module is imported (fast start-up)."""
    from stability import __version__

    parser = _Parser(prog="stability", description="Train looped transformers and test their fixed points.")
    parser.add_argument("--version", action="version", version=f"stability {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:  # a room not built yet: leave the command out
            if exc.name and module_name.startswith(exc.name):
                continue
            raise
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from stability.errors import StabilityError

    argv = sys.argv[1:] if argv is None else list(argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(first if first in COMMANDS and "-h" not in argv[:1] else None)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    try:
        return int(args._run(args) or 0)
    except StabilityError as exc:
        print(f"stability {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `stability verify | head`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"stability {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
