"""Where the cells run: a local pool of worker processes, or SLURM (and its stand-ins) through submitit.

Both executors run :func:`stability.sweep.runner.run_cell_file` on cells described by ``DIR/cells/<id>.json``
(written by :func:`write_cell_files`), so a worker needs only the results directory and a cell id; an ensemble
group (``--ensemble auto``, :mod:`stability.sweep.groups`) is one worker or job given its members' ids
(:func:`stability.sweep.runner.run_cell_files`).

* :func:`run_local`: a scheduler in this process keeps at most one worker process per *slot* busy. With
  ``gpus = N`` the slots are GPUs 0..N−1: each worker sees only its GPU (``CUDA_VISIBLE_DEVICES``). Otherwise the
  slots are ``workers`` CPU workers, each with ``cpu_count // workers`` threads (unless OMP_NUM_THREADS is set).
  Every cell (or group) runs in a fresh process (``python -m stability.sweep.runner DIR ID [ID ...]``, log in
  ``DIR/logs/<id>.log``, a group's under its first member's id): GPU memory is returned between cells and one
  crashed cell cannot take the pool down. Ctrl-C or SIGTERM stops the workers this process started; their cells
  keep their checkpoints and resume on the next sweep.
* :func:`run_submitit`: one submitit job per cell or group (a job array on SLURM), each requeued on timeout or
  preemption (``submitit.helpers.Checkpointable``), resuming from the cells' own checkpoints. ``cluster`` is
  ``slurm`` on a cluster; submitit's ``local`` (subprocesses) and ``debug`` (in this process) executors run the
  same path without one, which is how the tests exercise it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional

try:  # the optional ``sweep`` extra; only --executor slurm needs it (local pools do not)
    from submitit.helpers import Checkpointable
except ImportError:
    Checkpointable = object

from stability.config import SweepSummary
from stability.errors import ConfigError
from stability.extras import require
from stability.processes import PARENT_ENV
from stability.sweep.grid import SLURM_KEYS
from stability.sweep.runner import atomic_write_json, cell_file, run_cell_files

Report = Callable[[dict], None]


def write_cell_files(cells: list, results: Path, options: SweepSummary, grid_name: str,
                     notes: Optional[dict] = None) -> None:
    """DIR/cells/<id>.json for every cell: the cell, its grid's name and the summary options (in a record's form,
    :meth:`~stability.config.SweepSummary.to_record`), and for a member of an ensemble group its ``ensemble`` note
    (``notes``: cell id -> note, :meth:`stability.sweep.groups.Plan.note`)."""
    for cell in cells:
        note = (notes or {}).get(cell.id)
        atomic_write_json(cell_file(results, cell.id),
                          {"format": "stability-sweep-cell", "grid": grid_name, "options": options.to_record(),
                           **cell.to_dict(), **({"ensemble": note} if note else {})})


# ---- local pool -------------------------------------------------------------------------------------
def _worker_env(slot: dict, threads: int) -> dict:
    """The worker's environment: its GPU, and ``threads`` CPU threads unless OMP_NUM_THREADS is set already."""
    env = {**os.environ, PARENT_ENV: str(os.getpid())}  # the worker ends when this process does
    if "OMP_NUM_THREADS" not in env:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    if slot["gpu"] is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(slot["gpu"])
    return env


def _new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """Complete lines appended to ``path`` since byte ``offset``, and the new offset."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except OSError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    lines = [ln.strip() for ln in data[:end].decode(errors="replace").splitlines() if ln.strip()]
    return lines, offset + end + 1


def run_local(cell_ids: list, results: Path, *, workers: int = 1, gpus: int = 0,
              report: Optional[Report] = None, poll_s: float = 0.2,
              progress: Optional[Callable[[str, str, str], None]] = None) -> list[dict]:
    """Run the cells in a pool of worker processes (one per GPU when ``gpus`` > 0); returns one outcome per cell:
    {id, status: done | diverged | skipped | busy | failed, message, seconds, slot}. An entry of ``cell_ids`` is a
    cell id, or a list of them: an ensemble group's members, run by one worker (its log the first member's).

    ``progress(slot, cell id, line)`` hears each line a worker writes to its log (the stages of its training and
    analysis), as it is written; the final JSON outcome lines are not passed on."""
    if workers < 1:
        raise ConfigError("--workers: must be at least 1")
    slots = [{"name": f"gpu{i}", "gpu": i} for i in range(gpus)] if gpus else \
        [{"name": f"cpu{i}", "gpu": None} for i in range(workers)]
    threads = 1 if gpus else max(1, (os.cpu_count() or 1) // len(slots))
    results = Path(results)
    (results / "logs").mkdir(parents=True, exist_ok=True)
    queue = [[c] if isinstance(c, str) else list(c) for c in cell_ids]
    running: dict[int, tuple] = {}  # slot index -> (Popen, cell id, start time, log handle)
    offsets: dict[int, int] = {}  # slot index -> bytes of its cell's log already passed to ``progress``
    outcomes: list[dict] = []
    stop = {"signal": None}

    def on_term(signum, frame):
        stop["signal"] = signum
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        while queue or running:
            for i, slot in enumerate(slots):
                if i in running or not queue:
                    continue
                ids = queue.pop(0)
                log = open(results / "logs" / f"{ids[0]}.log", "ab")
                offsets[i] = log.tell()
                proc = subprocess.Popen([sys.executable, "-m", "stability.sweep.runner", str(results), *ids],
                                        stdout=log, stderr=subprocess.STDOUT, env=_worker_env(slot, threads))
                running[i] = (proc, ids, time.perf_counter(), log)
            time.sleep(poll_s)
            for i in list(running):
                proc, ids, t0, log = running[i]
                if progress:
                    lines, offsets[i] = _new_lines(results / "logs" / f"{ids[0]}.log", offsets[i])
                    for line in lines:
                        if not line.startswith("{"):
                            progress(slots[i]["name"], ids[0], line)
                if proc.poll() is None:
                    continue
                log.close()
                del running[i]
                for cid in ids:
                    outcome = _outcome_from_files(results, cid, proc.returncode, log=ids[0])
                    # a member's share of its group's wall time (its record's timing has the details)
                    outcome.update(seconds=(time.perf_counter() - t0) / len(ids), slot=slots[i]["name"])
                    outcomes.append(outcome)
                    if report:
                        report(outcome)
    except KeyboardInterrupt:
        for proc, _, _, log in running.values():
            if proc.poll() is None:
                proc.terminate()
        for proc, _, _, log in running.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return outcomes


def _outcome_from_files(results: Path, cid: str, returncode: int, log: Optional[str] = None) -> dict:
    """A cell's outcome: the status line its worker wrote (DIR/logs/<id>.status.json), or failed with the tail of
    the worker's log (``log``: the id it is named after, the cell's own by default)."""
    import json

    status_path = results / "logs" / f"{cid}.status.json"
    if returncode == 0 and status_path.exists():
        try:
            return json.loads(status_path.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    tail = ""
    log = results / "logs" / f"{log or cid}.log"
    if log.exists():
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        tail = lines[-1] if lines else ""
    return {"id": cid, "status": "failed", "message": f"exit {returncode}: {tail}"[:300]}


# ---- submitit ---------------------------------------------------------------------------------------
class CellJob(Checkpointable):
    """A submitit job running one cell, or an ensemble group's members (``cell_id``: their ids joined by commas,
    which no id holds); on timeout or preemption submitit requeues it with the same arguments and it resumes from
    the cells' checkpoints. Returns the cell's outcome, or the list of the members'."""

    def __call__(self, results: str, cell_id: str):
        ids = cell_id.split(",")
        outcomes = run_cell_files(Path(results), ids)
        return outcomes[0] if len(ids) == 1 else outcomes


