"""The trainer's stability-monitor callback: every ``every`` epochs, the paper's axes of stability on a fixed
probe (the first ``samples`` validation samples), measured by :func:`stability.analysis.monitor.measure` and added
to the epoch record as ``record["monitor"]`` (keys: :data:`stability.analysis.monitor.MONITOR_KEYS` and more; see
that module for what each means and how it is computed)."""

from __future__ import annotations

from typing import Optional

import torch

from stability.analysis.monitor import MONITOR_KEYS, measure, monitor_history
from stability.errors import ConfigError
from stability.protocols import is_looped

__all__ = ["MONITOR_KEYS", "StabilityMonitor", "monitor_history"]


class StabilityMonitor:
    """Trainer callback ``(model, task, record) -> None``: every ``every`` epochs, adds ``record["monitor"]``.

    ``task``: the run's task (its first ``samples`` val samples are the fixed probe). ``device``: where the model
    lives. ``max_iter`` / ``tol``: the Picard solve for x* (Def. 3.3's reachability, FPRM's residual criterion).
    ``krylov`` / ``restarts``: the batched Krylov–Schur iteration for ρ(J*). ``probes``: Hutchinson directions for
    ‖dx*/dx0‖_F. The monitor can also be called directly on any looped model: :meth:`measure` needs only
    ``embed(inputs) -> x0`` and ``step(x, x0)`` (``initial_state`` and a recall weight ``W_x`` are used when present),
    so a model that is not ours works too (``task`` may then be None and ``inputs`` given).
    """

    def __init__(self, task, every: int = 1, samples: int = 16, device="cpu", *, max_iter: int = 200,
                 tol: float = 1e-4, krylov: int = 20, restarts: int = 2, probes: int = 2, seed: int = 0):
        if every < 1:
            raise ConfigError("every must be at least 1")
        self.task, self.every, self.samples = task, int(every), int(samples)
        self.device = torch.device(device)
        self.max_iter, self.tol, self.krylov, self.restarts = max_iter, tol, krylov, restarts
        self.probes, self.seed = probes, seed
        self._probe: Optional[torch.Tensor] = None

    def __call__(self, model, task, record: dict) -> None:
        epoch = int(record.get("epoch", 0))
        if epoch % self.every:
            return
        record["monitor"] = self.measure(model)

    def probe(self) -> torch.Tensor:
        """The fixed probe: the first ``samples`` val inputs (the same at every epoch)."""
        if self._probe is None:
            inputs, _ = self.task.dataset("val")
            self._probe = inputs[: self.samples].to(self.device)
        return self._probe

    def measure(self, model, inputs: Optional[torch.Tensor] = None) -> dict:
        """The monitor's quantities for ``model`` on ``inputs`` (default: the probe). JSON-ready."""
        if not is_looped(model):
            raise ConfigError("a fixed-depth baseline has no loop map: nothing to monitor")
        inputs = self.probe() if inputs is None else inputs.to(self.device)
        return measure(model, inputs, max_iter=self.max_iter, tol=self.tol, krylov=self.krylov,
                       restarts=self.restarts, probes=self.probes, seed=self.seed)
