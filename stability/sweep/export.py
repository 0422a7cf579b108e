"""A sweep's records in the tools a researcher already uses: one JSONL file and one flat CSV table.

``records.jsonl`` holds every record (one JSON object a line, sorted by cell id) as the sweep wrote it; it is what
a replication commits and what ``tests/e2e/test_replication.py`` compares a rerun against. ``records.csv`` is one row
per run: the cell's axes, its status, whole-answer and per-position accuracy per split at the test iteration, and
the analysis summary of each analysed split (converged share, ρ(J*), ρ(M), ρ(W_x), ‖dx*/dx0‖_F, distinct fixed
points, the App. A.8 distance, ‖dx_T/de‖ at the largest T), plus the run's seconds.

:func:`deterministic_view` drops what legitimately differs between two runs of the same cell (timings, host,
finish time, paths), leaving what must be equal bit for bit on the CPU; it writes the config block through the
current schema (:func:`canonical_config`), so a record written before an option existed compares equal.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Union

from stability import atomic
from stability.config import RunConfig, from_dict
from stability.errors import ConfigError, StabilityError
from stability.sweep.record import SweepRecord, parse_record, typed

#: per-split analysis quantities in the CSV (the keys of ``runner.analysis_summary``)
ANALYSIS_COLUMNS = ("samples", "converged_fraction", "rho_J_median", "rho_M_median", "rho_Wx",
                    "input_grad_norm_median", "distinct_fixed_points", "fixed_point_distance_max", "dxT_de_norm_last",
                    "prop5_rel_error_last", "accuracy_at_fixed_point")
#: per-split quantities of later stages, as columns only where some record has them (older CSVs keep their shape)
OPTIONAL_ANALYSIS_COLUMNS = ("repelling_found", "repelling_searched", "repelling_ran_out", "e_local_exceed",
                             "e_local_measured", "e_global_differ", "e_global_compared", "geometry_median_radius",
                             "geometry_log_iqr", "geometry_log_range", "geometry_balance", "geometry_unstable_t0",
                             "path_aa_other_median", "path_aa_noise_median")
BASE_COLUMNS = ("cell_id", "id", "task", "norm", "recall", "lr", "seed", "status", "epochs_completed", "loss_last")
#: record keys that differ between two runs of one cell without the results differing
VOLATILE = ("timing", "environment", "finished_at")


Records = list[Union[SweepRecord, dict]]


def _sorted(records: Records) -> list[SweepRecord]:
    """The records typed, by cell id (then id)."""
    return sorted(map(typed, records), key=lambda r: (r.cell_id or r.id, r.id))


def csv_columns(records: Records) -> list[str]:
    """The CSV's columns: the base ones, the final accuracies, each analysed split's headline columns (the optional
    ones only where some record has them) and the timings."""
    records = list(map(typed, records))
    splits = sorted({s for r in records for s in (r.analysis or {})})
    cols = list(BASE_COLUMNS)
    for split in ("val", "hard"):
        cols += [f"{split}_accuracy", f"{split}_position_accuracy", f"{split}_best_accuracy"]
    present = {k for r in records for b in (r.analysis or {}).values() for k in b.model_fields_set}
    for split in splits:
        cols += [f"{split}_{k}" for k in ANALYSIS_COLUMNS]
        cols += [f"{split}_{k}" for k in OPTIONAL_ANALYSIS_COLUMNS if k in present]
    if any(r.curves is not None and r.curves.train_accuracy for r in records):
        cols.append("train_accuracy_last")
    return cols + ["stability_source", "train_seconds", "summary_seconds", "run_seconds", "cpu_seconds"]


def csv_row(rec: Union[SweepRecord, dict]) -> dict:
    """The flat CSV row of one record, read typed (empty strings where a value is undefined)."""
    rec = typed(rec)
    c = rec.config
    row = {"cell_id": rec.cell_id or rec.id, "id": rec.id, "task": c.task.name,
           "norm": c.model.norm, "recall": c.model.recall, "lr": c.train.lr,
           "seed": c.train.seed, "status": rec.status, "epochs_completed": rec.epochs_completed,
           "loss_last": rec.loss_last}
    for split in ("val", "hard"):
        f = (rec.final or {}).get(split)
        row[f"{split}_accuracy"] = None if f is None else f.accuracy
        row[f"{split}_position_accuracy"] = None if f is None else f.position_accuracy
        row[f"{split}_best_accuracy"] = None if f is None else f.best_accuracy
    for split, block in (rec.analysis or {}).items():
        for k in ANALYSIS_COLUMNS + OPTIONAL_ANALYSIS_COLUMNS:
            row[f"{split}_{k}"] = getattr(block, k)
    train_accuracy = rec.curves.train_accuracy if rec.curves is not None else []
    row["train_accuracy_last"] = next((a for a in reversed(train_accuracy) if a is not None), None)
    timing = rec.timing
    row["stability_source"] = rec.stability.source if rec.stability is not None else None
    row["train_seconds"] = (timing.epoch_seconds or 0.0) + (timing.eval_and_io_seconds or 0.0)
    row["summary_seconds"] = timing.summary_seconds
    row["run_seconds"] = timing.run_seconds
    row["cpu_seconds"] = timing.cpu_seconds
    return {k: ("" if v is None else v) for k, v in row.items()}


def records_csv(records: Records) -> str:
    """``records.csv``: one row per record, by cell id."""
    cols = csv_columns(records)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for rec in _sorted(records):
        row = csv_row(rec)
        w.writerow({k: row.get(k, "") for k in cols})
    return buf.getvalue()


def records_jsonl(records: Records) -> str:
    """``records.jsonl``: each record's JSON (as the sweep wrote it, keys sorted) a line, by cell id."""
    return "".join(atomic.json_text(r.to_dict(), sort_keys=True) + "\n" for r in _sorted(records))


