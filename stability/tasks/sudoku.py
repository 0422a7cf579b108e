"""Sudoku (App. B.1.1): fill in a 9×9 grid.

Encoding (as in the paper's release; docs/data.md): input one-hot over 10 channels (0 = blank, 1–9 = digit), 10
output classes (the digit; class 0 is never a target), a 9×9 board with 2-D positions; loss and accuracy over all
81 cells.

Sources, in order:

* ``TaskConfig.data_path``: Sapient's sudoku-extreme CSVs (columns source, question, answer, rating; blanks '.'
  or '0'): a folder holding ``train.csv`` and ``test.csv``, or the path of ``train.csv`` with ``test.csv`` beside
  it. The cut is the 80th percentile of the train file's ratings (38 for the real file) unless
  ``TaskConfig.sudoku_cut`` is set; train then val are the first rows of the train file rated below it, hard the
  first rows of the test file rated at or above it, in file order, except that val skips any puzzle that is also
  in train (val never holds a training input; ``describe()["val_repeats_dropped"]`` counts the skipped rows when
  there are any). A single other CSV serves as both files.
  The split is cached, so the 3.8M rows are read once.
* the cache: a dataset built by ``stability data make --task sudoku`` (:mod:`stability.tasks.sudoku_generate`:
  random minimal puzzles below the cut, puzzles made hard on purpose at or above it; val again skips train's
  puzzles, :func:`stability.tasks.cache.load_generated`);
* otherwise a small offline set generated now, with a one-line message.
"""

from __future__ import annotations

import itertools
import os
import sys
from typing import Optional

import numpy as np
import torch

from stability.errors import DataError
from stability.tasks import cache
from stability.tasks.base import SPLITS, ArrayTask
from stability.tasks.splits import split_stream
from stability.tasks.sudoku_solver import is_valid_solution

PAPER_SIZES = {"train": 40000, "val": 10000, "hard": 10000}
PERCENTILE = 80


def one_hot(puzzles: np.ndarray) -> np.ndarray:
    """(N, 81) boards (0 = blank) → (N, 9, 9, 10) float32 one-hot inputs."""
    puzzles = np.asarray(puzzles, dtype=np.int64).reshape(-1, 81)
    return np.eye(10, dtype=np.float32)[puzzles].reshape(-1, 9, 9, 10)


# ---- the sudoku-extreme CSVs ----------------------------------------------------------------------------------
def _open(path: str):
    try:
        return open(path, encoding="utf-8", newline="")
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None


def _columns(first_line: str, path: str) -> tuple[dict, bool]:
    """Column indices of question, answer, rating, and whether the first line is a header."""
    fields = [f.strip() for f in first_line.rstrip("\r\n").split(",")]
    if "question" in fields and "answer" in fields and "rating" in fields:
        return {k: fields.index(k) for k in ("question", "answer", "rating")}, True
    if len(fields) == 4:
        return {"question": 1, "answer": 2, "rating": 3}, False
    raise DataError(f"{path}: not a sudoku-extreme CSV (expected columns source, question, answer, rating)")


def read_ratings(path: str) -> tuple[np.ndarray, int]:
    """Every rating of a sudoku-extreme CSV (the last column), fast; returns (ratings, rows with a bad rating)."""
    ratings, bad = [], 0
    with _open(path) as f:
        first = f.readline()
        cols, header = _columns(first, path)
        lines = f if header else itertools.chain([first], f)
        for line in lines:
            if not line.strip():
                continue
            fields = line.rstrip("\r\n").split(",")
            try:
                ratings.append(int(fields[cols["rating"]]))
            except (ValueError, IndexError):
                bad += 1
    return np.array(ratings, dtype=np.int64), bad


def _parse_row(fields: list[str], cols: dict) -> tuple[np.ndarray, np.ndarray, int]:
    if len(fields) <= max(cols.values()):
        raise ValueError("wrong number of columns")
    q, a = fields[cols["question"]].strip(), fields[cols["answer"]].strip()
    rating = int(fields[cols["rating"]])
    if len(q) != 81 or any(ch not in ".0123456789" for ch in q):
        raise ValueError("bad question")
    if len(a) != 81 or any(ch not in "123456789" for ch in a):
        raise ValueError("bad answer")
    puzzle = np.array([0 if ch == "." else int(ch) for ch in q], np.uint8)
    solution = np.array([int(ch) for ch in a], np.uint8)
    if not is_valid_solution(puzzle, solution):
        raise ValueError("answer does not solve the question")
    return puzzle, solution, rating


def iter_rows(path: str, keep, malformed: dict, counter: Optional[dict] = None):
    """Yield (puzzle, solution, rating) for every valid row whose rating satisfies ``keep``, in file order;
    malformed rows are counted in ``malformed`` (reason -> count) and skipped; ``counter["read"]`` counts the
    rows read."""
    counter = {} if counter is None else counter
    counter.setdefault("read", 0)
    with _open(path) as f:
        first = f.readline()
        cols, header = _columns(first, path)
        lines = f if header else itertools.chain([first], f)
        for line in lines:
            if not line.strip():
                continue
            counter["read"] += 1
            fields = line.rstrip("\r\n").split(",")
            try:
                rating = int(fields[cols["rating"]])
            except (ValueError, IndexError):
                malformed["bad rating"] = malformed.get("bad rating", 0) + 1
                continue
            if not keep(rating):
                continue
            try:
                yield _parse_row(fields, cols)
            except ValueError as exc:
                malformed[str(exc)] = malformed.get(str(exc), 0) + 1


