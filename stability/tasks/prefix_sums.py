"""Prefix sums (App. B.1.1; Bansal et al. 2022): N-bit strings, target = cumulative sum mod 2.

Inputs are coded in one channel as bit − 0.5 (so ±0.5, as in the paper's release), 2 output classes. Train/val
use ``train_length`` bits (8,000 / 2,000), hard uses ``hard_length`` bits (10,000). Generated from the seed, no
download. Each split draws from its own generator (seed, split index), so changing one split's size leaves the
others unchanged.
"""

from __future__ import annotations

import torch

from stability.tasks.base import SPLITS, Task


def prefix_sums(bits: torch.Tensor) -> torch.Tensor:
    """Cumulative sum mod 2 along the last axis (the target of the task)."""
    return torch.cumsum(bits, dim=-1) % 2


class PrefixSums(Task):
    name = "prefix-sums"
    in_channels = 1
    out_channels = 2
    spatial_ndim = 1
    attention_window = 5  # non-causal local window (App. B.1.2)
    options = ("train_length", "hard_length")

    def _size_and_length(self, split: str) -> tuple[int, int]:
        c = self.config
        return {
            "train": (c.train_size, c.train_length),
            "val": (c.val_size, c.train_length),
            "hard": (c.hard_size, c.hard_length),
        }[split]

    def _build(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        n, length = self._size_and_length(split)
        gen = torch.Generator().manual_seed(self.config.seed * 1000 + SPLITS.index(split))
        bits = torch.randint(0, 2, (n, length), generator=gen, dtype=torch.int64)
        inputs = (bits.to(torch.float32) - 0.5).unsqueeze(-1)
        return inputs, prefix_sums(bits)

    def describe(self) -> dict:
        out = {"task": self.name, "source": f"generated (seed {self.config.seed})", "splits": {}}
        for split in SPLITS:
            n, length = self._size_and_length(split)
            out["splits"][split] = {"size": n, "bits": length}
        return out
