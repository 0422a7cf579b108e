"""The ``lm`` extra is optional: without transformers, the reference model (pure torch) is analysed as a language
model, and loading a Hugging Face directory stops with one line naming ``pip install 'stability[lm]'``. A fresh
interpreter refuses ``transformers`` through a ``sys.meta_path`` finder, as if it were not installed."""

import json
import subprocess
import sys
import textwrap

from tests.conftest import ROOT

SCRIPT = textwrap.dedent("""
    import json, sys

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "transformers":
                raise ImportError(f"No module named {name!r} (refused by the test)")

    sys.meta_path.insert(0, Refuse())
    import torch
    import stability
    from stability.config import AnalysisOptions
    from stability.errors import MissingExtraError
    from stability.lm.huginn import tiny

    out, hf_dir = sys.argv[1], sys.argv[2]
    ids = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    a = stability.analyze(tiny(), ids, options=AnalysisOptions(samples=2, stages=("reachability",), max_iter=20,
                                                               iterations=2))
    try:
        stability.load(hf_dir)
        refused = None
    except MissingExtraError as exc:
        refused = str(exc)
    json.dump({"lm": sorted(a["lm"]), "refused": refused,
               "transformers_loaded": any(m.split(".")[0] == "transformers" for m in sys.modules)}, open(out, "w"))
""")


def test_the_lm_extra_is_optional(tmp_path):
    hf_dir = tmp_path / "hf"
    hf_dir.mkdir()
    (hf_dir / "config.json").write_text(json.dumps({"model_type": "hrm_text"}))
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, str(script), str(out), str(hf_dir)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())
    assert {"tokens", "token_rho", "scoring", "exits", "precision"} <= set(got["lm"])
    assert got["refused"] and "pip install 'stability[lm]'" in got["refused"] and "\n" not in got["refused"]
    assert got["transformers_loaded"] is False