def _stack(rows: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    shape = (-1, 81)
    return (np.array([p for p, _, _ in rows], np.uint8).reshape(shape),
            np.array([s for _, s, _ in rows], np.uint8).reshape(shape), np.array([r for _, _, r in rows], np.float32))


def read_rows(path: str, keep, count: int, malformed: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """The first ``count`` valid rows whose rating satisfies ``keep``, in file order; malformed rows are counted
    in ``malformed`` (reason -> count) and skipped. Returns (puzzles, solutions, ratings, rows read)."""
    counter: dict = {}
    rows = list(itertools.islice(iter_rows(path, keep, malformed, counter), count)) if count > 0 else []
    return (*_stack(rows), counter.get("read", 0))


def sudoku_extreme_files(path: str) -> tuple[str, str]:
    """(train file, test file) named by ``data_path``."""
    if os.path.isdir(path):
        train, test = os.path.join(path, "train.csv"), os.path.join(path, "test.csv")
        missing = [p for p in (train, test) if not os.path.isfile(p)]
        if missing:
            raise DataError(f"{path} should hold train.csv and test.csv (sudoku-extreme); missing {missing[0]}")
        return train, test
    if not os.path.isfile(path):
        raise DataError(f"sudoku data path {path} does not exist")
    sibling = os.path.join(os.path.dirname(path), "test.csv")
    if os.path.basename(path) == "train.csv" and os.path.isfile(sibling):
        return path, sibling
    return path, path


def read_sudoku_extreme(path: str, sizes: dict, cut: Optional[float] = None) -> tuple[dict, dict]:
    """The paper's splits from sudoku-extreme: (arrays {"<split>/<key>"}, meta with the cut and malformed rows)."""
    train_file, test_file = sudoku_extreme_files(path)
    malformed: dict[str, int] = {}
    if cut is None:
        ratings, bad = read_ratings(train_file)
        if not len(ratings):
            raise DataError(f"{train_file}: no rows with a rating")
        cut = float(np.percentile(ratings, PERCENTILE))
    counter: dict = {}
    easy = ((row[0].tobytes(), row) for row in iter_rows(train_file, lambda x: x < cut, malformed, counter))
    train, val, dropped = split_stream(easy, sizes["train"], sizes["val"])
    read_train = counter.get("read", 0)
    hp, hs, hr, read_test = read_rows(test_file, lambda x: x >= cut, sizes["hard"], malformed)
    arrays = {}
    for split, rows in (("train", train), ("val", val)):
        p, s, r = _stack(rows)
        arrays.update({f"{split}/puzzles": p, f"{split}/solutions": s, f"{split}/rating": r})
    arrays.update({"hard/puzzles": hp, "hard/solutions": hs, "hard/rating": hr})
    for split in SPLITS:
        if not len(arrays[f"{split}/puzzles"]):
            side = "below" if split != "hard" else "at or above"
            raise DataError(f"{path}: no usable rows {side} the cut {cut:g} for the {split} split "
                            f"({sum(malformed.values())} malformed rows)")
    return arrays, {"cut": cut, "malformed": malformed, "files": [train_file, test_file],
                    "rows_read": read_train + read_test, "val_repeats_dropped": dropped}


# ---- the task -------------------------------------------------------------------------------------------------
class Sudoku(ArrayTask):
    """Sudoku: one-hot 9×9×10 boards → the digit of every cell (App. B.1.1)."""

    name = "sudoku"
    options = ("data_path", "cache_dir", "sudoku_cut")
    in_channels = 10
    out_channels = 10
    spatial_ndim = 2
    attention_window = None
    paper_sizes = PAPER_SIZES

    def _load_real(self) -> dict:
        c = self.config
        sizes = self.sizes()
        train_file, test_file = sudoku_extreme_files(c.data_path)
        st = os.stat(test_file)
        params = {**sizes, "cut": c.sudoku_cut, "test": [os.path.abspath(test_file), st.st_size, st.st_mtime_ns]}
        arrays, meta = cache.cached_real_split(
            self.name, train_file, params,
            lambda: read_sudoku_extreme(c.data_path, sizes, c.sudoku_cut), c)
        if meta["malformed"]:
            detail = "; ".join(f"{n} {why}" for why, n in sorted(meta["malformed"].items()))
            print(f"stability: skipped {sum(meta['malformed'].values())} malformed row(s) of {c.data_path}: "
                  f"{detail}", file=sys.stderr)
        short = [f"{s} {len(arrays[f'{s}/puzzles'])} of {sizes[s]}" for s in SPLITS
                 if len(arrays[f"{s}/puzzles"]) < sizes[s]]
        if short:
            print(f"stability: {c.data_path} holds fewer rows than asked: {', '.join(short)}", file=sys.stderr)
        self._info = {"source": f"sudoku-extreme CSV {c.data_path}", "cut": meta["cut"],
                      "malformed": meta["malformed"]}
        if meta.get("val_repeats_dropped"):
            self._info["val_repeats_dropped"] = meta["val_repeats_dropped"]
        return arrays

    def _build(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        puzzles = self.arrays[f"{split}/puzzles"]
        solutions = self.arrays[f"{split}/solutions"].astype(np.int64).reshape(-1, 9, 9)
        return torch.from_numpy(one_hot(puzzles)), torch.from_numpy(solutions)

    def describe(self) -> dict:
        arrays = self.arrays
        out = {"task": self.name, **self._info, "splits": {}}
        for split in SPLITS:
            rating = arrays[f"{split}/rating"]
            out["splits"][split] = {"size": int(len(rating)), **cache.rating_stats(rating)}
        return out
