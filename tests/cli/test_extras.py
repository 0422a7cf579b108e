"""The optional extras (pyproject.toml; stability/extras.py): the analysis core runs without numba, python-chess,
submitit and sympy, and a command that needs one of them stops with one line naming ``pip install
'stability[EXTRA]'`` and exit 2.

A fresh interpreter is started with a ``sys.meta_path`` finder that refuses the four packages, as if they were not
installed (sympy only to stability's own modules: torch imports it too); what it runs is the README's core: train a small prefix-sums model, ``stability.load`` and
``stability.analyze`` it, ``stability analyze`` it, then the commands that need an extra.
"""

import json
import os
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

OPTIONAL = ("numba", "chess", "submitit", "sympy")

BLOCK = textwrap.dedent(f"""
    import sys

    def importer():
        frame = sys._getframe(2)
        while frame.f_globals.get("__name__", "").startswith("importlib"):
            frame = frame.f_back
        return frame.f_globals.get("__name__", "")

    class Refuse:
        # torch imports sympy itself (torch.fx), so sympy is refused to stability's modules only
        def find_spec(self, name, path=None, target=None):
            top = name.split(".")[0]
            if top in {OPTIONAL!r} and (top != "sympy" or importer().startswith(("stability", "__main__"))):
                raise ImportError(f"No module named {{name!r}} (refused by the test)")

    sys.meta_path.insert(0, Refuse())
""")

CORE = BLOCK + textwrap.dedent("""
    import json, sys
    import stability
    from stability.cli import main

    out, work = sys.argv[1], sys.argv[2]
    codes = {}
    codes["train"] = main(["train", "--task", "prefix-sums", "--width", "16", "--heads", "2", "--train-size", "40",
                           "--val-size", "8", "--hard-size", "8", "--train-length", "6", "--hard-length", "8",
                           "--batch-size", "20", "--iterations", "3", "--test-iterations", "3", "--epochs", "1",
                           "--cooldown-at", "1", "--warmup-epochs", "0", "--quiet", "--out", work + "/m.pt"])
    loaded = stability.load(work + "/m.pt")
    x, y = loaded.task.dataset("val")
    options = stability.AnalysisOptions(stages=("rho",), samples=2)
    result = stability.analyze(loaded.model, x[:2], y[:2], options)
    codes["analyze"] = main(["analyze", work + "/m.pt", "--only", "rho", "--samples", "2", "--quiet",
                             "--json", work + "/a.json"])
    codes["verify_numeric"] = main(["verify", "--only", "b2_exact_projection"])
    loaded_optional = sorted(m for m in sys.modules if m.split(".")[0] in %r or m == "stability.theory.symbolic")
    json.dump({"codes": codes, "rho_keys": sorted(result.to_json()), "loaded_optional": loaded_optional},
              open(out, "w"))
""" % (OPTIONAL[:3],))


def _run(code: str, *args, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          encoding="utf-8", env=env, cwd=cwd, timeout=600)


def test_the_analysis_core_runs_without_the_optional_packages(tmp_path):
    report = tmp_path / "report.json"
    proc = _run(CORE, report, tmp_path)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(report.read_text())
    assert got["codes"] == {"train": 0, "analyze": 0, "verify_numeric": 0}
    assert got["loaded_optional"] == []
    assert json.loads((tmp_path / "a.json").read_text())["splits"]  # the CLI's record was written


def test_a_command_needing_an_extra_says_which_in_one_line(tmp_path):
    cases = {
        "data": ["data", "make", "--task", "chess", "--out", tmp_path / "cache", "--sizes", "1", "1", "1",
                 "--engine", "none", "--quiet"],
        "theory": ["verify", "--only", "sym_fig5_regions"],
        "sweep": ["sweep", tmp_path / "g.toml", "--executor", "slurm", "--cluster", "local", "--results",
                  tmp_path / "sweep"],
    }
    (tmp_path / "g.toml").write_text('name = "g"\n[fixed.task]\nname = "prefix-sums"\n[axes.train]\nseed = [0]\n')
    for extra, argv in cases.items():
        code = BLOCK + "from stability.cli import main\nraise SystemExit(main(sys.argv[1:]))\n"
        proc = _run(code, *argv, cwd=tmp_path)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2, (extra, proc.stderr)
        assert len(lines) == 1 and f"pip install 'stability[{extra}]'" in lines[0], (extra, lines)
        assert "Traceback" not in proc.stderr


def test_the_test_extra_installs_every_optional_extra():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    required = " ".join(project["dependencies"])
    for name in OPTIONAL:
        assert name not in required, name  # the core does not ask for it
    assert any(r.replace(" ", "").startswith("stability[") and {"data", "sweep", "theory"} <= set(
        r.split("[")[1].split("]")[0].split(",")) for r in extras["test"])
