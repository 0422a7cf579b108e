"""``stability migrate``: what earlier versions wrote, rewritten once into the current shapes (docs/configuration.md,
"Migrating").

* A checkpoint of schema 1 (method options flat in ``train``, every method's options present, a GradScaler state)
  is refused by the loader with one line naming the command; migrated, it loads with the config and weights it
  was written with, and resumes as schema 2.
* A sweep results directory written with the flat-view id hash: its cell ids become those ``stability sweep --list``
  prints for the grid (the references below are the ids the previous version gave these cells), every file named
  by an id follows, and every number of every record is untouched.
* Running it twice changes nothing; a foreign file, or a directory a sweep holds, is one error line, exit 2, with
  nothing written.
"""

import fcntl
import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

import stability
from tests.conftest import ROOT, run_cli
from stability import atomic
from stability import checkpoint as ckpt
from stability.config import METHOD_CLASSES, RunConfig
from stability.errors import CheckpointError
from stability.sweep import grid as gridlib
from stability.sweep.export import write_records

#: a committed record whose numbers the synthetic results directory carries
RECORD = ROOT / "experiments" / "results" / "replication" / "records" / \
    "prefix-sums_pre_external_lr1e-3_seed0--1faaaae751.json"
GRID = """name = "mig"
[fixed.task]
name = "prefix-sums"
train_size = 40
val_size = 8
hard_size = 8
train_length = 8
hard_length = 12
[fixed.model]
width = 16
heads = 2
[fixed.train]
epochs = 1
batch_size = 20
iterations = 4
test_iterations = 6
device = "cpu"
[fixed.train.method]
name = "implicit"
solver_tol = 1e-2
[axes.train.method]
jac_reg = [0.0, 0.1]
"""
#: the ids the previous version (the flat-view hash) gave GRID's cells, with the axis names it recorded
OLD_IDS = {0.0: "prefix-sums_jac-reg0e0--4c185e8756", 0.1: "prefix-sums_jac-reg1e-1--ae64013aa1"}


def schema_1(obj: dict) -> dict:
    """A checkpoint as the schema-1 writer saved it: every method's options beside the train options (the other
    methods' at their defaults), ``method`` the name, the release-semantics fields absent (a file older than them),
    and the never-enabled GradScaler's state."""
    old = dict(obj)
    config = {k: dict(v) for k, v in obj["config"].items()}
    method = dict(config["train"].pop("method"))
    for cls in METHOD_CLASSES.values():
        config["train"].update({n: f.default for n, f in cls.model_fields.items() if n != "name"})
    config["train"]["method"] = method.pop("name")
    config["train"].update(method)
    for name in ("norm_eps", "window_edges", "rope_precision"):
        del config["model"][name]
    old.update(schema_version=1, config=config, scaler=torch.amp.GradScaler("cpu", enabled=False).state_dict())
    return old


