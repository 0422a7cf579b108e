"""The sweep record: the typed form of the one JSON object a finished cell leaves (``DIR/records/<id>.json``;
docs/experiments.md, "The record format"), and the loaders that read records through it.

:class:`SweepRecord` is the format, schema 1, field by field, on the project's one config base (frozen, unknown
keys refused, strict types, one :class:`~stability.errors.ConfigError` line naming the place by its path,
``final.val.accuracy: expected ...``). The runner builds each record through it, and every loader
(:func:`read_record`, :func:`load_records`, :func:`stability.sweep.export.read_jsonl`) validates each record
through it, so a record that does not fit is one error line, never a KeyError in a table.

Serialisation is the record's JSON as the runner has always written it: :meth:`SweepRecord.to_dict` gives the keys
in the same order with the same values (an int stays an int, a float a float: :data:`Real`), and a key that a
record predates (``cell_id``, ``curves``, ``timing.cpu_seconds``, ``environment.hardware``, the analysis keys of
later stages) is absent from it as it was from the file: every record written so far round-trips to the same dict.
Its ``config`` is the one config schema, a :class:`~stability.config.RunConfig` (``rec.config.train.lr``), which
remembers the options the file gave: an option the record predates reads as its default and is written back absent
(:func:`written`). A number written as an int into a float option would be written back as a float; no record has
one (the runner writes a RunConfig's own values).
A record whose config block was written before the method block (schema 1 as written until then) is refused
naming ``stability migrate``, which converts it once (:mod:`stability.migrate`).

Torch-free: the tables, figures and claims read records without importing torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import field_serializer, field_validator

from stability.analysis.headline import SplitSummary
from stability.config import Real, RecordPart, RunConfig, SweepSummary, from_dict, is_flat_config, to_dict
from stability.errors import ConfigError, StabilityError

RECORD_FORMAT = "stability-sweep-record"
RECORD_SCHEMA = 1

Split = Literal["val", "hard"]


class FinalSplit(RecordPart):
    """One split's final evaluation: accuracy at the test iteration (the tables' number), the best one and its
    iteration, whole-answer accuracy after every iteration 1..T (``curve``), the split's size ``n``."""

    test_iteration: int
    accuracy: Optional[Real]
    position_accuracy: Optional[Real]
    best_accuracy: Optional[Real]
    best_iteration: Optional[int]
    n: Optional[int]
    curve: list[Real]


class MonitorEntry(RecordPart):
    """One epoch of the training-time stability monitor (:func:`stability.analysis.monitor.measure`)."""

    epoch: int
    rho_Wx: Optional[Real] = None
    rho_J_median: Optional[Real] = None
    converged_fraction: Optional[Real] = None
    input_grad_norm_median: Optional[Real] = None
    samples: Optional[int] = None
    nfe_median: Optional[Real] = None
    rho_J_max: Optional[Real] = None
    input_grad_converged: Optional[int] = None
    seconds: Optional[Real] = None


class Curves(RecordPart):
    """Per-epoch training curves: the loss, and the accuracy on training inputs (None where not measured)."""

    epoch: list[Optional[int]]
    loss: list[Optional[Real]]
    train_accuracy: list[Optional[Real]]


class StabilitySummary(RecordPart):
    """The final model's stability in four numbers, from the analysis (its val split, else its first) or the
    monitor."""

    source: Literal["analyze", "monitor"]
    split: str
    rho_Wx: Optional[Real]
    rho_J_median: Optional[Real]
    converged_fraction: Optional[Real]
    input_grad_norm_median: Optional[Real]
    samples: Optional[int]
    rho_M_median: Optional[Real] = None
    distinct_fixed_points: Optional[int] = None


class Timing(RecordPart):
    """Where the cell's time went (``run_seconds``: its whole cost on its device; ``cpu_seconds``: this process's
    CPU time, all threads)."""

    epoch_seconds: Real
    eval_and_io_seconds: Real
    summary_seconds: Real
    run_seconds: Real
    wall_seconds: Real
    cpu_seconds: Optional[Real] = None
    resumed_from_epoch: int


class Environment(RecordPart):
    """What ran the cell: the device, the host, the versions, ``CUDA_VISIBLE_DEVICES`` and the hardware signature
    (:func:`stability.hardware.signature`, what makes its numbers reproducible or not)."""

    device: str
    host: str
    torch: str
    package: str
    cuda_visible_devices: Optional[str]
    hardware: Optional[dict[str, Any]] = None


class EnsembleNote(RecordPart):
    """A member of an ensemble group (``stability sweep --ensemble auto``): the group's size, its members' readable
    cell ids in grid order, and this cell's index among them. A solo cell's record has no such key."""

    size: int
    members: list[str]
    index: int


