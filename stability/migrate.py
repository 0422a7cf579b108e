"""``stability migrate``: the one conversion of what earlier versions wrote into the current shapes, run once
(docs/configuration.md, "Migrating"). The loaders convert nothing: they refuse an old file naming this command.

* A checkpoint of schema 1 becomes schema 2: the chosen method's options move from ``train`` into its method
  block, the other methods' options (at their defaults in schema 1, whose validation refused anything else) are
  dropped, and so is the ``scaler`` entry (a GradScaler that was never enabled); weights, optimizer, schedule, RNG
  state and history are written back as they were read.
* An analysis JSON (``stability analyze --json``) whose config block has that flat shape: the block.
* A sweep results directory (or a records ``.jsonl`` file): each record's, cell's and analysis's config block, and
  each cell id whose hash is the one of earlier versions, SHA-1 over the flat view of the train options, becomes
  the id :func:`stability.sweep.grid.config_hash` gives the nested config. Cells whose method is the default one with
  its default options hash the same either way and keep their ids; the others get new ones. The files named by
  an id (``records/``, ``runs/``, ``analysis/``, ``cells/``, ``logs/``, ``locks/``) are renamed, and each mention
  of an id in the directory's JSON, JSONL and CSV files is rewritten: nothing else in them changes. A converted
  record is one the typed record reads (:class:`stability.sweep.record.SweepRecord`, schema 1: the records written
  before the method block were schema 1 too, and differ only in their config block).

Every path is read and checked before anything is written; a path that is none of these (a foreign file), or a
directory a sweep is still writing, is one error line. Each file is written atomically
(:mod:`stability.atomic`), records last, so an interrupted migration is finished by running it again; running it
on migrated files changes nothing.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from stability import atomic
from stability.config import (METHOD_CLASSES, OPTION_METHOD, SECTIONS, ModelConfig, RunConfig, TrainConfig,
                              from_dict, is_flat_config, to_dict)
from stability.errors import StabilityError, first_line
from stability.sweep.grid import config_hash, digest
from stability.sweep.record import RECORD_FORMAT, parse_record

# the checkpoint modules (torch) are imported where a checkpoint is converted: records and JSONs migrate without it

#: the ModelConfig fields a sweep's runner sets from the task (``Task.model_options``) before it records the config
TASK_FIELDS = ("in_channels", "out_channels", "spatial_ndim", "attention_window")
#: files whose text may mention a cell id
TEXT_SUFFIXES = (".json", ".jsonl", ".csv")
_ID = re.compile(r"(.+)--([0-9a-f]{10})")


def nest_method(config: dict) -> dict:
    """A config block written before the method block (``train``'s ``method`` a name, every method's options beside
    the other train options) in the current shape: the chosen method's options in its block, the others dropped."""
    if not is_flat_config(config):
        return config
    train = dict(config["train"])
    name = train.get("method", "progressive")
    block = {"name": name}
    for key in [k for k in train if k in OPTION_METHOD]:
        value = train.pop(key)
        if OPTION_METHOD[key] == name:
            block[key] = value
    train["method"] = block
    return {**config, "train": train}


def nest_axes(axes: dict) -> dict:
    """A cell's axes as earlier versions named them (``train.method`` the method's name, ``train.<option>`` an option
    of the method) by their paths in the nested config (``train.method.name``, ``train.method.<option>``)."""
    def path(key: str) -> str:
        if key == "train.method":
            return "train.method.name"
        section, _, name = key.partition(".")
        return f"train.method.{name}" if section == "train" and name in OPTION_METHOD else key

    return {path(k): v for k, v in axes.items()}


def _current(obj: Any) -> Any:
    """A record, cell or analysis (a JSON object) with its config block and axes in the current shapes; the object
    itself when they are."""
    if not isinstance(obj, dict):
        return obj
    out = dict(obj)
    if is_flat_config(obj.get("config")):
        out["config"] = nest_method(obj["config"])
    if isinstance(obj.get("axes"), dict):
        out["axes"] = nest_axes(obj["axes"])
    return obj if out == obj else out


