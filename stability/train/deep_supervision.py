"""Deep supervision with truncated back-propagation through time: the Fixed-Point Reasoner's training method
(FPRM App. C, "Deep supervision"; the error bound of App. A.4).

A batch is iterated in segments of T_sup iterations (``supervision_interval``; T_sup = k by default). At the end of
each segment the state is decoded through the head, the loss is taken and back-propagated through the k latest
iterations only (``bptt_steps``; the T_sup − k before them run without gradient), the optimizer takes one step,
and the graph is detached. A sample leaves the batch once its fixed point is reached, i.e. its relative L∞
residual between the last two iterates of a segment,

    r = ‖x_t − x_{t−1}‖∞ / (‖x_t‖∞ + ε)   (FPRM App. C; ``stability.solvers.residual``),

is below τ (``halt_tol``, 0.1 by default), or when ``iterations`` iterations are spent. The k-step truncated
gradient Pᵀ Σ_{j<k} (Jᵀ)ʲ δ approaches the implicit one Pᵀ (I − J)⁻ᵀ δ as O(σᵏ) (App. A.4).
"""

from __future__ import annotations

import torch

from stability.solvers import residual


def segments(cfg) -> list[tuple[int, int]]:
    """The (iterations without gradient, iterations with gradient) of each segment within the cap ``iterations``."""
    k, T_sup = cfg.method.bptt_steps, cfg.method.supervision_interval or cfg.method.bptt_steps
    out, t = [], 0
    while t < cfg.iterations:
        seg = min(T_sup, cfg.iterations - t)
        out.append((max(seg - k, 0), min(seg, k)))
        t += seg
    return out


def deep_supervision_batch(ctx, inputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, int]:
    """Train on one batch by deep supervision; returns (the sample-weighted mean of the segment losses, the
    optimizer steps taken, one per segment).

    x0 is recomputed with gradient in every segment (the parameters changed since the last one); the first
    segment starts from e = initial_state(x0), so its gradient also reaches e, as the progressive loss's n = 0.
    """
    model, task, cfg = ctx.model, ctx.task, ctx.cfg
    active = torch.arange(inputs.shape[0], device=inputs.device)
    x = None  # the detached state carried between segments
    total, weight, steps = 0.0, 0, 0
    for free, grad in segments(cfg):
        if active.numel() == 0:
            break
        inp, tgt = inputs[active], targets[active]
        with ctx.autocast():
            x0 = model.embed(inp)
            state = model.initial_state(x0) if x is None else x
            if free:
                with torch.no_grad():
                    for _ in range(free):
                        state = model.step(state, x0)
                state = state.detach()
            for _ in range(grad):
                prev, state = state, model.step(state, x0)
            loss = task.loss(model.readout(state), tgt)
        ctx.optimize(loss)
        steps += 1
        total += loss.item() * active.numel()
        weight += active.numel()
        with torch.no_grad():
            running = residual(state, prev) >= cfg.method.halt_tol
        x, active = state.detach()[running], active[running]
    return total / weight, steps