def write_records(records: Records, out_dir: Path) -> list[Path]:
    """``records.jsonl`` and ``records.csv`` in ``out_dir`` (atomically); returns the two paths."""
    out_dir = Path(out_dir)
    return [atomic.write_text(out_dir / "records.jsonl", records_jsonl(records)),
            atomic.write_text(out_dir / "records.csv", records_csv(records))]


def read_jsonl(path: Path) -> list[SweepRecord]:
    """The records of a ``records.jsonl`` file, typed (:class:`~stability.sweep.record.SweepRecord`; one written
    before the method block refused, naming ``stability migrate``)."""
    out = []
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise StabilityError(f"{path}: cannot read the records ({type(exc).__name__})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            raise StabilityError(f"{path}:{n}: not a JSON record") from None
        out.append(parse_record(obj, f"{path}:{n}", path))
    return out


def canonical_config(config: dict) -> dict:
    """A stored RunConfig dict through the current schema (the fields it predates at their defaults); a block the
    schema refuses (one written before the method block: ``stability migrate`` converts it) is returned as it
    is."""
    try:
        return from_dict(RunConfig, config).to_dict()
    except ConfigError:
        return config


def deterministic_view(rec: dict) -> dict:
    """The record without what differs between two runs of one cell on one machine: timings (also those inside
    the analysis summary and the monitor's entries), the environment (host, versions) and the finish time; its
    config in the current schema's shape (:func:`canonical_config`)."""
    out = {k: v for k, v in rec.items() if k not in VOLATILE}
    if isinstance(out.get("config"), dict):
        out["config"] = canonical_config(out["config"])
    if out.get("monitor"):
        out["monitor"] = [{k: v for k, v in m.items() if k != "seconds"} for m in out["monitor"]]
    if out.get("analysis"):
        out["analysis"] = {s: {k: v for k, v in b.items() if k not in ("timings_s", "timings")}
                           for s, b in out["analysis"].items()}
    return json.loads(json.dumps(out, sort_keys=True))
