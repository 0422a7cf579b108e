"""One definition of the median over converged samples: every report takes ``stats.median`` (the middle two's mean
for an even count) over the samples at which a fixed point was found (status converged or repelling,
``stats.FIXED_POINT_STATUSES``), for ρ(J*) and ρ(M) alike."""

import statistics

from stability.stats import FIXED_POINT_STATUSES, median
from stability.sweep.runner import analysis_summary
from tests.conftest import ROOT


def _report() -> dict:
    status = ["converged", "repelling", "stalled", "converged"]
    rho = [0.5, 1.2, 9.0, 0.7]
    return {"splits": ["val"], "val": {
        "samples": 4,
        "fixed_point": {"status": status, "converged_fraction": 0.75},
        "jacobian": {"spectral_radius": rho,
                     "spectral_radius_median": median([r for r, s in zip(rho, status) if s in FIXED_POINT_STATUSES])},
        "prop4": {"rho_M": rho, "max_abs_diff_vs_autograd": 0.0}}}


def test_rho_M_median_counts_the_samples_rho_J_median_counts():
    summary = analysis_summary(_report())["val"]
    expected = statistics.median([0.5, 1.2, 0.7])  # the three fixed points, the repelling one included
    assert summary["rho_M_median"] == expected == summary["rho_J_median"] == 0.7


def test_the_report_row_of_rho_M_counts_a_repelling_fixed_point():
    import json
    from pathlib import Path

    from stability.analysis.report import split_table

    block = json.loads((ROOT / "docs" / "demo-sample.json").read_text())
    block = block["analysis"]["val"]
    status, rho_M = block["fixed_point"]["status"], block["prop4"]["rho_M"]
    i = next(i for i, s in enumerate(status) if s != "converged")  # a sample without a fixed point, made repelling
    status[i] = "repelling"
    rho_M[i] = 5.0
    expected = statistics.median([r for r, s in zip(rho_M, status) if s in ("converged", "repelling")])
    row = next(line for line in split_table(block).splitlines() if line.startswith("ρ(M) median"))
    assert row.split()[2] == format(expected, ".4g")  # the report's number format


def test_the_median_of_an_even_count_is_the_mean_of_the_middle_two():
    assert median([4, 1, 3, 2]) == 2.5 == statistics.median([4, 1, 3, 2])
