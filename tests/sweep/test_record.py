"""The typed sweep record (stability/sweep/record.py): every committed record loads through it unchanged and is
written back byte for byte, a record that does not fit is one line naming the place, the grid's summary options
round-trip through their record form, and the records written before the method block are refused naming
`stability migrate`, which converts them into records the typed record reads. No training."""

import copy
import json
import shutil
import tempfile
from pathlib import Path

import pytest

from stability.analysis.headline import HEADLINE
from stability.config import ModelConfig, RunConfig, SweepSummary, TrainConfig, to_dict
from stability.errors import StabilityError
from stability.sweep.export import read_jsonl, records_jsonl
from stability.sweep.record import (RECORD_SCHEMA, SplitSummary, SweepRecord, load_records, parse_record, read_record,
                                    typed, written)
from stability.sweep.runner import atomic_write_json
from tests.conftest import ROOT, run_cli

COMMITTED = [ROOT / "experiments" / "results" / "replication", ROOT / "experiments" / "results" / "ieee-kernels",
             ROOT / "experiments" / "results" / "replication-v3"]
#: two records as the sweep wrote them before the method block (commit 0a8f4a3; tests/fixtures/.../README.md)
FLAT = ROOT / "tests" / "fixtures" / "sweep-flat-records"


def _one_committed() -> dict:
    path = sorted((COMMITTED[0] / "records").glob("prefix-sums_pre_external_lr1e-3_seed0--*.json"))[0]
    return json.loads(path.read_text())


#: every committed record and records.jsonl, wherever a results directory holds them
RECORD_FILES = sorted((ROOT / "experiments" / "results").glob("**/records/*.json"))
JSONL_FILES = sorted((ROOT / "experiments" / "results").glob("**/records.jsonl"))


def test_every_committed_record_validates_and_round_trips_to_the_same_dict_and_bytes():
    assert len(RECORD_FILES) == 389  # the second edition's 204, the ieee kernel set's one, the third edition's 184
    assert {p.parent.parent for p in RECORD_FILES} == set(COMMITTED)
    for path in RECORD_FILES:
        raw = json.loads(path.read_text())
        rec = SweepRecord(**raw)
        assert isinstance(rec.config, RunConfig), path  # the one config schema, not a dict
        assert rec.to_dict() == raw, path
        assert list(rec.to_dict()) == list(raw), path  # the keys in the order the sweep writes them
        # what the sweep writes for it (runner.atomic_write_json: atomic.write_json of the typed record's dict) is
        # the committed file, byte for byte
        with tempfile.TemporaryDirectory() as tmp:
            atomic_write_json(Path(tmp) / path.name, rec.to_dict())
            assert (Path(tmp) / path.name).read_bytes() == path.read_bytes(), path
        assert read_record(path).to_dict() == raw


def test_every_committed_records_jsonl_validates_and_is_written_back_byte_for_byte():
    assert {p.parent for p in JSONL_FILES} == set(COMMITTED)
    for path in JSONL_FILES:
        raw = [json.loads(line) for line in path.read_text().splitlines()]
        records = read_jsonl(path)
        assert all(isinstance(r.config, RunConfig) for r in records)
        assert [r.to_dict() for r in records] == raw
        assert records_jsonl(records).encode() == path.read_bytes(), path  # export.write_records' text


def test_the_config_block_is_a_run_config_that_reads_by_attribute_and_writes_back_what_it_was_given():
    raw = _one_committed()
    rec = SweepRecord(**raw)
    assert rec.config.train.lr == raw["config"]["train"]["lr"]
    assert rec.config.model.norm == raw["config"]["model"]["norm"]
    assert list(rec.config.train.betas) == raw["config"]["train"]["betas"]
    assert written(rec.config) == raw["config"]
    # an option the record predates reads as the schema's default and stays absent from the JSON
    del raw["config"]["model"]["depth"], raw["config"]["train"]["train_accuracy_samples"]
    old = SweepRecord(**raw)
    assert old.config.model.depth == ModelConfig().depth
    assert old.config.train.train_accuracy_samples == TrainConfig().train_accuracy_samples
    assert old.to_dict()["config"] == raw["config"] and "depth" not in old.to_dict()["config"]["model"]
    # a record built from a run's RunConfig writes every option
    built = SweepRecord(**{**raw, "config": RunConfig()})
    assert built.to_dict()["config"] == to_dict(RunConfig())


