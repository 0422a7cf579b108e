"""One implementation per concept, checked on the source (issue 23): JSON is serialised only by the output module
(``stability.atomic``: one NaN policy, null), no module takes a median other than the middle two's mean
(``stability.stats.median``, or numpy's, which agrees; torch's ``median`` returns the lower middle element), and
ρ(J*), σ_max, the Jacobian products and the (I − J) solves are computed only in the numerics wing
(``stability.numerics``), which the rest of the package reaches through its entry points."""

import ast
from pathlib import Path

import stability

ROOT = Path(stability.__file__).resolve().parent

#: ``json.dumps`` used as a key or a comparison, never written or printed: module -> why
JSON_KEYS = {
    "stability/tasks/cache.py": "the cache key of a dataset file, and an old signature compared with a new one",
    "stability/sweep/executors.py": "a dict of SLURM resources as a grouping key",
    "stability/sweep/export.py": "the deterministic view normalised through a JSON round trip",
    "stability/sweep/grid.py": "the config hash of a cell id, and axis values made hashable",
}


def _calls(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            yield node


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT.parent))


def test_json_is_serialised_only_by_the_output_module():
    writers = sorted({_rel(p) for p in ROOT.rglob("*.py") for c in _calls(p)
                      if c.func.attr in ("dump", "dumps") and isinstance(c.func.value, ast.Name)
                      and c.func.value.id == "json"})
    assert set(writers) - set(JSON_KEYS) == {"stability/atomic.py"}, writers
    assert set(JSON_KEYS) <= set(writers), "an allowed key use is gone: drop it from JSON_KEYS"


def test_the_output_module_writes_non_finite_numbers_as_null(tmp_path):
    import json

    import torch

    from stability.atomic import json_text, write_json

    obj = {"a": float("nan"), "b": [1.0, float("inf")], "c": (torch.tensor(2.5), -float("inf"))}
    assert json.loads(json_text(obj)) == {"a": None, "b": [1.0, None], "c": [2.5, None]}
    write_json(tmp_path / "x.json", obj)
    assert json.loads((tmp_path / "x.json").read_text()) == {"a": None, "b": [1.0, None], "c": [2.5, None]}


def test_no_module_takes_a_lower_or_upper_middle_median():
    allowed = {"np", "numpy", "statistics", "stats"}
    found = sorted(f"{_rel(p)}:{c.lineno}" for p in ROOT.rglob("*.py") for c in _calls(p)
                   if c.func.attr in ("median", "nanmedian")
                   and not (isinstance(c.func.value, ast.Name) and c.func.value.id in allowed))
    assert found == []


