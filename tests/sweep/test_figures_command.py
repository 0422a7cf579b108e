"""`stability figures`: regenerating the committed figures works, and the figures show what they claim."""

import argparse
import json
import subprocess
import sys

import numpy as np

from stability.commands import figures as figures_command
from stability.theory import figures, regions
from tests.conftest import ROOT, run_cli

REPO = ROOT
OUTPUTS = ["fig2_phase_portraits.png", "fig2_phase_portraits.pdf", "fig5_stability_regions.png",
           "fig5_stability_regions.pdf", "anisotropy.json", "anisotropy.md", "anisotropy.tex",
           "table3_anisotropy_points.png", "table3_anisotropy_points.pdf"]


def _figures(*args):
    return run_cli("figures", *args, check=False, timeout=300)


def test_regenerating_the_figures_reproduces_the_committed_tables(tmp_path):
    out = tmp_path / "figs"
    proc = _figures("--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(OUTPUTS)  # and no temporary files left behind
    for name in OUTPUTS:
        data = (out / name).read_bytes()
        if name.endswith(".png"):
            assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 10_000
        if name.endswith(".pdf"):
            assert data.startswith(b"%PDF") and b"%%EOF" in data[-64:]
    for name in ("anisotropy.json", "anisotropy.md", "anisotropy.tex"):  # deterministic text outputs
        assert (out / name).read_text(encoding="utf-8") == (REPO / "figures" / name).read_text(encoding="utf-8")
    table = json.loads((out / "anisotropy.json").read_text())
    assert set(table) == {"0.5", "1", "2", "4"}


def test_figures_refuses_an_out_path_that_is_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    proc = _figures("--out", str(target), "--only", "fig2")
    assert proc.returncode == 2 and "is a file, expected a directory" in proc.stderr and "Traceback" not in proc.stderr
    proc = _figures("--out", str(tmp_path), "--only", "fig9")
    assert proc.returncode == 2 and "unknown figure fig9" in proc.stderr
    assert target.read_text() == "x" and sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_a_result_driven_entry_is_built_only_when_its_input_is_given(monkeypatch):
    spec = figures_command.FigureSpec("from a sweep", lambda out, args: [], needs=("results",))
    monkeypatch.setitem(figures_command.FIGURES, "sweep_plot", spec)
    assert "sweep_plot" not in figures_command.selected(argparse.Namespace(only=None))
    assert "sweep_plot" in figures_command.selected(argparse.Namespace(only=None, results="dir"))
    assert figures_command.selected(argparse.Namespace(only=["fig5"])) == ["fig5"]


def test_figure5_shades_exactly_the_stable_regions():
    fig = figures.stability_regions(n=2001)
    ax = fig.axes[0]
    fills = [c for c in ax.collections if len(c.get_paths())]
    assert len(fills) == 2  # external, then internal
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-10, 10, 4000), rng.uniform(-6, 6, 4000)
    pts = np.c_[x, y]
    for coll, stable in zip(fills, (regions.stable_external, regions.stable_internal)):
        shaded = np.zeros(len(pts), bool)
        for path in coll.get_paths():
            shaded |= path.contains_points(pts)
        eig = (regions.external_eigenvalue if stable is regions.stable_external else regions.internal_eigenvalue)(x, y)
        clear = np.abs(np.abs(eig) - 1) > 0.05  # away from the boundary, where the 2001-point outline is exact
        clear &= np.abs(x) > 0.02
        assert np.array_equal(shaded[clear], stable(x, y)[clear])


def test_figure2_marks_the_stable_manifold_only_in_the_saddle_case():
    fig = figures.phase_portraits()
    a, b = fig.axes[:2]

    def red_horizontal(ax):
        return [ln for ln in ax.lines if ln.get_color() == figures.MANIFOLD_COLOR
                and np.allclose(ln.get_ydata(), 0)]

    assert not red_horizontal(a) and red_horizontal(b)
    # every plotted trajectory of panel (a) ends closer to x* than it started
    for ln in a.lines:
        xy = np.c_[ln.get_xdata(), ln.get_ydata()]
        if len(xy) > 2:
            assert np.hypot(*xy[-1]) < np.hypot(*xy[0])


def test_figures_without_out_writes_into_an_untracked_folder_not_the_committed_figures(tmp_path):
    """The default --out is runs/figures, which .gitignore leaves out; the tracked figures/ is untouched."""
    proc = run_cli("figures", "--only", "fig2", cwd=tmp_path, check=False, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (tmp_path / "runs" / "figures").iterdir()) == \
        ["fig2_phase_portraits.pdf", "fig2_phase_portraits.png"]
    assert not (tmp_path / "figures").exists()
    default = figures_command.DEFAULT_OUT
    ignored = subprocess.run(["git", "check-ignore", "-q", f"{default}/fig2_phase_portraits.png"], cwd=REPO)
    assert ignored.returncode == 0, f"{default} is not ignored by git"
    tracked = subprocess.run(["git", "ls-files", default], cwd=REPO, capture_output=True, text=True).stdout
    assert tracked == ""
