"""Training throughput (samples/s) of the paper's configuration on the device it runs on.

Paper configuration (App. B.1.2): width 256, 8 heads, MLP 1024, external recall, post-norm, batch 500,
progressive loss with T = 30 on 32-bit prefix sums. Because the progressive loss draws (n, k) at random, the
cost of a step varies; the benchmark fixes the seed and times the same steps for every variant, side by side
in one run: the math attention path against the fused one, and on CUDA float32 against bf16 autocast and
torch.compile.

    python benchmarks/train_throughput.py [--steps 20] [--device auto] [--batch-size 500]
"""

from __future__ import annotations

import argparse
import time

import torch

from stability.config import ModelConfig, TaskConfig, TrainConfig
from stability.model import build_model
from stability.tasks import make_task
from stability.train.loop import make_optimizer, resolve_device, training_loss


def _timed(one, device, steps: int, warmup: int, reseed=None) -> float:
    """Seconds of ``steps`` calls of ``one(i)`` after ``warmup`` untimed ones (warm-up, compilation, graph
    capture; then ``reseed()`` where given), the device synchronised at both ends."""
    for i in range(warmup):
        one(i)
    if reseed is not None:
        reseed()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        one(i)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def measure(device, *, impl: str, bf16: bool, compile_: bool, steps: int, batch: int, width: int,
            iterations: int = 30, warmup: int = 3) -> float:
    task = make_task(TaskConfig(train_size=batch * 4))
    cfg = TrainConfig(batch_size=batch, iterations=iterations)
    torch.manual_seed(0)
    model = build_model(ModelConfig(width=width, **task.model_options())).to(device)
    model.attention_impl = impl
    opt = make_optimizer(model, cfg)
    runner = model
    if compile_:
        from stability.train.loop import CompiledModel

        runner = CompiledModel(model)
    x, y = task.dataset("train")
    x, y = x.to(device), y.to(device)
    gen = torch.Generator().manual_seed(0)

    def one(i):
        sl = slice((i % 4) * batch, (i % 4 + 1) * batch)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = training_loss(runner, task, x[sl], y[sl], cfg, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    return steps * batch / _timed(one, device, steps, warmup, reseed=lambda: gen.manual_seed(1))


def flops_per_sample(device, *, width: int, iterations: int = 30, batch: int = 2) -> float:
    """Matrix FLOPs of one sample's training step through all ``iterations`` (forward and backward, n = 0,
    k = T: what the fixed ensemble step executes per member and sample, and the issue's "~5 GFLOP per sample"
    convention for the solo variants), counted by :class:`torch.utils.flop_counter.FlopCounterMode` at ``batch``."""
    from torch.utils.flop_counter import FlopCounterMode

    from stability.train.loop import progressive_loss

    task = make_task(TaskConfig(train_size=max(batch, 8)))
    torch.manual_seed(0)
    model = build_model(ModelConfig(width=width, **task.model_options())).to(device)
    model.attention_impl = "dense"
    x, y = task.dataset("train")
    with FlopCounterMode(display=False) as counter:
        progressive_loss(model, task, x[:batch].to(device), y[:batch].to(device), 0, iterations, 1.0,
                         iterations).backward()
    return counter.get_total_flops() / batch


def measure_ensemble(device, *, members: int, bf16: bool, compile_: bool, steps: int, batch: int, width: int,
                     iterations: int = 30, warmup: int = 3) -> float:
    """Samples/s (all members' samples) of a ``members``-member ensemble of the configuration above in the
    fixed-shape step (stability/train/fixed_step.py; ``compile_``: torch.compile, CUDA graphs on CUDA), each
    member's own draws, AdamW and clipping as ``stability train --seeds`` runs them."""
    import tempfile
    from pathlib import Path

    from stability.config import RunConfig
    from stability.train import ensemble, loop
    from stability.train.fixed_step import FixedStep

    config = RunConfig(model=ModelConfig(width=width), task=TaskConfig(train_size=batch * 4),
                       train=TrainConfig(batch_size=batch, iterations=iterations, device=str(device), bf16=bf16,
                                         compile=compile_))
    with tempfile.TemporaryDirectory() as tmp:
        runs = [loop._start(c, Path(tmp) / name, resume=False, progress=False)
                for name, c in ensemble.members(config, range(members))]
    for run in runs:
        run.model.attention_impl = "dense"
    step = FixedStep(runs, compile=compile_)
    x, y = runs[0].task.dataset("train")
    x, y = x.to(device), y.to(device)

    def one(i):
        sl = slice((i % 4) * batch, (i % 4 + 1) * batch)
        xb, yb = torch.stack([x[sl]] * members), torch.stack([y[sl]] * members)
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=runs[0].use_bf16):
            losses = step(runs, xb, yb, [ensemble._draw_depth(r) for r in runs])
        for run in runs:
            run.optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        for run in runs:
            torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
            run.optimizer.step()

    return steps * batch * members / _timed(one, device, steps, warmup)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = ap.parse_args()
    device = resolve_device(args.device)
    variants = [("math, fp32", "math", False, False), ("sdpa, fp32", "sdpa", False, False)]
    if device.type == "cuda":
        variants += [("sdpa, bf16", "sdpa", True, False), ("sdpa, bf16, compile", "sdpa", True, True)]
    name = torch.cuda.get_device_name() if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"device: {name}; width {args.width}, batch {args.batch_size}, T=30 progressive loss, {args.steps} steps")
    base = None
    for label, impl, bf16, comp in variants:
        sps = measure(device, impl=impl, bf16=bf16, compile_=comp, steps=args.steps, batch=args.batch_size,
                      width=args.width)
        base = base or sps
        print(f"{label:<24} {sps:10.1f} samples/s   {sps / base:5.2f}x")


if __name__ == "__main__":
    main()
