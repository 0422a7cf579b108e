"""The ``stability`` command line: argument parsing only; each command calls library functions of the rooms.

Every command lives in :mod:`stability.commands` (one module a command, listed in :data:`COMMANDS`), exposing
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Errors the toolkit raises (:class:`~stability.errors.StabilityError`) become one line on stderr and exit 2.
The commands that compute (:data:`PINNABLE`) take ``--reproducible``: the command reruns itself in a fresh process
with every CPU kernel choice pinned (:mod:`stability.hardware`), so that its numbers are the same bits on any x86-64
machine with the same library versions.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from stability import __version__, hardware, threads
from stability.errors import EXIT_TERMINATED, StabilityError, Terminated

#: every command, from one place: name -> its module in :mod:`stability.commands`
COMMANDS = {
    "demo": "stability.commands.demo",
    "train": "stability.commands.train",
    "analyze": "stability.commands.analyze",
    "verify": "stability.commands.verify",
    "figures": "stability.commands.figures",
    "data": "stability.commands.data",
    "sweep": "stability.commands.sweep",
    "tables": "stability.commands.tables",
    "halt": "stability.commands.halt",
    "import": "stability.commands.import_",
    "compare": "stability.commands.compare",
    "claims": "stability.commands.claims",
    "migrate": "stability.commands.migrate",
    "doctor": "stability.commands.doctor",
}


#: the commands whose numbers depend on kernel choices: they take ``--reproducible``
PINNABLE = ("demo", "train", "analyze", "halt", "sweep")


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (usage stays available through --help)."""

    def error(self, message: str):  # noqa: D102
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``only`` set, just that command's module is imported (fast start-up)."""
    parser = _Parser(prog="stability", description="Train looped transformers and test their fixed points.")
    parser.add_argument("--version", action="version", version=f"stability {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module_name in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(p)
        if name in PINNABLE:
            p.add_argument("--reproducible", action="store_true",
                           help="pin every CPU kernel choice (vector width, MKL's code path, oneDNN off, OpenBLAS's "
                                "kernels, libm's variants, one thread) so the numbers are the same bits on any x86-64 "
                                "machine with the same library versions; slower (README: Reproducibility)")
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    threads.apply()  # the OpenMP wait for a busy machine, before anything loads torch (stability/threads.py)
    top = argv is None  # the command line itself (re-executed when pinning), not a call from Python
    argv = sys.argv[1:] if argv is None else list(argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(first if first in COMMANDS and "-h" not in argv[:1] else None)
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    args._argv, args._top = argv, top
    if getattr(args, "reproducible", False) and not hardware.env_is_pinned():
        return hardware.run_pinned(argv, replace=top)
    hardware.apply_in_process()
    try:
        return int(args._run(args) or 0)
    except StabilityError as exc:
        print(f"stability {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `stability verify | head`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt as exc:
        if isinstance(exc, Terminated):  # SIGTERM during training (stability.train.loop.sigterm_unwinds)
            print(f"stability {args.command}: terminated", file=sys.stderr)
            return EXIT_TERMINATED
        print(f"stability {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
