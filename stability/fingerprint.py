"""The kernel fingerprint: which CPU kernels give other bits on this machine than on another (``stability doctor``).

Each row is one kernel a training or an analysis uses, run on fixed inputs; its fingerprint is the sha256 (first
16 hex digits) of its output's bytes. Two machines whose fingerprints agree on a row computed that kernel to the
same bits; a row that differs is a kernel that still picks its code path by the CPU. The rows and their inputs
are those of the kernel-dispatch probe whose Intel Xeon (Sapphire Rapids, AVX-512, AMX) output ships in
``stability/data/fingerprints/`` beside an AMD EPYC's, so a user's machine is compared with both; after them come
the toolkit's own routes (the ``ieee`` kernel set, stability/hardware.py), each also checked against an
independent IEEE computation in numpy here: a row equal to IEEE arithmetic is the same on every IEEE machine.

Run pinned (the reproducible mode's settings, in a fresh process) unless asked otherwise: the promise of
``--reproducible`` is about the pinned paths.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F

from stability import hardware
from stability.config import ModelConfig
from stability.model import build_model
from stability.numerics import exact


def digest(x) -> str:
    """The first 16 hex digits of the sha256 of an array's (or tensor's) bytes."""
    if isinstance(x, torch.Tensor):
        x = x.detach().contiguous().cpu().numpy()
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()[:16]


def _rnd(*shape, dtype=torch.float32, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


def _elementwise(t: str, dt) -> list:
    A, B = _rnd(500, 256, dtype=dt), _rnd(256, 256, dtype=dt, seed=1)
    W, b = _rnd(1024, 256, dtype=dt, seed=2), _rnd(1024, dtype=dt, seed=3)
    X = _rnd(16, 32, 256, dtype=dt, seed=4)
    return [(f"mm 500x256x256 {t}", A @ B), (f"mm 256x500 @ 500x256 {t}", A.T @ A),
            (f"linear 16x32x256 -> 1024 {t}", F.linear(X, W, b)),
            (f"bmm 16x32x256 @ 16x256x32 {t}", torch.bmm(X, X.transpose(1, 2))),
            (f"matvec 500x256 {t}", A @ B[0]),
            (f"softmax {t}", torch.softmax(X, -1)), (f"log_softmax {t}", torch.log_softmax(X, -1)),
            (f"layer_norm {t}", F.layer_norm(X, (256,))), (f"rms_norm {t}", F.rms_norm(X, (256,))),
            (f"gelu {t}", F.gelu(X)), (f"silu {t}", F.silu(X)), (f"exp {t}", X.exp()),
            (f"log {t}", X.abs().log()), (f"tanh {t}", X.tanh()), (f"sigmoid {t}", X.sigmoid()),
            (f"sin/cos {t}", torch.cat([X.sin(), X.cos()])), (f"rsqrt {t}", X.abs().rsqrt()),
            (f"sum {t}", X.sum()), (f"sum dim {t}", X.sum(-1)), (f"mean dim {t}", X.mean(1)),
            (f"norm {t}", X.norm()), (f"cumsum {t}", X.cumsum(1)), (f"var {t}", X.var(-1))]


def _attention_and_grads(t: str, dt) -> list:
    q, k, v = (_rnd(16, 8, 32, 32, dtype=dt, seed=s) for s in (5, 6, 7))
    rows = [(f"sdpa (default backend) {t}", F.scaled_dot_product_attention(q, k, v))]
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        rows.append((f"sdpa math {t}", F.scaled_dot_product_attention(q, k, v)))
    X = _rnd(16, 32, 256, dtype=dt, seed=4).requires_grad_(True)
    W = _rnd(1024, 256, dtype=dt, seed=2).requires_grad_(True)
    y = F.gelu(F.linear(F.layer_norm(X, (256,)), W, _rnd(1024, dtype=dt, seed=3)))
    tgt = torch.randint(0, 1024, (16, 32), generator=torch.Generator().manual_seed(8))
    loss = F.cross_entropy(y.reshape(-1, 1024), tgt.reshape(-1))
    loss.backward()
    return rows + [(f"cross_entropy {t}", loss), (f"grad x {t}", X.grad), (f"grad W {t}", W.grad)]


def _adamw(dt, **kind) -> torch.Tensor:
    """Three AdamW steps (lr 1e-3, weight decay 0.01) on a 1024 × 256 parameter with fixed gradients."""
    p = torch.nn.Parameter(_rnd(1024, 256, dtype=dt, seed=2))
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, **kind)
    for s in range(3):
        p.grad = _rnd(1024, 256, dtype=dt, seed=20 + s)
        opt.step()
    return p.detach()


def adamw_ieee_reference(dt) -> np.ndarray:
    """The same three AdamW steps (Loshchilov & Hutter 2019, Alg. 2, as torch orders them) in numpy: one IEEE
    operation at a time, the square root the correctly rounded one."""
    npdt = np.float32 if dt == torch.float32 else np.float64
    p = _rnd(1024, 256, dtype=dt, seed=2).numpy().copy()
    m, v = np.zeros_like(p), np.zeros_like(p)
    lr, wd, b1, b2, eps = 1e-3, 0.01, 0.9, 0.999, 1e-8
    for s in range(3):
        g = _rnd(1024, 256, dtype=dt, seed=20 + s).numpy()
        p = p * npdt(1 - lr * wd)
        m = m + npdt(1 - b1) * (g - m)
        v = v * npdt(b2) + npdt(1 - b2) * g * g
        denom = np.sqrt(v) / npdt((1 - b2 ** (s + 1)) ** 0.5) + npdt(eps)
        p = p - npdt(lr / (1 - b1 ** (s + 1))) * m / denom
    return p


def _optimizer_and_misc(t: str, dt) -> list:
    rows = [(f"adamw foreach={f} 3 steps {t}", _adamw(dt, foreach=f)) for f in (False, True)]
    emb = torch.nn.Parameter(_rnd(64, 256, dtype=dt, seed=12))
    out = F.embedding(torch.randint(0, 64, (16, 32), generator=torch.Generator().manual_seed(13)), emb)
    out.pow(2).sum().backward()
    rows += [(f"embedding {t}", out), (f"embedding backward {t}", emb.grad)]
    ps = [torch.nn.Parameter(_rnd(64, 64, dtype=dt, seed=30 + i)) for i in range(3)]
    for i, q in enumerate(ps):
        q.grad = _rnd(64, 64, dtype=dt, seed=40 + i)
    rows.append((f"clip_grad_norm_ {t}", torch.nn.utils.clip_grad_norm_(ps, 1.0)))
    rows.append((f"clipped grads {t}", torch.cat([q.grad.flatten() for q in ps])))
    X = _rnd(16, 32, 256, dtype=dt, seed=4)
    src = _rnd(500, 16, dtype=dt, seed=14)
    idx = torch.randint(0, 50, (500,), generator=torch.Generator().manual_seed(15))
    return rows + [
        (f"index_add {t}", torch.zeros(50, 16, dtype=dt).index_add_(0, idx, src)),
        (f"scatter_add {t}", torch.zeros(50, 16, dtype=dt).scatter_add_(0, idx[:, None].expand(-1, 16), src)),
        (f"topk/sort {t}", torch.cat([X.topk(5, -1).values.flatten(), X.sort(-1).values.flatten()])),
        (f"pow/div/where {t}", torch.where(X > 0, X.pow(1.5), X / 3.0)),
        (f"erf/expm1/log1p {t}", torch.cat([X.erf(), X.expm1(), X.abs().log1p()]))]


def _linalg(t: str, dt) -> list:
    S, B = _rnd(96, 96, dtype=dt, seed=9), _rnd(256, 256, dtype=dt, seed=1)
    return [(f"eigvals 96 {t}", torch.linalg.eigvals(S)), (f"svdvals 96 {t}", torch.linalg.svdvals(S)),
            (f"qr 500x64 {t}", torch.linalg.qr(_rnd(500, 64, dtype=dt, seed=10))[0]),
            (f"solve 96 {t}", torch.linalg.solve(S, B[:96, :8].to(dt)))]


def _python_libraries() -> list:
    import scipy.linalg

    S = _rnd(96, 96, dtype=torch.float64, seed=11).numpy()
    return [("numpy dot 96 float64", S @ S), ("numpy eigvals 96", np.linalg.eigvals(S)), ("numpy exp", np.exp(S)),
            ("scipy schur 96", scipy.linalg.schur(S)[0]), ("scipy eig 96", scipy.linalg.eigvals(S))]


def _demo_steps(optimizer) -> torch.Tensor:
    """Three training steps of the demo's model (width 32, external recall, pre-norm), 8 iterations each."""
    torch.manual_seed(0)
    m = build_model(ModelConfig(recall="external", norm="pre", width=32, heads=4))
    opt = optimizer(m)
    xin = torch.randint(0, 2, (50, 11, 1), generator=torch.Generator().manual_seed(16)).float() - 0.5
    for _ in range(3):
        x0 = m.embed(xin)
        x = m.initial_state(x0)
        for _ in range(8):
            x = m.step(x, x0)
        loss = m.readout(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
    return torch.cat([p.detach().flatten() for p in m.parameters()])


def probe_rows() -> list:
    """(name, output) of the kernel-dispatch probe, in its order: its reference files compare row by row."""
    rows = []
    for dt in (torch.float32, torch.float64):
        t = str(dt).split(".")[-1]
        rows += _elementwise(t, dt) + _attention_and_grads(t, dt) + _optimizer_and_misc(t, dt) + _linalg(t, dt)
    rows += _python_libraries()
    rows.append(("stability: demo model, 3 AdamW steps (end to end)",
                 _demo_steps(lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3))))
    return rows