def test_the_typed_record_knows_its_parts():
    rec = SweepRecord(**_one_committed())
    assert rec.schema_version == RECORD_SCHEMA and rec.status == "done"
    assert rec.final["val"].accuracy > 0.9 and rec.analysis["hard"].repelling_searched == 4
    assert rec.options.splits == ("val", "hard") and rec.options.analyze_geometry is True
    assert rec.config.model.recall == "external" and rec.monitor[0].epoch == 8


def test_the_records_headline_block_has_the_documented_headline_keys_in_their_order():
    """A split of ``record["analysis"]`` is the analysis' headline block: every committed record's blocks use the
    names headline.HEADLINE documents (read from SplitSummary, the one list), in the documented order."""
    order = [key for key, _ in HEADLINE]
    blocks = [block for results in COMMITTED for path in sorted((results / "records").glob("*.json"))
              for block in (json.loads(path.read_text()).get("analysis") or {}).values()]
    assert len(blocks) > 300
    for block in blocks:
        assert list(block) == [key for key in order if key in block]
        assert list(SplitSummary(**block).to_dict()) == list(block)


def test_typed_reads_a_records_json_once_and_gives_a_typed_record_back_as_it_is():
    raw = _one_committed()
    rec = typed(raw)
    assert typed(rec) is rec and rec.to_dict() == raw
    assert rec.final["val"].accuracy == raw["final"]["val"]["accuracy"]
    assert rec.analysis["val"].rho_J_median == raw["analysis"]["val"]["rho_J_median"]


def test_a_key_a_record_predates_stays_absent_when_it_is_written_back():
    raw = _one_committed()
    for key in ("cell_id", "curves"):
        del raw[key]
    del raw["timing"]["cpu_seconds"], raw["environment"]["hardware"], raw["analysis"]["val"]["geometry_log_iqr"]
    del raw["options"]["reproducible"]
    back = SweepRecord(**raw).to_dict()
    assert back == raw and "curves" not in back and "cpu_seconds" not in back["timing"]


BAD = [
    ("a number that is text", lambda r: r["final"]["val"].update(accuracy="x"),
     "final.val.accuracy: expected a number, got 'x'"),
    ("a missing key", lambda r: r.pop("grid"), "grid: missing"),
    ("a count that is not whole", lambda r: r["analysis"]["val"].update(samples=1.5),
     "analysis.val.samples: expected an integer, got 1.5"),
    ("an unknown monitor key", lambda r: r["monitor"][2].update(foo=1), "monitor[2]: unknown key(s) foo; allowed: epoch"),
    ("an unknown split", lambda r: r["analysis"].update(train=r["analysis"]["val"]),
     "analysis.train: 'train' is not allowed"),
    ("a status", lambda r: r.update(status="weird"), "status: 'weird' is not allowed; allowed: done, diverged"),
    ("a config the schema refuses", lambda r: r["config"]["model"].update(width=0),
     "config: ModelConfig.width: 0 is outside [1, 65536]"),
    ("options' splits", lambda r: r["options"].update(analyze_splits=["hard", "val"]),
     "options: analyze_splits: ['hard', 'val'] is not allowed; allowed: ['val'], ['hard'], ['val', 'hard']"),
    ("options' count", lambda r: r["options"].update(analyze_samples=-2),
     "options: analyze_samples: -2 is outside [0, 10000000]"),
]


