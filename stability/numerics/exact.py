"""Correctly rounded elementwise math where torch's CPU kernel is not: the square root.

ATen takes ``sqrt`` (and log, exp, tanh, ...) on the CPU through MKL's vector math (VML, high-accuracy mode). Its
square root is not the IEEE one: measured on torch 2.13's CPU wheel, 1 ulp off the correctly rounded root on 1.3 %
of float64 and 17 % of float32 inputs, at every ATen capability and MKL_CBWR setting; and which inputs are off
depends on the CPU vendor (the pinned kernel fingerprints of an AMD EPYC and an Intel Xeon differ in AdamW, whose
only vendor-dependent step is that root: stability/hardware.py, "Kernel sets"). IEEE 754 fixes the square root
to the last bit, and the hardware instruction (which numpy's ``sqrt`` uses) computes exactly that on every x86-64
CPU, so a number that passes through :func:`sqrt` is the same on every machine. CUDA's ``sqrt`` is correctly
rounded already (nvcc's default ``-prec-sqrt=true``), so on a GPU this is torch's own.

Only for numbers the toolkit reports (σ_max, the monitor's norms, a solver's scaling), not inside a
differentiated map: the CPU route leaves autograd.
"""

from __future__ import annotations

import numpy as np
import torch

from stability import hardware


def sqrt(t: torch.Tensor) -> torch.Tensor:
    """√t, correctly rounded (IEEE 754 §5.4.1) on every device; with the ``mkl-vml`` kernel set, ATen's
    (:data:`stability.hardware.KERNEL_SETS`)."""
    if t.device.type != "cpu" or t.dtype not in (torch.float32, torch.float64) or hardware.kernels() == "mkl-vml":
        return t.sqrt()
    if t.requires_grad:
        raise ValueError("exact.sqrt is for reported numbers: it does not carry gradients")
    return torch.from_numpy(np.sqrt(t.detach().contiguous().numpy())).to(t.dtype)
