"""`stability compare`: two analyses (or two checkpoints) side by side; every number in the table is the one in
the files, every change is B − A, and a file of the wrong kind is one line and exit 2."""

from __future__ import annotations

import json
import re

import pytest
import torch

from stability.cli import main
from stability.compare import compare_files

TRAIN = ["train", "--task", "prefix-sums", "--width", "16", "--heads", "2", "--train-size", "40", "--val-size", "8",
         "--hard-size", "8", "--train-length", "6", "--hard-length", "8", "--batch-size", "20", "--iterations", "3",
         "--test-iterations", "12", "--epochs", "1", "--warmup-epochs", "0", "--cooldown-at", "1", "--quiet"]
ANALYZE = ["--split", "val", "--samples", "1", "--max-iter", "60", "--iterations", "12", "--probes", "1", "--quiet"]

pytestmark = pytest.mark.slow  # two trainings and two analyses (~20 s on 2 loaded cores)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny runs that differ in their norm, each analysed once."""
    d = tmp_path_factory.mktemp("compare")
    out = {}
    for name, norm in (("a", "pre"), ("b", "post")):
        ckpt, js = d / f"{name}.pt", d / f"{name}.json"
        assert main([*TRAIN, "--norm", norm, "--out", str(ckpt)]) == 0
        assert main(["analyze", str(ckpt), *ANALYZE, "--json", str(js)]) == 0
        out[name], out[name + "_json"] = ckpt, js
    return out


def _row(text: str, split_label: str, label: str) -> list[str]:
    """The cells of the row ``label`` in the table of split ``split_label``."""
    block = text.split(f"\n{split_label} ", 1)[1]
    line = next(line for line in block.splitlines() if line.startswith(label + " "))
    return re.split(r"\s{2,}", line.strip())


def test_compare_analyses_shows_the_files_numbers_and_their_change(runs, capsys, tmp_path):
    capsys.readouterr()
    assert main(["compare", str(runs["a_json"]), str(runs["b_json"]), "--json", str(tmp_path / "c.json")]) == 0
    text = capsys.readouterr().out
    a, b = json.loads(runs["a_json"].read_text()), json.loads(runs["b_json"].read_text())
    assert "model.norm: 'pre' → 'post'" in text
    conv = _row(text, "val", "converged share")
    ca, cb = a["val"]["fixed_point"]["converged_fraction"], b["val"]["fixed_point"]["converged_fraction"]
    assert conv[1:3] == [f"{100 * ca:.1f}%", f"{100 * cb:.1f}%"]
    rho = _row(text, "val", "ρ(J*) median")
    ra, rb = a["val"]["jacobian"]["spectral_radius_median"], b["val"]["jacobian"]["spectral_radius_median"]
    assert ra is not None  # the pre-norm run converges
    assert float(rho[1]) == pytest.approx(ra, rel=1e-3)
    if rb is None:  # no converged sample in B: a blank, and the change says so
        assert rho[2] == "–" and rho[3] == "only in A"
    else:
        assert float(rho[2]) == pytest.approx(rb, rel=1e-3) and rho[3].startswith(f"{rb - ra:+.3g}")
    wa, wb = a["val"]["recall"]["rho_Wx"], b["val"]["recall"]["rho_Wx"]
    wx = _row(text, "val", "ρ(W_x)")
    assert float(wx[1]) == pytest.approx(wa, rel=1e-3) and float(wx[2]) == pytest.approx(wb, rel=1e-3)
    assert wx[3].startswith(f"{wb - wa:+.3g}")
    acc = _row(text, "val", "accuracy at iteration 12")
    assert acc[1:3] == [f"{100 * a['val']['accuracy']['accuracy'][11]:.1f}%",
                        f"{100 * b['val']['accuracy']['accuracy'][11]:.1f}%"]
    assert "Prop. 5 relative error (T = " in text
    written = json.loads((tmp_path / "c.json").read_text())
    by_label = {(r["split"], r["quantity"]): r for r in written["rows"]}
    r = by_label[("val", "ρ(W_x)")]
    assert r["a"] == wa and r["b"] == wb and r["delta"] == pytest.approx(wb - wa) and r["changed"]
    r = by_label[("val", "ρ(J*) median")]
    assert r["a"] == ra and r["b"] == rb and (r["changed"] if rb is not None else r["only_in"] == "A")
    assert {"option": "model.norm", "a": "pre", "b": "post"} in written["config_changes"]


