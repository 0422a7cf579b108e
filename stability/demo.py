"""The demo's run (``stability demo``): a small prefix-sums looped transformer that trains on the CPU in minutes."""

from __future__ import annotations


def demo_config():
    """The demo's run: external recall, pre-norm, width 32, 45 epochs of 1,000 8-bit strings at LR 3e-3 (no warm-up,
    cooldown at 80 %), hard split of 16-bit strings, final evaluation to 60 iterations, on the CPU."""
    from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig

    return RunConfig(
        model=ModelConfig(recall="external", norm="pre", width=32, heads=4),
        task=TaskConfig(name="prefix-sums", train_size=1000, val_size=200, hard_size=200, train_length=8,
                        hard_length=16),
        train=TrainConfig(lr=3e-3, epochs=45, warmup_epochs=0, cooldown_at=0.8, batch_size=50, iterations=8,
                          test_iterations=60, device="cpu"))


#: samples per split the demo analyses
ANALYSIS_SAMPLES = 32