def _ieee_sqrt_reference(x: torch.Tensor) -> np.ndarray:
    import math

    return np.array([math.sqrt(v) for v in x.tolist()], dtype=x.numpy().dtype)


def toolkit_rows() -> list:
    """(name, output, IEEE reference or None) of the toolkit's own routes (the ``ieee`` kernel set) and of the
    ATen kernel they replace."""
    rows = []
    for dt in (torch.float32, torch.float64):
        t = str(dt).split(".")[-1]
        x = _rnd(4096, dtype=dt, seed=50).abs()
        rows += [(f"toolkit: adamw fused 3 steps {t}", _adamw(dt, fused=True), adamw_ieee_reference(dt)),
                 (f"toolkit: exact.sqrt {t}", exact.sqrt(x), _ieee_sqrt_reference(x)),
                 (f"aten sqrt (MKL vector math) {t}", x.sqrt(), _ieee_sqrt_reference(x))]
    rows.append(("toolkit: demo model, 3 fused-AdamW steps (end to end)",
                 _demo_steps(lambda m: torch.optim.AdamW(m.parameters(), lr=3e-3, fused=True)), None))
    return rows


@dataclass
class Row:
    """One kernel's fingerprint; ``ieee``: whether it equals an independent IEEE computation (None: no reference)."""

    name: str
    digest: str
    ieee: Optional[bool] = None


