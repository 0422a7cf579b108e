"""benchmarks/gpu_suite.py --dry-run: every check runs at tiny sizes on the CPU inside its budget, the JSON is
written after every check with their numbers and each analysis' seconds per stage, and a cap never fires inside an
import."""

import importlib.util
import json
import math
import sys
import time

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
    assert suite.main(["--dry-run", "--out", str(out), "--budget", "240"]) == 0
    data = json.loads(out.read_text())
    assert data["dry_run"] is True and data["device"].startswith("cpu")
    assert list(data["checks"]) == ["batched_rho", "solvers", "full_analysis", "train_throughput",
                                    "prefix_sums_cell"]
    assert data["budget_s"] == 240 and data["seconds"] <= 240
    assert all(c["at_s"] + c["cap_s"] <= 240 - suite.RESERVE_S + 1e-9 for c in data["checks"].values())  # each cap ends inside the budget
    for name, chk in data["checks"].items():
        assert chk["status"] == "ok", (name, chk["error"])
        assert 0 < chk["seconds"] <= chk["cap_s"]
        assert all(math.isfinite(x) for x in numbers(chk["result"])), name
    tp = data["checks"]["train_throughput"]["result"]
    assert tp["samples_per_s"]["fp32"] > 0 and tp["samples_per_s"]["bf16"] > 0
    assert tp["samples_per_s"][suite.ENSEMBLE_LABEL] > 0 and tp["ensemble"]["members"] == 2  # dry: 2, uncompiled
    for label, sps in tp["samples_per_s"].items():  # TFLOP/s = samples/s × the counted FLOPs of a sample's step
        if sps is not None:
            assert tp["tflops"][label] == pytest.approx(sps * tp["flops_per_sample"] / 1e12, rel=1e-12)
            assert tp["fraction_of_bf16_matrix_rate"][label] == pytest.approx(
                tp["tflops"][label] / tp["bf16_matrix_tflops"], rel=1e-12)
    rho = data["checks"]["batched_rho"]["result"]
    assert rho["samples"] == 2 and 0 < rho["rho_median"] < 1.5 and rho["ritz_residual_max"] <= 1e-6
    assert rho["goal_s"] == 3.0 and isinstance(rho["met"], bool) and rho["stages_s"] == {"rho": rho["seconds"]}
    sol = data["checks"]["solvers"]["result"]["solvers"]
    assert set(sol) == {"picard", "anderson", "broyden", "auto"}
    assert sol["picard"]["time_per_eval_vs_picard"] == 1.0
    full = data["checks"]["full_analysis"]["result"]
    assert set(full["tasks"]) == {"sudoku", "chess", "prefix-sums-32", "prefix-sums-512"} and full["samples"] == 2
    assert full["batch"] == "all" and full["skipped"] == {}
    for row in full["tasks"].values():  # every stage of `stability analyze` ran and was timed
        assert set(row["stages_s"]) == set(STAGES) and sum(row["stages_s"].values()) <= row["seconds"]
        assert row["converged_fraction"] == 1.0 and 0 < row["rho_median"] < 1
    cell = data["checks"]["prefix_sums_cell"]["result"]
    assert cell["epochs"] == 2 and len(cell["loss"]) == 2 and 0.0 <= cell["val_accuracy_last"] <= 1.0


def test_a_check_past_its_cap_is_recorded_as_timeout_and_the_others_still_run(monkeypatch):
    suite = load_suite()

    def slow(device, dry, partial, lease):
        partial["started"] = 1.0
        while True:
            time.sleep(0.01)

    def quick(device, dry, partial, lease):
        partial["value"] = 2.0

    def broken(device, dry, partial, lease):
        raise RuntimeError("no such kernel")

    monkeypatch.setattr(suite, "CHECKS", {"a": slow, "b": broken, "c": quick})
    data = suite.run_suite(dry_run=True, caps={"a": 0.2, "b": 5, "c": 5})
    assert data["checks"]["a"]["status"] == "timeout" and data["checks"]["a"]["result"] == {"started": 1.0}
    assert data["checks"]["b"]["status"] == "error" and "no such kernel" in data["checks"]["b"]["error"]
    assert data["checks"]["c"]["status"] == "ok" and data["checks"]["c"]["result"] == {"value": 2.0}


