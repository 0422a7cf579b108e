"""Every theory check holds for the paper's claim and rejects its deliberately wrong variant."""

import json
import math

import pytest

from stability.theory.checks import VERIFIERS, Check, Verifier, run_checks
from stability.theory.checks.instances import TanhMap, real_matrix_with_spectrum

NAMES = list(VERIFIERS)


def test_the_registry_covers_every_result_the_issue_lists():
    sources = " ".join(v.source for v in VERIFIERS.values())
    for cited in ("Prop. 1", "Prop. 2", "Prop. 3", "A.4 case 1", "A.4 case 2", "A.4 case 3", "Prop. 4 (external)",
                  "Prop. 4 (internal)", "Prop. 5", "A.7", "A.8", "Lemma 1", "FPRM (contraction", "A.3 (damping)",
                  "truncated BPTT", "Corollary 1", "eq. 8", "B.3.3", "B.2"):
        assert cited in sources, cited


@pytest.mark.parametrize("name", NAMES)
def test_check_holds_for_the_papers_claim(name):
    check = VERIFIERS[name].run(seed=0)
    assert check.passed, f"{check.measured} {check.relation} {check.tolerance}: {check.instance}"
    assert check.variant == "paper" and math.isfinite(check.measured)


@pytest.mark.parametrize("name", NAMES)
def test_check_rejects_its_deliberately_wrong_variant(name):
    check = VERIFIERS[name].run(seed=0, wrong=True)
    assert not check.passed, f"wrong variant accepted: {check.measured} {check.relation} {check.tolerance}"
    assert math.isfinite(check.measured), check.instance  # rejected by measurement, not by a crash
    assert check.variant == "wrong" and check.statement.startswith("[wrong variant:")


@pytest.mark.parametrize("name", ["prop4_internal_attracts_iff_rho_M_below_1", "a4_case3_exploding_parameter_gradient",
                                  "prop5_error_decays_with_T", "fprm_damping_eta0"])
def test_randomised_checks_hold_on_other_instances(name):
    assert VERIFIERS[name].run(seed=3).passed
    assert not VERIFIERS[name].run(seed=3, wrong=True).passed


def test_a_measurement_that_raises_is_a_failed_row_not_a_traceback():
    def broken(seed, wrong):
        raise ArithmeticError("no convergence")

    check = Verifier("broken", "nowhere", "a property", "<=", 1.0, "none", broken).run()
    assert not check.passed and math.isnan(check.measured)
    assert "ArithmeticError: no convergence" in check.instance


def test_check_records_are_json_ready():
    check = Check("n", "s", "st", "inst", float("nan"), "<=", 1.0, False)
    assert json.loads(json.dumps(check.to_dict()))["measured"] is None
    record = VERIFIERS["lemma1_telescoping_product"].run().to_dict()
    assert set(record) == {"name", "source", "statement", "instance", "measured", "relation", "tolerance", "passed",
                           "variant"}


def test_run_checks_refuses_unknown_names():
    with pytest.raises(KeyError, match="unknown check"):
        run_checks(["no_such_check"])


def test_constructed_tanh_map_has_the_prescribed_fixed_point_and_jacobian():
    import numpy as np

    rng = np.random.default_rng(0)
    J = real_matrix_with_spectrum(rng, [0.9, -0.5 + 0.3j])
    assert np.allclose(np.sort_complex(np.linalg.eigvals(J)), np.sort_complex([0.9, -0.5 - 0.3j, -0.5 + 0.3j]))
    m, x_star = TanhMap.around(rng.uniform(-0.5, 0.5, size=3), J)
    assert np.allclose(m(x_star), x_star, atol=1e-15) and np.allclose(m.jac(x_star), J, atol=1e-12)
