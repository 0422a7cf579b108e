"""Tasks: prefix sums, sudoku, chess. ``make_task(config)`` builds one from its TaskConfig.

``TASKS`` is importable without torch (the CLI lists it before anything heavy is loaded).
"""

from __future__ import annotations

import importlib

TASKS = {
    "prefix-sums": "stability.tasks.prefix_sums:PrefixSums",
    "sudoku": "stability.tasks.sudoku:Sudoku",
    "chess": "stability.tasks.chess:Chess",
}


def make_task(config):
    """The task named by ``config.name`` (a TaskConfig), ready to give its splits."""
    module, cls = TASKS[config.name].split(":")
    return getattr(importlib.import_module(module), cls)(config)


def __getattr__(name):
    if name in ("SPLITS", "Task"):
        from stability.tasks import base

        return getattr(base, name)
    raise AttributeError(name)


__all__ = ["SPLITS", "TASKS", "Task", "make_task"]