def test_an_analysis_compared_with_itself_has_no_change(runs, capsys):
    capsys.readouterr()
    assert main(["compare", str(runs["a_json"]), str(runs["a_json"]), "--changed"]) == 0
    text = capsys.readouterr().out
    m = re.search(r"(\d+) of (\d+) quantities changed", text)
    assert m and m.group(1) == "0" and int(m.group(2)) >= 15
    assert "options: the same" in text


def test_analysis_json_with_or_without_format_keys_is_read(runs, tmp_path):
    obj = json.loads(runs["b_json"].read_text())
    obj.pop("format", None), obj.pop("schema_version", None)
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(obj))
    tagged = tmp_path / "tagged.json"
    tagged.write_text(json.dumps({**obj, "format": "stability-analysis", "schema_version": 1}))
    c = compare_files(bare, tagged)
    assert not any(r.changed for r in c.rows)
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({**obj, "format": "something-else"}))
    from stability.errors import StabilityError

    with pytest.raises(StabilityError, match="not an analysis JSON"):
        compare_files(bare, foreign)


def test_compare_checkpoints_uses_their_final_evaluations(runs, capsys):
    capsys.readouterr()
    assert main(["compare", str(runs["a"]), str(runs["b"])]) == 0
    text = capsys.readouterr().out
    fa = torch.load(runs["a"], weights_only=True)["final"]
    fb = torch.load(runs["b"], weights_only=True)["final"]
    for split in ("val", "hard"):
        for t in (1, 5, 12):
            row = _row(text, split, f"accuracy at iteration {t}")
            assert row[1:3] == [f"{100 * fa[split]['accuracy'][t - 1]:.1f}%",
                                f"{100 * fb[split]['accuracy'][t - 1]:.1f}%"]
        row = _row(text, split, "per-position accuracy at iteration 12")
        d = fb[split]["position_accuracy"][11] - fa[split]["position_accuracy"][11]
        assert row[3] == ("=" if abs(d) < 1e-12 else f"{100 * d:+.1f} pts")
    assert "model.norm: 'pre' → 'post'" in text


def _bad_files(tmp_path, runs):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "other.json").write_text(json.dumps({"splits": ["val"], "val": {"rows": 3}}))
    (tmp_path / "broken.json").write_text("{ not json")
    unfinished = tmp_path / "unfinished.pt"
    obj = torch.load(runs["a"], weights_only=True)
    obj["final"] = None
    torch.save(obj, unfinished)
    return [
        ([tmp_path / "nosuch.json", runs["a_json"]], "no such file"),
        ([tmp_path, runs["a_json"]], "is a directory"),
        ([tmp_path / "notes.txt", runs["a_json"]], "neither an analysis JSON"),
        ([tmp_path / "list.json", runs["a_json"]], "not an analysis JSON"),
        ([tmp_path / "other.json", runs["a_json"]], "not an analysis JSON"),
        ([tmp_path / "broken.json", runs["a_json"]], "not a readable JSON"),
        ([runs["a_json"], runs["b"]], "compare two of a kind"),
        ([unfinished, runs["b"]], "training has not finished"),
    ]


def test_bad_inputs_are_one_line_and_exit_2(runs, tmp_path, capsys):
    for files, needle in _bad_files(tmp_path, runs):
        capsys.readouterr()
        assert main(["compare", *map(str, files), "--json", str(tmp_path / "out.json")]) == 2, files
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], (files, err)
        assert captured.out == "" and not (tmp_path / "out.json").exists()
