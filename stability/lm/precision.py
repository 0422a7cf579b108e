"""Precision: a model that casts to float32 inside the analysis' float64 copy, made float64 throughout, and checked.

Language models cast on purpose: ``hidden.float()`` before a norm, ``softmax(..., dtype=torch.float32)``,
``zeros_like(x, dtype=torch.float32)`` to accumulate experts. In the float64 copy the analysis makes, each of
these rounds the state to float32 (ε ≈ 1.2e-7), so a derivative, a Krylov solve or a tolerance of 1e-10 measures
float32 rounding instead of the model. :func:`float64_mode` is a :class:`torch.overrides.TorchFunctionMode` that,
while active, turns every such cast into float64: ``Tensor.float/half/bfloat16`` become ``Tensor.double`` and any
floating ``dtype`` argument (positional or keyword) becomes ``torch.float64``. It composes with torch.func (jvp,
vjp, vmap: the mode acts before dispatch). The adapters of :mod:`stability.lm` enter it whenever their parameters
are float64, so their float64 copy is float64 end to end; at the model's own precision they run its code as it is.

:func:`precision_audit` lists the operations that produce a non-float64 floating tensor during ``step`` of a
float64 model (none, for a model that is float64 throughout, or one run under :func:`float64_mode`);
:func:`check_float64` turns a non-empty audit into one line naming precision as the cause.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Optional

import torch
from torch.overrides import TorchFunctionMode

from stability.errors import StabilityError

_DOWNCASTS = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}
_LOW = {torch.float32, torch.float16, torch.bfloat16}
_CARRIERS = (torch.dtype, list, tuple)  # the argument types that can hold a dtype


def _promote(v):
    if isinstance(v, torch.dtype) and v in _LOW:
        return torch.float64
    if isinstance(v, (list, tuple)) and any(isinstance(a, torch.dtype) for a in v):
        return type(v)(_promote(a) for a in v)
    return v


class Float64Mode(TorchFunctionMode):
    """Every floating cast below float64 becomes float64 while active (module docstring)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _DOWNCASTS:
            func = torch.Tensor.double
        if any(a.__class__ in _CARRIERS for a in args):  # the fast path: most calls carry no dtype
            args = tuple(_promote(a) for a in args)
        if kwargs and any(v.__class__ in _CARRIERS for v in kwargs.values()):
            kwargs = {k: _promote(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


def float64_mode(active: bool = True):
    """:class:`Float64Mode` when ``active``, else a no-op context."""
    return Float64Mode() if active else contextlib.nullcontext()


def model_dtype(model) -> Optional[torch.dtype]:
    """The dtype the model computes in: float64 when any floating parameter is float64 (the analysis copy, whose
    vocabulary tables may be stored in float32: :mod:`stability.lm.storage`), else its first floating parameter's
    (None without one)."""
    first = None
    for p in model.parameters():
        if p.is_floating_point():
            if p.dtype == torch.float64:
                return torch.float64
            first = first or p.dtype
    return first


def _name(func) -> str:
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or str(func)
    return name.replace("TensorBase.", "Tensor.").replace("_VariableFunctionsClass.", "torch.")


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, dict):
        for o in obj.values():
            yield from _tensors(o)


class _Recorder(TorchFunctionMode):
    """Counts the casts: operations with a float64 input and a floating output below float64."""

    def __init__(self):
        super().__init__()
        self.found: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not any(t.dtype == torch.float64 for t in _tensors((args, kwargs))):
            return out
        for t in _tensors(out):
            if t.is_floating_point() and t.dtype != torch.float64:
                self.found[f"{_name(func)} -> {str(t.dtype).replace('torch.', '')}"] += 1
                break
        return out


def precision_audit(model, inputs: torch.Tensor) -> dict:
    """{operation -> dtype: count} of the casts below float64 (an operation with a float64 input and a lower
    floating output: ``Tensor.float -> float32``, ``torch.softmax -> float32``) made by ``embed``,
    ``initial_state``, ``step`` and ``readout`` of a float64 ``model`` on ``inputs`` (empty: float64 throughout).
    A float32 model has no float64 input to cast: its audit is empty, and :func:`model_dtype` says float32."""
    rec = _Recorder()
    with torch.no_grad():
        with rec:
            x0 = model.embed(inputs)
            x = model.initial_state(x0, generator=torch.Generator().manual_seed(0))
            x = model.step(x, x0)
            model.readout(x)
    return dict(rec.found)


def check_float64(model, inputs: torch.Tensor) -> None:
    """One :class:`StabilityError` line when a float64 model computes below float64 (:func:`precision_audit`):
    the numbers of the analysis would then be float32 rounding, and a failed Krylov solve or a stalled solve would
    be precision, not the model."""
    found = precision_audit(model, inputs)
    if found:
        ops = ", ".join(f"{k} ({n}x)" for k, n in sorted(found.items(), key=lambda kv: -kv[1])[:4])
        raise StabilityError(f"{type(model).__name__}: the float64 copy computes in lower precision ({ops}): its "
                             "results would be float32 rounding (ε ≈ 1e-7), not the model; run the model's code "
                             "under stability.lm.float64_mode() (the adapters of stability.lm do)")


def precision_hint(exc: BaseException, model, inputs: torch.Tensor) -> str:
    """The message of a failure (a GMRES that did not converge, a stalled solve) with its likelier cause named
    when the model is not float64 or computes below it: ``... (cause: precision, not the model: ...)``; the
    message unchanged otherwise."""
    msg = str(exc)
    if "cause: precision" in msg:  # the message names precision already (stability.analysis.prop5.krylov_message)
        return msg
    dtype = model_dtype(model)
    if dtype is not None and dtype != torch.float64:
        cause = f"the model is {str(dtype).replace('torch.', '')}"
    else:
        try:
            found = precision_audit(model, inputs)
        except Exception:  # noqa: BLE001 - the hint must never replace the error
            return msg
        if not found:
            return msg
        cause = f"its step computes in lower precision ({', '.join(sorted(found)[:3])})"
    return (f"{msg.split(' (is x* attracting')[0]} (cause: precision, not the model: {cause}, so residuals and "
            "solves below ~1e-7 are rounding; analyse it in float64: stability.lm.analyze_lm does, running the "
            "model under stability.lm.float64_mode())")