def _strict(text: str):
    """JSON as a strict reader takes it: a bare NaN / Infinity token is an error (Python's json accepts them)."""
    import json

    def refuse(token):
        raise AssertionError(f"a bare {token} in the JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_nan_in_a_metrics_line_and_in_a_halt_json_is_written_as_null(tmp_path, monkeypatch, cli):
    import math

    import stability.analysis.halting as halting
    from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
    from stability.train import train
    from stability.train.loop import metrics_path

    def nan_metric(model, task, record):  # an epoch callback's metric that came out NaN (e.g. a failed estimate)
        record["probe"] = float("nan")
        record["probe_list"] = [1.5, float("inf")]

    cfg = RunConfig(model=ModelConfig(width=16, heads=2),
                    task=TaskConfig(train_size=20, val_size=6, hard_size=6, train_length=6, hard_length=8),
                    train=TrainConfig(epochs=1, batch_size=20, iterations=3, test_iterations=4, device="cpu"))
    out = tmp_path / "h.pt"
    res = train(cfg, out, progress=False, callbacks=(nan_metric,))
    assert math.isnan(res.history[0]["probe"])
    lines = metrics_path(out).read_text().splitlines()
    epoch = _strict(lines[0])
    assert epoch["probe"] is None and epoch["probe_list"] == [1.5, None]
    assert epoch["loss"] == res.history[0]["loss"]  # finite numbers as they were
    assert "final" in _strict(lines[-1])

    real = halting.halting_report

    def with_a_nan(*args, **kwargs):  # a row whose accuracy came out NaN
        report = real(*args, **kwargs)
        report["rows"][1]["accuracy_halted"] = float("nan")
        return report

    monkeypatch.setattr(halting, "halting_report", with_a_nan)
    cli("halt", out, "--tol", "0.1", "--quiet", "--json", tmp_path / "h.json")
    report = _strict((tmp_path / "h.json").read_text())
    assert report["rows"][1]["tau"] == 0.1 and report["rows"][1]["accuracy_halted"] is None
    assert report["samples"] == 6


# ---- one numerics wing: ρ(J*), σ_max, the Jacobian products and the (I − J) solves live in stability/numerics/ -----
NUMERICS = "stability/numerics/"
#: the theory room is self-contained by design (docs/design.md): its checks recompute closed-form instances with
#: numpy and sympy, independent of the toolkit's numerics
SELF_CONTAINED = "stability/theory/"
#: library routines that compute a spectrum, a singular value or a Krylov solve
SPECTRAL_CALLS = {"eig", "eigvals", "eigh", "eigvalsh", "eigs", "eigsh", "svd", "svds", "svdvals", "schur", "gmres",
                  "lgmres", "bicgstab", "cg", "minres", "matrix_norm"}
#: (module, routine) outside the wing, with the reason it is not a second ρ, σ_max or solve of J
SPECTRAL_ALLOWED = {
    ("stability/solvers.py", "eigh"): "Broyden's limited memory: the eigenvalues of its stored Gram matrix",
    ("stability/solvers.py", "svd"): "Broyden's limited memory: the best low-rank compression of its correction",
    ("stability/fingerprint.py", "eigvals"): "the kernel fingerprint hashes LAPACK's output; no spectrum reported",
    ("stability/fingerprint.py", "svdvals"): "the kernel fingerprint hashes LAPACK's output; no spectrum reported",
    ("stability/fingerprint.py", "schur"): "the kernel fingerprint hashes scipy's output; no spectrum reported",
}
#: a function or class whose name says it computes one of these (outside the wing: the GMRES failure's error class
#: and its message)
ITERATION_NAMES = ("spectral_radius", "sigma_max", "gmres", "arnoldi", "lanczos", "krylov", "schur", "neumann")
ITERATION_ALLOWED = {"KrylovError", "krylov_message"}


def _outside_the_wing():
    for path in sorted(ROOT.rglob("*.py")):
        rel = _rel(path)
        if not rel.startswith((NUMERICS, SELF_CONTAINED)):
            yield rel, ast.parse(path.read_text(encoding="utf-8"))


def _called_name(node: ast.Call):
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def test_no_module_outside_the_numerics_wing_computes_a_spectrum_or_a_krylov_solve():
    found = sorted({(rel, _called_name(node)) for rel, tree in _outside_the_wing() for node in ast.walk(tree)
                    if isinstance(node, ast.Call) and _called_name(node) in SPECTRAL_CALLS})
    assert set(found) - set(SPECTRAL_ALLOWED) == set(), found
    assert set(SPECTRAL_ALLOWED) <= set(found), "an allowed call is gone: drop it from SPECTRAL_ALLOWED"


def test_no_second_spectral_radius_sigma_max_or_krylov_iteration_is_defined_outside_the_wing():
    found = sorted(f"{rel}:{node.name}" for rel, tree in _outside_the_wing() for node in ast.walk(tree)
                   if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                   and any(w in node.name.lower() for w in ITERATION_NAMES) and node.name not in ITERATION_ALLOWED)
    assert found == []


def test_the_package_reaches_the_wing_only_through_its_entry_points_and_scipy_operators_only_in_the_tests():
    """Callers use spectral_radius, sigma_max, solve_I_minus_J and Linearisation (stability.numerics), never its
    Krylov–Schur core or dense builders directly; no module builds a scipy LinearOperator (the per-sample scipy
    routes are the tests' references, tests/reference_numerics.py)."""
    entry = {"spectral_radius", "sigma_max", "solve_I_minus_J", "Linearisation", "IJSolve", "Spectrum", "route_for",
             "DENSE_MAX", "DENSE_KRYLOV_MAX", "DENSE_BUDGET", "serial_blas", "exact"}
    bad, scipy_ops = [], []
    for rel, tree in _outside_the_wing():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stability.numerics"):
                bad += [f"{rel}: {a.name}" for a in node.names
                        if a.name not in entry and (rel, a.name) not in CORE_ALLOWED]
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("scipy.sparse"):
                scipy_ops.append(rel)
    assert bad == [] and scipy_ops == []
    users = {rel for rel, tree in _outside_the_wing() for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("stability.numerics")}
    # the analysis stages, the training monitor, the solvers' repelling check and implicit training all call it
    assert {"stability/analysis/stages/rho.py", "stability/analysis/monitor.py", "stability/solvers.py",
            "stability/train/implicit.py"} <= users


#: a caller of the wing's core, with why an entry point does not serve it
CORE_ALLOWED = {
    ("stability/lm/tokens.py", "krylov_schur"): "per-token ρ of a causal LM: the operator is J*'s block diagonal "
                                                "(one block a token, the tokens as the batch), not a Linearisation",
}

#: where ATen's sqrt may be called: the exact route itself, and the fingerprint's row that measures ATen's sqrt
SQRT_ALLOWED = {"stability/numerics/exact.py", "stability/fingerprint.py"}


def test_no_module_takes_torch_s_cpu_square_root_of_a_reported_number():
    """ATen's CPU sqrt is MKL's vector math: not correctly rounded, and its last bit differs between Intel and AMD
    CPUs (stability/hardware.py, "Kernel sets"); the package's roots go through stability.numerics.exact.sqrt.
    numpy's and math's roots are the IEEE instruction; rsqrt (ATen's own loop) is the same on every CPU."""
    found = sorted(f"{_rel(p)}:{c.lineno}" for p in ROOT.rglob("*.py") for c in _calls(p)
                   if c.func.attr in ("sqrt", "sqrt_") and _rel(p) not in SQRT_ALLOWED
                   and not (isinstance(c.func.value, ast.Name) and c.func.value.id in ("np", "numpy", "math"))
                   and not (isinstance(c.func.value, ast.Name) and c.func.value.id == "exact"))
    assert found == []
