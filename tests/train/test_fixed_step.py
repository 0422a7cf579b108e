"""The fixed-shape ensemble step (stability/train/fixed_step.py, ``--ensemble-step fixed``): each member's loss and
gradient against its solo progressive loss and against the subset step, the compiled path on the CPU, the choice
of step."""

import pytest
import torch

from stability.config import Progressive
from stability.train import ensemble, loop
from stability.train.fixed_step import FixedStep, resolve_step
from tests.conftest import run_process
from tests.train.test_ensemble import SMALL, small_config


def _with_alpha(cfg, alpha):
    return cfg.replace(train=cfg.train.replace(method=Progressive(alpha=alpha)))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_each_members_gradient_in_the_fixed_step_is_its_solo_progressive_losss(tmp_path, alpha):
    """In float64, members at different depths (from e itself, after frozen iterations, finished early while another
    runs on to T): the masked all-T step's per-member loss and gradient equal those of the member's own
    :func:`~stability.train.loop.progressive_loss`, to 1e-12 relative (the loss value to 1e-6: the task's loss
    reduces in float32 and the vmapped mean sums in another order); with α < 1 the full-depth term too."""
    cfg = _with_alpha(small_config(), alpha)
    runs = [loop._start(c, tmp_path / n, resume=False, progress=False) for n, c in ensemble.members(cfg, range(4))]
    for r in runs:
        r.model.double()
        r.model.attention_impl = "dense"
    task, B, T = runs[0].task, 20, cfg.train.iterations
    x, y = task.dataset("train")
    x = x.double() if x.is_floating_point() else x
    xb, yb = torch.stack([x[i * B:(i + 1) * B] for i in range(4)]), torch.stack([y[i * B:(i + 1) * B] for i in range(4)])
    depths = [(0, 3), (2, 1), (5, 1), (1, 5)]
    losses = FixedStep(runs)(runs, xb, yb, depths)
    losses.sum().backward()
    batched = [[p.grad.clone() for p in r.model.parameters()] for r in runs]
    for i, (r, (n, k)) in enumerate(zip(runs, depths)):
        r.model.zero_grad()
        solo = loop.progressive_loss(r.model, task, xb[i], yb[i], n, k, alpha, T)
        solo.backward()
        assert abs(float(losses[i].detach()) - float(solo.detach())) <= 1e-6 * abs(float(solo.detach())), i
        for g, p in zip(batched[i], r.model.parameters()):
            assert torch.allclose(g, p.grad, rtol=1e-12, atol=1e-12 * float(p.grad.abs().max())), (i, depths[i])


@pytest.mark.parametrize("alpha", [1.0, 0.5])
def test_the_fixed_step_trains_each_member_as_the_subset_step_does(tmp_path, alpha):
    """A 3-member ensemble's first epoch by the two steps: each member's loss and its weights after the epoch
    agree to 1e-6 relative (float32; the members' draws, data order and AdamW are the same)."""
    cfg = _with_alpha(small_config(epochs=1), alpha)
    subsets = ensemble.train_ensemble(cfg, tmp_path / "subsets", [0, 1, 2], progress=False, step="subsets")
    fixed = ensemble.train_ensemble(cfg, tmp_path / "fixed", [0, 1, 2], progress=False, step="fixed")
    for a, b in zip(subsets, fixed):
        assert abs(a.history[0]["loss"] - b.history[0]["loss"]) <= 1e-6 * a.history[0]["loss"], a.path.name
        pa, pb = (torch.load(r.path, weights_only=True)["model"] for r in (a, b))
        for key in pa:
            assert _rel(pb[key], pa[key]) <= 1e-6, (a.path.name, key)


def test_auto_is_fixed_on_cuda_or_compiled_and_subsets_on_the_cpu():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_step("auto", cpu, False) == "subsets" and resolve_step("auto", cpu, True) == "fixed"
    assert resolve_step("auto", cuda, False) == "fixed"
    assert resolve_step("subsets", cuda, False) == "subsets" and resolve_step("fixed", cpu, False) == "fixed"


def test_the_compiled_fixed_step_uses_cuda_graphs_on_cuda_and_the_default_mode_on_the_cpu(tmp_path):
    """The mode is chosen from the members' device when the wrapper is built (torch.compile is lazy: nothing is
    compiled here, so no GPU is needed to check CUDA's choice)."""
    runs = [loop._start(small_config(), tmp_path / "s0.pt", resume=False, progress=False)]
    assert FixedStep(runs, compile=True).mode == "default" and FixedStep(runs).mode is None
    runs[0].device = torch.device("cuda")
    assert FixedStep(runs, compile=True).mode == "reduce-overhead"


def test_the_command_trains_the_fixed_step_to_the_subset_steps_members(tmp_path):
    """``--ensemble-step fixed`` and ``subsets`` through the command: the same members (weights to 1e-6)."""
    for step in ("fixed", "subsets"):
        run_process("train", *SMALL, "--epochs", "1", "--seeds", "0-1", "--ensemble-step", step,
                    "--out", tmp_path / step)
    for name in ("s0.pt", "s1.pt"):
        a, b = (torch.load(tmp_path / d / name, weights_only=True)["model"] for d in ("subsets", "fixed"))
        assert all(_rel(b[k], a[k]) <= 1e-6 for k in a), name


@pytest.mark.slow
def test_the_compiled_fixed_step_trains_the_members_on_the_cpu(tmp_path):
    """``--compile`` with an ensemble: the fixed step through torch.compile (inductor on the CPU; the same code CUDA
    captures in graphs). One epoch: each member's loss within 1e-5 relative of the subset step's (the generated
    kernels fuse and reorder float32 arithmetic), its weights within 1e-4."""
    cfg = small_config(epochs=1)
    subsets = ensemble.train_ensemble(cfg, tmp_path / "subsets", [0, 1], progress=False, step="subsets")
    compiled = ensemble.train_ensemble(cfg.replace(train=cfg.train.replace(compile=True)), tmp_path / "compiled",
                                       [0, 1], progress=False)  # auto: fixed, compiled
    for a, b in zip(subsets, compiled):
        assert abs(a.history[0]["loss"] - b.history[0]["loss"]) <= 1e-5 * a.history[0]["loss"], a.path.name
        pa, obj = (torch.load(r.path, weights_only=True) for r in (a, b))
        assert obj["config"]["train"]["compile"] is True
        for key in pa["model"]:
            assert _rel(obj["model"][key], pa["model"][key]) <= 1e-4, (a.path.name, key)
