"""The model contract: what the analysis needs from a looped model, and nothing more (docs/python-api.md, "The model contract").

:class:`LoopedModel` is the whole contract of ``stability analyze`` (Defs. 3.1–3.3):

* ``embed(inputs) -> x0``                      the input injection x0, batch-first (B, ...)
* ``initial_state(x0, generator=None) -> e``    the first iterate e (Def. 3.1); ``x0`` itself is the usual choice
* ``step(x, x0) -> x'``                         one iteration of the loop map f (Def. 3.3)
* ``readout(x) -> logits``                      the answer read from a state, (B, *positions, classes)

``step`` must be *pure* (no hidden state, no in-place update of its arguments, the same output for the same
input), *batch-first* with *independent samples* (sample b of the output depends only on sample b of x and x0),
and carry *one* state tensor: a model whose carry has two parts (TRM's (y, z), a recurrent-depth model's state
and its memory) packs them into one tensor, e.g. ``torch.cat([y, z], -1)`` and ``x[..., :d], x[..., d:]`` to
unpack, or a flat vector per sample. The state x and the input x0 need not have the same shape.

:class:`RecallParts` adds the named parts of Defs. 5.1 / 5.2 and App. A.7 (with s ∈ {1, 2} the sublayer), from
which Prop. 4's matrices M_ext / M_int are assembled by calling the parts:

* ``recall``               "none" | "external" | "internal"
* ``g(x, x0)``             the recall map, linear in x: ∂g/∂x = W_x
* ``W_x``                  the recall weight (d, d) for ρ(W_x), or None
* ``pre(s, u)``            the Pre norm inside sublayer s (the identity where there is none)
* ``h(s, v)``              the sublayer update
* ``residual(s, u, v)``    R_s(u, v): u + v, a scaled residual, or a GRU cell
* ``phi(s, u)``            the outer normalisation φ_s (the identity where there is none)

and, optional, the Fixed-Point Reasoner options: ``conv(x)`` (applied to x at the start of each loop; the
identity when absent), ``variant_options`` (a dict; its ``"damping"`` η makes step = (1 − η) x + η f(x)) and
``has_outer_norm`` (Def. 3.4, φ ≠ I, only used to name the form). The composition the parts must reproduce:

* external: u = g(c(x), x0); z = φ1(R1(u, h1(pre1 u))); x' = φ2(R2(z, h2(pre2 z)))
* internal: z = φ1(R1(c(x), h1(g(pre1 c(x), x0)))); x' = φ2(R2(z, h2(g(pre2 z, x0))))
* none:     as external with g(x, x0) = x

:func:`check_model` validates a model against the contract before any long computation, including that ``step``
can be differentiated the three ways the analysis differentiates it (forward mode, reverse mode, and the reverse of
reverse mode), under :func:`differentiable_attention`, the attention kernels the analysis runs every model with.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import TYPE_CHECKING, Optional, Protocol, runtime_checkable

from stability.errors import StabilityError, first_line

if TYPE_CHECKING:  # torch is imported where it is used: `is_looped` serves commands that start fast
    import torch

RECALLS = ("none", "external", "internal")

#: the members of each protocol, with the signature shown in error messages
LOOPED_MEMBERS = {"embed": "embed(inputs)", "initial_state": "initial_state(x0, generator=None)",
                  "step": "step(x, x0)", "readout": "readout(x)"}
RECALL_MEMBERS = {"g": "g(x, x0)", "pre": "pre(s, u)", "h": "h(s, v)", "residual": "residual(s, u, v)",
                  "phi": "phi(s, u)"}
RECALL_ATTRIBUTES = ("recall", "W_x")


@runtime_checkable
class LoopedModel(Protocol):
    """A looped model x_{t+1} = step(x_t, x0), x_1 = step(e, x0) (Defs. 3.1–3.3); see the module docstring."""

    def embed(self, inputs: torch.Tensor) -> torch.Tensor: ...

    def initial_state(self, x0: torch.Tensor, generator: Optional[torch.Generator] = None) -> torch.Tensor: ...

    def step(self, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor: ...

    def readout(self, x: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class RecallParts(LoopedModel, Protocol):
    """A looped model that exposes the named parts of Defs. 5.1 / 5.2 and App. A.7 (module docstring)."""

    recall: str
    W_x: Optional[torch.Tensor]

    def g(self, x: torch.Tensor, x0: torch.Tensor) -> torch.Tensor: ...

    def pre(self, s: int, u: torch.Tensor) -> torch.Tensor: ...

    def h(self, s: int, v: torch.Tensor) -> torch.Tensor: ...

    def residual(self, s: int, u: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...

    def phi(self, s: int, u: torch.Tensor) -> torch.Tensor: ...


def is_looped(model) -> bool:
    """True when the model has a loop map ``step``; a fixed-depth baseline (run once, no loop map) has none."""
    return callable(getattr(model, "step", None))


def missing_members(model) -> list[str]:
    """The :class:`LoopedModel` members the model lacks (their signatures), in contract order."""
    return [sig for name, sig in LOOPED_MEMBERS.items() if not callable(getattr(model, name, None))]


def has_recall_parts(model) -> bool:
    """True when the model provides :class:`RecallParts` with a known ``recall`` (then Prop. 4 and ρ(W_x) apply)."""
    if any(not callable(getattr(model, name, None)) for name in RECALL_MEMBERS):
        return False
    if any(not hasattr(model, name) for name in RECALL_ATTRIBUTES):
        return False
    return getattr(model, "recall") in RECALLS


def recall_parts_missing(model) -> list[str]:
    """What a model lacks for :class:`RecallParts` (empty when it provides them)."""
    out = [sig for name, sig in RECALL_MEMBERS.items() if not callable(getattr(model, name, None))]
    out += [name for name in RECALL_ATTRIBUTES if not hasattr(model, name)]
    if not out and getattr(model, "recall") not in RECALLS:
        out.append(f"recall in {{{', '.join(RECALLS)}}} (got {getattr(model, 'recall')!r})")
    return out


def damping(model) -> float:
    """η of the damped step (1 − η) x + η f(x) (FPRM App. A.3), from ``variant_options``; 1 when undamped."""
    return float((getattr(model, "variant_options", None) or {}).get("damping", 1.0))


def _name(model) -> str:
    return type(model).__name__


def _shape(t) -> str:
    import torch

    return "(" + ", ".join(map(str, t.shape)) + ")" if isinstance(t, torch.Tensor) else type(t).__name__


def _call(model, what: str, fn, *args):
    import torch

    try:
        out = fn(*args)
    except StabilityError:
        raise
    except Exception as exc:  # noqa: BLE001 - a user's model: report its failure as one line
        msg = first_line(exc)
        raise StabilityError(f"{_name(model)}.{what} failed on inputs of shape "
                             f"{', '.join(_shape(a) for a in args if isinstance(a, torch.Tensor))}: "
                             f"{type(exc).__name__}: {msg}") from None
    if not isinstance(out, torch.Tensor):
        raise StabilityError(f"{_name(model)}.{what} returned {type(out).__name__}, not a tensor")
    return out


def check_contract(model) -> None:
    """The :class:`LoopedModel` members exist (and ``initial_state`` takes ``generator``); one line otherwise."""
    name = _name(model)
    if not is_looped(model):
        hint = " (a fixed-depth model has no loop map, so it has no fixed points to analyse)" \
            if callable(getattr(model, "forward", None)) else ""
        raise StabilityError(f"{name} does not satisfy the LoopedModel contract: missing step(x, x0){hint}")
    missing = missing_members(model)
    if missing:
        raise StabilityError(f"{name} does not satisfy the LoopedModel contract: missing {', '.join(missing)}")
    params = inspect.signature(model.initial_state).parameters
    if "generator" not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        raise StabilityError(f"{name}.initial_state must accept generator=None (initial_state(x0, generator=None))")


@contextlib.contextmanager
def differentiable_attention():
    """The attention kernels the analysis runs a model with: ``F.scaled_dot_product_attention`` on its math backend
    (torch's fused flash / memory-efficient kernels have no forward-mode and no double-backward derivative:
    ``derivative for aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented``) and
    ``nn.MultiheadAttention`` without its fused inference fast path (so the solve and the Jacobians evaluate the
    same function). A model that calls neither (this toolkit's own, whose analysis path is explicit einsums) is
    unaffected. Both settings are restored on exit."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)


#: the transforms of step the analysis needs, as :func:`check_differentiable` names them
TRANSFORMS = {"jvp": "forward mode, torch.func.jvp (ρ(J*), Prop. 5, the initial-iterate stage)",
              "vjp": "reverse mode, torch.func.vjp (Jᵀ products)",
              "double-backward": "the vjp of the vjp (J products, Prop. 5's K = ∂f/∂x0)"}


def check_differentiable(model, x, x0) -> None:
    """``step`` at (x, x0) can be differentiated by forward mode, reverse mode and the reverse of reverse mode, in
    x and x0, under :func:`differentiable_attention`, giving finite numbers; otherwise one
    :class:`~stability.errors.StabilityError` line naming the transform that failed and why."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(1)
    v, u = (torch.randn(x.shape, generator=g, dtype=x.dtype).to(x) for _ in range(2))
    # in x and x0 where x0 is a float tensor (Prop. 5 differentiates in x0), else in x alone
    args = (x, x0) if x0.is_floating_point() else (x,)

    def f(*a):
        return model.step(a[0], a[1] if len(a) > 1 else x0)

    def jvp():
        return torch.func.jvp(f, args, (v, *(torch.zeros_like(a) for a in args[1:])))[1]

    def vjp():
        return torch.func.vjp(f, *args)[1](u)

    def double_backward():
        pull = torch.func.vjp(f, *args)[1]
        return torch.func.vjp(pull, torch.zeros_like(u))[1]((v, *(torch.zeros_like(a) for a in args[1:])))

    with differentiable_attention():
        for what, fn in (("jvp", jvp), ("vjp", vjp), ("double-backward", double_backward)):
            try:
                out = fn()
            except Exception as exc:  # noqa: BLE001 - a user's model: report its failure as one line
                raise StabilityError(f"{_name(model)}.step cannot be differentiated by {what} ({TRANSFORMS[what]}), "
                                     f"which the analysis needs: {type(exc).__name__}: {first_line(exc)}") from None
            outs = out if isinstance(out, tuple) else (out,)
            if not all(bool(torch.isfinite(t).all()) for t in outs if isinstance(t, torch.Tensor)):
                raise StabilityError(f"{_name(model)}.step: its {what} ({TRANSFORMS[what]}) is not finite at the "
                                     "first iterate")


def _check_step(model, e, x0, rtol: float):
    """``step`` at (e, x0), two samples: shape kept, finite, pure, batch-independent; returns step(e, x0)."""
    import torch

    name = _name(model)
    e_copy, x0_copy = e.clone(), x0.clone()
    out = _call(model, "step(x, x0)", model.step, e, x0)
    if out.shape != e.shape:
        raise StabilityError(f"{name}.step must return a state shaped like its input: x {_shape(e)} gave "
                             f"{_shape(out)} (a carry of several tensors must be packed into one)")
    if not bool(torch.isfinite(out).all()):
        raise StabilityError(f"{name}.step returned non-finite values on the first iterate")
    if not (torch.equal(e, e_copy) and torch.equal(x0, x0_copy)):
        raise StabilityError(f"{name}.step modified its arguments in place: step(x, x0) must be pure")
    again = _call(model, "step(x, x0)", model.step, e, x0)
    scale = float(out.abs().max()) + 1e-12
    if float((again - out).abs().max()) > rtol * scale:
        raise StabilityError(f"{name}.step is not pure: two calls on the same (x, x0) differ "
                             f"(hidden state, dropout or randomness inside step?)")
    alone = torch.cat([_call(model, "step(x, x0)", model.step, e[b:b + 1], x0[b:b + 1]) for b in range(2)])
    diff = float((alone - out).abs().max())
    if diff > rtol * scale:
        raise StabilityError(f"{name}.step is not batch-independent: two samples stepped together differ from "
                             f"each stepped alone by {diff:.3g} (relative {diff / scale:.3g}); samples must not "
                             f"interact (no batch statistics, no mixing over the batch axis)")
    return out


def check_model(model, inputs: torch.Tensor, targets: Optional[torch.Tensor] = None, *, rtol: float = 1e-5) -> None:
    """Validate a model against :class:`LoopedModel` on (up to) two samples of ``inputs``; raise
    :class:`~stability.errors.StabilityError` with one line naming the problem.

    Checks: the four members exist; ``inputs`` is a batch (B ≥ 1, ...); ``embed``, ``initial_state``, ``step`` and
    ``readout`` run and return batch-first tensors; ``step`` keeps the state's shape, is finite, does not modify its
    arguments, gives the same output twice, and is batch-independent (two samples stepped together equal each
    stepped alone, to ``rtol`` relative), and can be differentiated by jvp, vjp and double backward
    (:func:`check_differentiable`); with ``targets``: one target per position of the readout. All of it runs under
    :func:`differentiable_attention`, as the analysis does.
    """
    import torch

    check_contract(model)
    name = _name(model)
    if not isinstance(inputs, torch.Tensor) or inputs.dim() < 1 or inputs.shape[0] < 1:
        raise StabilityError(f"inputs must be a tensor with a batch axis first (B, ...), got {_shape(inputs)}")
    if targets is not None:
        if not isinstance(targets, torch.Tensor) or targets.shape[:1] != inputs.shape[:1]:
            raise StabilityError(f"targets must be a tensor with one row per input sample: inputs {_shape(inputs)}, "
                                 f"targets {_shape(targets)}")
        if targets.is_floating_point() or targets.is_complex():
            raise StabilityError(f"targets must hold class indices (an integer tensor), got {targets.dtype}")
    param = next(iter(model.parameters()), None) if hasattr(model, "parameters") else None
    if param is not None and param.is_floating_point() and inputs.is_floating_point():
        inputs = inputs.to(param.dtype)
    if param is not None:
        inputs = inputs.to(param.device)
    xin = inputs[:2]
    with differentiable_attention(), torch.no_grad():
        x0 = _call(model, "embed(inputs)", model.embed, xin)
        if x0.dim() < 1 or x0.shape[0] != xin.shape[0]:
            raise StabilityError(f"{name}.embed must keep the batch axis first: inputs {_shape(xin)} gave x0 "
                                 f"{_shape(x0)}")
        e = _call(model, "initial_state(x0)", model.initial_state, x0)
        if e.shape[:1] != x0.shape[:1]:
            raise StabilityError(f"{name}.initial_state must return one state per sample: x0 {_shape(x0)} gave e "
                                 f"{_shape(e)}")
        if xin.shape[0] < 2:  # a second, different sample: the first one perturbed
            g = torch.Generator(device="cpu").manual_seed(0)
            x0 = torch.cat([x0, x0 + 0.1 * torch.randn(x0.shape, generator=g, dtype=x0.dtype).to(x0)])
            e = torch.cat([e, e + 0.1 * torch.randn(e.shape, generator=g, dtype=e.dtype).to(e)])
        out = _check_step(model, e, x0, rtol)
        logits = _call(model, "readout(x)", model.readout, out)
        if logits.shape[:1] != out.shape[:1]:
            raise StabilityError(f"{name}.readout must keep the batch axis first: x {_shape(out)} gave "
                                 f"{_shape(logits)}")
    if targets is not None and tuple(logits.shape[1:-1]) != tuple(targets.shape[1:]):
        raise StabilityError(f"targets {_shape(targets)} do not match the readout {_shape(logits)}: expected one "
                             f"class index per position, targets of shape (B, {', '.join(map(str, logits.shape[1:-1]))})")
    check_differentiable(model, e, x0)