@pytest.mark.parametrize("what,mutate,expected", BAD, ids=[b[0] for b in BAD])
def test_a_record_that_does_not_fit_the_schema_is_one_line_naming_the_place(what, mutate, expected):
    raw = _one_committed()
    mutate(raw)
    with pytest.raises(StabilityError) as err:
        parse_record(raw, "r.json")
    text = str(err.value)
    assert text.startswith("r.json: not a valid sweep record: ") and len(text.splitlines()) == 1, text
    assert expected in text, text


def test_a_record_of_another_schema_or_no_record_at_all_is_refused_in_one_line():
    raw = _one_committed()
    with pytest.raises(StabilityError, match="sweep record schema 2 is not supported"):
        parse_record(dict(raw, schema_version=2), "r.json")
    with pytest.raises(StabilityError, match="not a sweep record"):
        parse_record({"hello": 1}, "r.json")


@pytest.mark.parametrize("summary", [SweepSummary(), SweepSummary(analyze_splits="hard", summary="monitor"),
                                     SweepSummary(analyze_splits="both", reproducible=True, analyze_geometry=True)])
def test_the_sweep_summary_round_trips_through_its_record_form(summary):
    record_form = summary.to_record()
    assert record_form["analyze_splits"] == list(summary.splits)
    assert SweepSummary.from_record(record_form) == summary
    assert ("reproducible" in record_form) == summary.reproducible  # a grid that never asked keeps its shape


def test_a_record_written_before_the_method_block_is_refused_until_migrate_converts_it(tmp_path):
    results = tmp_path / "old"
    shutil.copytree(FLAT, results, ignore=shutil.ignore_patterns("*.md"))
    before = {p.name: json.loads(p.read_text()) for p in (results / "records").glob("*.json")}
    with pytest.raises(StabilityError, match=f"convert it once with `stability migrate {results}`"):
        load_records(results)
    proc = run_cli("tables", results, check=False)
    assert proc.returncode == 2 and "stability migrate" in proc.stderr
    run_cli("migrate", results)
    after = {r.id: r.to_dict() for r in load_records(results)}  # every record through the typed record
    assert sorted(f"{i}.json" for i in after) == sorted(before)  # the default method's cells keep their ids
    for name, old in before.items():
        new = after[name.removesuffix(".json")]
        assert {k: v for k, v in new.items() if k != "config"} == {k: v for k, v in old.items() if k != "config"}
        assert new["config"]["train"]["method"] == {"name": "progressive", "alpha": old["config"]["train"]["alpha"]}
        assert "curves" not in new and "hardware" not in new["environment"]  # predating keys stay absent
        assert SweepRecord(**new).to_dict() == new
    run_cli("tables", results)


def test_a_records_jsonl_with_a_record_that_does_not_fit_names_its_line(tmp_path):
    good = _one_committed()
    bad = copy.deepcopy(good)
    bad["timing"].pop("run_seconds")
    (tmp_path / "records.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(StabilityError, match=r"records\.jsonl:2: not a valid sweep record: timing\.run_seconds: "
                                             r"missing"):
        read_jsonl(tmp_path / "records.jsonl")


def test_migrate_refuses_a_record_its_conversion_would_leave_unreadable_and_writes_nothing(tmp_path):
    results = tmp_path / "old"
    shutil.copytree(FLAT, results, ignore=shutil.ignore_patterns("*.md"))
    path = sorted((results / "records").glob("*.json"))[0]
    broken = json.loads(path.read_text())
    broken["timing"].pop("run_seconds")
    path.write_text(json.dumps(broken))
    before = {p: p.read_bytes() for p in (results / "records").glob("*.json")}
    proc = run_cli("migrate", results, check=False)
    assert proc.returncode == 2 and "not a valid sweep record: timing.run_seconds: missing" in proc.stderr
    assert {p: p.read_bytes() for p in (results / "records").glob("*.json")} == before