def measure() -> tuple:
    """(header line, rows) of this process: the probe's rows, then the toolkit's."""
    rows = [Row(n, digest(v)) for n, v in probe_rows()]
    for name, value, ref in toolkit_rows():
        ok = None if ref is None else bool(np.array_equal(value.numpy(), ref))
        rows.append(Row(name, digest(value), ok))
    sig = hardware.signature()
    header = (f"# cpu: {sig['cpu']}; torch {sig['torch']}; numpy {sig['numpy']}; scipy {sig['scipy']}; "
              f"pinned: {sig['reproducible']}; aten capability: {sig['cpu_capability']}")
    return header, rows


def text(header: str, rows: list) -> str:
    """The fingerprint file: the header, then ``digest  name`` a line (the probe's format)."""
    return "\n".join([header] + [f"{r.digest}  {r.name}" for r in rows]) + "\n"


def read(path) -> tuple:
    """(header, {name: digest}) of a fingerprint file."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    header = lines[0] if lines and lines[0].startswith("#") else ""
    pairs = (line.split("  ", 1) for line in lines if line and not line.startswith("#"))
    return header, {name: d for d, name in pairs}


def references() -> dict:
    """The shipped reference fingerprints (pinned): file stem -> (header, {name: digest})."""
    folder = resources.files("stability") / "data" / "fingerprints"
    return {p.name.removesuffix(".txt"): read(p) for p in sorted(folder.iterdir(), key=lambda p: p.name)
            if p.name.endswith(".txt")}


#: how the toolkit meets the kernels that differ between the reference machines (an AMD EPYC's and an Intel Xeon's
#: pinned fingerprints differ in exactly these): row-name prefix -> what the ``ieee`` kernel set does instead
ROUTED = {
    "adamw foreach": "the toolkit's AdamW is the fused kernel (IEEE arithmetic: 'toolkit: adamw fused' rows)",
    "log float64": "MKL's vector-math log; the toolkit takes no torch log of a reported number (numpy's, math's)",
    "stability: demo model, 3 AdamW steps": "the probe's foreach AdamW; the toolkit's own: 'toolkit: demo model'",
    "aten sqrt (MKL vector math)": "MKL's vector-math sqrt (not correctly rounded); the toolkit's roots are exact.sqrt",
}


def routed(name: str) -> Optional[str]:
    """What the toolkit does about a differing kernel, or None when it is not known to differ elsewhere."""
    return next((why for prefix, why in ROUTED.items() if name.startswith(prefix)), None)


def differing(rows: list, ref: dict) -> list:
    """Names of the rows whose digest differs from ``ref``'s (rows ``ref`` lacks are not compared)."""
    return [r.name for r in rows if r.name in ref and ref[r.name] != r.digest]
