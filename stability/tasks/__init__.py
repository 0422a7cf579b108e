"""Tasks: prefix sums, sudoku, chess. ``make_task(config)`` builds one from its TaskConfig."""

from __future__ import annotations

import importlib

from stability.config import TaskConfig
from stability.tasks.base import SPLITS, Task

TASKS = {
    "prefix-sums": "stability.tasks.prefix_sums:PrefixSums",
    "sudoku": "stability.tasks.sudoku:Sudoku",
    "chess": "stability.tasks.chess:Chess",
}


def make_task(config: TaskConfig) -> Task:
    """The task named by ``config.name``, ready to give its splits."""
    module, cls = TASKS[config.name].split(":")
    return getattr(importlib.import_module(module), cls)(config)


__all__ = ["SPLITS", "TASKS", "Task", "make_task"]
