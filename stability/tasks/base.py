"""The task interface: data as tensors laid out (batch, *spatial, channels), and how answers are scored.

A task turns a :class:`~stability.config.TaskConfig` into three fixed-order splits (train, val, hard; val never
holds a training input: every task makes it disjoint from train, :mod:`stability.tasks.splits`):
``dataset(split) -> (inputs, targets)`` with ``inputs`` float32 of shape (N, *spatial, in_channels) and
``targets`` int64 of shape (N, *spatial) holding a class per position. A sample counts as correct only if
every position is right (App. B.5: "total" accuracy).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

import torch
import torch.nn.functional as F

from stability.config import TaskConfig
from stability.errors import ConfigError
from stability.tasks import cache

SPLITS = ("train", "val", "hard")


class Task(ABC):
    """Base class. Subclasses set the class attributes and implement :meth:`_build`."""

    name: str = ""
    in_channels: int = 1
    out_channels: int = 2
    spatial_ndim: int = 1
    attention_window: Optional[int] = None  # None = full bidirectional attention
    #: TaskConfig fields this task reads beyond the common ones (name, sizes, seed); the others must stay at
    #: their defaults, so that no option is silently ignored
    options: tuple[str, ...] = ()
    COMMON = ("name", "train_size", "val_size", "hard_size", "seed")

    def __init__(self, config: TaskConfig):
        if config.name != self.name:
            raise ConfigError(f"task config names {config.name!r}, not {self.name!r}")
        ignored = [name for name, f in type(config).model_fields.items() if name not in self.COMMON + self.options
                   and getattr(config, name) != f.default]
        if ignored:
            raise ConfigError(f"the {self.name} task does not use {', '.join(ignored)}; leave "
                              f"{'it' if len(ignored) == 1 else 'them'} unset (it uses "
                              f"{', '.join(self.options) or 'no task-specific options'})")
        self.config = config
        self._cache: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    # ---- data -------------------------------------------------------------------------------------
    def dataset(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of ``split`` ∈ {train, val, hard}, always in the same order."""
        if split not in SPLITS:
            raise ConfigError(f"unknown split {split!r}; allowed: {', '.join(SPLITS)}")
        if split not in self._cache:
            self._cache[split] = self._build(split)
        return self._cache[split]

    def check(self) -> None:
        """Raise a ConfigError (one line) if the config asks for splits the task cannot make (prefix sums: more
        distinct strings than there are). :func:`stability.tasks.make_task` calls it, so a run fails before any
        work; tasks made without it (an old checkpoint's) refuse when the split is made."""

    @abstractmethod
    def _build(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Make or load one split (called once per split and cached in memory)."""

    def describe(self) -> dict:
        """Sizes and provenance of the data, for reports (``stability data info``, analyze's header)."""
        return {"task": self.name}

    def model_options(self) -> dict:
        """The ModelConfig fields the task decides."""
        return {
            "in_channels": self.in_channels,
            "out_channels": self.out_channels,
            "spatial_ndim": self.spatial_ndim,
            "attention_window": self.attention_window,
        }

    # ---- scoring ----------------------------------------------------------------------------------
    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over every position. logits: (B, *spatial, out_channels)."""
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    def predict(self, logits: torch.Tensor) -> torch.Tensor:
        """Predicted class per position, (B, *spatial)."""
        return logits.argmax(-1)

    def score(self, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(correct, position_accuracy), both (B,): whole-answer correctness and the share of right positions."""
        right = (self.predict(logits) == targets).reshape(targets.shape[0], -1)
        return right.all(dim=1), right.float().mean(dim=1)


class ArrayTask(Task):
    """A task whose splits come as one dict of numpy arrays keyed "split/name", loaded once: from the real file
    ``config.data_path`` (:meth:`_load_real`) or else from the generated-dataset cache
    (:func:`stability.tasks.cache.load_generated`, which also falls back to the packaged or a freshly built
    small set). ``_info`` describes the source for :meth:`describe`."""

    def __init__(self, config: TaskConfig):
        super().__init__(config)
        self._arrays: Optional[dict] = None
        self._info: dict = {}

    def sizes(self) -> dict[str, int]:
        c = self.config
        return {"train": c.train_size, "val": c.val_size, "hard": c.hard_size}

    @property
    def arrays(self) -> dict:
        if self._arrays is None:
            if self.config.data_path:
                self._arrays = self._load_real()
            else:
                self._arrays, self._info = cache.load_generated(self.name, self.config, self.sizes())
        return self._arrays

    @abstractmethod
    def _load_real(self) -> dict:
        """Read ``config.data_path`` into the arrays dict (and set ``_info``)."""
