"""The commands of ``stability``: one module a command, each exposing ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``, and calling library functions of the rooms.

:data:`stability.cli.COMMANDS` lists them; :func:`stability.cli.main` dispatches. Only this package and
``stability/cli.py`` import argparse (tests/house/test_layout.py).
"""
