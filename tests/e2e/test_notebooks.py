"""The notebooks run top to bottom on the CPU (executed with nbclient, as a reader would run them), and the numbers
they print have the properties the text around them claims (read from the outputs by label, not by layout)."""

import ast
import json
import math
import re

import pytest

from tests.conftest import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: a number as Python prints it, not a digit inside a name such as x0 or dx0
NUMBER = r"(?<![\w.])(?:[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?|nan|inf)(?!\w)"


def numbers(s: str) -> list[float]:
    return [float(v) for v in re.findall(NUMBER, s)]


def line_after(text: str, label: str) -> str:
    """The rest of the first output line that contains ``label``."""
    for line in text.splitlines():
        if label in line:
            return line.split(label, 1)[1]
    raise AssertionError(f"no output line contains {label!r}")


def numbers_after(text: str, label: str) -> list[float]:
    return numbers(line_after(text, label))


def dict_after(text: str, label: str) -> dict:
    """The first ``{...}`` literal printed after ``label`` (a dict of numbers and strings)."""
    rest = text.split(label, 1)[1] if label in text else ""
    match = re.search(r"\{[^{}]*\}", rest)
    assert match, f"no dict printed after {label!r}"
    return ast.literal_eval(match.group(0))


def check_quickstart(text: str) -> None:
    # the accuracy table: iterations increase up to test_iterations = 20, accuracies are percentages
    lines = text.split("accuracy (%) against iteration count", 1)[1].splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["iteration"])  # after the n line
    assert "n = val" in lines[0]  # the table says how many strings it scored
    rows = [numbers(line) for line in lines[head + 1:]]
    rows = rows[:next((i for i, r in enumerate(rows) if len(r) != 3), len(rows))]
    assert len(rows) >= 2
    iterations = [r[0] for r in rows]
    assert iterations == sorted(set(iterations)) and iterations[-1] == 20
    assert all(0 <= a <= 100 for r in rows for a in r[1:])
    change = numbers_after(text, "relative change of the last step, per sample:")
    assert len(change) == 4 and all(c >= 0 and math.isfinite(c) for c in change)
    (converged,) = numbers_after(text, "converged fraction:")
    assert 0 <= converged <= 1 and (2 * converged).is_integer()  # a share of samples=2
    rho = numbers_after(text, "ρ(J*) per sample:")
    assert len(rho) == 2 and all(math.isfinite(r) and r > 0 for r in rho)
    (rho_wx,) = numbers_after(text, "ρ(W_x):")
    assert math.isfinite(rho_wx) and rho_wx >= 0


def check_theory(text: str) -> None:
    from stability.theory.checks import VERIFIERS

    relation = {"≤": float.__le__, "≥": float.__ge__}
    rows = re.findall(rf"^(PASS|FAIL)\s+(\S+)\s+({NUMBER})\s+([≤≥])\s+({NUMBER})", text, flags=re.M)
    assert len(rows) >= 10
    for status, name, measured, rel, tolerance in rows:
        assert name in VERIFIERS and status == "PASS", name
        assert relation[rel](float(measured), float(tolerance)), name  # the printed numbers bear the verdict out
    passed, total = (int(v) for v in re.search(r"(\d+)/(\d+) checks pass", text).groups())
    assert passed == total == len(VERIFIERS)
    # Table 3: one row per σ, the medians equal the committed figures/anisotropy.json to the printed precision
    header = next(line for line in text.splitlines() if line.startswith("| σ |"))
    columns = [c.strip() for c in header.strip("|").split("|")]
    recorded = json.loads((ROOT / "figures" / "anisotropy.json").read_text(encoding="utf-8"))
    table = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(columns) and re.fullmatch(NUMBER, cells[0]):
            table[cells[0]] = dict(zip(columns, cells))
    assert set(table) == set(recorded)
    for sigma, row in table.items():
        for side, short in (("internal", "int"), ("external", "ext")):
            (median,) = numbers(row[f"log-range median, {short}"])
            assert median == pytest.approx(recorded[sigma][side]["log_range_median"], abs=6e-4)
        (ratio,) = numbers(row["median log-range int/ext"])
        assert ratio == pytest.approx(recorded[sigma]["internal"]["log_range_median"]
                                      / recorded[sigma]["external"]["log_range_median"], abs=6e-3)


def check_own_model(text: str) -> None:
    for solver in ("picard", "anderson"):
        counts = dict_after(text, f"{solver}")
        assert counts.get("converged") == sum(counts.values()) == 6, (solver, counts)  # all 6 samples converge
    (res,) = numbers_after(text, "‖f(x*) − x*‖∞:")
    assert res < 1e-8
    spectra = [line for line in text.splitlines() if "Krylov–Schur" in line]
    assert len(spectra) == 3
    for line in spectra:
        _, krylov, dense = numbers(line.split("attracting")[0])
        assert krylov == pytest.approx(dense, abs=2e-6)  # the matrix-free route against the dense spectrum
        assert re.search(r"attracting: (True|False)", line).group(1) == str(krylov < 1) == "True"
    errors = {int(T): numbers(rest)[-1] for T, rest in re.findall(r"^T\s*=\s*(\d+):(.*)$", text, flags=re.M)}
    Ts = sorted(errors)
    assert len(Ts) >= 3 and Ts[-1] == 100
    assert errors[Ts[-1]] < 1e-9 and errors[Ts[-1]] < 1e-6 * errors[Ts[0]]  # Prop. 5: the error dies out
    (distance,) = numbers_after(text, "largest relative distance between the fixed points:")
    assert distance < 1e-6  # independent of e (App. A.8)
    (rho_median,) = numbers_after(text, "'rho_J_median':")
    assert 0 < rho_median < 1


#: what each notebook must show: a check of the numbers it prints, and whether it draws a figure
EXPECTED = {"01-quickstart": (check_quickstart, True), "02-theory": (check_theory, True),
            "03-your-own-model": (check_own_model, False)}


def test_every_notebook_has_a_check_of_its_numbers_and_every_check_its_notebook():
    assert NOTEBOOKS and sorted(p.stem for p in NOTEBOOKS) == sorted(EXPECTED)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code)
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    outputs = [o for c in code for o in c.get("outputs", [])]
    text = "\n".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    check, figure = EXPECTED[path.stem]
    check(text)
    assert not figure or any("image/png" in o.get("data", {}) for o in outputs)
