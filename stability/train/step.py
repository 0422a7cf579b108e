"""One optimizer step of training: AdamW and its decay groups, the progressive loss, a method's batch function
(:data:`METHODS`: progressive, deep supervision, implicit) with its :class:`BatchContext`, the compiled step, the
divergence message, and the timing of one batch for the run's forecast."""

from __future__ import annotations

import copy
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from stability import hardware
from stability.config import TrainConfig
from stability.errors import DivergenceError
from stability.protocols import is_looped
from stability.tasks import Task
from stability.train.deep_supervision import deep_supervision_batch
from stability.train.forecast import TIMED_SAMPLES, expected_depth
from stability.train.implicit import implicit_batch
from stability.train.schedule import draw_depths


def decay_exempt(model: torch.nn.Module, rule: str) -> set:
    """Names of the parameters that escape weight decay (TrainConfig.decay_exempt; docs/release-differences.md).

    norms: every bias and norm gain (tensors of fewer than 2 dimensions). release: the same except the output
    head's RMSNorm gain, which the release decays (its name-based rule does not catch ``head.0.weight``)."""
    exempt = {n for n, p in model.named_parameters() if p.ndim < 2}
    head_norm = getattr(getattr(model, "head", None), "norm", None)
    if rule == "release" and isinstance(head_norm, torch.nn.Module):
        exempt -= {f"head.norm.{n}" for n, _ in head_norm.named_parameters()}
    return exempt


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW (App. B.1.2): weight decay on all parameters but those ``decay_exempt`` names (cfg.decay_exempt).
    torch's fused kernel (plain IEEE arithmetic, the same bits on any CPU when pinned), or with the ``mkl-vml``
    kernel set its foreach one (stability/hardware.py, "Kernel sets")."""
    exempt = decay_exempt(model, cfg.decay_exempt)
    decay = [p for n, p in model.named_parameters() if n not in exempt]
    no_decay = [p for n, p in model.named_parameters() if n in exempt]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    fused = hardware.kernels() == "ieee"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.adam_eps, fused=fused or None)


def progressive_loss(model, task: Task, inputs: torch.Tensor, targets: torch.Tensor, n: int, k: int,
                     alpha: float, iterations: int) -> torch.Tensor:
    """Progressive loss: n iterations without gradient from e, detach, k iterations with gradient
    (x0 recomputed with gradient); loss = (1 − α)·CE(output after T) + α·CE(output after n + k).

    With n = 0 the k iterations start from e itself, so gradient also reaches e (= x0 by default)."""
    x0 = model.embed(inputs)
    x = model.initial_state(x0)
    if n > 0:
        with torch.no_grad():
            for _ in range(n):
                x = model.step(x, x0)
        x = x.detach()
    for _ in range(k):
        x = model.step(x, x0)
    loss = task.loss(model.readout(x), targets)
    if alpha < 1.0:
        xT = model.initial_state(x0)
        for _ in range(iterations):
            xT = model.step(xT, x0)
        loss = (1.0 - alpha) * task.loss(model.readout(xT), targets) + alpha * loss
    return loss


def training_loss(model, task: Task, inputs, targets, cfg: TrainConfig, gen: torch.Generator) -> torch.Tensor:
    """The progressive loss of one batch with (n, k) drawn from ``gen``; the fixed-depth baseline is trained
    on its one output."""
    if not is_looped(model):
        return task.loss(model(inputs, 1)[0], targets)
    T = cfg.iterations
    n, k = draw_depths(T, gen)
    return progressive_loss(model, task, inputs, targets, n, k, cfg.method.alpha, T)


@dataclass
class BatchContext:
    """What a training method needs for one batch. ``model`` may be a compiled wrapper of ``params``."""

    model: object
    params: torch.nn.Module
    task: Task
    cfg: TrainConfig
    gen: torch.Generator
    optimizer: torch.optim.Optimizer
    autocast: Callable
    where: Callable[[str], str]
    stats: dict = field(default_factory=dict)  # per-epoch statistics a method keeps (name -> obj with summary())

    def optimize(self, loss: torch.Tensor) -> None:
        """One optimizer step on ``loss``: non-finite checks, gradient clipping, AdamW."""
        if not torch.isfinite(loss):
            raise DivergenceError(self.where("loss"))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params.parameters(), self.cfg.grad_clip)
        if not torch.isfinite(norm):
            raise DivergenceError(self.where("gradient"))
        self.optimizer.step()


def progressive_batch(ctx: BatchContext, inputs, targets) -> tuple[float, int]:
    """One optimizer step on the progressive loss; returns (loss, optimizer steps taken)."""
    with ctx.autocast():
        loss = training_loss(ctx.model, ctx.task, inputs, targets, ctx.cfg, ctx.gen)
    ctx.optimize(loss)
    return loss.item(), 1


#: training method -> batch function (ctx, inputs, targets) -> (mean loss, optimizer steps)
METHODS: dict[str, Callable] = {"progressive": progressive_batch, "deep-supervision": deep_supervision_batch,
                                "implicit": implicit_batch}


def train_batch(ctx: BatchContext, inputs, targets) -> tuple[float, int]:
    """One batch of the config's training method (:data:`METHODS`): (mean loss, optimizer steps taken)."""
    return METHODS[ctx.cfg.method.name](ctx, inputs, targets)


def time_batch(ctx, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Seconds one batch of ``ctx``'s method takes, timed on copies of its model and optimizer under a forked
    random state (the run is untouched): a warm-up batch, then the timed one, scaled to ``ctx.cfg.batch_size``
    samples; the progressive loss at :func:`expected_depth`."""
    cfg, device = ctx.cfg, inputs.device
    b = min(cfg.batch_size, TIMED_SAMPLES, inputs.shape[0])
    xb, yb = inputs[:b], targets[:b]
    params = copy.deepcopy(ctx.params)  # uncompiled: --compile's compilation is not counted
    c = BatchContext(model=params, params=params, task=ctx.task, cfg=cfg,
                     gen=torch.Generator().set_state(ctx.gen.get_state()), optimizer=make_optimizer(params, cfg),
                     autocast=ctx.autocast, where=ctx.where)

    def one(n: Optional[int] = None, k: Optional[int] = None) -> float:
        t0 = time.perf_counter()
        with suppress(DivergenceError):  # the copy's divergence is the run's to report, when it happens there
            if cfg.method.name == "progressive" and n is not None and is_looped(params):
                with c.autocast():
                    loss = progressive_loss(c.model, c.task, xb, yb, n, k, cfg.method.alpha, cfg.iterations)
                c.optimize(loss)
            else:
                train_batch(c, xb, yb)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    one(0, 1)  # warm-up: first-call allocations, lazy initialisation
    return one(*expected_depth(cfg.iterations)) * cfg.batch_size / b


def diverged(what: str, epoch: int, step: int, out: Path) -> str:
    """The one line of a run stopped by a non-finite ``what`` (loss, gradient) at ``epoch``, ``step``."""
    kept = f"the last good checkpoint {out} is kept" if out.exists() else "no checkpoint was written"
    return f"non-finite {what} at epoch {epoch + 1}, step {step + 1}: training stopped; {kept}"


class CompiledModel:
    """The model with ``step`` replaced by its torch.compile'd version (the release compiles the block): what
    ``train.compile = true`` trains; every other attribute and the call are the wrapped model's."""

    def __init__(self, model):
        self._model = model
        self.step = torch.compile(model.step, dynamic=False)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        return self._model(*args, **kwargs)
