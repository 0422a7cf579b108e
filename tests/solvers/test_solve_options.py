"""One solver (issue 34, "one of each"): its options are one frozen value with a preset per caller, its methods a
registry the built-in ones are in, its row-wise option lets rows start and end at their own times, and every caller
reaches x* through the analysis' FixedPoint."""

import dataclasses
import math

import pytest
import torch

import stability.solvers as solvers
from stability.analysis.fixed_point import FixedPoint
from stability.solvers import (CONTINUED, HALTING, IMPLICIT, MONITOR, POLISH, Rows, Solve, detect_period,
                               orbit_period, register_solver, solve)


def linear_map(n=6, rho=0.9, seed=0, B=4):
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(n, n, generator=g, dtype=torch.float64)
    A = A / torch.linalg.eigvals(A).abs().max() * rho
    x0 = torch.randn(B, n, generator=g, dtype=torch.float64)
    return (lambda x, x0: x @ A.T + x0), x0


def same(a, b):
    for name in ("x_last", "x_best", "residuals", "best_residual", "nfe", "period"):
        assert torch.equal(getattr(a, name).nan_to_num(7.0), getattr(b, name).nan_to_num(7.0)), name
    assert a.status == b.status and a.info == b.info


@pytest.mark.parametrize("method", ["picard", "damped", "anderson", "broyden"])
def test_a_solve_value_and_the_same_keywords_give_the_same_result(method):
    f, x0 = linear_map()
    how = Solve(method=method, tol=1e-10, max_iter=300, max_period=3)
    same(solve(f, x0, x0, how), solve(f, x0, x0, method=method, tol=1e-10, max_iter=300, max_period=3))
    same(solve(f, x0, x0, how, tol=1e-6), solve(f, x0, x0, how.replace(tol=1e-6)))  # keywords replace its fields


def test_the_presets_are_frozen_values_that_say_whose_solve_they_are():
    assert [p.name for p in (POLISH, MONITOR, HALTING, IMPLICIT, CONTINUED)] == [
        "polish", "monitor", "halting", "implicit", "continued"]
    assert HALTING.diverge_ratio == math.inf and HALTING.max_period == 0 and IMPLICIT.method == "anderson"
    with pytest.raises(dataclasses.FrozenInstanceError):
        MONITOR.tol = 1.0
    with pytest.raises(TypeError):
        solve(lambda x, x0: x, torch.zeros(1, 1), None, nope=1)  # not a knob of Solve
    with pytest.raises(ValueError, match="scale"):
        solve(lambda x, x0: x, torch.zeros(1, 1), None, scale="huge")


def test_the_built_in_methods_are_in_the_registry_an_added_method_joins(monkeypatch):
    monkeypatch.setattr(solvers, "SOLVERS", dict(solvers.SOLVERS))
    monkeypatch.setattr(solvers, "METHODS", solvers.METHODS)
    monkeypatch.setattr(solvers, "ROOT_FINDERS", solvers.ROOT_FINDERS)
    monkeypatch.setattr(solvers, "_DEFAULTS", dict(solvers._DEFAULTS))
    assert set(solvers.SOLVERS) == {"picard", "damped", "anderson", "broyden"}
    assert solvers.ROOT_FINDERS == ("anderson", "broyden")
    f, x0 = linear_map()
    damped = solve(f, x0, x0, method="damped", tol=1e-10, max_iter=400)
    register_solver("half", solvers.SOLVERS["damped"], damping=0.5)  # the damped method under another name
    assert "half" in solvers.METHODS
    half = solve(f, x0, x0, method="half", tol=1e-10, max_iter=400)
    assert torch.equal(half.x_best, damped.x_best) and half.info["damping"] == 0.5 and half.method == "half"


def test_x_last_of_a_diverged_sample_is_its_last_image_before_it_diverged():
    r = solve(lambda x, x0: 10 * x + 1, torch.zeros(2, 1, dtype=torch.float64), None, max_iter=50)
    assert r.status == ["diverged"] * 2
    last = r.x_last[0, 0].item()  # 1, 11, 111, ...: the last image below 1e6 × the start's scale (max(1, |f(e)|))
    assert last < 1e6 and 10 * last + 1 > 1e6


