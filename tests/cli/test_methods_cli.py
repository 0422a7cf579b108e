"""The methods through real CLI processes: `stability train --method deep-supervision|implicit` with their options,
`stability analyze` and residual-based halting on the checkpoints, and one-line errors for options of another
method."""

import json

import pytest

import stability

SMALL = ["--task", "prefix-sums", "--width", "8", "--heads", "2", "--train-size", "96", "--val-size", "16",
         "--hard-size", "8", "--train-length", "7", "--hard-length", "8", "--batch-size", "48", "--epochs", "2",
         "--iterations", "8", "--test-iterations", "10", "--eval-batch-size", "16", "--device", "cpu", "--quiet"]

METHOD_FLAGS = {
    "deep-supervision": ["--method", "deep-supervision", "--norm", "pre", "--residual-scale", "0.5", "--conv", "3",
                         "--damping", "0.8", "--bptt-steps", "2", "--supervision-interval", "4", "--halt-tol", "0.05"],
    "implicit": ["--method", "implicit", "--norm", "pre", "--solver-tol", "1e-3", "--implicit-backward", "neumann",
                 "--backward-iterations", "20", "--jac-reg", "0.5", "--jac-reg-probes", "2"],
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from tests.conftest import run_cli

    out = {}
    root = tmp_path_factory.mktemp("methods")
    for method, flags in METHOD_FLAGS.items():
        path = root / f"{method}.pt"
        run_cli("train", *SMALL, *flags, "--out", path)
        out[method] = path
    return out


def test_train_writes_checkpoints_whose_config_records_each_method_and_its_options(checkpoints):
    ds = stability.load(checkpoints["deep-supervision"])
    m = ds.config.train.method
    assert m.name == "deep-supervision" and (m.bptt_steps, m.supervision_interval, m.halt_tol) == (2, 4, 0.05)
    assert ds.model.variant_options == {"damping": 0.8, "residual_scale": 0.5, "conv": 3}
    # one optimizer step per segment: 1 or 2 segments of 4 iterations per batch, 2 batches per epoch, 2 epochs
    assert 2 * 2 <= ds.history[-1]["step"] <= 2 * 2 * 2
    imp = stability.load(checkpoints["implicit"])
    m = imp.config.train.method
    assert m.name == "implicit" and m.implicit_backward == "neumann" and m.jac_reg == 0.5 and m.jac_reg_probes == 2
    for run in (ds, imp):
        assert len(run.final["val"]["accuracy"]) == 10


def test_options_of_another_method_are_refused_with_one_line(cli, tmp_path):
    proc = cli("train", *SMALL, "--method", "implicit", "--bptt-steps", "3", "--out", tmp_path / "x.pt", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "only the deep-supervision method uses it" in proc.stderr
    proc = cli("train", *SMALL, "--conv", "4", "--out", tmp_path / "y.pt", check=False)
    assert proc.returncode == 2 and "odd" in proc.stderr and proc.stderr.strip().count("\n") == 0
    assert not (tmp_path / "x.pt").exists() and not (tmp_path / "y.pt").exists()


@pytest.mark.parametrize("method", ["deep-supervision", "implicit"])
def test_checkpoints_of_every_method_analyse_with_stability_analyze(cli, checkpoints, tmp_path, method):
    out = tmp_path / "analysis.json"
    cli("analyze", checkpoints[method], "--split", "val", "--samples", "1", "--max-iter", "30", "--iterations", "5",
        "--probes", "1", "--quiet", "--json", out)
    rep = json.loads(out.read_text())
    assert rep["config"]["train"]["method"]["name"] == method  # the config block carries the method block
    rho = rep["val"]["jacobian"]["spectral_radius"][0]
    assert 0.0 < rho < 10.0
    assert rep["val"]["fixed_point"]["status_counts"]["non-finite"] == 0


def halt_cli(*args):
    from tests.conftest import run_cli

    return run_cli("halt", *args, check=False, timeout=300)


@pytest.mark.parametrize("method", ["deep-supervision", "implicit"])
def test_halting_command_reports_compute_against_accuracy(checkpoints, tmp_path, method):
    out = tmp_path / "halt.json"
    proc = halt_cli(checkpoints[method], "--tol", "0.1", "0.01", "--max-iterations", "20", "--json", out)
    assert proc.returncode == 0, proc.stderr
    assert "fixed T" in proc.stdout and "compute" in proc.stdout
    rep = json.loads(out.read_text())
    taus = [r["tau"] for r in rep["rows"]]
    assert taus == [None, 0.1, 0.01] and rep["budget"] == 20 and rep["samples"] == 16
    assert rep["rows"][0]["compute"] == 1.0
    assert rep["rows"][1]["compute"] <= rep["rows"][2]["compute"] <= 1.0


def test_halting_command_errors_are_one_line(checkpoints, tmp_path):
    (tmp_path / "a-file").write_text("x")  # --json under a file: its folder can never be made
    for args in ([tmp_path / "missing.pt"], [checkpoints["implicit"], "--tol", "-1"],
                 [checkpoints["implicit"], "--json", tmp_path / "a-file" / "dir.json"]):
        proc = halt_cli(*args)
        assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "error" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