class SweepRecord(RecordPart):
    """One finished cell: its identity and config, the final metrics, the training-time monitor and curves, the
    stability summary and the compact analysis, how it was summarised (``options``: the grid's
    :class:`~stability.config.SweepSummary` in its record form), the timings and the environment."""

    format: Literal["stability-sweep-record"]
    schema_version: Literal[1]
    id: str
    cell_id: Optional[str] = None
    grid: str
    axes: dict[str, Any]
    config: RunConfig
    status: Literal["done", "diverged"]
    error: Optional[str]
    checkpoint: str
    epochs_completed: int
    final: Optional[dict[Split, FinalSplit]]
    loss_last: Optional[Real]
    monitor: list[MonitorEntry]
    curves: Optional[Curves] = None
    stability: Optional[StabilitySummary]
    analysis: Optional[dict[Split, SplitSummary]]
    analysis_note: Optional[str]
    options: SweepSummary
    ensemble: Optional[EnsembleNote] = None
    timing: Timing
    environment: Environment
    finished_at: str

    @field_validator("config", mode="before")
    @classmethod
    def _config(cls, value: Any) -> Any:
        """The config block as a :class:`~stability.config.RunConfig` of the current schema, which remembers the
        options it was given (a record predating an option has none of it, and writes none back); one written
        before the method block names ``stability migrate``."""
        if isinstance(value, RunConfig):  # a run's config: every option written
            value = to_dict(value)
        if is_flat_config(value):
            raise ValueError("written before the method block (its config has the method options beside the train "
                             "options); convert it once with `stability migrate`")
        try:
            return from_dict(RunConfig, value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("options", mode="before")
    @classmethod
    def _options(cls, value: Any) -> Any:
        """The record form of the grid's summary (``analyze_splits`` a list of splits)."""
        if not isinstance(value, dict):
            return value
        try:
            return SweepSummary.from_record(value)
        except ConfigError as exc:  # SweepSummary names itself "summary": here it is the record's options
            text = str(exc).removeprefix("SweepSummary").removeprefix("summary")
            raise ValueError(text.lstrip(".: ")) from None

    @field_serializer("options")
    def _options_json(self, value: SweepSummary) -> dict:
        return value.to_record()

    @field_serializer("config")
    def _config_json(self, value: RunConfig) -> dict:
        return written(value)


def parse_record(obj: Any, where: str, migrate_path: Any = None) -> SweepRecord:
    """``obj`` (a record's JSON) as a :class:`SweepRecord`; a StabilityError line starting ``where`` when it is
    not a record, is of another schema, was written before the method block (naming ``stability migrate
    MIGRATE_PATH``), or does not fit the schema."""
    if not isinstance(obj, dict) or obj.get("format") != RECORD_FORMAT:
        raise StabilityError(f"{where}: not a sweep record (no '{RECORD_FORMAT}' marker)")
    if obj.get("schema_version") != RECORD_SCHEMA:
        raise StabilityError(f"{where}: sweep record schema {obj.get('schema_version')!r} is not supported "
                             f"(this toolkit reads {RECORD_SCHEMA})")
    check_config_shape(obj, where, migrate_path if migrate_path is not None else where)
    try:
        return SweepRecord(**obj)
    except ConfigError as exc:
        raise StabilityError(f"{where}: not a valid sweep record: {exc}") from None


def written(config: RunConfig) -> dict:
    """A record's config block as its JSON holds it: the options it was given, in the schema's order, lists for
    tuples (a record predating an option has none of it)."""
    return _plain(config.model_dump(exclude_unset=True))


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def typed(rec: Union[SweepRecord, dict]) -> SweepRecord:
    """``rec`` as a :class:`SweepRecord`: a record's JSON validated through it (a ConfigError line where it does
    not fit), a SweepRecord as it is."""
    return rec if isinstance(rec, SweepRecord) else SweepRecord(**rec)


def check_config_shape(obj: dict, path, migrate_path) -> None:
    """Refuse (one line naming ``stability migrate``) a record whose config was written before the method block."""
    if isinstance(obj, dict) and is_flat_config(obj.get("config")):
        raise StabilityError(f"{path}: written before the method block (its config has the method options beside "
                             f"the train options); convert it once with `stability migrate {migrate_path}`")


def read_record(path: Path) -> SweepRecord:
    """A record file as a :class:`SweepRecord` (a StabilityError line where it is not one)."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StabilityError(f"{path}: not a readable sweep record ({type(exc).__name__})") from None
    return parse_record(rec, str(path), Path(path).parent.parent)


def load_records(results: Path) -> list[SweepRecord]:
    """Every record under ``results/records`` (sorted by id), typed; a StabilityError when there is none. Its JSON,
    for a file people read (``records.jsonl``), is each record's :meth:`SweepRecord.to_dict`."""
    results = Path(results)
    if not results.exists():
        raise StabilityError(f"{results}: no such results directory")
    folder = results / "records"
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not paths:
        raise StabilityError(f"{results}: no sweep records (expected {folder}/*.json; run `stability sweep` first)")
    return [read_record(p) for p in paths]
