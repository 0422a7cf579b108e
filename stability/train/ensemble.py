"""Ensembles: the K members of one architecture (seeds × learning rates) trained in one process, one batched step.

``stability train --seeds 0-4 [--lrs 1e-3,2.5e-3] --out DIR`` writes one ordinary checkpoint per member,
``DIR/s{seed}.pt`` (``DIR/lr{rate}-s{seed}.pt`` with ``--lrs``, the rate as the sweep's grid writes it), each the
checkpoint its solo run would write plus an ``ensemble`` note (the members, this one's index).

Each member is a solo run's state (:class:`stability.train.loop._Run`): its model initialised from
``torch.manual_seed(seed)``, its own data generator (so its data order and its progressive loss's (n, k) draws are
its solo run's), its learning-rate schedule, its own AdamW (its state exactly a solo run's) and its gradient clipping.
Only the forward and backward pass are shared: the members' parameters are stacked and the progressive loss is
evaluated under :func:`torch.vmap` with :func:`torch.func.functional_call`; the members' losses are summed, so each
member's gradient is its own loss's. Members draw different depths (n, k): the batched loop runs to the deepest
member, and a member outside its gradient window keeps its state (``torch.where``), detached during its first n
iterations, exactly as the solo loss computes it.

Not bitwise a solo run: the batched matrix products reduce in other shapes, so losses agree to float32 rounding at
first and drift apart slowly (benchmarks/RESULTS.md, "Ensembles" measures how far). In reproducible mode an ensemble
run is deterministic per machine, and a killed ensemble resumed with ``--resume`` ends with bitwise the weights of
an uninterrupted one (when every member had written the same epoch; a member behind the others is trained on with
the members at its epoch until it catches up, which is a different batch shape).

:func:`train_members` is the trainer itself, given each member's checkpoint path and config: ``stability sweep
--ensemble auto`` trains a group of a grid's cells through it (members that differ in ``task.seed`` as well, each
on its own training set), each into its own cell's checkpoint.

Two batched steps (``--ensemble-step``): the subset step above (:func:`batched_losses`, the CPU's default) and the
fixed-shape step (:mod:`stability.train.fixed_step`: every member through all T iterations, masked, one shape every
batch; CUDA's default, and what ``--compile`` compiles, with CUDA graphs on CUDA). Both give each member its solo
loss's gradient (on the CPU the same bits: tests/train/test_fixed_step.py).

Stays solo: deep supervision and implicit training (per-sample halting and solver iterations make a batched step
unnatural), ``--compile`` with ``--ensemble-step subsets``, and the ``noise`` initial state (drawn from the global
generator each batch).
"""

from __future__ import annotations

import functools
import re
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from stability import hardware
from stability.atomic import check_writable
from stability.config import RunConfig, resolve_device, short_number
from stability.errors import ConfigError, DivergenceError
from stability.protocols import is_looped
from stability.train import ensemble_memory, loop, split
from stability.train.batchable import solo_reason
from stability.train.fixed_step import FixedStep, _Call, resolve_step, stack_state
from stability.train.loop import TrainResult, _Run, evaluate, lr_factor
from stability.train.monitor import StabilityMonitor

#: the most members one ensemble may have
MAX_MEMBERS = 256


def parse_seeds(text: str) -> list[int]:
    """``0-4`` -> [0, 1, 2, 3, 4]; ``0,2,7``; ``0-2,9``. One ConfigError line for anything else."""
    seeds: list[int] = []
    for part in str(text).split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise ConfigError(f"--seeds {text!r}: expected seeds like 0-4 or 0,2,7 (non-negative integers)")
        a, b = int(m.group(1)), int(m.group(2)) if m.group(2) is not None else int(m.group(1))
        if b < a:
            raise ConfigError(f"--seeds {text!r}: the range {a}-{b} is empty (write it low-high, e.g. {b}-{a})")
        seeds += range(a, b + 1)
        if len(seeds) > MAX_MEMBERS:
            raise ConfigError(f"--seeds {text!r}: more than {MAX_MEMBERS} seeds")
    if len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds {text!r}: a seed is given twice")
    return seeds


def parse_lrs(text: str) -> list[float]:
    """``1e-3,2.5e-3`` -> [0.001, 0.0025]; one ConfigError line for anything else."""
    out = []
    for part in str(text).split(","):
        try:
            v = float(part)
        except ValueError:
            raise ConfigError(f"--lrs {text!r}: expected learning rates like 1e-3,2.5e-3") from None
        if not (v > 0 and v < float("inf")):
            raise ConfigError(f"--lrs {text!r}: a learning rate must be positive and finite, got {part.strip()}")
        out.append(v)
    if len(set(out)) != len(out):
        raise ConfigError(f"--lrs {text!r}: a rate is given twice")
    return out


