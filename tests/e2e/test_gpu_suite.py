"""benchmarks/gpu_suite.py --dry-run: every check runs at tiny sizes on the CPU and the JSON has their numbers."""

import importlib.util
import json
import math

import pytest

from stability.analysis.options import STAGES
from tests.conftest import ROOT

SUITE = ROOT / "benchmarks" / "gpu_suite.py"


def load_suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", SUITE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def numbers(v):
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return
    if isinstance(v, (int, float)):
        yield v
    elif isinstance(v, dict):
        for x in v.values():
            yield from numbers(x)
    elif isinstance(v, list):
        for x in v:
            yield from numbers(x)


@pytest.mark.slow
def test_dry_run_writes_every_check_with_finite_numbers(tmp_path, capsys):
    suite = load_suite()
    out = tmp_path / "suite.json"
    assert suite.main(["--dry-run", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["dry_run"] is True and data["device"].startswith("cpu")
    assert set(data["checks"]) == {"train_throughput", "prefix_sums_cell", "batched_rho", "solvers",
                                   "full_analysis"}
    for name, chk in data["checks"].items():
        assert chk["status"] == "ok", (name, chk["error"])
        assert 0 < chk["seconds"] <= chk["cap_s"]
        assert all(math.isfinite(x) for x in numbers(chk["result"])), name
    tp = data["checks"]["train_throughput"]["result"]
    assert tp["samples_per_s"]["fp32"] > 0 and tp["samples_per_s"]["bf16"] > 0
    rho = data["checks"]["batched_rho"]["result"]
    assert rho["samples"] == 2 and 0 < rho["rho_median"] < 1.5 and rho["ritz_residual_max"] <= 1e-6
    assert rho["goal_s"] == 10.0 and isinstance(rho["met"], bool)
    sol = data["checks"]["solvers"]["result"]["solvers"]
    assert set(sol) == {"picard", "anderson", "broyden", "auto"}
    assert sol["picard"]["time_per_eval_vs_picard"] == 1.0
    full = data["checks"]["full_analysis"]["result"]
    assert set(full["tasks"]) == {"sudoku", "chess", "prefix-sums-32", "prefix-sums-512"} and full["samples"] == 2
    for row in full["tasks"].values():  # every stage of `stability analyze` ran and was timed
        assert set(row["stages_s"]) == set(STAGES)
        assert row["converged_fraction"] == 1.0 and 0 < row["rho_median"] < 1
    cell = data["checks"]["prefix_sums_cell"]["result"]
    assert cell["epochs"] == 2 and len(cell["loss"]) == 2 and 0.0 <= cell["val_accuracy_last"] <= 1.0


def test_a_check_past_its_cap_is_recorded_as_timeout_and_the_others_still_run(monkeypatch):
    suite = load_suite()

    def slow(device, dry, partial):
        partial["started"] = 1.0
        import time
        while True:
            time.sleep(0.01)

    def quick(device, dry, partial):
        partial["value"] = 2.0

    def broken(device, dry, partial):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(suite, "CHECKS", {"a": slow, "b": broken, "c": quick})
    data = suite.run_suite(dry_run=True, caps={"a": 0.2, "b": 5, "c": 5})
    assert data["checks"]["a"]["status"] == "timeout" and data["checks"]["a"]["result"] == {"started": 1.0}
    assert data["checks"]["b"]["status"] == "error" and "no such kernel" in data["checks"]["b"]["error"]
    assert data["checks"]["c"]["status"] == "ok" and data["checks"]["c"]["result"] == {"value": 2.0}
