"""How many members one batched step can hold: the ensemble's size from the device's memory (issue 37, "the
ensemble size chosen from the device's memory; say what limits it").

A member of the fixed-shape step (:mod:`stability.train.fixed_step`, the one that needs most) holds

* its state, **computed**: 6 × its parameter bytes: the parameters, their gradients, AdamW's two moments, and the
  stacked copy of the parameters the batched step reads with its gradient;
* its activations, **measured** by one probe forward on the device: the bytes autograd saves for the backward pass
  of the progressive loss through all T iterations (the fixed step keeps every iteration's, for every member),
  counted by :func:`torch.autograd.graph.saved_tensors_hooks` at a small batch and scaled linearly to the batch
  size (they are batch × iterations × tokens × width × a few per layer, under the run's autocast), plus one
  iteration's worth for the backward pass's transient gradients.

What limits K is therefore the activations: batch × T × tokens × width (the state of a width-256 member is a few
MB; its activations at batch 500, T = 30, 32 tokens are GBs). :func:`free_bytes` is the device's free memory
(``torch.cuda.mem_get_info`` on CUDA; on the CPU the available memory, psutil's or /proc/meminfo's
MemAvailable), of which :data:`USABLE` is used; K_max = ⌊usable / per member⌋, at least 1. More members than that
train in chunks of K_max, one ensemble after another (:func:`chunks`), each member's checkpoint the one an ensemble
of its chunk writes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from stability.config import RunConfig
from stability.model import build_model
from stability.protocols import is_looped
from stability.tasks import make_task
from stability.train.step import progressive_loss

#: the fraction of the free memory an ensemble plans to use (the rest: the allocator's fragmentation, evaluation)
USABLE = 0.8
#: samples of the probe forward (activations scale linearly with the batch)
PROBE_SAMPLES = 8


@dataclass
class MemoryPlan:
    """Bytes of one member (``state`` + ``activations``), the device's free bytes and the members that fit."""

    state: int
    activations: int
    free: int
    k_max: int

    @property
    def per_member(self) -> int:
        return self.state + self.activations


def free_bytes(device: torch.device) -> int:
    """The device's free memory in bytes: ``torch.cuda.mem_get_info`` on CUDA, the available memory on the CPU
    (psutil, else /proc/meminfo's MemAvailable)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    raise RuntimeError("the CPU's available memory is unknown (no psutil, no /proc/meminfo)")


def saved_bytes(model, task, inputs: torch.Tensor, targets: torch.Tensor, cfg) -> int:
    """Bytes autograd saves for the backward pass of the progressive loss through all ``cfg.iterations`` iterations
    (n = 0, k = T: the fixed step's graph of one member), the parameters' own storage not counted."""

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    T = cfg.iterations
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if is_looped(model):
            progressive_loss(model, task, inputs, targets, 0, T, cfg.method.alpha, T)
        else:
            task.loss(model(inputs, 1)[0], targets)
    return sum(seen.values())


def member_bytes(config: RunConfig, device: torch.device) -> tuple[int, int]:
    """(state, activations) bytes of one member of ``config`` on ``device`` (module docstring): a probe model
    built under a forked generator (the caller's random state is untouched), one forward at :data:`PROBE_SAMPLES`
    samples under the run's autocast."""

    cfg = config.train
    task = make_task(config.task)
    bf16 = cfg.bf16 and device.type == "cuda"
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        model = build_model(config.model.replace(**task.model_options())).to(device)
        model.attention_impl = "dense"  # the members' attention
        x, y = task.dataset("train")
        b = min(PROBE_SAMPLES, cfg.batch_size, x.shape[0])
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
            saved = saved_bytes(model, task, x[:b].to(device), y[:b].to(device), cfg)
    state = 6 * sum(p.numel() * p.element_size() for p in model.parameters())
    iterations = max(1, cfg.iterations * (2 if cfg.method.alpha < 1.0 else 1))
    activations = saved * (1.0 + 1.0 / iterations) * cfg.batch_size / b
    return state, int(math.ceil(activations))


def plan(config: RunConfig, device: torch.device, free: Optional[int] = None) -> MemoryPlan:
    """K_max for ``config``'s members on ``device``: ⌊:data:`USABLE` × free / per member⌋, at least 1 (``free``:
    the device's free bytes, :func:`free_bytes` when None)."""
    state, activations = member_bytes(config, device)
    free = free_bytes(device) if free is None else int(free)
    return MemoryPlan(state, activations, free, max(1, int(USABLE * free) // (state + activations)))


def chunks(count: int, size: int) -> list[list[int]]:
    """Member indices in consecutive chunks of at most ``size`` (the last the smallest)."""
    size = max(1, int(size))
    return [list(range(i, min(i + size, count))) for i in range(0, count, size)]
