"""The public API: ``import stability`` gives load, analyze, AnalysisOptions, solve, LoopedModel and check_model,
the same objects as their home modules', without importing torch until one of the lazy names is used."""

import subprocess
import sys


def test_the_public_names_are_the_home_modules_objects():
    import stability
    from stability.analysis.options import AnalysisOptions
    from stability.protocols import LoopedModel, check_model
    from stability.solvers import solve

    assert stability.AnalysisOptions is AnalysisOptions and stability.solve is solve
    assert stability.LoopedModel is LoopedModel and stability.check_model is check_model
    assert set(stability.__all__) == {"__version__", "load", "analyze", "AnalysisOptions", "solve", "LoopedModel",
                                      "check_model"}


def test_import_stability_stays_light_until_a_lazy_name_is_used():
    code = ("import sys, stability; light = 'torch' not in sys.modules; stability.solve; "
            "print(light, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True"]


def test_an_unknown_name_is_an_attribute_error():
    import pytest

    import stability

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        stability.nope  # noqa: B018