def flat_view_hash(config: RunConfig) -> str:
    """A cell's id hash as versions before the nested hash computed it: the options that differ from their
    defaults, the train options in the flat view (``method`` the method's name, its options beside the others,
    every method's options at their defaults)."""
    def flat(train: dict) -> dict:
        method = dict(train.pop("method"))
        return {**train, "method": method.pop("name"), **method}

    defaults = flat(to_dict(TrainConfig()))
    for cls in METHOD_CLASSES.values():
        defaults.update({n: f.default for n, f in cls.model_fields.items() if n != "name"})
    explicit = {}
    for section, cls in SECTIONS.items():
        values = to_dict(getattr(config, section))
        base = defaults if section == "train" else to_dict(cls())
        values = flat(values) if section == "train" else values
        explicit[section] = {k: v for k, v in values.items() if v != base[k]}
    return digest(explicit)


def new_cell_id(cell_id: str, config: dict, where: str) -> str:
    """The current id of a cell whose id is ``cell_id`` and whose stored config is ``config`` (a record's: the
    task's model fields filled in, or a cell's: as the grid gave it): ``cell_id`` itself when its hash is the nested
    one, the readable part with the nested hash when it is the flat view's; a StabilityError when it is neither."""
    m = _ID.fullmatch(cell_id)
    if m is None:
        raise StabilityError(f"{where}: {cell_id!r} is not a cell id (readable part, '--', 10 hex digits)")
    try:
        stored = from_dict(RunConfig, nest_method(config))
    except StabilityError as exc:
        raise StabilityError(f"{where}: its config is not valid here ({first_line(exc)})") from None
    candidates = [stored]
    try:
        candidates.insert(0, stored.replace(model=stored.model.replace(**{k: ModelConfig.model_fields[k].default
                                                                          for k in TASK_FIELDS})))
    except StabilityError:  # a model the task's defaults do not fit: its config is the cell's as it is
        pass
    if any(config_hash(c) == m[2] for c in candidates):
        return cell_id
    for c in candidates:
        if flat_view_hash(c) == m[2]:
            return f"{m[1]}--{config_hash(c)}"
    raise StabilityError(f"{where}: the hash of {cell_id} is not the hash of its config (now or before the "
                         "nested hash): cannot tell its new id")


@dataclass
class Migration:
    """What migrating one path does: ``steps``, each (what kind of change, its file, the write), run in order by
    :meth:`apply`; nothing is written before. ``ids``: the cell ids that change (old -> new)."""

    path: Path
    steps: list = field(default_factory=list)
    ids: dict = field(default_factory=dict)

    def apply(self) -> list[str]:
        for _, _, run in self.steps:
            run()
        return self.report()

    def report(self) -> list[str]:
        """What it rewrote, in a few lines: the count of each kind of change, then each cell id that changed."""
        if not self.steps:
            return [f"{self.path}: already current, nothing rewritten"]
        counts: dict[str, list] = {}
        for kind, name, _ in self.steps:
            if kind:
                counts.setdefault(kind, []).append(name)
        lines = [f"{self.path}: " + "; ".join(f"{kind}: {names[0]}" if len(names) == 1 else
                                              f"{kind}: {len(names)} files" for kind, names in counts.items())]
        return lines + [f"  cell id {old} -> {new}" for old, new in sorted(self.ids.items())]


def plan(path: Path | str) -> Migration:
    """What migrating ``path`` would do (nothing written); a StabilityError line for a foreign path."""
    path = Path(path)
    if not path.exists():
        raise StabilityError(f"{path}: no such file or directory")
    if path.is_dir():
        return _plan_results(path)
    if path.suffix == ".jsonl":
        return _plan_results(path.parent, only=path)
    with open(path, "rb") as fh:
        head = fh.read(64).lstrip()
    if head.startswith(b"{"):
        return _plan_json(path)
    if head.startswith(b"PK\x03\x04"):
        return _plan_checkpoint(path)
    raise StabilityError(_foreign(path))


def _foreign(path: Path, what: str = "") -> str:
    return (f"{path}: {what or 'not a file stability migrate converts'} (it converts checkpoints, analysis JSONs, "
            "records .jsonl files and sweep results directories)")