def member_name(seed: int, lr: Optional[float] = None) -> str:
    """The member's file name: ``s3.pt``, or ``lr2.5e-3-s3.pt`` (the rate as the sweep's grid writes it)."""
    if lr is None:
        return f"s{seed}.pt"
    return f"lr{short_number(float(lr))}-s{seed}.pt"


def members(config: RunConfig, seeds: Sequence[int],
            lrs: Optional[Sequence[float]] = None) -> list[tuple[str, RunConfig]]:
    """(file name, config) of every member: learning rates outer, seeds inner."""
    out = []
    for lr in (lrs if lrs else [None]):
        for seed in seeds:
            train = config.train.replace(seed=int(seed), **({"lr": float(lr)} if lr is not None else {}))
            out.append((member_name(seed, lr), config.replace(train=train)))
    return out


def check_ensemble(config: RunConfig, step: str = "auto") -> None:
    """Refuse (one line) what the batched ``step`` does not cover (:func:`~stability.train.batchable.solo_reason`)."""
    reason = solo_reason(config, step)
    if reason is not None:
        raise ConfigError(f"--seeds with {reason}; train each seed with its own `stability train`, or use "
                          "`stability sweep`")


def batched_losses(runs: Sequence[_Run], inputs: torch.Tensor, targets: torch.Tensor,
                   depths: Sequence[tuple[int, int]]) -> torch.Tensor:
    """The members' progressive losses, shape (K,): ``inputs``/``targets`` (K, B, ...), ``depths`` the members'
    (n, k). The members' parameters are stacked here (per call), so gradients reach each member's own.

    Each iteration t runs, under :func:`torch.vmap`, once without gradient for the members still in their first n
    iterations and once with gradient for those in their k; a member past n + k keeps its state. So every member
    computes what its solo loss computes (:func:`stability.train.loop.progressive_loss`), and no more."""
    model, task, cfg = runs[0].model, runs[0].task, runs[0].config.train
    K, device = len(runs), inputs.device
    params, buffers = stack_state(runs)
    wrapper = _Call(model)
    everyone = list(range(K))

    def call(sub: list[int], fn, *args):
        """``fn(model, *args)`` of the members ``sub`` (args already theirs, stacked), vmapped."""
        if len(sub) == K:
            p, b = params, buffers
        else:
            index = torch.tensor(sub, device=device)
            p = {k: v.index_select(0, index) for k, v in params.items()}
            b = {k: v.index_select(0, index) for k, v in buffers.items()}

        def one(p, b, *a):
            return torch.func.functional_call(wrapper, (p, b), (lambda m: fn(m, *a),))

        return torch.vmap(one)(p, b, *args)

    losses = torch.vmap(task.loss)
    if not is_looped(model):
        return losses(call(everyone, lambda m, i: m(i, 1)[0], inputs), targets)
    step = lambda m, x, x0: m.step(x, x0)  # noqa: E731
    x0 = call(everyone, lambda m, i: m.embed(i), inputs)
    x = call(everyone, lambda m, e: m.initial_state(e), x0)
    for t in range(max(n + k for n, k in depths)):
        frozen = [i for i, (n, _) in enumerate(depths) if t < n]
        active = [i for i, (n, k) in enumerate(depths) if n <= t < n + k]
        if frozen:
            with torch.no_grad():
                index = torch.tensor(frozen, device=device)
                xf = call(frozen, step, x.index_select(0, index), x0.index_select(0, index))
            x = xf if len(frozen) == K else x.index_put((index,), xf)
        if active:
            if len(active) == K:
                x = call(everyone, step, x, x0)
            else:
                index = torch.tensor(active, device=device)
                x = x.index_put((index,), call(active, step, x.index_select(0, index), x0.index_select(0, index)))
    loss = losses(call(everyone, lambda m, s: m.readout(s), x), targets)
    alpha = cfg.method.alpha
    if alpha < 1.0:
        xT = call(everyone, lambda m, e: m.initial_state(e), x0)
        for _ in range(cfg.iterations):
            xT = call(everyone, step, xT, x0)
        loss = (1.0 - alpha) * losses(call(everyone, lambda m, s: m.readout(s), xT), targets) + alpha * loss
    return loss


