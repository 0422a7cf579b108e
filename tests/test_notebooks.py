"""The notebooks run top to bottom on the CPU (executed with nbclient, as a reader would run them)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
#: what each notebook must show: text patterns in its outputs, and whether it draws a figure
EXPECTED = {
    "01-quickstart": ([r"accuracy \(%\) against iteration count", r"converged fraction: [01]\.\d",
                       r"ρ\(J\*\) per sample: +\[\d", r"ρ\(W_x\): +0\.\d"], True),
    "02-theory": ([r"(\d+)/\1 checks pass", r"PASS  prop4_M_ext_equals_autograd", r"\| σ \| log-range mean"], True),
    "03-your-own-model": ([r"anderson: \{'converged': 6", r"-> attracting: True", r"T = 100: .* = \d\.\d+e-1\d",
                           r"'rho_J_median': 0\.\d+"], False),
}


def test_the_three_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS] == ["01-quickstart.ipynb", "02-theory.ipynb", "03-your-own-model.ipynb"]


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
    patterns, figure = EXPECTED[path.stem]
    for pattern in patterns:
        assert re.search(pattern, text), pattern
    assert not figure or any("image/png" in o.get("data", {}) for o in outputs)
