"""``stability sweep GRID``: expand a grid file and run its cells locally or on SLURM, one record per cell.

Cells whose record already exists are skipped, so a sweep killed halfway resumes where it stopped; a cell that
was in flight continues from its own checkpoint. See docs/experiments.md.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Optional

from stability import hardware
from stability.analysis.cost import clock
from stability.atomic import check_writable
from stability.commands._types import check_maxima, default_text, nonneg_int, positive_int, schema_argument
from stability.config import MAX_WORKERS, SweepSummary
from stability.errors import ConfigError, StabilityError
from stability.extras import require
from stability.sweep import grid as gridlib
from stability.sweep import groups
from stability.sweep.export import write_records
from stability.sweep.record import read_record
from stability.sweep.runner import analysis_path, checkpoint_path, load_records, outcome_line, record_path
from stability.tasks import make_task

# the sweep's modules (the executors import submitit, the record builds its schema) are imported where the command
# runs, not when `stability --help` imports every command

HELP = "run a grid of training runs (locally, one worker per GPU, or on SLURM via submitit), one record per run"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("grid", metavar="GRID", help="a grid file (TOML), e.g. experiments/smoke.toml")
    p.add_argument("--executor", choices=["local", "slurm"], default="local",
                   help="local: a pool of worker processes here; slurm: one submitit job per cell (default local)")
    p.add_argument("--results", metavar="DIR", help="results directory (default results/<grid name>)")
    p.add_argument("--gpus", type=nonneg_int, default=0, metavar="N",
                   help="local: one worker per GPU on GPUs 0..N-1; slurm: GPUs per job (default 1 on SLURM)")
    p.add_argument("--workers", type=positive_int, default=None, metavar="N",
                   help="local, without --gpus: N CPU worker processes (default 1)")
    p.add_argument("--dry-run", action="store_true",
                   help="list the cells, which are done, and the estimated cost of the rest; run nothing")
    p.add_argument("--list", action="store_true",
                   help="list the cell ids (the readable cell_id and the full id of its files) and their state; "
                        "run nothing")
    p.add_argument("--only", metavar="CELL_ID[,CELL_ID...]", default=None,
                   help="run only these cells (a readable cell_id such as ps-external-post-lr1e-3-s0, or the full "
                        "id), rerunning them from scratch even if they have records")
    p.add_argument("--where", action="append", default=[], metavar="SECTION.OPTION=V[,V...]",
                   help="run only the cells whose option has one of these values (repeatable), e.g. "
                        "--where train.seed=0 --where model.recall=external,internal")
    for name in SweepSummary.FLAGS:  # derived from the schema, as train's and analyze's flags
        info = SweepSummary.model_fields[name]
        flag_args, kw = schema_argument(name.replace("_", "-"), name, info, dest=name)
        kw["help"] = f"{info.description} (default: the grid's [summary] value, else {default_text(info.default)})"
        p.add_argument(*flag_args, **kw)
    p.add_argument("--cluster", choices=["slurm", "local", "debug"], default="slurm",
                   help="with --executor slurm: submitit's backend; local/debug run the same path without a "
                        "cluster (default slurm)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines: only the grid's state, failed cells and the summary")
    p.add_argument("--no-wait", action="store_true",
                   help="with --executor slurm: submit the jobs and return (run `stability sweep` again, or "
                        "`stability tables`, once they are done)")


def _fmt_acc(acc: dict) -> str:
    parts = []
    for split in ("val", "hard"):
        v = (acc or {}).get(split)
        if v is not None:
            parts.append(f"{split} {100 * v:6.2f}%")
    return "  ".join(parts)


def _kind(task: str, recall: str) -> tuple[str, str]:
    return task, "fixed-depth" if recall == "fixed" else "looped"


def _estimate(cells_todo: list, results) -> list[str]:
    """Cost of the remaining cells: per (task, looped or fixed-depth), the mean measured time of the finished runs
    of that kind (of the task when none of the kind has finished) times the number of runs to go."""
    times: dict[tuple, list[float]] = {}
    devices: set = set()
    for path in sorted((Path(results) / "records").glob("*.json")):
        try:
            rec = read_record(path)
        except StabilityError:  # a record that does not fit times nothing (the sweep names it where it reads it)
            continue
        if rec.status == "done":
            key = _kind(rec.config.task.name, rec.config.model.recall)
            times.setdefault(key, []).append(float(rec.timing.run_seconds))
            devices.add(rec.environment.device)
    todo: dict[tuple, int] = {}
    for cell in cells_todo:
        key = _kind(cell.config.task.name, cell.config.model.recall)
        todo[key] = todo.get(key, 0) + 1
    lines, total, untimed, timed = [], 0.0, 0, 0
    for (task, kind), n in sorted(todo.items()):
        measured = times.get((task, kind)) or [t for (tk, _), ts in times.items() if tk == task for t in ts]
        if not measured:
            untimed += n
            lines.append(f"  {task} ({kind}): {n} runs to go, no finished {task} run to time yet")
            continue
        mean = sum(measured) / len(measured)
        total += mean * n
        timed += n
        lines.append(f"  {task} ({kind}): {n} runs × {mean:.1f} s/run (mean of {len(measured)} finished) "
                     f"= {mean * n / 3600:.2f} h")
    if todo and not timed:
        lines.append(f"  estimated total: unknown: no finished run in this results directory to time the "
                     f"{untimed} runs by (run a few cells first, e.g. with --only or --where)")
    elif todo:
        on = f" on {', '.join(sorted(devices))}" if devices else ""
        lines.append(f"  estimated total: {total / 3600:.2f} device-hours{on}, one run at a time"
                     + (f", for the {timed} runs of timed kinds; {untimed} more not yet timed" if untimed else ""))
    return lines


def _export(results) -> None:
    """Every record of the results directory as records.jsonl and records.csv beside records/."""

    try:
        records = load_records(results)
    except StabilityError:
        return
    paths = write_records(records, results)
    print(f"{len(records)} records → " + ", ".join(str(p) for p in paths))


def resume_command(args: argparse.Namespace, results, left: list) -> str:
    """The exact command that resumes an interrupted sweep: the grid, ``--results`` (given or default) and every
    other option given that selects or runs cells. A ``--only`` sweep resumes with ``--only`` of the cells still
    without a record (``--only`` reruns them from scratch, so the finished ones are left out)."""
    cmd = ["stability", "sweep", str(args.grid), "--results", str(results)]
    if args.executor != "local":
        cmd += ["--executor", args.executor]
    if args.cluster != "slurm":
        cmd += ["--cluster", args.cluster]
    if args.gpus:
        cmd += ["--gpus", str(args.gpus)]
    if args.workers is not None:
        cmd += ["--workers", str(args.workers)]
    for where in args.where:
        cmd += ["--where", where]
    if args.only is not None:
        cmd += ["--only", ",".join(c.cell_id or c.id for c in left)]
    for name in SweepSummary.FLAGS:
        if getattr(args, name) is not None:
            cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if getattr(args, "reproducible", False):
        cmd.append("--reproducible")
    return shlex.join(cmd)


def check_counts(args: argparse.Namespace) -> None:
    """Refuse, in one line before any work, a summary flag above its schema maximum and ``--workers`` or ``--gpus``
    above :data:`~stability.config.MAX_WORKERS` (a process each: ``--workers 99999999999`` would exhaust memory
    listing its slots)."""
    check_maxima(args, [(n.replace("_", "-"), n, SweepSummary.model_fields[n]) for n in SweepSummary.FLAGS])
    for flag in ("workers", "gpus"):
        value = getattr(args, flag, None)
        if value is not None and value > MAX_WORKERS:
            raise ConfigError(f"--{flag} {value}: at most {MAX_WORKERS} (one process each)")


def run(args: argparse.Namespace) -> int:
    # lazy: submitit; `stability --help` imports this module without it
    from stability.sweep import executors

    check_counts(args)
    grid = gridlib.load(args.grid)  # every cell's options validated, their maxima too (dry run and --list as well)
    cells = _selected_cells(args, grid)
    results = Path(args.results) if args.results else Path("results") / grid.name
    check_writable(results, "dir", "--results")
    _check_executor(args)
    options = summary_options(args, grid)
    if options.reproducible and not hardware.env_is_pinned():
        # the grid asks for pinned kernels: this sweep reruns itself pinned, and its workers inherit the settings
        return hardware.run_pinned(args._argv, replace=getattr(args, "_top", False))
    todo = _show_state(args, grid, cells, results, options)
    if todo is None:
        return 0
    if not todo:
        print("nothing to run: every selected cell has its record")
        _export(results)  # every finishing sweep writes them (a killed one may have left them behind)
        return 0
    _check_resources(args)
    plan = groups.plan(cells, todo, options.ensemble)
    if options.ensemble == "auto":
        print("\n".join(groups.describe(plan, every_group=False)), flush=True)
    results.mkdir(parents=True, exist_ok=True)
    executors.write_cell_files(todo, results, options, grid.name, notes={c.id: plan.note(c) for c in todo})
    try:
        outcomes = _execute(args, grid, todo, plan.jobs, results)
    except KeyboardInterrupt:
        left = [c for c in todo if not record_path(results, c.id).exists()]
        print("interrupted: finished cells keep their records; " + (
            f"the rest resume with `{resume_command(args, results, left)}`" if left else
            "every selected cell has its record"), file=sys.stderr)
        return 130
    return _finish(args, outcomes, results)


def _selected_cells(args: argparse.Namespace, grid) -> list:
    """The cells ``--where`` and ``--only`` select, each one a task can make (checked before any work; ``--list``
    shows any grid's cells)."""
    cells = gridlib.select(grid.cells, args.where)
    if args.only is not None:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        if not wanted:
            raise ConfigError("--only: expected one or more cell ids separated by commas")
        cells = gridlib.find_cells(cells if args.where else grid.cells, wanted, str(args.grid))
    for cell in ([] if args.list else cells):  # sizes a task cannot make (a val not disjoint from train)
        try:
            make_task(cell.config.task)
        except ConfigError as exc:
            raise ConfigError(f"{args.grid}: cell {cell.cell_id or cell.id}: {exc}") from None
    return cells


def _check_executor(args: argparse.Namespace) -> None:
    """Refuse options of one executor given to the other."""

    if args.executor == "local" and args.gpus and args.workers:
        raise ConfigError("--workers counts CPU workers; with --gpus N there is one worker per GPU")
    if args.executor == "slurm" and args.workers:
        raise ConfigError("--workers is for --executor local; on SLURM every cell is its own job")
    if args.executor == "local" and (args.no_wait or args.cluster != "slurm"):
        raise ConfigError("--cluster and --no-wait are options of --executor slurm")


def summary_options(args: argparse.Namespace, grid):
    """How each cell is summarised (:class:`~stability.config.SweepSummary`): each option from the command line,
    else the grid's ``[summary]`` table, else the schema's default; ``--reproducible`` (global) or the grid's."""
    given = {k: getattr(args, k) for k in SweepSummary.FLAGS if getattr(args, k) is not None}
    chosen = SweepSummary(**{**grid.summary, **given})
    return chosen.replace(reproducible=True) if getattr(args, "reproducible", False) else chosen


def _show_state(args: argparse.Namespace, grid, cells: list, results: Path, options) -> Optional[list]:
    """Print the grid's state; with ``--dry-run`` or ``--list`` the cells (and the estimate; with ``--ensemble
    auto`` the groups), returning None (run nothing); else the cells to run (``--only``: the chosen ones, their old
    files removed: a rerun from scratch)."""
    done = [c for c in cells if record_path(results, c.id).exists()]
    todo = [c for c in cells if not record_path(results, c.id).exists()]
    partial = [c for c in todo if checkpoint_path(results, c.id).exists()]
    selected = args.where or args.only is not None
    print(f"grid {grid.name}: {len(grid.cells)} cells" + (f", {len(cells)} selected" if selected else "")
          + f"; {len(done)} done, {len(partial)} partly trained, {len(todo) - len(partial)} not started"
          + f"  → {results}")
    if args.dry_run or args.list:
        width = max((len(c.cell_id) for c in cells), default=0)
        for c in cells:
            state = "done" if c in done else ("partial" if c in partial else "todo")
            print(f"  {state:8s} {c.cell_id:{width}s}  {c.id}")
        if args.dry_run:
            for line in _estimate(cells if args.only is not None else todo, results):
                print(line)
            if options.ensemble == "auto":
                rest = cells if args.only is not None else todo
                print("\n".join(groups.describe(groups.plan(cells, rest, "auto"), every_group=True)))
        return None
    if args.only is not None:  # a rerun from scratch: the chosen cells lose their record, checkpoint, analysis
        for c in cells:
            for path in (record_path(results, c.id), checkpoint_path(results, c.id), analysis_path(results, c.id),
                         checkpoint_path(results, c.id).with_suffix(".metrics.jsonl")):
                if path.exists():
                    path.unlink()
        return list(cells)
    return todo


def _check_resources(args: argparse.Namespace) -> None:
    """The GPUs asked for are here; submitit and, on a cluster, ``sbatch`` for ``--executor slurm``."""
    if args.executor == "local" and args.gpus:
        import torch

        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if args.gpus > available:
            raise ConfigError(f"--gpus {args.gpus}: only {available} CUDA device(s) are available here")
    if args.executor == "slurm":
        require("submitit", "--executor slurm")
    if args.executor == "slurm" and args.cluster == "slurm" and shutil.which("sbatch") is None:
        raise ConfigError("--executor slurm: no `sbatch` here (not a SLURM login node); run on the cluster, or "
                          "try the same path locally with --cluster local")


def _execute(args: argparse.Namespace, grid, todo: list, jobs: list, results: Path) -> list:
    """Run the cells ``todo`` as ``jobs`` (each a solo cell or an ensemble group's members, :mod:`stability.sweep
    .groups`) in a local pool or through submitit, printing one line per finished cell with the time left."""
    # lazy: submitit; `stability --help` imports this module without it
    from stability.sweep import executors

    report = _reporter(args, todo)
    if args.executor == "local":
        if not args.gpus:  # fewer groups than CPU workers: groups are shared out so that none sits idle
            jobs = groups.fill_workers(jobs, args.workers or 1)
        return executors.run_local([[c.id for c in job] for job in jobs], results, workers=args.workers or 1,
                                   gpus=args.gpus, report=report, progress=None if args.quiet else _progress)
    return executors.run_submitit(jobs, results, cluster=args.cluster, gpus=args.gpus, name=f"stability-{grid.name}",
                                  wait=not args.no_wait, report=None if args.no_wait else report)


def _progress(slot: str, cid: str, text: str) -> None:
    print(f"      {slot}: {text}", flush=True)


def _reporter(args: argparse.Namespace, todo: list):
    """The callback that prints a cell's outcome: ``[k/n] status name accuracies seconds`` and the time left (the
    wall time per finished cell so far, the workers side by side included, times the cells to go)."""
    counter = {"n": 0}
    names = {c.id: c.cell_id for c in todo}
    started = time.monotonic()

    def report(outcome: dict) -> None:
        counter["n"] += 1
        line = outcome if "accuracy" in outcome else outcome_line(outcome)
        msg = f"  {line['message']}" if line["status"] in ("failed", "diverged", "busy") and line["message"] else ""
        if args.quiet and not msg:
            return
        name = line.get("cell_id") or names.get(line["id"], line["id"])
        left = len(todo) - counter["n"]
        eta = f"  about {clock((time.monotonic() - started) / counter['n'] * left)} left" if left else ""
        print(f"[{counter['n']}/{len(todo)}] {line['status']:8s} {name}  {_fmt_acc(line.get('accuracy'))}"
              f"  {line.get('seconds', 0.0):.1f} s{msg}{eta}", flush=True)

    return report


def _finish(args: argparse.Namespace, outcomes: list, results: Path) -> int:
    """The submitted jobs (``--no-wait``), or the summary of the outcomes, the records exported; 1 when a cell
    failed."""
    if args.no_wait:
        for o in outcomes:
            print(f"submitted {o['id']}  job {o['job_id']}")
        print(f"{len(outcomes)} jobs submitted; logs in {results / 'submitit'}")
        return 0
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o["status"]] = counts.get(o["status"], 0) + 1
    _export(results)
    print("summary: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) + f"; records in {results / 'records'}")
    if counts.get("failed"):
        print(f"{counts['failed']} cell(s) failed (see {results / 'logs'}); run the sweep again to retry them",
              file=sys.stderr)
        return 1
    return 0