def _draw_depth(run: _Run) -> tuple[int, int]:
    """(n, k) from the member's generator, as :func:`stability.train.loop.training_loss` draws them."""
    if not is_looped(run.model):
        return 0, 1
    T = run.config.train.iterations
    n = int(torch.randint(0, T, (1,), generator=run.gen))
    k = int(torch.randint(1, T - n + 1, (1,), generator=run.gen))
    return n, k


def _diverged(run: _Run, what: str, epoch: int) -> DivergenceError:
    """The member's DivergenceError, its checkpoint path as ``member`` (the sweep goes on without it)."""
    exc = DivergenceError(loop._diverged(what, epoch, run.step, run.out))
    exc.member = run.out
    return exc


def _ensemble_epoch(runs: list[_Run], epoch: int, inputs: list, targets: list, bar,
                    losses_of=batched_losses) -> list[dict]:
    """One epoch of the members in ``runs`` (all at ``epoch``), batched, each on its own training set
    (``inputs[i]``, ``targets[i]``: the same tensors where the members' data are the same), their losses by
    ``losses_of`` (the subset step :func:`batched_losses` or a :class:`~stability.train.fixed_step.FixedStep`);
    their records (without evaluations)."""
    cfg0, device = runs[0].config.train, runs[0].device
    N = inputs[0].shape[0]
    lrs = []
    for run in runs:
        lr = run.config.train.lr * lr_factor(epoch, run.config.train)
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        run.model.train()
        lrs.append(lr)
    t0 = time.perf_counter()
    perms = [torch.randperm(N, generator=run.gen).to(device) for run in runs]
    totals, count = [0.0] * len(runs), 0
    for i in range(0, N, cfg0.batch_size):
        idx = [p[i:i + cfg0.batch_size] for p in perms]
        xb = torch.stack([x[j] for x, j in zip(inputs, idx)])
        yb = torch.stack([y[j] for y, j in zip(targets, idx)])
        depths = [_draw_depth(run) for run in runs]
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=runs[0].use_bf16):
            losses = losses_of(runs, xb, yb, depths)
        values = losses.detach().tolist()
        for run, v in zip(runs, values):
            if not torch.isfinite(torch.tensor(v)):
                raise _diverged(run, "loss", epoch)
            run.optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        for run in runs:
            norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), run.config.train.grad_clip)
            if not torch.isfinite(norm):
                raise _diverged(run, "gradient", epoch)
        for run in runs:
            run.optimizer.step()
            run.step += 1
        b = idx[0].numel()
        totals = [t + v * b for t, v in zip(totals, values)]
        count += b
        bar.update(1)
        bar.set_postfix_str(f"epoch {epoch + 1}/{cfg0.epochs}, {len(runs)} members, mean loss "
                            f"{sum(totals) / len(totals) / count:.4f}", refresh=False)
    seconds = time.perf_counter() - t0
    return [{"epoch": epoch + 1, "step": run.step, "loss": total / count, "lr": lr, "seconds": seconds,
             "samples_per_s": count / seconds} for run, total, lr in zip(runs, totals, lrs)]


def _evaluations(run: _Run, record: dict, epoch: int, progress: bool) -> None:
    """The evaluations a solo run's epoch record has (training fit, periodic val/hard), added to ``record``."""
    cfg, model, task, device, bf16 = run.config.train, run.model, run.task, run.device, run.use_bf16
    if cfg.train_accuracy_samples:
        fit = evaluate(model, task, "train", cfg.iterations, limit=cfg.train_accuracy_samples,
                       batch_size=cfg.eval_batch_size, device=device, bf16=bf16)
        record["train_accuracy"] = fit["accuracy"][-1]
    if cfg.eval_every and (epoch + 1) % cfg.eval_every == 0 and epoch + 1 < cfg.epochs:
        record["eval"] = {s: loop._summary(evaluate(model, task, s, cfg.eval_iterations, batch_size=cfg.eval_batch_size,
                                                    device=device, bf16=bf16,
                                                    progress=progress and f"{run.out.name} epoch {epoch + 1} eval"))
                          for s in ("val", "hard")}


def check_outputs(out_dir: Path | str, names: Sequence[str]) -> Path:
    """Refuse (one line) an ``--out`` that is not a directory that can be written, or member files that cannot."""
    out_dir = check_writable(out_dir, "dir", "--out")
    for name in names:
        path = out_dir / name
        for p in (path, loop.metrics_path(path), loop.csv_path(path), loop.accuracy_csv_path(path)):
            check_writable(p, "file", "checkpoint" if p == path else "metrics file")
    return out_dir


