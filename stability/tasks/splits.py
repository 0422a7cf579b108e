"""Train and val that share no input (issue 27): the rule every task keeps is that a split called "val" never
holds a training input.

* :class:`TrainVal` cuts one stream of rows (a real file's rows in file order) into train and val: train is the
  first ``n_train`` rows, val the rows after them whose input is not a train input, up to ``n_val``; a row of val
  repeating a train input is dropped (and counted), and the next row takes its place.
* :func:`disjoint_val` does the same for a val split read from its own stream (the generated datasets, whose
  splits are separate streams of shards): the first ``n_val`` rows of the val stream whose input is not a train
  input.

An input is compared by its bytes (a sudoku's 81 cells, a chess position's 64 canonical piece codes), so two
puzzles count as the same exactly when the model would see the same input.
"""

from __future__ import annotations

from typing import Callable, Hashable, Iterable, Optional

import numpy as np


def row_keys(inputs: np.ndarray) -> list[bytes]:
    """One hashable key per row of ``inputs`` (its bytes)."""
    inputs = np.ascontiguousarray(inputs)
    return [row.tobytes() for row in inputs.reshape(len(inputs), -1)]


class TrainVal:
    """Train then val from one stream of rows offered in order (see the module docstring).

    ``offer(key, row)`` while not :meth:`full`; :meth:`finish` returns (train rows, val rows, val rows dropped
    because their input is a train input). If the stream ran out first (a small file), every row offered is cut
    in the ratio ``n_train : n_val`` as before, and val then drops its repeats of train.
    """

    def __init__(self, n_train: int, n_val: int):
        self.n_train, self.n_val = int(n_train), int(n_val)
        self._offered: list[tuple[Hashable, object]] = []
        self._train_keys: set = set()
        self.train: list = []
        self.val: list = []
        self.dropped = 0

    def full(self) -> bool:
        return len(self.train) >= self.n_train and len(self.val) >= self.n_val

    def offer(self, key: Hashable, row) -> None:
        self._offered.append((key, row))
        if len(self.train) < self.n_train:
            self.train.append(row)
            self._train_keys.add(key)
        elif key in self._train_keys:
            self.dropped += 1
        elif len(self.val) < self.n_val:
            self.val.append(row)

    def finish(self) -> tuple[list, list, int]:
        if self.full() or not self._offered:
            return self.train, self.val, self.dropped
        # a small file: keep the train:val ratio over the rows there are
        n_train = round(len(self._offered) * self.n_train / (self.n_train + self.n_val))
        train = self._offered[:n_train]
        keys = {k for k, _ in train}
        val = [(k, r) for k, r in self._offered[n_train:] if k not in keys]
        return [r for _, r in train], [r for _, r in val], len(self._offered) - n_train - len(val)


def split_stream(rows: Iterable[tuple[Hashable, object]], n_train: int, n_val: int) -> tuple[list, list, int]:
    """:class:`TrainVal` over an iterable of (key, row), read only as far as needed."""
    tv = TrainVal(n_train, n_val)
    for key, row in rows:
        tv.offer(key, row)
        if tv.full():
            break
    return tv.finish()


def disjoint_val(train_inputs: np.ndarray, fetch: Callable[[int], dict], want: int, key: str,
                 limit: Optional[int] = None) -> tuple[dict, int]:
    """The first ``want`` rows of a val stream whose input (``fetch(rows)[key]``) is not one of ``train_inputs``,
    and how many rows of the stream were dropped before the last one kept. ``fetch(rows)`` gives the first
    ``rows`` rows of the stream (a dict of arrays with the row first); it is asked again for more rows while
    repeats leave val short, up to ``limit`` rows (None: no limit). Fewer than ``want`` rows come back only when
    the stream holds no more."""
    train = set(row_keys(train_inputs))
    rows = want
    while True:
        arrays = fetch(rows)
        got = len(arrays[key])
        keep = np.array([k not in train for k in row_keys(arrays[key])], dtype=bool)
        if keep.sum() >= want or got < rows or (limit is not None and rows >= limit):
            break
        rows = rows + (want - int(keep.sum()))
        if limit is not None:
            rows = min(rows, limit)
    index = np.flatnonzero(keep)[:want]
    dropped = int(index[-1] + 1 - len(index)) if len(index) == want else int((~keep).sum())
    return {k: v[index] for k, v in arrays.items()}, dropped
