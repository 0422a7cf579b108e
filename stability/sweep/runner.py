"""One cell of a sweep: train (resumable), summarise, write one JSON record atomically.

Layout of a results directory (``stability sweep GRID --results DIR``)::

    DIR/records/<cell id>.json    one record per finished cell: the sweep's source of truth
    DIR/runs/<cell id>.pt         the cell's checkpoint (and <cell id>.metrics.jsonl beside it)
    DIR/analysis/<cell id>.json   the full ``stability analyze`` report of the cell (when analysed)
    DIR/locks/<cell id>.lock      held while a process works on the cell
    DIR/cells/<cell id>.json      the cell its worker runs (written by the executor)

With ``--ensemble auto`` the members of one group (:mod:`stability.sweep.groups`) run in one process
(:func:`run_group`): trained together in one batched step, then each summarised and recorded as a solo cell is,
its record with an ``ensemble`` note; its files, lock and resume are its own cell's.

A cell is *done* when its record exists: a resumed sweep skips it. A cell killed in flight has a checkpoint but
no record; running it again continues the checkpoint (``train(..., resume=True)``), so a kill loses at most the
epoch in progress. A run that diverges (non-finite loss or gradient) is a result, not a failure: its record has
``status = "diverged"`` and counts as 0 % accuracy in the tables, like the paper's 0.00 cells. Any other error
leaves no record, so the next sweep retries the cell.

The record (schema 1; see docs/experiments.md) holds the cell's config, the final metrics (val / hard accuracy
at the test iteration and against iteration), the training-time monitor history, the stability summary
(ρ(W_x), median ρ(J*), converged fraction, median ‖dx*/dx0‖_F) and the compact ``analyze`` summary, and timings;
its format is the typed :class:`stability.sweep.record.SweepRecord`, through which it is built and read.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import stability
from stability import atomic, hardware
from stability.analysis.headline import headlines
from stability.analysis.options import AnalysisOptions
from stability.config import DEFAULT_STAGES, GEOMETRY_STAGE, PATH_STAGE, SweepSummary
from stability.errors import EXIT_TERMINATED, DivergenceError, StabilityError, Terminated
from stability.processes import die_with_parent
from stability.sweep.grid import Cell
from stability.tasks import make_task
# the record's format and its loaders live in stability.sweep.record; named here as well, where the sweep's other
# modules and the tests have always found them
from stability.sweep.record import (RECORD_FORMAT, RECORD_SCHEMA, SweepRecord, check_config_shape,  # noqa: F401
                                    load_records, read_record)

# torch, the trainer, the checkpoint reader and the analysis pipeline are imported where a cell trains or is
# summarised: the sweep command imports this module for its paths (a dry run, --list) without them

SUMMARIES = ("analyze", "monitor")


# ---- paths and files ---------------------------------------------------------------------------------
def record_path(results: Path, cell_id: str) -> Path:
    return Path(results) / "records" / f"{cell_id}.json"


def checkpoint_path(results: Path, cell_id: str) -> Path:
    return Path(results) / "runs" / f"{cell_id}.pt"


def analysis_path(results: Path, cell_id: str) -> Path:
    return Path(results) / "analysis" / f"{cell_id}.json"


def atomic_write_json(path: Path, obj) -> None:
    """A record as JSON, written atomically (never half-written)."""
    atomic.write_json(path, obj)


@contextmanager
def cell_lock(results: Path, cell_id: str):
    """An exclusive, non-blocking lock on the cell (fcntl.flock): yields False when another process holds it."""
    path = Path(results) / "locks" / f"{cell_id}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fh = open(path, "a+")
    try:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    finally:
        fh.close()


# ---- summaries ------------------------------------------------------------------------------------------
def final_metrics(final: Optional[dict]) -> Optional[dict]:
    """Per split: accuracy and position accuracy at the test iteration (the tables' number, App. B.5), the best
    accuracy and its iteration, and the whole-answer accuracy against iteration 1..T_test (Figure 3)."""
    if not final:
        return None
    out = {}
    for split, ev in final.items():
        acc = list(ev["accuracy"])
        best = max(range(len(acc)), key=lambda i: acc[i]) if acc else None
        out[split] = {
            "test_iteration": len(acc),
            "accuracy": acc[-1] if acc else None,
            "position_accuracy": ev["position_accuracy"][-1] if ev.get("position_accuracy") else None,
            "best_accuracy": acc[best] if best is not None else None,
            "best_iteration": best + 1 if best is not None else None,
            "n": ev.get("n"),
            "curve": acc,
        }
    return out


def analysis_summary(report: dict) -> dict:
    """The compact per-split summary of an ``analyze`` report that goes into the record: each split's headline block
    (:mod:`stability.analysis.headline`, the documented key set)."""
    return headlines(report)


def _stability_from_analysis(summary: dict) -> dict:
    s = summary.get("val") or next(iter(summary.values()))
    return {"source": "analyze", "split": "val" if "val" in summary else next(iter(summary)),
            "rho_Wx": s["rho_Wx"], "rho_J_median": s["rho_J_median"], "converged_fraction": s["converged_fraction"],
            "input_grad_norm_median": s["input_grad_norm_median"], "samples": s["samples"],
            "rho_M_median": s.get("rho_M_median"), "distinct_fixed_points": s.get("distinct_fixed_points")}


def _with_task_options(config):
    """The config as the trainer stores it: the model fields the task decides filled in (``Task.model_options``)."""
    model = config.model.replace(**make_task(config.task).model_options())
    return config if model == config.model else config.replace(model=model)


def _environment(device) -> dict:
    import torch

    name = "cpu"
    if device.type == "cuda":
        name = f"cuda:{torch.cuda.current_device()} {torch.cuda.get_device_name()}"
    return {"device": name, "host": platform.node(), "torch": str(torch.__version__),
            "package": stability.__version__, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "hardware": hardware.signature()}


# ---- one cell -------------------------------------------------------------------------------------------
@dataclass
class _Trained:
    """A cell's training as the record tells it: how it ended, its history, final evaluation and config as
    trained, the epoch it resumed from and the seconds of the train call."""

    status: str
    error: Optional[str]
    config: object
    checkpoint: Path
    device: object
    history: list = field(default_factory=list)
    final: Optional[dict] = None
    resumed_from: int = 0
    train_call: float = 0.0
    share: float = 1.0  # an ensemble member's share of its group's training time: 1 / the members trained


@dataclass
class _Summary:
    """The stability summary, the compact analysis, the note saying why there is none, and their seconds."""

    stability: Optional[dict] = None
    analysis: Optional[dict] = None
    note: Optional[str] = None
    seconds: float = 0.0


def run_cell(cell, results: Path, options: SweepSummary = SweepSummary(), *, grid_name: str = "",
             log=None) -> dict:
    """Run one cell unless its record exists; returns {"id", "status", "record"?, "seconds", "message"}.

    status: ``skipped`` (a record exists), ``busy`` (another process holds the cell), ``done`` or ``diverged``
    (a record was written). Other errors propagate (no record: the cell will be retried). ``options``: how the
    cell is summarised after training (the grid's :class:`~stability.config.SweepSummary`).
    """
    say = log or (lambda msg: None)
    results = Path(results)
    rpath = record_path(results, cell.id)
    if rpath.exists():
        return {"id": cell.id, "status": "skipped", "seconds": 0.0, "message": "record exists"}
    _check_pinned(cell, options)
    with cell_lock(results, cell.id) as mine:
        if not mine:
            return {"id": cell.id, "status": "busy", "seconds": 0.0, "message": "another process runs this cell"}
        if rpath.exists():  # finished by another process while we waited for nothing
            return {"id": cell.id, "status": "skipped", "seconds": 0.0, "message": "record exists"}
        t0, cpu0 = time.perf_counter(), time.process_time()
        name = cell.cell_id or cell.id
        trained = _train_cell(cell, results, say)
        summary = _summary_of(trained, results, cell.id, options, lambda m: say(f"{name}: {m}"))
        record = _record(cell, results, grid_name, options, trained, summary, t0, cpu0).to_dict()
        atomic_write_json(rpath, record)
        return {"id": cell.id, "status": trained.status, "record": record, "seconds": time.perf_counter() - t0,
                "message": trained.error or ""}


def _check_pinned(cell, options: SweepSummary) -> None:
    """Refuse to run a reproducible grid's cell in a process whose CPU kernels are not pinned."""
    if options.reproducible and not hardware.pinned():
        raise StabilityError(f"{cell.cell_id}: the grid asks for reproducible mode, but this process's CPU kernels "
                             "are not pinned (start it with stability.hardware.pinned_env(); `stability sweep` does)")


def run_group(cells: list, results: Path, options: SweepSummary = SweepSummary(), *, notes: list,
              grid_name: str = "", log=None) -> list[dict]:
    """Run the members ``cells`` of one ensemble group (``--ensemble auto``, :mod:`stability.sweep.groups`): those
    without a record trained together in one batched step (:func:`stability.train.ensemble.train_members`), then
    each summarised and recorded as :func:`run_cell` does, its record with its ``ensemble`` note ``notes[i]``.
    Returns one outcome per cell, as :func:`run_cell`'s; each member's lock is held from before the group trains
    until its last record is written (a member another process holds is ``busy`` and left out)."""
    say = log or (lambda msg: None)
    results = Path(results)
    _check_pinned(cells[0], options)
    outcomes: dict[str, dict] = {}
    with ExitStack() as stack:
        mine = []
        for cell, note in zip(cells, notes):
            if record_path(results, cell.id).exists():
                outcomes[cell.id] = {"id": cell.id, "status": "skipped", "seconds": 0.0, "message": "record exists"}
            elif not stack.enter_context(cell_lock(results, cell.id)):
                outcomes[cell.id] = {"id": cell.id, "status": "busy", "seconds": 0.0,
                                     "message": "another process runs this cell"}
            elif record_path(results, cell.id).exists():  # finished by another process meanwhile
                outcomes[cell.id] = {"id": cell.id, "status": "skipped", "seconds": 0.0, "message": "record exists"}
            else:
                mine.append((cell, note))
        if mine:
            outcomes.update(_run_members(mine, results, options, grid_name, say))
    return [outcomes[c.id] for c in cells]


def _run_members(mine: list, results: Path, options: SweepSummary, grid_name: str, say) -> dict:
    """Train the (cell, note) pairs ``mine`` as one ensemble, then summarise and record each; their outcomes."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    trained = _train_group([c for c, _ in mine], [n for _, n in mine], results, say)
    train_wall, train_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    outcomes = {}
    for (cell, note), tr in zip(mine, trained):
        name = cell.cell_id or cell.id
        # the member's clocks: its share of the group's training, then its own summary
        t1, cpu1 = time.perf_counter() - train_wall * tr.share, time.process_time() - train_cpu * tr.share
        summary = _summary_of(tr, results, cell.id, options, lambda m, name=name: say(f"{name}: {m}"))
        record = _record(cell, results, grid_name, options, tr, summary, t1, cpu1, ensemble=note).to_dict()
        atomic_write_json(record_path(results, cell.id), record)
        outcomes[cell.id] = {"id": cell.id, "status": tr.status, "record": record,
                             "seconds": time.perf_counter() - t1, "message": tr.error or ""}
    return outcomes


def _train_group(cells: list, notes: list, results: Path, say) -> list[_Trained]:
    """Train the members ``cells`` in one batched step, continuing their checkpoints; a member that diverges is a
    result (status ``diverged``, its last good checkpoint kept) and the others train on from their checkpoints
    without it. Each holds :func:`stability.train.loop.run_lock` on its checkpoint meanwhile."""
    # lazy: torch; this module imports without it
    from stability.train.ensemble import train_members
    from stability.train.loop import run_lock, sigterm_unwinds

    trained = [_before_training(cell, results, say) for cell in cells]
    left = list(range(len(cells)))
    say(f"ensemble of {len(cells)} ({', '.join(c.cell_id or c.id for c in cells)}): training "
        f"({cells[0].config.train.epochs} epochs) in one batched step")
    t_train = time.perf_counter()
    with sigterm_unwinds(), ExitStack() as locks:
        for tr in trained:
            locks.enter_context(run_lock(tr.checkpoint))
        while left:
            try:
                train_members([(trained[i].checkpoint, cells[i].config) for i in left],
                              [{**notes[i], "batched": True} for i in left], resume=True, progress=False)
                break
            except DivergenceError as exc:
                i = next((i for i in left if trained[i].checkpoint == getattr(exc, "member", None)), None)
                if i is None:
                    raise
                trained[i].status, trained[i].error = "diverged", str(exc)
                left.remove(i)
                say(f"{cells[i].cell_id or cells[i].id}: diverged; the other members train on without it")
    seconds = time.perf_counter() - t_train
    say(f"ensemble of {len(cells)}: training ended in {seconds:.1f} s")
    for cell, tr in zip(cells, trained):
        tr.train_call, tr.share = seconds, 1.0 / len(cells)
        _after_training(tr, cell)
    return trained


def _train_cell(cell, results: Path, say) -> _Trained:
    """Train the cell, continuing its checkpoint where one is left (a corrupt leftover starts again); a divergence
    is a result (status ``diverged``), any other error propagates."""
    # lazy: torch; this module imports without it
    from stability.train.loop import train

    trained = _before_training(cell, results, say)
    out = trained.checkpoint
    name = cell.cell_id or cell.id
    say(f"{name}: training ({cell.config.train.epochs} epochs)")
    t_train = time.perf_counter()
    result = None
    try:
        result = train(cell.config, out, resume=True, progress=False)
    except DivergenceError as exc:
        trained.status, trained.error = "diverged", str(exc)
    trained.train_call = time.perf_counter() - t_train
    say(f"{name}: training {trained.status} in {trained.train_call:.1f} s")
    _after_training(trained, cell)
    if result is not None:
        trained.final = result.final
    return trained


def _before_training(cell, results: Path, say) -> _Trained:
    """The cell's training state before it trains: its checkpoint, device and the epoch it resumes from (a corrupt
    leftover checkpoint is removed: it starts again)."""
    # lazy: torch; this module imports without it
    from stability import checkpoint as ckpt
    from stability.train.loop import resolve_device

    out = checkpoint_path(results, cell.id)
    resumed_from = 0
    if out.exists():
        try:
            resumed_from = int(ckpt.read(out)["epoch"])
        except StabilityError:
            out.unlink()  # a corrupt leftover cannot be resumed: start again
        else:
            say(f"{cell.id}: resuming from its checkpoint at epoch {resumed_from}/{cell.config.train.epochs}")
    return _Trained("done", None, None, out, resolve_device(cell.config.train.device), resumed_from=resumed_from)


def _after_training(trained: _Trained, cell) -> None:
    """The config as trained, the history and final evaluation, from the checkpoint where there is one."""
    # lazy: torch; this module imports without it
    from stability import checkpoint as ckpt

    trained.config = _with_task_options(cell.config)
    if trained.checkpoint.exists():
        obj = ckpt.read(trained.checkpoint)
        trained.history, trained.final = list(obj["history"]), obj.get("final")
        trained.config = ckpt.run_config(obj, trained.checkpoint)


def _summary_of(trained: _Trained, results: Path, cell_id: str, options: SweepSummary, say) -> _Summary:
    """The summary of a trained looped model (none for a diverged run; a note for a fixed-depth baseline)."""
    t_sum = time.perf_counter()
    summary = _Summary()
    if trained.status == "done" and trained.config.model.recall != "fixed":
        summary.stability, summary.analysis, summary.note = _summarise(
            trained.checkpoint, results, cell_id, options, trained.device, trained.config.train.test_iterations,
            log=say)
    elif trained.config.model.recall == "fixed":
        summary.note = "a fixed-depth baseline has no loop map: no fixed-point analysis"
    summary.seconds = time.perf_counter() - t_sum
    return summary


def _record(cell, results: Path, grid_name: str, options: SweepSummary, trained: _Trained, summary: _Summary,
            t0: float, cpu0: float, ensemble: Optional[dict] = None) -> SweepRecord:
    """The cell's record, built through the typed :class:`~stability.sweep.record.SweepRecord`; an ensemble
    member's with its group's ``ensemble`` note."""
    # lazy: torch; this module imports without it
    from stability.analysis.monitor import monitor_history

    history = trained.history
    return SweepRecord(**atomic.clean({
        "format": RECORD_FORMAT,
        "schema_version": RECORD_SCHEMA,
        "id": cell.id,
        "cell_id": cell.cell_id or cell.id,
        "grid": grid_name,
        "axes": cell.axes,
        "config": trained.config.to_dict(),
        "status": trained.status,
        "error": trained.error,
        "checkpoint": str(trained.checkpoint.relative_to(results)),
        "epochs_completed": history[-1]["epoch"] if history else 0,
        "final": final_metrics(trained.final),
        "loss_last": history[-1]["loss"] if history else None,
        "monitor": monitor_history(history),
        # per-epoch training curves: the loss, and the accuracy on training inputs where train_accuracy_samples
        # asked for it (how well each run fits what it was trained on, beside what it generalises to)
        "curves": {"epoch": [r.get("epoch") for r in history], "loss": [r.get("loss") for r in history],
                   "train_accuracy": [r.get("train_accuracy") for r in history]},
        "stability": summary.stability,
        "analysis": summary.analysis,
        "analysis_note": summary.note,
        "options": options,
        **({"ensemble": ensemble} if ensemble else {}),
        "timing": _timing(trained, summary, t0, cpu0),
        "environment": _environment(trained.device),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }))


def _timing(trained: _Trained, summary: _Summary, t0: float, cpu0: float) -> dict:
    """Where the cell's time went: all its epochs (across resumes), the rest of this process's train call (final
    evaluation, monitor, checkpoints), the summary; their sum is the run's cost on its device. An ensemble
    member's epochs and train call are its share of its group's (``trained.share``)."""
    epoch_seconds = sum(float(r.get("seconds", 0.0)) for r in trained.history) * trained.share
    epochs_here = [r for r in trained.history if int(r.get("epoch", 0)) > trained.resumed_from]
    overhead = max(0.0, trained.train_call - sum(float(r.get("seconds", 0.0)) for r in epochs_here)) * trained.share
    return {
        "epoch_seconds": epoch_seconds,
        "eval_and_io_seconds": overhead,
        "summary_seconds": summary.seconds,
        "run_seconds": epoch_seconds + overhead + summary.seconds,
        "wall_seconds": time.perf_counter() - t0,
        # CPU seconds of this process (all its threads): what the cell costs on a free core, whatever the
        # machine's load made of its wall time
        "cpu_seconds": time.process_time() - cpu0,
        "resumed_from_epoch": trained.resumed_from,
    }


def _summarise(ckpt_path: Path, results: Path, cell_id: str, options: SweepSummary, device, test_iterations: int,
               log=None):
    """(stability summary, analysis summary, note) of a trained looped model; ``log`` hears each stage."""
    say = log or (lambda msg: None)
    if options.summary == "monitor" or options.analyze_samples == 0:
        say("summary by the stability monitor")
        from stability.train.monitor import StabilityMonitor  # lazy: torch; this module imports without it

        loaded = stability.load(ckpt_path, device=str(device))
        mon = StabilityMonitor(loaded.task, samples=loaded.config.train.monitor_samples, device=device)
        m = mon.measure(loaded.model)
        keys = ("rho_Wx", "rho_J_median", "converged_fraction", "input_grad_norm_median", "samples")
        return {"source": "monitor", "split": "val", **{k: m[k] for k in keys}}, None, "summary by the monitor"
    # lazy: torch; this module imports without it
    from stability.analysis.pipeline import analyze_checkpoint

    aopts = analysis_options(options, test_iterations, device.type)
    say(f"analysis: {options.analyze_samples} samples of {', '.join(options.splits)}")
    t = time.perf_counter()
    analysis = analyze_checkpoint(ckpt_path, splits=options.splits, options=aopts, log=say)
    say(f"analysis done in {time.perf_counter() - t:.1f} s")
    analysis.write_json(analysis_path(results, cell_id))
    summary = analysis_summary(analysis.to_json())
    return _stability_from_analysis(summary), summary, None


#: the geometry stage's sample choice of every sweep: the one the committed replication records were measured with
#: (the first sample of each split), pinned so that they reproduce bit for bit whatever the library's default
SWEEP_GEOMETRY = {"geometry_samples": 1, "geometry_pick": "first"}


def analysis_options(options, test_iterations: int, device: str):
    """The :class:`~stability.config.AnalysisOptions` a sweep cell's summary runs with (``options``: the grid's
    :class:`~stability.config.SweepSummary`): its samples, budget, stages and drifting status, the geometry stage's
    sample choice pinned (:data:`SWEEP_GEOMETRY`), one split after the other (the sweep runs cells side by side)."""
    stages = (DEFAULT_STAGES + ((PATH_STAGE,) if options.analyze_path_independence else ())
              + ((GEOMETRY_STAGE,) if options.analyze_geometry else ()))
    return AnalysisOptions(samples=options.analyze_samples, max_iter=options.analyze_max_iter, stages=stages,
                           iterations=test_iterations, device=device, workers=1, drift=options.analyze_drift,
                           **SWEEP_GEOMETRY)


# ---- the worker entry: one cell by id --------------------------------------------------------------------
def cell_file(results: Path, cell_id: str) -> Path:
    return Path(results) / "cells" / f"{cell_id}.json"


def outcome_line(outcome: dict) -> dict:
    """The compact outcome of a cell (what the sweep prints): id, status, message, accuracies, seconds."""
    rec = outcome.get("record") or {}
    final = rec.get("final") or {}
    return {"id": outcome["id"], "cell_id": rec.get("cell_id", outcome["id"]), "status": outcome["status"],
            "message": outcome.get("message", ""),
            "seconds": outcome.get("seconds", 0.0),
            "accuracy": {s: v.get("accuracy") for s, v in final.items()}}


def run_cell_file(results: Path, cell_id: str, log=None) -> dict:
    """Run the cell described by DIR/cells/<id>.json (see :func:`stability.sweep.executors.write_cell_files`);
    writes its outcome to DIR/logs/<id>.status.json and returns it."""
    results = Path(results)
    path = cell_file(results, cell_id)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StabilityError(f"{path}: cannot read the cell ({type(exc).__name__})") from None
    cell = Cell.from_dict(data)
    options = SweepSummary.from_record(data["options"])
    outcome = outcome_line(run_cell(cell, results, options, grid_name=data["grid"], log=log))
    atomic_write_json(results / "logs" / f"{cell_id}.status.json", outcome)
    return outcome


def run_cell_files(results: Path, cell_ids: list, log=None) -> list[dict]:
    """Run the cells DIR/cells/<id>.json of ``cell_ids``: one solo cell (:func:`run_cell_file`), or the members of
    one ensemble group (their cell files carry its ``ensemble`` note, :func:`run_group`); writes each outcome to
    DIR/logs/<id>.status.json and returns them."""
    results = Path(results)
    data = []
    for cid in cell_ids:
        path = cell_file(results, cid)
        try:
            data.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise StabilityError(f"{path}: cannot read the cell ({type(exc).__name__})") from None
    if not any("ensemble" in d for d in data):
        if len(cell_ids) != 1:
            raise StabilityError(f"{', '.join(cell_ids)}: several cells, but no ensemble group")
        return [run_cell_file(results, cell_ids[0], log=log)]
    options = SweepSummary.from_record(data[0]["options"])
    raw = run_group([Cell.from_dict(d) for d in data], results, options, notes=[d.get("ensemble") for d in data],
                    grid_name=data[0]["grid"], log=log)
    outcomes = [outcome_line(o) for o in raw]
    for cid, out in zip(cell_ids, outcomes):
        atomic_write_json(results / "logs" / f"{cid}.status.json", out)
    return outcomes


def main(argv: Optional[list] = None) -> int:
    """``python -m stability.sweep.runner RESULTS CELL_ID [CELL_ID ...]``: the local pool's worker process (several
    ids: an ensemble group's members)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        print("usage: python -m stability.sweep.runner RESULTS CELL_ID [CELL_ID ...]", file=sys.stderr)
        return 2

    die_with_parent()  # a sweep killed with SIGKILL takes its workers with it: no orphan finishes a cell
    try:
        import torch

        if os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        outs = run_cell_files(Path(argv[0]), argv[1:], log=lambda m: print(m, file=sys.stderr, flush=True))
    except StabilityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Terminated:  # the sweep stopping its workers: the cell's lock is released, its checkpoint kept
        print("terminated", file=sys.stderr)
        return EXIT_TERMINATED
    for out in outs:
        print(atomic.json_text(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