def test_the_json_is_on_disk_after_each_check_and_the_caps_share_the_budget_left(monkeypatch, tmp_path):
    suite = load_suite()
    out = tmp_path / "suite.json"
    seen = {}

    def check(name, sleep):
        def run(device, dry, partial, lease):
            seen[name] = (sorted(json.loads(out.read_text())["checks"]) if out.exists() else None, lease.cap)
            partial["done"] = sorted(lease.done)
            time.sleep(sleep)
        return run

    monkeypatch.setattr(suite, "CHECKS", {"a": check("a", 0.3), "b": check("b", 0.0), "c": check("c", 0.0)})
    monkeypatch.setattr(suite, "SHARES", {"a": 1.0, "b": 1.0, "c": 2.0})
    data = suite.run_suite(dry_run=True, budget=20.0, out=out)
    assert seen["a"][0] is None and seen["b"][0] == ["a"] and seen["c"][0] == ["a", "b"]
    assert data["checks"]["c"]["result"] == {"done": ["a", "b"]}
    # a's cap: its share (1 of 4) of the budget less the preload and the reserve; b's: 1 of 3 of what a left;
    # c, the last, has all that a and b left
    left = 20.0 - data["preload_s"] - suite.RESERVE_S
    a, b = data["checks"]["a"]["seconds"], data["checks"]["b"]["seconds"]
    assert abs(seen["a"][1] - left / 4) < 0.05 and abs(seen["b"][1] - (left - a) / 3) < 0.05
    assert abs(seen["c"][1] - (left - a - b)) < 0.05
    assert json.loads(out.read_text()) == json.loads(json.dumps(data)) and data["seconds"] <= 20.0


def test_a_cap_waits_for_an_import_to_finish_before_it_fires(tmp_path, monkeypatch):
    suite = load_suite()
    (tmp_path / "gpu2_slow_module.py").write_text("import time\ntime.sleep(0.6)\nLAST = 'imported whole'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    t = time.perf_counter()
    with pytest.raises(suite.CheckTimeout):
        with suite.time_cap(0.1):
            import gpu2_slow_module  # noqa: F401  (the import the cap must not cut)
            while True:
                time.sleep(0.01)
    assert sys.modules["gpu2_slow_module"].LAST == "imported whole" and time.perf_counter() - t >= 0.6
    sys.modules.pop("gpu2_slow_module")


def test_the_dry_run_of_the_analysis_checks_stays_inside_a_small_budget(tmp_path):
    suite = load_suite()
    out = tmp_path / "suite.json"
    assert suite.main(["--dry-run", "--out", str(out), "--budget", "60", "--only", "batched_rho",
                       "--only", "solvers"]) == 0
    data = json.loads(out.read_text())
    assert list(data["checks"]) == ["batched_rho", "solvers"] and data["seconds"] <= 60
    assert all(c["status"] == "ok" and c["seconds"] <= c["cap_s"] for c in data["checks"].values())
    assert all(c["at_s"] + c["cap_s"] <= 60 - suite.RESERVE_S + 1e-9 for c in data["checks"].values())
    assert set(data["checks"]["batched_rho"]["result"]["stages_s"]) == {"rho"}


def test_a_budget_without_room_for_a_check_is_one_error_line_and_exit_2(capsys):
    suite = load_suite()
    with pytest.raises(SystemExit) as exc:
        suite.main(["--dry-run", "--budget", "1"])
    assert exc.value.code == 2 and "--budget: 1 s leaves no time" in capsys.readouterr().err
