"""Prefix sums (App. B.1.1; Bansal et al. 2022): N-bit strings, target = cumulative sum mod 2.

Inputs are coded in one channel as bit − 0.5 (so ±0.5, as in the paper's release), 2 output classes. Train/val
use ``train_length`` bits (8,000 / 2,000), hard uses ``hard_length`` bits (10,000). Generated from the seed, no
download.

How the splits are drawn (issue 27: a split called "val" never holds a training input). Each split has its own
generator (seed·1000 + split index, as before) and reads strings from it in order:

* train: the first ``train_size`` *distinct* strings of its stream (a repeat is skipped);
* val: the first ``val_size`` distinct strings of its stream that are not train strings;
* hard: ``hard_size`` strings of its stream, drawn with replacement as before; when ``hard_length`` equals
  ``train_length`` it also skips train and val strings.

So train and val are disjoint and each has no repeats by construction. There are only 2^train_length strings, so
``train_size + val_size`` must not exceed it: a config asking more is refused with a ConfigError (one line
naming the numbers and the shortest length that fits) when the task is made, before any training. The old
draw, with replacement, at 8 bits with 1,000 train strings covered 252 of the 256 strings, and 198 of 200 val
strings were training strings.

Where nothing collides a split is exactly the old draw (its stream starts with the same strings). At lengths of
~20 bits and more collisions are rare anyway (10,000 strings of 32 bits: about one chance in a hundred of a
single repeat), so the paper's splits (32-bit train/val, 512-bit hard) almost always stay as they were; the
rule changes short strings, where the old val was mostly training strings. Val now depends on train_size: which
strings it skips are the train strings. Changing val_size leaves train unchanged, and changing hard_size leaves
train and val unchanged.

Strings are compared as integers up to 62 bits and as packed bytes above, so long strings cost no more than a
set lookup each.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import torch

from stability.errors import ConfigError
from stability.tasks.base import SPLITS, Task

#: strings up to this many bits are compared as int64, longer ones as packed bytes
INT_KEY_BITS = 62
#: the fewest strings drawn at a time once the first batch (the split's size) left the split short
MIN_BATCH = 1024


def prefix_sums(bits: torch.Tensor) -> torch.Tensor:
    """Cumulative sum mod 2 along the last axis (the target of the task)."""
    return torch.cumsum(bits, dim=-1) % 2


def string_keys(bits: torch.Tensor) -> list:
    """One hashable key per row of a (N, L) 0/1 tensor: an int for L ≤ 62 bits, else the packed bytes."""
    arr = bits.numpy().astype(np.uint8, copy=False)
    length = arr.shape[1]
    if length <= INT_KEY_BITS:
        weights = np.left_shift(np.int64(1), np.arange(length, dtype=np.int64))
        return (arr.astype(np.int64) @ weights).tolist()
    packed = np.packbits(arr, axis=1)
    return [row.tobytes() for row in packed]


def draw_strings(gen: torch.Generator, n: int, length: int, *, distinct: bool, exclude: Optional[set] = None
                 ) -> tuple[torch.Tensor, list, int]:
    """The first ``n`` strings of ``gen``'s stream of ``length``-bit strings (rows of ``torch.randint(0, 2,
    (batch, length))``, the first batch ``n`` rows) that are not in ``exclude`` and, if ``distinct``, not
    repeats of one taken before. Returns (bits (n, length) int64, their keys, strings skipped). The caller makes
    sure enough strings exist."""
    exclude = exclude if exclude is not None else set()
    rows: list[torch.Tensor] = []
    keys: list = []
    taken: set = set()
    skipped, batch, first = 0, n, True
    while len(keys) < n:
        bits = torch.randint(0, 2, (batch, length), generator=gen, dtype=torch.int64)
        batch_keys = string_keys(bits)
        if first and not exclude.intersection(batch_keys) and (not distinct or len(set(batch_keys)) == n):
            return bits, batch_keys, 0  # the usual case at long lengths: nothing to skip
        first = False
        keep = []
        for i, key in enumerate(batch_keys):
            if len(keys) == n:
                break
            if key in exclude or (distinct and key in taken):
                skipped += 1
                continue
            keep.append(i)
            keys.append(key)
            if distinct:
                taken.add(key)
        rows.append(bits[torch.tensor(keep, dtype=torch.int64)])
        batch = max(n - len(keys), MIN_BATCH)
    return torch.cat(rows), keys, skipped


def shortest_length(strings: int) -> int:
    """The fewest bits with at least ``strings`` distinct strings."""
    return max(1, (strings - 1).bit_length())


class PrefixSums(Task):
    name = "prefix-sums"
    in_channels = 1
    out_channels = 2
    spatial_ndim = 1
    attention_window = 5  # non-causal local window (App. B.1.2)
    options = ("train_length", "hard_length")

    def __init__(self, config):
        super().__init__(config)
        self._keys: dict[str, list] = {}
        self._skipped: dict[str, int] = {}

    def check(self) -> None:
        """A ConfigError (one line) if train and val cannot be disjoint sets of distinct strings, or no hard
        string is left beside them at the same length."""
        c = self.config
        need, there = c.train_size + c.val_size, 2 ** c.train_length
        if need > there:
            raise ConfigError(
                f"prefix sums: train_size {c.train_size} + val_size {c.val_size} = {need} distinct strings do not "
                f"fit in the {there} strings of train_length {c.train_length} bits (val never holds a training "
                f"string); use train_length {shortest_length(need)} or more, or fewer samples")
        if c.hard_length == c.train_length and need == there:
            raise ConfigError(
                f"prefix sums: train_size {c.train_size} + val_size {c.val_size} take all {there} strings of "
                f"{c.train_length} bits, leaving none for the hard split of the same length; use fewer samples or "
                f"another hard_length")

    def _size_and_length(self, split: str) -> tuple[int, int]:
        c = self.config
        return {
            "train": (c.train_size, c.train_length),
            "val": (c.val_size, c.train_length),
            "hard": (c.hard_size, c.hard_length),
        }[split]

    def _bits(self, split: str) -> torch.Tensor:
        n, length = self._size_and_length(split)
        gen = torch.Generator().manual_seed(self.config.seed * 1000 + SPLITS.index(split))
        if split == "train":
            exclude, distinct = set(), True
        elif split == "val":
            self.dataset("train")
            exclude, distinct = set(self._keys["train"]), True
        elif length == self.config.train_length:  # hard at the train length: none of train's or val's strings
            self.dataset("train"), self.dataset("val")
            exclude, distinct = set(self._keys["train"]) | set(self._keys["val"]), False
        else:  # hard as before: with replacement, nothing to skip
            return torch.randint(0, 2, (n, length), generator=gen, dtype=torch.int64)
        bits, keys, skipped = draw_strings(gen, n, length, distinct=distinct, exclude=exclude)
        self._keys[split], self._skipped[split] = keys, skipped
        return bits

    def _build(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        if split != "hard" or self.config.hard_length == self.config.train_length:
            self.check()  # a task made without the check (an old checkpoint's) still refuses to make such splits
        bits = self._bits(split)
        inputs = (bits.to(torch.float32) - 0.5).unsqueeze(-1)
        return inputs, prefix_sums(bits)

    def describe(self) -> dict:
        out = {"task": self.name, "source": f"generated (seed {self.config.seed})",
               "sampling": "train and val: distinct strings, val none of train's", "splits": {}}
        for split in SPLITS:
            n, length = self._size_and_length(split)
            out["splits"][split] = {"size": n, "bits": length}
        return out
