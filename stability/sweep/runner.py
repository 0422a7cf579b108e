"""One cell of a sweep: train (resumable), summarise, write one JSON record atomically.

Layout of a results directory (``stability sweep GRID --results DIR``)::

    DIR/records/<cell id>.json    one record per finished cell: the sweep's source of truth
    DIR/runs/<cell id>.pt         the cell's checkpoint (and <cell id>.metrics.jsonl beside it)
    DIR/analysis/<cell id>.json   the full ``stability analyze`` report of the cell (when analysed)
    DIR/locks/<cell id>.lock      held while a process works on the cell
    DIR/cells/<cell id>.json      the cell its worker runs (written by the executor)

A cell is *done* when its record exists: a resumed sweep skips it. A cell killed in flight has a checkpoint but
no record; running it again continues the checkpoint (``train(..., resume=True)``), so a kill loses at most the
epoch in progress. A run that diverges (non-finite loss or gradient) is a result, not a failure: its record has
``status = "diverged"`` and counts as 0 % accuracy in the tables, like the paper's 0.00 cells. Any other error
leaves no record, so the next sweep retries the cell.

The record (schema 1; see docs/experiments.md) holds the cell's config, the final metrics (val / hard accuracy
at the test iteration and against iteration), the training-time monitor history, the stability summary
(ρ(W_x), median ρ(J*), converged fraction, median ‖dx*/dx0‖_F) and the compact ``analyze`` summary, and timings.
"""

from __future__ import annotations

import json
import os
import platform
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from stability import atomic, hardware
from stability.analysis.headline import headlines
from stability.errors import EXIT_TERMINATED, DivergenceError, StabilityError, Terminated

RECORD_FORMAT = "stability-sweep-record"
RECORD_SCHEMA = 1
SUMMARIES = ("analyze", "monitor")


@dataclass(frozen=True)
class RunOptions:
    """How each cell is summarised after training.

    ``summary``: ``analyze`` runs the analysis pipeline of ``stability analyze`` on the first ``analyze_samples``
    samples of each of ``analyze_splits`` (its full report goes to DIR/analysis/), ``monitor`` only measures the
    stability monitor's four quantities on the val probe (cheaper). ``analyze_max_iter``: the solver's budget.
    ``reproducible``: the cells run with pinned CPU kernels (:mod:`stability.hardware`); written into the options
    only when set, so the records of grids that never asked for it keep their shape. ``analyze_geometry``: the
    analysis adds the geometry stage (radii of stability in parameter space; off by default, and then neither the
    options nor the records change).
    """

    summary: str = "analyze"
    analyze_samples: int = 8
    analyze_splits: tuple = ("val",)
    analyze_max_iter: int = 500
    reproducible: bool = False
    analyze_geometry: bool = False

    def to_dict(self) -> dict:
        out = {"summary": self.summary, "analyze_samples": self.analyze_samples,
               "analyze_splits": list(self.analyze_splits), "analyze_max_iter": self.analyze_max_iter}
        if self.reproducible:
            out["reproducible"] = True
        if self.analyze_geometry:
            out["analyze_geometry"] = True
        return out

    @staticmethod
    def from_dict(d: dict) -> "RunOptions":
        return RunOptions(summary=d["summary"], analyze_samples=int(d["analyze_samples"]),
                          analyze_splits=tuple(d["analyze_splits"]), analyze_max_iter=int(d["analyze_max_iter"]),
                          reproducible=bool(d.get("reproducible", False)),
                          analyze_geometry=bool(d.get("analyze_geometry", False)))


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


def read_record(path: Path) -> dict:
    """A record, checked to be one (StabilityError with one line otherwise)."""
    try:
        rec = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StabilityError(f"{path}: not a readable sweep record ({type(exc).__name__})") from None
    if not isinstance(rec, dict) or rec.get("format") != RECORD_FORMAT:
        raise StabilityError(f"{path}: not a sweep record (no '{RECORD_FORMAT}' marker)")
    if rec.get("schema_version") != RECORD_SCHEMA:
        raise StabilityError(f"{path}: sweep record schema {rec.get('schema_version')!r} is not supported "
                             f"(this toolkit reads {RECORD_SCHEMA})")
    check_config_shape(rec, path, Path(path).parent.parent)
    return rec


def check_config_shape(obj: dict, path, migrate_path) -> None:
    """Refuse (one line naming ``stability migrate``) a record whose config was written before the method block."""
    from stability.config import is_flat_config

    if is_flat_config(obj.get("config")):
        raise StabilityError(f"{path}: written before the method block (its config has the method options beside "
                             f"the train options); convert it once with `stability migrate {migrate_path}`")


def load_records(results: Path) -> list[dict]:
    """Every record under ``results/records`` (sorted by id); a StabilityError when there is none."""
    results = Path(results)
    if not results.exists():
        raise StabilityError(f"{results}: no such results directory")
    folder = results / "records"
    paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not paths:
        raise StabilityError(f"{results}: no sweep records (expected {folder}/*.json; run `stability sweep` first)")
    return [read_record(p) for p in paths]