# ---- checkpoints ------------------------------------------------------------------------------------------
def _checkpoint_steps(path: Path, target: Path, obj: Any = None, strict: bool = True) -> list:
    """The step converting the checkpoint ``path`` (written to ``target``) if it is of schema 1; none if it is
    current. ``strict``: anything else is an error (else: left alone)."""
    # lazy: torch; this module imports without it
    from stability import checkpoint as ckpt
    from stability import release
    from stability.stored import atomic_save, read_torch

    try:
        obj = read_torch(path) if obj is None else obj
    except StabilityError:
        if strict:
            raise
        return []
    if release.is_release_checkpoint(obj):
        if strict:
            raise StabilityError(f"{path}: a release checkpoint: `stability import` converts it, not migrate")
        return []
    if not isinstance(obj, dict) or obj.get("format") != ckpt.FORMAT:
        if strict:
            raise StabilityError(_foreign(path, "not a stability checkpoint"))
        return []
    if obj.get("schema_version") == ckpt.SCHEMA_VERSION:
        return []
    if obj.get("schema_version") != 1:
        raise StabilityError(f"{path}: checkpoint schema {obj.get('schema_version')!r}: migrate converts schema 1")
    new = {k: v for k, v in obj.items() if k != "scaler"}
    new.update(schema_version=ckpt.SCHEMA_VERSION, config=nest_method(obj["config"]))
    ckpt.run_config(ckpt.read(path, new), path)  # the converted file is one the loader reads

    def write() -> None:
        atomic_save(new, target)

    return [(f"checkpoint schema 1 -> {ckpt.SCHEMA_VERSION}", target.name, write)]


def _plan_checkpoint(path: Path) -> Migration:
    return Migration(path, _checkpoint_steps(path, path))


# ---- JSON -------------------------------------------------------------------------------------------------
def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise StabilityError(_foreign(path, f"not a readable JSON file ({first_line(exc)[:80]})")) from None


def _plan_json(path: Path) -> Migration:
    obj = _read_json(path)
    if not isinstance(obj, dict):
        raise StabilityError(_foreign(path))
    if obj.get("format") == RECORD_FORMAT:
        raise StabilityError(f"{path}: a sweep record: migrate its results directory (`stability migrate "
                             f"{path.parent.parent if path.parent.name == 'records' else path.parent}`), whose files "
                             "its id names")
    fmt = obj.get("format")
    if not (isinstance(fmt, str) and "analysis" in fmt) and not isinstance(obj.get("splits"), list):
        raise StabilityError(_foreign(path))
    migration = Migration(path)
    if is_flat_config(obj.get("config")):
        obj = _current(obj)
        migration.steps.append(("config block with the method block", path.name,
                                lambda: atomic.write_json(path, obj)))
    return migration


# ---- results directories ----------------------------------------------------------------------------------
def _held_lock(results: Path) -> Optional[str]:
    """The cell whose lock a process holds in ``results/locks`` (a sweep at work), or None."""
    for lock in sorted((results / "locks").glob("*.lock")):
        with open(lock, "a+") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return lock.stem
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    return None


def _records_in(path: Path, text: str) -> list[tuple[str, str, dict]]:
    """(id, readable cell_id, config) of each record or cell a JSON / JSONL file holds."""
    objs = []
    try:
        objs = [json.loads(line) for line in text.splitlines() if line.strip()] if path.suffix == ".jsonl" \
            else [json.loads(text)]
    except ValueError:
        raise StabilityError(_foreign(path, "not readable JSON")) from None
    out = []
    for obj in objs:
        if isinstance(obj, dict) and obj.get("format") in (RECORD_FORMAT, "stability-sweep-cell") \
                and isinstance(obj.get("id"), str) and isinstance(obj.get("config"), dict):
            out.append((obj["id"], obj.get("cell_id") or "", obj["config"]))
    return out


def _convert_configs(path: Path, text: str) -> str:
    """``text`` with the config block and axes of the JSON object, or of each JSONL line, in the current shapes
    (:func:`_current`; an object that changes is written as the sweep writes it); unchanged when they are."""
    if path.suffix == ".jsonl":
        lines = []
        for line in text.splitlines(keepends=True):
            obj = json.loads(line) if line.strip() else None
            new = _current(obj)
            lines.append(line if new is obj else atomic.json_text(new, sort_keys=True) + "\n")
        return "".join(lines)
    if path.suffix == ".json":
        try:
            obj = json.loads(text)
        except ValueError:
            return text
        new = _current(obj)
        if new is not obj:
            return atomic.json_text(new, indent=1) + "\n"
    return text


