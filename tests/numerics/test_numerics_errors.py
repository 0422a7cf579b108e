"""The numerics layer refuses a wrong argument with the project's error class (a ConfigError: the command line
prints it as one line and exits 2), which is still a ValueError for callers that catch that."""

import pytest
import torch

from stability.errors import ConfigError, StabilityError
from stability.numerics import solve_I_minus_J
from stability.solvers import solve
from stability.stats import distinct_clusters


def _f(x, x0):
    return 0.5 * x + x0


@pytest.mark.parametrize("call, words", [
    (lambda: solve(_f, torch.zeros(2, 3), torch.ones(2, 3), method="nope"), "unknown solver method 'nope'"),
    (lambda: solve(_f, torch.zeros(2, 3), torch.ones(2, 3), max_iter=0), "max_iter must be at least 1"),
    (lambda: solve(_f, torch.zeros(2, 3), torch.ones(2, 3), method="damped", damping=1.5), "damping must be in"),
    (lambda: solve_I_minus_J(lambda v: 0.5 * v, torch.ones(2, 3), tol=float("nan")), "tol must be a positive"),
    (lambda: distinct_clusters(torch.ones(3, 2), atol=-1.0), "atol and rtol must be finite"),
])
def test_a_wrong_argument_to_the_numerics_is_a_one_line_config_error(call, words):
    with pytest.raises(ConfigError, match=words) as info:
        call()
    assert isinstance(info.value, StabilityError) and isinstance(info.value, ValueError)
    assert "\n" not in str(info.value)


def test_the_solvers_still_solve_when_given_valid_arguments():
    res = solve(_f, torch.zeros(2, 3), torch.ones(2, 3), tol=1e-10, max_iter=200)
    assert res.status == ["converged", "converged"]
    assert torch.allclose(res.x_best, torch.full((2, 3), 2.0), atol=1e-8)  # x* = x0 / (1 − 0.5)


def test_first_line_takes_the_first_non_empty_line_or_the_class_name():
    from stability.errors import first_line

    assert first_line(RuntimeError("\n  disk gone  \nmore detail")) == "disk gone"
    assert first_line(KeyError()) == "KeyError"
    assert first_line(ValueError(""), "no message") == "no message"
    assert first_line("one\ntwo") == "one"


def test_a_numerics_error_inside_a_command_is_one_line_and_exit_2(tmp_path, monkeypatch, cli):
    """The numerics' ConfigError reaches the command line's one-line handling: `stability halt` with its solver's
    method gone from the registry (a wrong argument reaching solve from inside a command) prints one line, no
    traceback, and exits 2."""
    import stability.solvers
    from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
    from stability.train import train

    cfg = RunConfig(model=ModelConfig(width=16, heads=2),
                    task=TaskConfig(train_size=20, val_size=6, hard_size=6, train_length=6, hard_length=8),
                    train=TrainConfig(epochs=1, batch_size=20, iterations=3, test_iterations=4, device="cpu"))
    train(cfg, tmp_path / "h.pt", progress=False)
    monkeypatch.delitem(stability.solvers.SOLVERS, "picard")
    proc = cli("halt", tmp_path / "h.pt", "--tol", "0.1", "--quiet", check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stability halt: error: unknown solver method 'picard'"), lines