def snapshot(path: Path) -> dict:
    """Every file under ``path`` (or the file itself): relative name -> SHA-256 of its bytes."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent if path.is_file() else path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in files}


def one_line_error(proc, needle: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


# ---- checkpoints ------------------------------------------------------------------------------------------
def test_a_schema_1_checkpoint_is_refused_then_migrated_once_and_resumes(trained, tmp_path):
    from stability.config import ModelConfig
    from stability.train import train

    obj = torch.load(trained, weights_only=True)
    old = tmp_path / "old.pt"
    ckpt.atomic_save(schema_1(obj), old)
    with pytest.raises(CheckpointError, match=r"checkpoint schema 1 .* `stability migrate .*old.pt`") as err:
        stability.load(old)
    assert "\n" not in str(err.value)
    one_line_error(run_cli("analyze", old, "--samples", "1", check=False), "stability migrate")

    proc = run_cli("migrate", old)
    assert "checkpoint schema 1 -> 2" in proc.stdout
    new = torch.load(old, weights_only=True)
    assert new["schema_version"] == 2 and "scaler" not in new
    assert new["config"]["train"]["method"] == {"name": "progressive", "alpha": 1.0}
    assert "solver_tol" not in new["config"]["train"] and "bptt_steps" not in new["config"]["train"]
    assert set(new) == set(obj) and new["epoch"] == obj["epoch"] and new["history"] == obj["history"]
    for k, v in obj["model"].items():
        assert torch.equal(new["model"][k], v), k
    loaded = stability.load(old)
    for name, value in ModelConfig.LEGACY_MODEL_VALUES.items():  # the semantics it was written with
        assert getattr(loaded.config.model, name) == value

    before = snapshot(old)
    again = run_cli("migrate", old)
    assert "already current" in again.stdout and snapshot(old) == before

    extended = loaded.config.replace(train=loaded.config.train.replace(epochs=3))
    train(extended, old, resume=True, progress=False)
    assert torch.load(old, weights_only=True)["epoch"] == 3


def test_a_schema_1_config_of_another_method_keeps_only_its_own_options(trained, tmp_path):
    obj = torch.load(trained, weights_only=True)
    obj["config"]["train"]["method"] = {"name": "implicit", "solver_tol": 1e-4}
    old = tmp_path / "imp.pt"
    ckpt.atomic_save(schema_1(obj), old)
    assert torch.load(old, weights_only=True)["config"]["train"]["alpha"] == 1.0
    run_cli("migrate", old)
    method = torch.load(old, weights_only=True)["config"]["train"]["method"]
    assert method == {"name": "implicit", **{n: f.default for n, f in METHOD_CLASSES["implicit"].model_fields.items()
                                             if n != "name"}, "solver_tol": 1e-4}


# ---- results directories ----------------------------------------------------------------------------------
def old_results(tmp_path: Path, trained: Path) -> tuple[Path, Path, dict]:
    """A results directory as the previous version wrote GRID's two cells (ids by the flat-view hash, axes named
    ``train.jac_reg``), each record carrying a committed record's numbers, with a schema-1 checkpoint, metrics,
    an analysis, a cell file, a log and a lock named by its id; plus the committed record itself (its id is the
    same under both hashes)."""
    grid_path = tmp_path / "mig.toml"
    grid_path.write_text(GRID)
    results = tmp_path / "results"
    committed = json.loads(RECORD.read_text())
    records = [committed]
    atomic.write_json(results / "records" / RECORD.name, committed)
    old_pt = schema_1(torch.load(trained, weights_only=True))
    for cell in gridlib.load(grid_path).cells:
        jac_reg = cell.config.train.method.jac_reg
        old = OLD_IDS[jac_reg]
        config = cell.config.replace(model=cell.config.model.replace(attention_window=committed["config"]["model"][
            "attention_window"])).to_dict()  # what the runner records: the task's model fields filled in
        rec = {**committed, "id": old, "cell_id": cell.cell_id, "grid": "mig", "axes": {"train.jac_reg": jac_reg},
               "config": config, "checkpoint": f"runs/{old}.pt"}
        records.append(rec)
        atomic.write_json(results / "records" / f"{old}.json", rec)
        atomic.write_json(results / "cells" / f"{old}.json", {"format": "stability-sweep-cell", "grid": "mig",
                                                               "id": old, "cell_id": cell.cell_id,
                                                               "axes": rec["axes"], "config": cell.config.to_dict()})
        ckpt.atomic_save(old_pt, results / "runs" / f"{old}.pt")
        atomic.write_text(results / "runs" / f"{old}.metrics.jsonl", '{"epoch": 1, "loss": 0.5}\n')
        atomic.write_json(results / "analysis" / f"{old}.json", {"format": "stability-analysis",
                                                                 "checkpoint": f"runs/{old}.pt",
                                                                 "config": old_pt["config"], "splits": []})
        atomic.write_text(results / "logs" / f"{old}.log", f"[1/1] done {cell.cell_id}\n")
        atomic.write_text(results / "locks" / f"{old}.lock", "")
    write_records(records, results)
    return grid_path, results, {r["id"]: r for r in records}


def test_a_results_directory_gets_the_ids_sweep_lists_and_keeps_every_number(trained, tmp_path):
    grid_path, results, old = old_results(tmp_path, trained)
    listed = run_cli("sweep", grid_path, "--list", "--results", results).stdout
    assert "0 done" in listed  # the old ids are not the grid's any more
    cells = gridlib.load(grid_path).cells
    new_ids = {c.config.train.method.jac_reg: c.id for c in cells}
    assert all(new_ids[j] != OLD_IDS[j] and new_ids[j].split("--")[0] == OLD_IDS[j].split("--")[0] for j in OLD_IDS)

    proc = run_cli("migrate", results)
    for j in OLD_IDS:
        assert f"cell id {OLD_IDS[j]} -> {new_ids[j]}" in proc.stdout
    listed = run_cli("sweep", grid_path, "--list", "--results", results).stdout
    assert "2 done" in listed and all(f"done     {c.cell_id}" in listed and c.id in listed for c in cells)

    names = {p.name for p in results.rglob("*") if p.is_file()}
    assert not any(o in n for o in OLD_IDS.values() for n in names)
    for j, new in new_ids.items():
        assert {f"{new}.json", f"{new}.pt", f"{new}.metrics.jsonl", f"{new}.log", f"{new}.lock"} <= names
        assert stability.load(results / "runs" / f"{new}.pt").config.train.method.name == "progressive"
        analysis = json.loads((results / "analysis" / f"{new}.json").read_text())
        assert analysis["checkpoint"] == f"runs/{new}.pt" and analysis["config"]["train"]["method"]["alpha"] == 1.0

    # every number untouched: each record equals the one written before, but for its id, axes names and paths
    by_old = {v: k for k, v in zip(new_ids.values(), OLD_IDS.values())}
    for line in (results / "records.jsonl").read_text().splitlines():
        rec = json.loads(line)
        before = old[next((o for o, n in by_old.items() if n == rec["id"]), rec["id"])]
        same = {"id", "axes", "checkpoint"}
        assert {k: v for k, v in rec.items() if k not in same} == {k: v for k, v in before.items() if k not in same}
        assert json.loads((results / "records" / f"{rec['id']}.json").read_text()) == rec
        if rec["id"] in by_old.values():
            assert rec["axes"] == {"train.method.jac_reg": before["axes"]["train.jac_reg"]}
            assert rec["checkpoint"] == f"runs/{rec['id']}.pt"
        else:
            assert rec == before  # the committed record: the same id under both hashes
    csv_text = (results / "records.csv").read_text()
    assert all(n in csv_text for n in new_ids.values()) and not any(o in csv_text for o in OLD_IDS.values())

    before = snapshot(results)
    again = run_cli("migrate", results)
    assert "already current" in again.stdout and snapshot(results) == before


def test_the_committed_results_are_current(tmp_path):
    """The committed records' cells keep their ids under the nested hash (default method and options): a copy of
    the committed results directory migrates to itself, byte for byte."""
    for name in ("replication",):
        copy = tmp_path / name
        shutil.copytree(ROOT / "experiments" / "results" / name, copy)
        before = snapshot(copy)
        assert "already current" in run_cli("migrate", copy).stdout
        assert snapshot(copy) == before


# ---- refusals ---------------------------------------------------------------------------------------------
def test_a_foreign_path_is_one_error_line_and_nothing_is_written(trained, tmp_path):
    old = tmp_path / "old.pt"
    ckpt.atomic_save(schema_1(torch.load(trained, weights_only=True)), old)
    before = snapshot(old)
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    other = tmp_path / "other.pt"
    torch.save({"weights": torch.zeros(2)}, other)
    release = tmp_path / "release.pth"
    torch.save({"net": {"w": torch.zeros(2)}, "epoch": 1}, release)
    listing = tmp_path / "list.json"
    listing.write_text("[1, 2]")
    empty = tmp_path / "empty"
    empty.mkdir()
    record = tmp_path / "records" / RECORD.name
    record.parent.mkdir()
    shutil.copy(RECORD, record)
    for path, needle in ((text, "not a file stability migrate converts"), (other, "not a stability checkpoint"),
                         (release, "`stability import` converts it"), (listing, "not a file stability migrate"),
                         (empty, "not a sweep results directory"), (record, "migrate its results directory"),
                         (tmp_path / "missing.pt", "no such file")):
        one_line_error(run_cli("migrate", old, path, check=False), needle)
    assert snapshot(old) == before  # every path is checked before anything is written


def test_a_directory_a_sweep_holds_is_refused(trained, tmp_path):
    _, results, _ = old_results(tmp_path, trained)
    before = snapshot(results)
    lock = next((results / "locks").glob("*.lock"))
    with open(lock, "a+") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        one_line_error(run_cli("migrate", results, check=False), "a sweep is running on it")
    assert snapshot(results) == before


# ---- analysis JSONs ---------------------------------------------------------------------------------------
def test_an_analysis_with_a_flat_config_is_refused_by_compare_until_migrated(trained, tmp_path):
    flat = schema_1(torch.load(trained, weights_only=True))["config"]
    report = {"format": "stability-analysis", "schema_version": 3, "checkpoint": "run.pt", "config": flat,
              "options": {}, "splits": ["val"], "val": {"fixed_point": {"converged_fraction": 1.0}}}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(report))
    b.write_text(json.dumps({**report, "config": torch.load(trained, weights_only=True)["config"]}))
    one_line_error(run_cli("compare", a, b, check=False), f"convert it once with `stability migrate {a}`")
    assert "config block with the method block" in run_cli("migrate", a, b).stdout
    migrated = json.loads(a.read_text())
    assert migrated["config"]["train"]["method"] == {"name": "progressive", "alpha": 1.0}
    assert {k: v for k, v in migrated.items() if k != "config"} == {k: v for k, v in report.items() if k != "config"}
    out = run_cli("compare", a, b).stdout
    for name in ("window_edges", "rope_precision"):  # fields a schema-1 file predates (norm_eps: None either way)
        assert f"model.{name}: None" in out
    assert "train.method" not in out