class RestartEach(Rows):
    """A row-wise option: row r is solved from each of its starts in turn, one start after the other."""

    rowwise = True

    def __init__(self, starts):
        self.starts, self.next, self.results = starts, [0] * len(starts), [[] for _ in starts]

    def begin(self, run, rows):
        go = [r for r in rows if self.next[r] < len(self.starts[r])]
        if go:
            run.restart(torch.tensor(go), torch.stack([self.starts[r][self.next[r]] for r in go]))
            for r in go:
                self.next[r] += 1

    def before(self, run):
        if not any(self.next):
            self.begin(run, range(len(self.starts)))

    def after(self, run):
        ended = run.ended[0].tolist()
        for r, status in zip(ended, run.status(run.ended[0])):
            self.results[r].append((status, int(run.age[r]), run.x_best[r].clone(), float(run.best_r[r])))
        self.begin(run, ended)


def test_a_row_wise_solve_restarts_rows_at_their_own_times_each_solve_as_if_alone():
    """Rows of a row-wise solve start again from new points whenever their solve ends, while the others iterate
    on, each with a budget of its own: every one of those solves is the plain solve of that row from that start,
    bit for bit (statuses, evaluations, x*)."""
    g = torch.Generator().manual_seed(1)
    a = torch.tensor([0.5, -0.9, 0.99, 1.5, 0.2, -0.3], dtype=torch.float64)
    x0 = torch.randn(3, 6, generator=g, dtype=torch.float64)
    f = (lambda x, x0: torch.tanh(a * x) + x0)  # elementwise: a row's bits do not depend on its batch mates
    starts = [[torch.randn(6, generator=g, dtype=torch.float64) * s for s in scales]
              for scales in ([1.0, 1e3, 0.1], [1e7], [10.0, 1.0])]
    hook = RestartEach(starts)
    rows_f = (lambda x, i: f(x, x0[i]))  # x0 of a row-wise solve: the rows' indices, as the geometry stage's
    solve(rows_f, x0, torch.arange(3), CONTINUED.replace(tol=1e-9, max_iter=50), rows=hook)
    for r in range(3):
        assert len(hook.results[r]) == len(starts[r])
        for start, (status, age, x_best, best_r) in zip(starts[r], hook.results[r]):
            alone = solve(rows_f, start[None], torch.tensor([r]),
                          CONTINUED.replace(tol=1e-9, max_iter=50))
            assert (status, age) == (alone.status[0], int(alone.nfe[0]))
            assert torch.equal(x_best, alone.x_best[0]) and best_r == float(alone.best_residual[0])
    assert {s for res in hook.results for s, *_ in res} >= {"converged", "max-iterations"}


def test_orbit_period_is_the_cycle_check_s_criterion_on_stored_iterates():
    r = torch.tensor([2.8, 3.2, 3.5, 3.9], dtype=torch.float64).view(4, 1)
    x = torch.full((4, 1), 0.3, dtype=torch.float64)
    f = (lambda x, r: r * x * (1 - x))
    for _ in range(2000):
        x = f(x, r)
    ys = [x]
    for _ in range(16):
        ys.append(f(ys[-1], r))
    assert orbit_period(torch.stack(ys, 1), 8, 1e-8).tolist() == detect_period(f, x, r, max_period=8, tol=1e-8).tolist()
    assert detect_period(f, x, r, max_period=8, tol=1e-8).tolist() == [1, 2, 4, 0]


def test_the_monitor_halting_and_implicit_training_solve_through_the_analysis_fixed_point(monkeypatch):
    """Each builds x0 → e → x* with FixedPoint, under its own named preset."""
    from stability.analysis.halting import halt
    from stability.analysis.monitor import measure
    from stability.config import ModelConfig, TrainConfig
    from stability.model.looped import LoopedTransformer
    from stability.train.implicit import implicit_loss

    used = []
    real = FixedPoint.solve

    def spy(self, how, **kwargs):
        used.append((type(self).__name__, how.name))
        return real(self, how, **kwargs)

    monkeypatch.setattr(FixedPoint, "solve", spy)
    torch.manual_seed(0)
    model = LoopedTransformer(ModelConfig(width=8, heads=2, in_channels=1, out_channels=2))
    inputs = torch.randint(0, 2, (3, 5, 1)).float()
    measure(model, inputs, max_iter=20)
    halt(model, inputs, tol=0.1, max_iter=10)

    class Task:
        def loss(self, logits, targets):
            return logits.float().mean()

    implicit_loss(model, Task(), inputs, None, TrainConfig(iterations=5, method={"name": "implicit"}))
    assert used == [("FixedPoint", "monitor"), ("FixedPoint", "halting"), ("FixedPoint", "implicit")]
