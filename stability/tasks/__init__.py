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


def make_task(config, *, check: bool = True):
    """The task named by ``config.name`` (a TaskConfig), ready to give its splits. ``check``: refuse (a one-line
    ConfigError) sizes the task cannot make (``Task.check``) now; loading a checkpoint passes False, so that an
    old checkpoint whose val could not be disjoint from train still loads (making that split then refuses)."""
    module, cls = TASKS[config.name].split(":")
    task = getattr(importlib.import_module(module), cls)(config)
    if check:
        task.check()
    return task


def __getattr__(name):
    if name in ("SPLITS", "Task"):
        from stability.tasks import base  # lazy: torch; TASKS imports without it

        return getattr(base, name)
    raise AttributeError(name)


__all__ = ["SPLITS", "TASKS", "Task", "make_task"]