def _plan_results(results: Path, only: Optional[Path] = None) -> Migration:
    """A sweep results directory (or the one records file ``only``): ids, configs, checkpoints."""
    target = only or results
    if only is None and not any((results / d).is_dir() for d in ("records", "cells")) \
            and not list(results.glob("*.jsonl")):
        raise StabilityError(_foreign(results, "not a sweep results directory (no records/, cells/ or *.jsonl)"))
    if only is None:
        busy = _held_lock(results)
        if busy:
            raise StabilityError(f"{results}: a sweep is running on it (cell {busy} holds its lock); migrate it "
                                 "when the sweep has finished")
    texts: dict[Path, str] = {}
    files = [only] if only else sorted(p for p in results.rglob("*") if p.is_file())
    ids: dict[str, str] = {}
    short: dict[str, str] = {}
    for p in files:
        if p.suffix not in TEXT_SUFFIXES:
            continue
        try:
            texts[p] = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise StabilityError(f"{p}: cannot read it ({first_line(exc)})") from None
        if p.suffix == ".csv":
            continue
        for old, cell, config in _records_in(p, texts[p]) if (p.parent == results or p.parent.name in (
                "records", "cells")) else []:
            new = new_cell_id(old, config, str(p))
            if ids.setdefault(old, new) != new:
                raise StabilityError(f"{p}: cell {old} has two configs in {target}")
            m_old, m_new = _ID.fullmatch(old), _ID.fullmatch(new)
            if new != old and cell.endswith(f"-{m_old[2][:6]}"):
                short[cell] = f"{cell[:-6]}{m_new[2][:6]}"
    if only is not None and not ids:
        raise StabilityError(_foreign(only, "not a records .jsonl file"))
    changed = {o: n for o, n in ids.items() if o != n}
    clash = sorted(set(changed.values()) & (set(ids) - set(changed)))
    if clash:
        raise StabilityError(f"{target}: the new id {clash[0]} is already the id of another cell")
    swap = _substitution({**changed, **short})
    migration = Migration(target, ids=changed)
    late = []  # records/ and the records files: written last (they tell the ids to a rerun of an interrupted one)
    for p in files:
        dest = p.with_name(swap(p.name)) if only is None else p
        steps = _checkpoint_steps(p, dest, strict=False) if p.suffix == ".pt" and only is None else []
        if p in texts:
            text = swap(_convert_configs(p, texts[p]))
            _check_records(p, text)
            if text != texts[p]:
                steps.append(("rewritten", p.name, _writer(dest, text)))
        if dest != p:
            steps.append(("renamed", p.name, _mover(p, dest, written=bool(steps))))
        (late if p.parent.name == "records" or p.parent == results else migration.steps).extend(steps)
    migration.steps += late
    return migration


def _check_records(path: Path, text: str) -> None:
    """Each sweep record in the converted ``text`` of a JSON or JSONL file is one the typed record reads
    (:func:`stability.sweep.record.parse_record`): a record that does not fit is one error line before anything is
    written."""
    if path.suffix not in (".json", ".jsonl"):
        return
    for n, line in enumerate(text.splitlines() if path.suffix == ".jsonl" else [text], 1):
        try:
            obj = json.loads(line) if line.strip() else None
        except ValueError:
            continue
        if isinstance(obj, dict) and obj.get("format") == RECORD_FORMAT:
            parse_record(obj, f"{path}:{n}" if path.suffix == ".jsonl" else str(path))


def _substitution(mapping: dict[str, str]) -> Callable[[str], str]:
    """A function replacing each whole occurrence of a key of ``mapping`` in a text (an id within a path or a JSON
    string, not part of a longer name)."""
    if not mapping:
        return lambda text: text
    pattern = re.compile(r"(?<![A-Za-z0-9_+.-])(" + "|".join(re.escape(k) for k in sorted(mapping, key=len,
                                                                                             reverse=True))
                         + r")(?![A-Za-z0-9_+-])")
    return lambda text: pattern.sub(lambda m: mapping[m[1]], text)


def _writer(dest: Path, text: str) -> Callable[[], None]:
    return lambda: atomic.write_text(dest, text)


def _mover(src: Path, dest: Path, written: bool) -> Callable[[], None]:
    """Move ``src`` to ``dest`` (one rename); when ``dest`` was just written from it, remove ``src``."""
    def run() -> None:
        if written:
            src.unlink(missing_ok=True)
        else:
            os.replace(src, dest)
    return run