def make_submitit_executor(folder: Path, *, cluster: str = "slurm", slurm: Optional[dict] = None, gpus: int = 0,
                           name: str = "stability-sweep"):
    """submitit's AutoExecutor for ``cluster`` with the grid's ``[slurm]`` resources (one cell per job)."""
    submitit = require("submitit", "--executor slurm")
    slurm = dict(slurm or {})
    unknown = sorted(set(slurm) - set(SLURM_KEYS))
    if unknown:
        raise ConfigError(f"slurm: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(SLURM_KEYS)}")
    try:
        executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
    except (ValueError, RuntimeError) as exc:
        raise ConfigError(f"--executor slurm: submitit cannot use cluster {cluster!r} here ({exc})") from None
    gpus_per_job = slurm.pop("gpus_per_node", 1 if cluster == "slurm" else 0)
    params = {"name": name, "timeout_min": int(slurm.pop("timeout_min", 240)),
              "gpus_per_node": int(gpus or gpus_per_job),  # --gpus overrides the grid's [slurm] gpus_per_node
              "tasks_per_node": 1, "nodes": 1}
    for key in ("cpus_per_task", "mem_gb"):
        if key in slurm:
            params[key] = slurm.pop(key)
    for key, value in slurm.items():
        params[f"slurm_{key}"] = value
    executor.update_parameters(**params)
    return executor


def run_submitit(cells: list, results: Path, *, cluster: str = "slurm", gpus: int = 0,
                 name: str = "stability-sweep", wait: bool = True, report: Optional[Report] = None) -> list[dict]:
    """Submit one job per cell (an entry of ``cells`` is a cell, or a list of them: an ensemble group's members,
    one job), as one job array per set of SLURM resources (each cell carries those of its grid file; a group's
    members share theirs); with ``wait`` collect their outcomes as they finish."""
    import json

    results = Path(results)
    groups: dict[str, list] = {}
    for entry in cells:
        members = list(entry) if isinstance(entry, (list, tuple)) else [entry]
        groups.setdefault(json.dumps(members[0].slurm, sort_keys=True), []).append(members)
    pending: dict[str, object] = {}
    submitted = []
    for key, group in groups.items():
        executor = make_submitit_executor(results / "submitit", cluster=cluster, slurm=json.loads(key), gpus=gpus,
                                          name=name)
        ids = [",".join(c.id for c in members) for members in group]
        jobs = executor.map_array(CellJob(), [str(results)] * len(ids), ids)
        for cid, j in zip(ids, jobs):
            pending[cid] = j
            submitted += [{"id": one, "status": "submitted", "job_id": j.job_id, "message": ""}
                          for one in cid.split(",")]
    if not wait:
        return submitted
    outcomes = []
    while pending:
        for cid in list(pending):
            j = pending[cid]
            if not j.done():
                continue
            del pending[cid]
            try:
                result = j.result()
            except Exception as exc:  # submitit's FailedJobError / UncompletedJobError carry the job's traceback
                lines = [ln for ln in str(exc).splitlines() if ln.strip()]
                result = [{"id": one, "status": "failed",
                           "message": (lines[-1] if lines else type(exc).__name__)[:300]} for one in cid.split(",")]
            for outcome in (result if isinstance(result, list) else [result]):
                outcome["job_id"] = j.job_id
                outcomes.append(outcome)
                if report:
                    report(outcome)
        if pending:
            time.sleep(0.5)
    return outcomes
