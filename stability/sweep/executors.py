"""Where the cells run: a local pool of worker processes, or SLURM (and its stand-ins) through submitit.

Both executors run :func:`stability.sweep.runner.run_cell_file` on cells described by ``DIR/cells/<id>.json``
(written by :func:`write_cell_files`), so a worker needs only the results directory and a cell id.

* :func:`run_local`: a scheduler in this process keeps at most one worker process per *slot* busy. With
  ``gpus = N`` the slots are GPUs 0..N−1: each worker sees only its GPU (``CUDA_VISIBLE_DEVICES``). Otherwise the
  slots are ``workers`` CPU workers, each with ``cpu_count // workers`` threads (unless OMP_NUM_THREADS is set). Every cell runs in a fresh
  process (``python -m stability.sweep.runner DIR ID``, log in ``DIR/logs/<id>.log``): GPU memory is returned
  between cells and one crashed cell cannot take the pool down. Ctrl-C or SIGTERM stops the workers this
  process started; their cells keep their checkpoints and resume on the next sweep.
* :func:`run_submitit`: one submitit job per cell (a job array on SLURM), each requeued on timeout or
  preemption (``submitit.helpers.Checkpointable``), resuming from the cell's own checkpoint. ``cluster`` is
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
from stability.sweep.runner import atomic_write_json, cell_file, run_cell_file

Report = Callable[[dict], None]


def write_cell_files(cells: list, results: Path, options: SweepSummary, grid_name: str) -> None:
    """DIR/cells/<id>.json for every cell: the cell, its grid's name and the summary options (in a record's form,
    :meth:`~stability.config.SweepSummary.to_record`)."""
    for cell in cells:
        atomic_write_json(cell_file(results, cell.id),
                          {"format": "stability-sweep-cell", "grid": grid_name, "options": options.to_record(),
                           **cell.to_dict()})


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


def run_local(cell_ids: list[str], results: Path, *, workers: int = 1, gpus: int = 0,
              report: Optional[Report] = None, poll_s: float = 0.2,
              progress: Optional[Callable[[str, str, str], None]] = None) -> list[dict]:
    """Run the cells in a pool of worker processes (one per GPU when ``gpus`` > 0); returns one outcome per cell:
    {id, status: done | diverged | skipped | busy | failed, message, seconds, slot}.

    ``progress(slot, cell id, line)`` hears each line a worker writes to its log (the stages of its training and
    analysis), as it is written; the final JSON outcome line is not passed on."""
    if workers < 1:
        raise ConfigError("--workers: must be at least 1")
    slots = [{"name": f"gpu{i}", "gpu": i} for i in range(gpus)] if gpus else \
        [{"name": f"cpu{i}", "gpu": None} for i in range(workers)]
    threads = 1 if gpus else max(1, (os.cpu_count() or 1) // len(slots))
    results = Path(results)
    (results / "logs").mkdir(parents=True, exist_ok=True)
    queue = list(cell_ids)
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
                cid = queue.pop(0)
                log = open(results / "logs" / f"{cid}.log", "ab")
                offsets[i] = log.tell()
                proc = subprocess.Popen([sys.executable, "-m", "stability.sweep.runner", str(results), cid],
                                        stdout=log, stderr=subprocess.STDOUT, env=_worker_env(slot, threads))
                running[i] = (proc, cid, time.perf_counter(), log)
            time.sleep(poll_s)
            for i in list(running):
                proc, cid, t0, log = running[i]
                if progress:
                    lines, offsets[i] = _new_lines(results / "logs" / f"{cid}.log", offsets[i])
                    for line in lines:
                        if not line.startswith("{"):
                            progress(slots[i]["name"], cid, line)
                if proc.poll() is None:
                    continue
                log.close()
                del running[i]
                outcome = _outcome_from_files(results, cid, proc.returncode)
                outcome.update(seconds=time.perf_counter() - t0, slot=slots[i]["name"])
                outcomes.append(outcome)
                if report:
                    report(outcome)
    except KeyboardInterrupt:
        for proc, cid, _, log in running.values():
            if proc.poll() is None:
                proc.terminate()
        for proc, cid, _, log in running.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return outcomes


def _outcome_from_files(results: Path, cid: str, returncode: int) -> dict:
    """A worker's outcome: the status line it wrote (DIR/logs/<id>.status.json), or failed with its log's tail."""
    import json

    status_path = results / "logs" / f"{cid}.status.json"
    if returncode == 0 and status_path.exists():
        try:
            return json.loads(status_path.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    tail = ""
    log = results / "logs" / f"{cid}.log"
    if log.exists():
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        tail = lines[-1] if lines else ""
    return {"id": cid, "status": "failed", "message": f"exit {returncode}: {tail}"[:300]}


# ---- submitit ---------------------------------------------------------------------------------------
class CellJob(Checkpointable):
    """A submitit job running one cell; on timeout or preemption submitit requeues it with the same arguments
    and it resumes from the cell's checkpoint."""

    def __call__(self, results: str, cell_id: str) -> dict:
        return run_cell_file(Path(results), cell_id)


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
    """Submit one job per cell, as one job array per set of SLURM resources (each cell carries those of its grid
    file); with ``wait`` collect their outcomes as they finish."""
    import json

    results = Path(results)
    groups: dict[str, list] = {}
    for cell in cells:
        groups.setdefault(json.dumps(cell.slurm, sort_keys=True), []).append(cell)
    pending: dict[str, object] = {}
    submitted = []
    for key, group in groups.items():
        executor = make_submitit_executor(results / "submitit", cluster=cluster, slurm=json.loads(key), gpus=gpus,
                                          name=name)
        ids = [c.id for c in group]
        jobs = executor.map_array(CellJob(), [str(results)] * len(ids), ids)
        for cid, j in zip(ids, jobs):
            pending[cid] = j
            submitted.append({"id": cid, "status": "submitted", "job_id": j.job_id, "message": ""})
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
                outcome = j.result()
            except Exception as exc:  # submitit's FailedJobError / UncompletedJobError carry the job's traceback
                lines = [ln for ln in str(exc).splitlines() if ln.strip()]
                outcome = {"id": cid, "status": "failed", "message": (lines[-1] if lines else type(exc).__name__)[:300]}
            outcome["job_id"] = j.job_id
            outcomes.append(outcome)
            if report:
                report(outcome)
        if pending:
            time.sleep(0.5)
    return outcomes
