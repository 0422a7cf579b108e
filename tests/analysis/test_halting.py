"""Residual-based halting at inference (FPRM App. C / E): converged samples stop, and only they."""

import json

import torch

from stability.config import ModelConfig, TaskConfig
from stability.analysis.halting import halt, halting_report
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
    task = make_task(TaskConfig(train_size=40, val_size=12, train_length=6))
    rep = halting_report(model.float(), task, "val", taus=(0.3, 0.1, 0.01), max_iter=30)
    rows = rep["rows"]
    assert rows[0]["tau"] is None and rows[0]["compute"] == 1.0 and rows[0]["halted_fraction"] == 0.0
    computes = [r["compute"] for r in rows[1:]]
    assert computes == sorted(computes) and computes[0] < 1.0
    for r in rows:
        assert 0.0 <= r["accuracy"] <= 1.0 and r["iterations_max"] <= 30
        assert abs(r["compute"] - r["iterations_mean"] / 30) < 1e-9
    json.dumps(rep)  # JSON-ready


def test_the_halting_median_of_an_even_count_is_the_mean_of_the_two_middle_values():
    """The report's median is stats.median, as every report's (issue 23), not torch's lower middle element."""
    model = tiny().float()
    task = make_task(TaskConfig(train_size=40, val_size=12, train_length=6))
    inputs = task.dataset("val")[0]
    assert inputs.shape[0] == 12
    # a τ at which the two middle samples stop at different iterations (so the two medians differ)
    for tau in (0.003, 0.01, 0.03, 0.1, 0.3):
        its = sorted(halt(model, inputs, tol=tau, max_iter=30).iterations.tolist())
        if its[5] != its[6]:
            break
    else:
        raise AssertionError("no τ separates the two middle halting times")
    row = halting_report(model, task, "val", taus=(tau,), max_iter=30)["rows"][1]
    assert row["tau"] == tau and row["iterations_median"] == (its[5] + its[6]) / 2 != its[5]


def test_halting_report_prints_shares_and_accuracies_in_percent():
    from stability.analysis.halting import format_report

    rep = {"split": "val", "samples": 4, "budget": 10, "rows": [
        {"tau": None, "halted_fraction": 0.0, "iterations_mean": 10.0, "iterations_median": 10.0,
         "iterations_max": 10, "compute": 1.0, "accuracy": 0.75, "position_accuracy": 0.9,
         "accuracy_halted": None, "accuracy_unhalted": 0.75},
        {"tau": 0.1, "halted_fraction": 0.5, "iterations_mean": 6.0, "iterations_median": 6.0,
         "iterations_max": 10, "compute": 0.6, "accuracy": 0.5, "position_accuracy": 0.8,
         "accuracy_halted": 0.25, "accuracy_unhalted": 1.0}]}
    lines = format_report(rep).splitlines()
    assert "(shares and accuracies in %)" in lines[1]
    assert lines[2].split() == ["fixed", "T", "0.0%", "10.0", "10", "10", "100.0%", "75.0%", "–", "75.0%"]
    assert lines[3].split() == ["0.1", "50.0%", "6.0", "6", "10", "60.0%", "50.0%", "25.0%", "100.0%"]


def test_halt_says_when_samples_exceed_the_split_and_writes_json(tmp_path, capsys):
    import json as _json

    from stability.cli import main
    from stability.config import ModelConfig, RunConfig, TrainConfig
    from stability.train import train

    cfg = RunConfig(model=ModelConfig(width=16, heads=2),
                    task=TaskConfig(train_size=20, val_size=6, hard_size=6, train_length=6, hard_length=8),
                    train=TrainConfig(epochs=1, batch_size=20, iterations=3, test_iterations=4, device="cpu"))
    train(cfg, tmp_path / "h.pt", progress=False)
    assert main(["halt", str(tmp_path / "h.pt"), "--samples", "1000", "--tol", "0.1",
                 "--json", str(tmp_path / "h.json")]) == 0
    captured = capsys.readouterr()
    assert "--samples 1000: the val split has 6 samples; using all 6" in captured.err
    report = _json.loads((tmp_path / "h.json").read_text())
    assert report["samples"] == 6 and [r["tau"] for r in report["rows"]] == [None, 0.1]
    assert f"{100 * report['rows'][1]['accuracy']:.1f}%" in captured.out
