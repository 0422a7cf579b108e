"""The trainer: progressive loss (Bansal et al. 2022; App. B.1.2), AdamW, the release's LR schedule,
evaluation of accuracy against iteration count, and resumable, atomic checkpoints.

Deterministic on the CPU: the model is initialised from ``torch.manual_seed(seed)``; data order and the
progressive loss's (n, k) draws come from one ``torch.Generator`` whose state is checkpointed every epoch, so a
killed run resumed with ``resume=True`` ends with bitwise the same weights as an uninterrupted one.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from stability import __version__
from stability.atomic import write_text
from stability.config import RunConfig, TrainConfig, to_dict
from stability.errors import CheckpointError, ConfigError, DivergenceError
from stability.model import build_model
from stability.tasks import Task, make_task
from stability.train import checkpoint as ckpt
from stability.train.deep_supervision import deep_supervision_batch
from stability.train.implicit import implicit_batch

EpochCallback = Callable[[torch.nn.Module, Task, dict], None]


# ---- schedule, optimiser ------------------------------------------------------------------------
def lr_factor(epoch: int, cfg: TrainConfig) -> float:
    """LR multiplier for 0-based ``epoch``: warm-up 1 − exp(−(e+1)/10) for e < warmup_epochs, then 1;
    ×cooldown_factor from epoch ⌊cooldown_at · epochs⌋ on (epoch 60 of 100 in the paper)."""
    f = 1.0 - math.exp(-(epoch + 1) / 10.0) if epoch < cfg.warmup_epochs else 1.0
    if epoch >= int(cfg.cooldown_at * cfg.epochs):
        f *= cfg.cooldown_factor
    return f


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
    """AdamW (App. B.1.2): weight decay on all parameters but those ``decay_exempt`` names (cfg.decay_exempt)."""
    exempt = decay_exempt(model, cfg.decay_exempt)
    decay = [p for n, p in model.named_parameters() if n not in exempt]
    no_decay = [p for n, p in model.named_parameters() if n in exempt]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.adam_eps)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device cuda: no CUDA device is available here; use --device cpu")
    return torch.device(name)


# ---- losses -------------------------------------------------------------------------------------
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
    if model.recall == "fixed":
        return task.loss(model(inputs, 1)[0], targets)
    T = cfg.iterations
    n = int(torch.randint(0, T, (1,), generator=gen))
    k = int(torch.randint(1, T - n + 1, (1,), generator=gen))
    return progressive_loss(model, task, inputs, targets, n, k, cfg.alpha, T)


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
    return METHODS[ctx.cfg.method](ctx, inputs, targets)


# ---- evaluation ---------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, task: Task, split: str, iterations: int, *, batch_size: int = 1000,
             device: torch.device | str = "cpu", bf16: bool = False, limit: Optional[int] = None) -> dict:
    """Whole-answer and per-position accuracy after every iteration 1..``iterations`` on ``split``.

    Returns {split, n, iterations: [1..T], accuracy: [...], position_accuracy: [...]}. The states are never
    stored, so T = 500 on 512-bit inputs costs memory for one batch only."""
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
    try:
        for i in range(0, N, batch_size):
            xb, yb = inputs[i:i + batch_size].to(device), targets[i:i + batch_size].to(device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
                if model.recall == "fixed":
                    c, p = task.score(model(xb, 1)[0].float(), yb)
                    correct += c.sum().item()
                    positions += p.sum().item()
                    continue
                for t, x in enumerate(model.trajectory(xb, iterations)):
                    c, p = task.score(model.readout(x).float(), yb)
                    correct[t] += c.sum().item()
                    positions[t] += p.sum().item()
    finally:
        model.attention_impl = impl
        model.train(was_training)
    return {
        "split": split,
        "n": N,
        "iterations": list(range(1, iterations + 1)),
        "accuracy": (correct / N).tolist(),
        "position_accuracy": (positions / N).tolist(),
    }


# ---- the run ------------------------------------------------------------------------------------
@dataclass
class TrainResult:
    path: Path
    epochs: int
    history: list
    final: Optional[dict]


def metrics_path(path: Path) -> Path:
    """The JSONL metrics file beside a checkpoint: run.pt -> run.metrics.jsonl."""
    return path.with_name(path.stem + ".metrics.jsonl")


def _write_metrics(path: Path, history: list, final: Optional[dict]) -> None:
    lines = [json.dumps(rec) for rec in history] + ([json.dumps({"final": final})] if final is not None else [])
    write_text(path, "".join(line + "\n" for line in lines))


def _rng_state(gen: torch.Generator) -> dict:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "data": gen.get_state(),
    }


def _set_rng_state(state: dict, gen: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    gen.set_state(state["data"])


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(msg, file=sys.stderr, flush=True)


def train(config: RunConfig, out: Path | str, *, resume: bool = False, progress: bool = True,
          callbacks: tuple[EpochCallback, ...] = ()) -> TrainResult:
    """Train ``config`` and write the checkpoint ``out`` after every epoch (atomically).

    ``resume=True`` continues from ``out`` if it exists (its config must equal ``config``). A non-finite loss
    or gradient raises DivergenceError and leaves the last good checkpoint in place. ``callbacks`` are called
    after each epoch with (model, task, record) and may add entries to the epoch's record.
    """
    out = Path(out)
    cfg = config.train
    device = resolve_device(cfg.device)
    use_bf16 = cfg.bf16 and device.type == "cuda"
    task = make_task(config.task)
    model_cfg = config.model.replace(**task.model_options())
    if model_cfg != config.model:
        config = config.replace(model=model_cfg)

    torch.manual_seed(cfg.seed)
    model = build_model(config.model).to(device)
    optimizer = make_optimizer(model, cfg)
    scaler = torch.amp.GradScaler(device.type, enabled=False)  # bf16 needs no loss scaling
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list = []
    final = None
    start_epoch, step = 0, 0

    if resume and out.exists():
        obj = ckpt.read(out)
        stored = ckpt.run_config(obj, out)
        if stored != config:
            diff = _config_diff(to_dict(stored), to_dict(config))
            raise ConfigError(f"--resume: {out} was trained with a different config ({diff})")
        model.load_state_dict(obj["model"])
        optimizer.load_state_dict(obj["optimizer"])
        scaler.load_state_dict(obj.get("scaler") or {})
        _set_rng_state(obj["rng"], gen)
        start_epoch, step = int(obj["epoch"]), int(obj["step"])
        history, final = list(obj["history"]), obj.get("final")
        _say(progress, f"resuming {out} at epoch {start_epoch}/{cfg.epochs}")
    elif out.exists() and not resume:
        raise CheckpointError(f"{out} exists; pass --resume to continue it or choose another --out")

    inputs, targets = task.dataset("train")
    inputs, targets = inputs.to(device), targets.to(device)
    N = inputs.shape[0]
    model.attention_impl = "sdpa"
    step_model = model
    if cfg.compile:
        step_model = _compiled(model)

    def save(epoch: int) -> None:
        ckpt.atomic_save({
            "format": ckpt.FORMAT,
            "schema_version": ckpt.SCHEMA_VERSION,
            "package_version": __version__,
            "torch_version": str(torch.__version__),
            "config": to_dict(config),
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(),
            "schedule": {"base_lr": cfg.lr, "epoch": epoch, "lr": cfg.lr * lr_factor(min(epoch, cfg.epochs - 1), cfg)},
            "scaler": scaler.state_dict(),
            "rng": _rng_state(gen),
            "epoch": epoch,
            "step": step,
            "history": history,
            "final": final,
        }, out)
        _write_metrics(metrics_path(out), history, final)

    if cfg.monitor_every and model.recall != "fixed":
        from stability.monitor import StabilityMonitor

        callbacks = (*callbacks, StabilityMonitor(task, every=cfg.monitor_every, samples=cfg.monitor_samples,
                                                  device=device))

    from tqdm.auto import tqdm

    bar = tqdm(range(start_epoch, cfg.epochs), initial=start_epoch, total=cfg.epochs, desc="epoch",
               disable=not progress, file=sys.stderr, dynamic_ncols=True)
    for epoch in bar:
        lr = cfg.lr * lr_factor(epoch, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        model.train()
        t0 = time.perf_counter()
        perm = torch.randperm(N, generator=gen).to(device)
        total, count = 0.0, 0
        for i in range(0, N, cfg.batch_size):
            idx = perm[i:i + cfg.batch_size]
            ctx = BatchContext(model=step_model, params=model, task=task, cfg=cfg, gen=gen, optimizer=optimizer,
                               autocast=lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16,
                                                               enabled=use_bf16),
                               where=lambda what, _e=epoch, _s=step: _diverged(what, _e, _s, out))
            loss_value, steps = train_batch(ctx, inputs[idx], targets[idx])
            step += steps
            total += loss_value * idx.numel()
            count += idx.numel()
        seconds = time.perf_counter() - t0
        record = {"epoch": epoch + 1, "step": step, "loss": total / count, "lr": lr, "seconds": seconds,
                  "samples_per_s": count / seconds}
        if cfg.eval_every and (epoch + 1) % cfg.eval_every == 0 and epoch + 1 < cfg.epochs:
            record["eval"] = {s: _summary(evaluate(model, task, s, cfg.eval_iterations,
                                                   batch_size=cfg.eval_batch_size, device=device, bf16=use_bf16))
                              for s in ("val", "hard")}
        for cb in callbacks:
            cb(model, task, record)
        history.append(record)
        bar.set_postfix(loss=f"{record['loss']:.4f}", lr=f"{lr:.2e}")
        save(epoch + 1)
    bar.close()

    if final is None:
        final = {s: evaluate(model, task, s, cfg.test_iterations, batch_size=cfg.eval_batch_size, device=device,
                             bf16=use_bf16) for s in ("val", "hard")}
        save(cfg.epochs)
    return TrainResult(path=out, epochs=cfg.epochs, history=history, final=final)


def _summary(ev: dict) -> dict:
    acc = ev["accuracy"]
    return {"iterations": len(acc), "accuracy_last": acc[-1], "accuracy_best": max(acc),
            "accuracy": acc}


def _diverged(what: str, epoch: int, step: int, out: Path) -> str:
    kept = f"the last good checkpoint {out} is kept" if out.exists() else "no checkpoint was written"
    return f"non-finite {what} at epoch {epoch + 1}, step {step + 1}: training stopped; {kept}"


def _config_diff(a: dict, b: dict, prefix: str = "") -> str:
    diffs = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            sub = _config_diff(va, vb, f"{prefix}{k}.")
            if sub:
                diffs.append(sub)
        elif va != vb:
            diffs.append(f"{prefix}{k}: checkpoint {va!r}, now {vb!r}")
    return "; ".join(diffs)


class _compiled:
    """The model with ``step`` replaced by its torch.compile'd version (the release compiles the block)."""

    def __init__(self, model):
        self._model = model
        self.step = torch.compile(model.step, dynamic=False)

    def __getattr__(self, name):
        return getattr(self._model, name)

    def __call__(self, *args, **kwargs):
        return self._model(*args, **kwargs)
