"""Evaluation during and after training: accuracy against iteration count on a split (:func:`evaluate`, the
analysis' own accuracy-vs-iteration routine on the looped models), its estimated time, the per-epoch summary of
it, and the progress bars."""

from __future__ import annotations

import sys
import time
from typing import Optional

import torch

from stability.analysis.accuracy import accuracy_curve
from stability.analysis.fixed_point import FixedPoint
from stability.protocols import is_looped
from stability.tasks import Task


def progress_bar(progress, total: int, desc: str, unit: str, **kw):
    """A tqdm bar on stderr, disabled when ``progress`` is falsy."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, disable=not progress, file=sys.stderr, dynamic_ncols=True,
                leave=kw.pop("leave", False), **kw)


@torch.no_grad()
def estimate_eval_seconds(model, task: Task, split: str, iterations: int, *, batch_size: int = 1000,
                          device: torch.device | str = "cpu", bf16: bool = False) -> float:
    """Seconds :func:`evaluate` will take, extrapolated from timing two loop steps on one (smaller) batch."""
    device = torch.device(device)
    inputs, _ = task.dataset(split)
    N = inputs.shape[0]
    b = min(batch_size, N, 256)
    xb = inputs[:b].to(device)
    was_training = model.training
    model.eval()
    try:
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
            if not is_looped(model):
                t0 = time.perf_counter()
                model(xb, 1)
                return (time.perf_counter() - t0) * N / b
            x0 = model.embed(xb)
            x = model.step(model.initial_state(x0), x0)  # warm-up
            t0 = time.perf_counter()
            for _ in range(2):
                x = model.step(x, x0)
                model.readout(x)
            per_step = (time.perf_counter() - t0) / 2
    finally:
        model.train(was_training)
    return per_step * iterations * N / b


@torch.no_grad()
def evaluate(model, task: Task, split: str, iterations: int, *, batch_size: int = 1000,
             device: torch.device | str = "cpu", bf16: bool = False, limit: Optional[int] = None,
             progress: bool | str = False) -> dict:
    """Whole-answer and per-position accuracy after every iteration 1..``iterations`` on ``split``.

    Returns {split, n, iterations: [1..T], accuracy: [...], position_accuracy: [...]}. The states are never
    stored, so T = 500 on 512-bit inputs costs memory for one batch only. ``progress`` (True or a label) shows a
    bar over batches × iterations on stderr."""
    device = torch.device(device)
    inputs, targets = task.dataset(split)
    if limit is not None:
        inputs, targets = inputs[:limit], targets[:limit]
    N = inputs.shape[0]
    correct = torch.zeros(iterations, dtype=torch.float64)
    positions = torch.zeros(iterations, dtype=torch.float64)
    was_training, impl = model.training, model.attention_impl
    model.eval()
    model.attention_impl = "math" if getattr(task, "attention_window", None) else "sdpa"
    batches = -(-N // batch_size)
    steps = batches * (1 if not is_looped(model) else iterations)
    bar = progress_bar(progress, steps, f"{progress if isinstance(progress, str) else 'eval'} {split}", "it")

    def autocast():
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16)

    def looped_batches():  # x0 and e made per batch, under the same autocast as the iteration
        for i in range(0, N, batch_size):
            xb, yb = inputs[i:i + batch_size].to(device), targets[i:i + batch_size].to(device)
            with torch.no_grad(), autocast():
                fp = FixedPoint.of(model, xb)  # x0 and e as the analysis builds them (e as training draws it)
            yield fp.x0, fp.e, yb

    try:
        if is_looped(model):  # the analysis' own accuracy-vs-iteration routine
            curve = accuracy_curve(model, task, looped_batches(), iterations, context=autocast,
                                   on_step=lambda: bar.update(1))
            accuracy, position_accuracy = curve.accuracy, curve.position_accuracy
        else:
            for i in range(0, N, batch_size):
                xb, yb = inputs[i:i + batch_size].to(device), targets[i:i + batch_size].to(device)
                with autocast():
                    c, p = task.score(model(xb, 1)[0].float(), yb)
                correct += c.sum().item()
                positions += p.sum().item()
                bar.update(1)
            accuracy, position_accuracy = (correct / N).tolist(), (positions / N).tolist()
    finally:
        bar.close()
        model.attention_impl = impl
        model.train(was_training)
    return {
        "split": split,
        "n": N,
        "iterations": list(range(1, iterations + 1)),
        "accuracy": accuracy,
        "position_accuracy": position_accuracy,
    }


def summary(ev: dict) -> dict:
    """An epoch record's summary of an evaluation: the depth, the last and best accuracy, the curve."""
    acc = ev["accuracy"]
    return {"iterations": len(acc), "accuracy_last": acc[-1], "accuracy_best": max(acc),
            "accuracy": acc}
