"""Residual-based halting at inference (FPRM App. C / E): converged samples stop, and only they."""

import json

import torch

from stability.config import ModelConfig, TaskConfig
from stability.halting import halt, halting_report
from stability.model import build_model
from stability.solvers import residual
from stability.tasks import make_task


def tiny(**kw):
    torch.manual_seed(0)
    opts = dict(recall="external", norm="pre", width=16, heads=2, attention_window=5)
    opts.update(kw)
    return build_model(ModelConfig(**opts)).double().eval()


def test_halting_stops_converged_samples_and_only_them():
    model = tiny()
    inputs = torch.rand(10, 8, 1, dtype=torch.double) - 0.5
    T = 40
    # reference: every sample iterated T times; its halting time is the first t with r_t < τ
    with torch.no_grad():
        x0 = model.embed(inputs)
        xs, rs = [model.initial_state(x0)], []
        for _ in range(T):
            xs.append(model.step(xs[-1], x0))
            rs.append(residual(xs[-1], xs[-2]))
    R = torch.stack(rs, 1)  # (B, T)
    last = R.min(1).values.sort().values
    tau = float(last[4] + last[5]) / 2  # half of the samples reach r < τ within T
    below = R < tau
    ref_halted = below.any(1)
    ref_t = torch.where(ref_halted, below.float().argmax(1) + 1, torch.full_like(ref_halted, T, dtype=torch.long))
    assert 0 < ref_halted.sum() < len(ref_halted)

    sizes = []
    step = model.step
    model.step = lambda a, b: (sizes.append(a.shape[0]), step(a, b))[1]
    res = halt(model, inputs, tol=tau, max_iter=T)
    model.step = step
    assert torch.equal(res.halted, ref_halted)
    assert torch.equal(res.iterations, ref_t)
    for b in range(len(inputs)):  # each sample stopped at its own iterate, read out there
        assert torch.allclose(res.x[b], xs[int(ref_t[b])][b], atol=1e-12)
        assert (res.residual[b] < tau) == ref_halted[b]
    assert torch.allclose(res.logits, model.readout(res.x))
    # only the samples still running were passed to f: t-th call has the samples with halting time ≥ t
    assert sizes == [int((ref_t >= t).sum()) for t in range(1, len(sizes) + 1)]
    assert sum(sizes) == int(res.iterations.sum())


def test_halting_report_spends_less_compute_for_looser_tolerances():
    model = tiny()
    task = make_task(TaskConfig(val_size=12, train_length=6))
    rep = halting_report(model.float(), task, "val", taus=(0.3, 0.1, 0.01), max_iter=30)
    rows = rep["rows"]
    assert rows[0]["tau"] is None and rows[0]["compute"] == 1.0 and rows[0]["halted_fraction"] == 0.0
    computes = [r["compute"] for r in rows[1:]]
    assert computes == sorted(computes) and computes[0] < 1.0
    for r in rows:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["iterations_max"] <= 30
        assert abs(r["compute"] - r["iterations_mean"] / 30) < 1e-9
    json.dumps(rep)  # JSON-ready
