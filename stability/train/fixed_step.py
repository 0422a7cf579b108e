"""The fixed-shape ensemble step (issue 37, "the GPU kept busy"): every member through all T iterations of every
batch, what each member's own progressive loss (n, k) computes selected by per-member masks.

The subset step (:func:`stability.train.ensemble.batched_losses`) runs each iteration t once without gradient for
the members still in their first n iterations and once with gradient for those in their k, on the subsets of
members in either state: subsets and a loop length (the deepest member's n + k) that change every batch, a
data-dependent shape that defeats CUDA graphs and recompiles a compiled step. Here each iteration t runs once, for
all K members, with gradient, and a member's new state is

* ``f(x, x0).detach()`` while t < n (its frozen iterations: the no_grad part, done by masking; gradient reaches
  neither its parameters nor x0 through them, as the solo loss's ``torch.no_grad`` and ``detach``),
* ``f(x, x0)`` while n <= t < n + k (its gradient window),
* ``x`` from t = n + k on (its state frozen: its loss is the readout at n + k, as its solo loss's),

so each member's loss and gradient are its solo progressive loss's (:func:`stability.train.step.progressive_loss`)
and every batch has one shape: T iterations, K members, the masks tensors built from the draws. It computes more
than the subset step (T iterations for every member, forward and backward, where the subset step runs n + k and
back-propagates k): on the CPU, where no launch overhead is saved, the subset step is the faster one.

:class:`FixedStep` compiles it (``train.compile``): ``torch.compile(mode="reduce-overhead")`` on CUDA (CUDA graphs:
one captured graph replays the whole forward and backward, no launch per operation) and the default mode on the
CPU, ``dynamic=False`` (the shape never changes, so it compiles once)."""

from __future__ import annotations

from typing import Sequence

import torch

from stability.protocols import is_looped

#: ``--ensemble-step`` values: auto (fixed on CUDA or with --compile, subsets otherwise), subsets, fixed
STEPS = ("auto", "subsets", "fixed")


class _Call(torch.nn.Module):
    """``functional_call``'s entry: calls ``fn(model)`` with the model's parameters swapped for the given ones."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn):
        return fn(self.model)


def stack_state(runs) -> tuple[dict, dict]:
    """The members' parameters and buffers stacked along a new first axis (``model.<name>`` keys, the names
    :class:`_Call` sees): gradients reach each member's own parameters through the stack."""
    model = runs[0].model
    named = [dict(r.model.named_parameters()) for r in runs]
    params = {f"model.{n}": torch.stack([p[n] for p in named]) for n, _ in model.named_parameters()}
    bufs = [dict(r.model.named_buffers()) for r in runs]
    buffers = {f"model.{n}": torch.stack([b[n] for b in bufs]) for n, _ in model.named_buffers()}
    return params, buffers


def resolve_step(step: str, device: torch.device, compile: bool) -> str:
    """``auto`` -> ``fixed`` on CUDA or with ``compile`` (a compiled step needs one shape), else ``subsets`` (on
    the CPU the fixed step's extra iterations cost more than they save); ``subsets``/``fixed`` as given."""
    if step == "auto":
        return "fixed" if compile or device.type == "cuda" else "subsets"
    return step


def fixed_losses(wrapper: _Call, task, iterations: int, alpha: float, params: dict, buffers: dict,
                 inputs: torch.Tensor, targets: torch.Tensor, n: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The members' progressive losses, shape (K,), in one shape for any draws: ``inputs``/``targets`` (K, B, ...),
    ``n``/``k`` (K,) the members' draws, ``params``/``buffers`` stacked (:func:`stack_state`). T = ``iterations``
    iterations for every member, each member's frozen, gradient and finished iterations selected by masks (module
    docstring); with ``alpha`` < 1 the full-depth term (1 − α)·CE(output after T) as in the subset step."""
    K = inputs.shape[0]

    def call(fn, *args):
        def one(p, b, *a):
            return torch.func.functional_call(wrapper, (p, b), (lambda m: fn(m, *a),))

        return torch.vmap(one)(params, buffers, *args)

    losses = torch.vmap(task.loss)
    if not is_looped(wrapper.model):
        return losses(call(lambda m, i: m(i, 1)[0], inputs), targets)
    step = lambda m, x, x0: m.step(x, x0)  # noqa: E731
    x0 = call(lambda m, i: m.embed(i), inputs)
    x = call(lambda m, e: m.initial_state(e), x0)
    shape = (K,) + (1,) * (x.dim() - 1)
    n, end = n.view(shape), (n + k).view(shape)
    for t in range(iterations):
        y = call(step, x, x0)
        x = torch.where(t < n, y.detach(), torch.where(t < end, y, x))
    loss = losses(call(lambda m, s: m.readout(s), x), targets)
    if alpha < 1.0:
        xT = call(lambda m, e: m.initial_state(e), x0)
        for _ in range(iterations):
            xT = call(step, xT, x0)
        loss = (1.0 - alpha) * losses(call(lambda m, s: m.readout(s), xT), targets) + alpha * loss
    return loss


class FixedStep:
    """The fixed-shape step of the members ``runs`` (one architecture), called as the subset step is:
    ``step(runs, inputs, targets, depths)`` -> the (K,) losses. ``compile``: :func:`fixed_losses` through
    ``torch.compile`` (mode ``reduce-overhead``, CUDA graphs, on CUDA; the default mode on the CPU), once."""

    def __init__(self, runs: Sequence, compile: bool = False):
        run = runs[0]
        self.device = run.device
        self.wrapper = _Call(run.model)
        task, T, alpha = run.task, run.config.train.iterations, run.config.train.method.alpha

        def core(params, buffers, inputs, targets, n, k):
            return fixed_losses(self.wrapper, task, T, alpha, params, buffers, inputs, targets, n, k)

        self.compiled = bool(compile)
        self.mode = ("reduce-overhead" if self.device.type == "cuda" else "default") if compile else None
        self.core = torch.compile(core, mode=self.mode, dynamic=False) if compile else core

    def __call__(self, runs: Sequence, inputs: torch.Tensor, targets: torch.Tensor,
                 depths: Sequence[tuple[int, int]]) -> torch.Tensor:
        params, buffers = stack_state(runs)
        n = torch.tensor([d[0] for d in depths], device=self.device)
        k = torch.tensor([d[1] for d in depths], device=self.device)
        return self.core(params, buffers, inputs, targets, n, k)