def train_ensemble(config: RunConfig, out_dir: Path | str, seeds: Sequence[int], lrs: Optional[Sequence[float]] = None,
                   *, resume: bool = False, progress: bool = True, processes: int = 1,
                   step: str = "auto", max_members: Optional[int] = None) -> list[TrainResult]:
    """Train the ensemble's members (:func:`members`) into ``out_dir`` in one batched step; one ordinary checkpoint
    per member, written after every epoch. ``resume`` continues each member from its checkpoint (as a solo
    ``--resume`` does; a larger ``config.train.epochs`` extends them). ``processes`` > 1: the members split across
    that many processes, each one batched step (:mod:`stability.train.split`). ``step``: ``--ensemble-step``
    (:func:`~stability.train.fixed_step.resolve_step`); ``max_members``: the most members in one batched step
    (None: from the device's memory; :func:`train_members`). Holds :func:`stability.train.loop.run_lock` on
    ``out_dir`` throughout."""
    check_ensemble(config, step)
    plan = members(config, seeds, lrs)
    out_dir = check_outputs(out_dir, [name for name, _ in plan])
    names = [name for name, _ in plan]
    notes = [{"members": names, "index": i, "seeds": [int(s) for s in seeds],
              "lrs": [float(r) for r in lrs] if lrs else None, "batched": True} for i in range(len(plan))]
    with loop.sigterm_unwinds(), loop.run_lock(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = [(out_dir / name, c) for name, c in plan]
        if processes > 1:
            if progress:
                split.log_line(names, processes, out_dir)
            return split.train_split(functools.partial(train_members, step=step, max_members=max_members), paths,
                                     notes, processes, resume=resume, progress=progress)
        if progress:
            print(f"ensemble: {len(plan)} members ({', '.join(names)}) in {out_dir}, one batched step",
                  file=sys.stderr, flush=True)
        return train_members(paths, notes, resume=resume, progress=progress, step=step, max_members=max_members)


def train_members(plan: Sequence[tuple[Path, RunConfig]], notes: Sequence[dict], *, resume: bool,
                  progress: bool, part: Optional[tuple[int, str]] = None, step: str = "auto",
                  max_members: Optional[int] = None) -> list[TrainResult]:
    """Train the members ``plan`` in batched steps of at most ``max_members`` members (None: K_max from the
    device's memory, :func:`stability.train.ensemble_memory.plan`), one chunk after another, each chunk by
    :func:`train_together` (whose arguments the rest are): each member's checkpoint is the one an ensemble of its
    chunk writes (its note still the whole ensemble's)."""
    size = len(plan)
    if len(plan) > 1:
        size = max_members if max_members is not None else _memory_chunk(plan[0][1], len(plan), progress)
    results: list[TrainResult] = []
    for idx in ensemble_memory.chunks(len(plan), size):
        results += train_together([plan[i] for i in idx], [notes[i] for i in idx], resume=resume,
                                  progress=progress, part=part, step=step)
    return results


def _memory_chunk(config: RunConfig, count: int, progress: bool) -> int:
    """K_max of ``config``'s members on its device (:mod:`stability.train.ensemble_memory`), said on stderr when
    the ``count`` members do not fit in one step."""
    device = resolve_device(config.train.device)
    mem = ensemble_memory.plan(config, device)
    if mem.k_max < count and progress:
        print(f"ensemble: {count} members do not fit in one batched step on {device} ({mem.per_member / 2**20:.0f} "
              f"MiB each, {mem.free / 2**20:.0f} MiB free): {-(-count // mem.k_max)} chunks of at most {mem.k_max}, "
              "one after another", file=sys.stderr, flush=True)
    return mem.k_max


def train_together(plan: Sequence[tuple[Path, RunConfig]], notes: Sequence[dict], *, resume: bool,
                   progress: bool, part: Optional[tuple[int, str]] = None, step: str = "auto") -> list[TrainResult]:
    """Train the members ``plan`` ((checkpoint path, config) each) in one batched step, each checkpoint carrying
    its ``notes[i]`` as its ``ensemble`` note. The members' configs may differ in seed, learning rate and data
    (``task.seed``: each member trains on its own training set), nothing that changes the model's shape. A
    member's divergence raises its DivergenceError (``.member``: its checkpoint path) with every member's last
    good checkpoint in place. The caller holds the locks. ``part`` (process j of a split ensemble, its label):
    the training bar on line j, named by the label; the evaluations' bars only in process 0 (one line each).
    ``step``: the subset step (:func:`batched_losses`) or the fixed-shape one (:class:`FixedStep`, compiled with
    ``train.compile``), ``auto`` resolved by :func:`~stability.train.fixed_step.resolve_step`."""
    runs: list[_Run] = []
    torch_states = []  # each member's global generator state, as its solo run leaves it after initialisation
    for (path, member_config), note in zip(plan, notes):
        run = loop._start(member_config, Path(path), resume=resume, progress=progress)
        run.ensemble, run.signature = dict(note), hardware.signature()
        torch_states.append(torch.get_rng_state())
        runs.append(run)
    shapes = {tuple((n, tuple(p.shape)) for n, p in r.model.named_parameters()) for r in runs}
    if len(shapes) != 1:
        raise ConfigError("--seeds: the members' models differ in shape; train them solo")
    data = _training_sets(runs)
    for run in runs:
        run.model.attention_impl = "dense"  # sdpa written out: torch.vmap has no batching rule for sdpa on the CPU
    monitors = [None] * len(runs)
    cfg, device = runs[0].config.train, runs[0].device
    if cfg.monitor_every and is_looped(runs[0].model):
        monitors = [StabilityMonitor(r.task, every=cfg.monitor_every, samples=cfg.monitor_samples, device=device)
                    for r in runs]

    def save(i: int, epoch: int) -> None:
        torch.set_rng_state(torch_states[i])  # the checkpoint's "rng" is the member's own
        runs[i].save(epoch)

    _train_runs(runs, data, monitors, save, progress, part or (0, "train"), _step_of(runs, step))
    return [TrainResult(path=r.out, epochs=cfg.epochs, history=r.history, final=r.final) for r in runs]


def _step_of(runs: Sequence[_Run], step: str):
    """The losses function of ``step`` for the members ``runs``: :func:`batched_losses` or a :class:`FixedStep`
    (compiled with ``train.compile``); a compiled subset step is refused in one line."""
    cfg = runs[0].config.train
    check_ensemble(runs[0].config, step)
    if resolve_step(step, runs[0].device, cfg.compile) == "subsets":
        return batched_losses
    return FixedStep(runs, compile=cfg.compile)


def _training_sets(runs: Sequence[_Run]) -> tuple[list, list]:
    """Each member's training inputs and targets on its device (one tensor shared by the members of one data)."""
    cache: dict = {}
    inputs, targets = [], []
    for run in runs:
        key = repr(run.config.task)
        if key not in cache:
            x, y = run.task.dataset("train")
            cache[key] = (x.to(run.device), y.to(run.device))
        inputs.append(cache[key][0])
        targets.append(cache[key][1])
    if len({x.shape for x in inputs}) != 1:
        raise ConfigError("--seeds: the members' training sets differ in size; train them solo")
    return inputs, targets


def _train_runs(runs: list[_Run], data: tuple[list, list], monitors: list, save, progress: bool,
                part: tuple[int, str], losses_of=batched_losses) -> None:
    """The epochs of the members from the earliest one's (a member behind catches up, one ahead waits), then each
    member's final evaluation; ``save(i, epoch)`` writes member i's checkpoint. ``part``: (line, label) of the
    training bar (:func:`train_members`); ``losses_of``: the step (:func:`_ensemble_epoch`)."""
    inputs, targets = data
    cfg = runs[0].config.train
    per_epoch = -(-inputs[0].shape[0] // cfg.batch_size)
    start = min(r.start_epoch for r in runs)
    bar = loop._bar(progress, cfg.epochs * per_epoch, part[1], "batch", initial=start * per_epoch, leave=True,
                    position=part[0])
    progress = progress and part[0] == 0  # the evaluations' bars: one process's (they would share line 0)
    try:
        for epoch in range(start, cfg.epochs):
            active = [i for i, r in enumerate(runs) if r.start_epoch <= epoch]  # a member behind catches up
            records = _ensemble_epoch([runs[i] for i in active], epoch, [inputs[i] for i in active],
                                      [targets[i] for i in active], bar, losses_of)
            for i, record in zip(active, records):
                _evaluations(runs[i], record, epoch, progress)
                if monitors[i] is not None:
                    monitors[i](runs[i].model, runs[i].task, record)
                runs[i].history.append(record)
                runs[i].start_epoch = epoch + 1
            for i in active:
                save(i, epoch + 1)
        bar.close()
        for i, run in enumerate(runs):
            if run.final is None:
                run.final = {s: evaluate(run.model, run.task, s, cfg.test_iterations, batch_size=cfg.eval_batch_size,
                                         device=run.device, bf16=run.use_bf16,
                                         progress=progress and f"{run.out.name} final eval")
                             for s in ("val", "hard")}
                save(i, cfg.epochs)
    finally:
        bar.close()
