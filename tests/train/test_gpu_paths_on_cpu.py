"""The GPU speed paths (bf16 autocast, torch.compile) run on the CPU too, so they are never untested here.

The torch.compile test is in the slow set (~60 s of Inductor compilation on a loaded 2-core machine, whatever the
model size): `python -m pytest -m slow` runs it, and so does CI.
"""

import pytest
import torch

from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
from stability.model import build_model
from stability.tasks import make_task
from stability.train.loop import CompiledModel, evaluate, progressive_loss

TASK = TaskConfig(train_size=16, val_size=8, hard_size=8, train_length=8, hard_length=12)


def test_progressive_loss_and_evaluation_run_under_bf16_autocast():
    torch.manual_seed(0)
    task = make_task(TASK)
    model = build_model(ModelConfig(width=16, heads=2, **task.model_options()))
    x, y = task.dataset("train")
    model.attention_impl = "sdpa"
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        loss = progressive_loss(model, task, x, y, n=2, k=3, alpha=0.5, iterations=6)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)  # the task's loss is taken in float32
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    ev = evaluate(model, task, "hard", 4, device="cpu", bf16=True)
    assert len(ev["accuracy"]) == 4 and all(0.0 <= a <= 1.0 for a in ev["accuracy"])


@pytest.mark.slow
def test_compiled_loop_map_trains_like_the_eager_one(tmp_path):
    from stability.train import train

    cfg = RunConfig(model=ModelConfig(width=16, heads=2), task=TASK,
                    train=TrainConfig(epochs=1, batch_size=8, iterations=3, test_iterations=3, device="cpu"))
    eager = train(cfg, tmp_path / "eager.pt", progress=False)
    compiled = train(cfg.replace(train=cfg.train.replace(compile=True)), tmp_path / "compiled.pt", progress=False)
    assert abs(eager.history[0]["loss"] - compiled.history[0]["loss"]) < 1e-4
    torch.manual_seed(0)
    model = build_model(ModelConfig(width=16, heads=2, attention_window=5))
    wrapped = CompiledModel(model)
    x0 = model.embed(torch.randn(2, 8, 1))
    assert torch.allclose(wrapped.step(x0, x0), model.step(x0, x0), atol=1e-5)