@contextmanager
def cell_lock(results: Path, cell_id: str):
    """An exclusive, non-blocking lock on the cell (fcntl.flock): yields False when another process holds it."""
    import fcntl

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
    from stability.tasks import make_task

    model = config.model.replace(**make_task(config.task).model_options())
    return config if model == config.model else config.replace(model=model)


def _environment(device) -> dict:
    import torch

    import stability

    name = "cpu"
    if device.type == "cuda":
        name = f"cuda:{torch.cuda.current_device()} {torch.cuda.get_device_name()}"
    return {"device": name, "host": platform.node(), "torch": str(torch.__version__),
            "package": stability.__version__, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "hardware": hardware.signature()}


def _clean(obj):
    from stability.atomic import clean

    return clean(obj)


# ---- one cell -------------------------------------------------------------------------------------------
def run_cell(cell, results: Path, options: RunOptions = RunOptions(), *, grid_name: str = "",
             log=None) -> dict:
    """Run one cell unless its record exists; returns {"id", "status", "record"?, "seconds", "message"}.

    status: ``skipped`` (a record exists), ``busy`` (another process holds the cell), ``done`` or ``diverged``
    (a record was written). Other errors propagate (no record: the cell will be retried).
    """
    from stability import checkpoint as ckpt
    from stability.train.loop import resolve_device, train

    say = log or (lambda msg: None)
    results = Path(results)
    rpath = record_path(results, cell.id)
    if rpath.exists():
        return {"id": cell.id, "status": "skipped", "seconds": 0.0, "message": "record exists"}
    if options.reproducible and not hardware.pinned():
        raise StabilityError(f"{cell.cell_id}: the grid asks for reproducible mode, but this process's CPU kernels "
                             "are not pinned (start it with stability.hardware.pinned_env(); `stability sweep` does)")
    with cell_lock(results, cell.id) as mine:
        if not mine:
            return {"id": cell.id, "status": "busy", "seconds": 0.0, "message": "another process runs this cell"}
        if rpath.exists():  # finished by another process while we waited for nothing
            return {"id": cell.id, "status": "skipped", "seconds": 0.0, "message": "record exists"}
        t0, cpu0 = time.perf_counter(), time.process_time()
        out = checkpoint_path(results, cell.id)
        resumed_from = 0
        if out.exists():
            try:
                resumed_from = int(ckpt.read(out)["epoch"])
            except StabilityError:
                out.unlink()  # a corrupt leftover cannot be resumed: start again
            else:
                say(f"{cell.id}: resuming from its checkpoint at epoch {resumed_from}/{cell.config.train.epochs}")
        device = resolve_device(cell.config.train.device)
        status, error, result = "done", None, None
        name = cell.cell_id or cell.id
        say(f"{name}: training ({cell.config.train.epochs} epochs)")
        t_train = time.perf_counter()
        try:
            result = train(cell.config, out, resume=True, progress=False)
        except DivergenceError as exc:
            status, error = "diverged", str(exc)
        train_call = time.perf_counter() - t_train
        say(f"{name}: training {status} in {train_call:.1f} s")

        history, final, trained_config = [], None, _with_task_options(cell.config)
        if out.exists():
            obj = ckpt.read(out)
            history, final = list(obj["history"]), obj.get("final")
            trained_config = ckpt.run_config(obj, out)
        if result is not None:
            final = result.final
        epoch_seconds = sum(float(r.get("seconds", 0.0)) for r in history)
        epochs_here = [r for r in history if int(r.get("epoch", 0)) > resumed_from]
        overhead = max(0.0, train_call - sum(float(r.get("seconds", 0.0)) for r in epochs_here))

        t_sum = time.perf_counter()
        stability_summary, analysis, analysis_note = None, None, None
        if status == "done" and trained_config.model.recall != "fixed":
            stability_summary, analysis, analysis_note = _summarise(out, results, cell.id, options, device,
                                                                    trained_config.train.test_iterations,
                                                                    log=lambda m: say(f"{name}: {m}"))
        elif trained_config.model.recall == "fixed":
            analysis_note = "a fixed-depth baseline has no loop map: no fixed-point analysis"
        summary_seconds = time.perf_counter() - t_sum

        from stability.analysis.monitor import monitor_history

        record = {
            "format": RECORD_FORMAT,
            "schema_version": RECORD_SCHEMA,
            "id": cell.id,
            "cell_id": cell.cell_id or cell.id,
            "grid": grid_name,
            "axes": cell.axes,
            "config": trained_config.to_dict(),
            "status": status,
            "error": error,
            "checkpoint": str(out.relative_to(results)),
            "epochs_completed": history[-1]["epoch"] if history else 0,
            "final": final_metrics(final),
            "loss_last": history[-1]["loss"] if history else None,
            "monitor": monitor_history(history),
            # per-epoch training curves: the loss, and the accuracy on training inputs where train_accuracy_samples
            # asked for it (how well each run fits what it was trained on, beside what it generalises to)
            "curves": {"epoch": [r.get("epoch") for r in history], "loss": [r.get("loss") for r in history],
                       "train_accuracy": [r.get("train_accuracy") for r in history]},
            "stability": stability_summary,
            "analysis": analysis,
            "analysis_note": analysis_note,
            "options": options.to_dict(),
            "timing": {
                "epoch_seconds": epoch_seconds,
                "eval_and_io_seconds": overhead,
                "summary_seconds": summary_seconds,
                "run_seconds": epoch_seconds + overhead + summary_seconds,
                "wall_seconds": time.perf_counter() - t0,
                # CPU seconds of this process (all its threads): what the cell costs on a free core, whatever the
                # machine's load made of its wall time
                "cpu_seconds": time.process_time() - cpu0,
                "resumed_from_epoch": resumed_from,
            },
            "environment": _environment(device),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        atomic_write_json(rpath, _clean(record))
        return {"id": cell.id, "status": status, "record": record, "seconds": time.perf_counter() - t0,
                "message": error or ""}


def _summarise(ckpt_path: Path, results: Path, cell_id: str, options: RunOptions, device, test_iterations: int,
               log=None):
    """(stability summary, analysis summary, note) of a trained looped model; ``log`` hears each stage."""
    say = log or (lambda msg: None)
    if options.summary == "monitor" or options.analyze_samples == 0:
        say("summary by the stability monitor")
        import stability
        from stability.train.monitor import StabilityMonitor

        loaded = stability.load(ckpt_path, device=str(device))
        mon = StabilityMonitor(loaded.task, samples=loaded.config.train.monitor_samples, device=device)
        m = mon.measure(loaded.model)
        keys = ("rho_Wx", "rho_J_median", "converged_fraction", "input_grad_norm_median", "samples")
        return {"source": "monitor", "split": "val", **{k: m[k] for k in keys}}, None, "summary by the monitor"
    from stability.analysis.pipeline import analyze_checkpoint

    aopts = analysis_options(options, test_iterations, device.type)
    say(f"analysis: {options.analyze_samples} samples of {', '.join(options.analyze_splits)}")
    t = time.perf_counter()
    analysis = analyze_checkpoint(ckpt_path, splits=tuple(options.analyze_splits), options=aopts, log=say)
    say(f"analysis done in {time.perf_counter() - t:.1f} s")
    analysis.write_json(analysis_path(results, cell_id))
    summary = analysis_summary(analysis.to_json())
    return _stability_from_analysis(summary), summary, None


#: the geometry stage's sample choice of every sweep: the one the committed replication records were measured with
#: (the first sample of each split), pinned so that they reproduce bit for bit whatever the library's default
SWEEP_GEOMETRY = {"geometry_samples": 1, "geometry_pick": "first"}


def analysis_options(options, test_iterations: int, device: str):
    """The :class:`~stability.config.AnalysisOptions` a sweep cell's summary runs with (``options``: the grid's
    :class:`~stability.config.SweepSummary`): its samples, budget and stages, the geometry stage's sample choice
    pinned (:data:`SWEEP_GEOMETRY`), one split after the other (the sweep runs cells side by side)."""
    from stability.analysis.options import AnalysisOptions
    from stability.config import DEFAULT_STAGES, GEOMETRY_STAGE

    return AnalysisOptions(samples=options.analyze_samples, max_iter=options.analyze_max_iter,
                           stages=DEFAULT_STAGES + ((GEOMETRY_STAGE,) if options.analyze_geometry else ()),
                           iterations=test_iterations, device=device, workers=1, **SWEEP_GEOMETRY)


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
    from stability.sweep.grid import Cell

    results = Path(results)
    path = cell_file(results, cell_id)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise StabilityError(f"{path}: cannot read the cell ({type(exc).__name__})") from None
    cell = Cell.from_dict(data)
    outcome = outcome_line(run_cell(cell, results, RunOptions.from_dict(data["options"]), grid_name=data["grid"],
                                    log=log))
    atomic_write_json(results / "logs" / f"{cell_id}.status.json", outcome)
    return outcome


def main(argv: Optional[list] = None) -> int:
    """``python -m stability.sweep.runner RESULTS CELL_ID``: the local pool's worker process."""
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m stability.sweep.runner RESULTS CELL_ID", file=sys.stderr)
        return 2
    from stability.processes import die_with_parent

    die_with_parent()  # a sweep killed with SIGKILL takes its workers with it: no orphan finishes a cell
    try:
        import torch

        if os.environ.get("OMP_NUM_THREADS"):
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        out = run_cell_file(Path(argv[0]), argv[1], log=lambda m: print(m, file=sys.stderr, flush=True))
    except StabilityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Terminated:  # the sweep stopping its workers: the cell's lock is released, its checkpoint kept
        print("terminated", file=sys.stderr)
        return EXIT_TERMINATED
    print(atomic.json_text(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
