"""An ensemble split across processes (``stability train --seeds 0-4 --processes auto|N``, issue 37).

On a few CPU cores a single batched step cannot use them all: its element-wise operations dominate and two
intra-op threads help small operations little (benchmarks/RESULTS.md, "Ensembles"). So the members are dealt out in
contiguous parts, sizes differing by at most one (5 members in 2 processes: s0-s2 and s3-s4), and each part trains
in its own spawned process with one thread per core it stands for, in the same batched step
(``stability.train.ensemble.train_members``), writing its members' ordinary checkpoints after every epoch; every
checkpoint's ``ensemble`` note still names the whole ensemble.

A member's numbers do not depend on the split: a member's arithmetic in the batched step is its own (the stacked
products and every reduction run per member), so at the same thread count a member of a split ensemble has bitwise
the weights of the same member of the one-process ensemble (tests/train/test_split_ensemble.py).

The parent holds the ensemble's lock and waits. Ctrl-C reaches every process of the terminal's group; SIGTERM to
the parent is passed on to the children; either way each child unwinds as a solo run does and keeps the checkpoint
of its members' last finished epoch, for ``--resume``. A parent killed outright takes its children with it
(:func:`stability.processes.die_with_parent`). A member's divergence stops the other parts, as it stops the other
members of a one-process ensemble.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as queue_mod
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from stability import hardware
from stability.threads import child_thread_env, limit_threads
from stability.config import RunConfig, resolve_device
from stability.errors import ConfigError, DivergenceError, StabilityError, Terminated, first_line
from stability.processes import die_with_parent
from stability.train import loop
from stability.train.loop import TrainResult


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_processes(processes: Optional[int], members: int, config: RunConfig) -> int:
    """How many processes train the ``members``: ``processes``, or for ``None`` (``auto``, the command's default)
    min(cores, torch's threads, members) on the CPU (``OMP_NUM_THREADS=1`` keeps the ensemble on one core) and 1
    on CUDA. More processes than members is refused in one line."""
    if processes is None:
        if resolve_device(config.train.device).type != "cpu":
            return 1
        return max(1, min(cores(), torch.get_num_threads(), members))
    if processes > members:
        raise ConfigError(f"--processes {processes}: more than the ensemble's {members} members; give at most "
                          f"{members}, or auto")
    return processes


def parts(count: int, processes: int) -> list[list[int]]:
    """The member indices of each process: contiguous, sizes differing by at most one, the larger first."""
    size, extra = divmod(count, processes)
    out, start = [], 0
    for j in range(processes):
        n = size + (j < extra)
        out.append(list(range(start, start + n)))
        start += n
    return out


def _worker(trainer, part: int, plan, notes, resume: bool, progress: bool, threads: int, queue) -> None:
    """A spawned process: train the members ``plan`` by ``trainer`` with ``threads`` threads (its training bar on
    line ``part``, named by its members) and put ``(part, "done", results)``, or ``(part, "diverged", message,
    member)``, ``(part, "interrupted")``, ``(part, "error", message)`` on ``queue``."""
    parent = multiprocessing.parent_process()
    die_with_parent(parent.pid if parent is not None else None)  # no orphan trains on when the parent is killed
    hardware.apply_in_process()
    limit_threads(threads)
    try:
        with loop.sigterm_unwinds():
            label = "train " + ", ".join(Path(path).stem for path, _ in plan)
            results = trainer(plan, notes, resume=resume, progress=progress, part=(part, label))
        queue.put((part, "done", [(str(r.path), r.epochs, r.history, r.final) for r in results]))
    except DivergenceError as exc:
        queue.put((part, "diverged", str(exc), str(getattr(exc, "member", "") or "")))
    except KeyboardInterrupt:
        queue.put((part, "interrupted"))
    except BaseException as exc:  # reported to the parent, which raises it there as one line
        kind = "" if isinstance(exc, StabilityError) else f"{type(exc).__name__}: "
        queue.put((part, "error", kind + first_line(exc)))


def train_split(trainer, plan: Sequence[tuple[Path, RunConfig]], notes: Sequence[dict], processes: int, *,
                resume: bool, progress: bool) -> list[TrainResult]:
    """Train the members ``plan`` by ``trainer`` (:func:`stability.train.ensemble.train_members`, passed in by its
    caller: this module does not import it back) in ``processes`` spawned processes (:func:`parts`), each with torch's threads divided among them (at least one); the results in
    ``plan``'s order. The caller holds the lock."""
    split = parts(len(plan), max(1, min(processes, len(plan))))
    threads = max(1, torch.get_num_threads() // len(split))
    ctx = multiprocessing.get_context("spawn")  # fork after torch has started its thread pools is not safe
    queue = ctx.Queue()
    procs = []
    try:
        with child_thread_env(threads):
            for j, idx in enumerate(split):
                proc = ctx.Process(target=_worker, daemon=True,
                                   args=(trainer, j, [plan[i] for i in idx], [notes[i] for i in idx], resume,
                                         progress, threads, queue))
                proc.start()
                procs.append(proc)
        outcomes = _collect(procs, queue, [[plan[i][0].name for i in idx] for idx in split])
    except Terminated:  # SIGTERM to the parent: passed on at once (Ctrl-C reached the children itself)
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        raise
    finally:
        for proc in procs:  # SIGTERM: a child still training unwinds, its last finished epoch's checkpoints kept
            if proc.is_alive():
                proc.join(2.0)
            if proc.is_alive():
                proc.terminate()
        for proc in procs:
            proc.join(60)
    results: list = [None] * len(plan)
    for idx, (_, done) in zip(split, sorted(outcomes.items())):
        for i, (path, epochs, history, final) in zip(idx, done):
            results[i] = TrainResult(path=Path(path), epochs=epochs, history=history, final=final)
    return results


def _collect(procs: list, queue, names: list[list[str]]) -> dict:
    """Each part's results, in the order they come; the first failure raised at once (one line; a divergence as
    its DivergenceError, its ``member`` set), which ends the other parts."""
    outcomes: dict = {}
    while len(outcomes) < len(procs):
        try:
            msg = queue.get(timeout=1.0)
        except queue_mod.Empty:
            gone = [j for j, p in enumerate(procs) if j not in outcomes and not p.is_alive()]
            if gone:
                try:
                    msg = queue.get(timeout=5.0)  # its last words may still be in the pipe
                except queue_mod.Empty:
                    j = gone[0]
                    raise StabilityError(f"the process training {', '.join(names[j])} ended without a result (exit "
                                         f"status {procs[j].exitcode}: killed, or out of memory?); --resume "
                                         "continues from the last finished epoch") from None
            else:
                continue
        part, kind, *rest = msg
        if kind == "done":
            outcomes[part] = rest[0]
        elif kind == "diverged":
            exc = DivergenceError(rest[0])
            exc.member = Path(rest[1]) if rest[1] else None
            raise exc
        elif kind == "interrupted":
            raise KeyboardInterrupt(f"the process training {', '.join(names[part])} was interrupted")
        else:
            raise StabilityError(f"{', '.join(names[part])}: {rest[0]}")
    return outcomes


def describe(names: Sequence[str], split: list[list[int]]) -> str:
    """``s0.pt, s1.pt, s2.pt | s3.pt, s4.pt``: the members of each process."""
    return " | ".join(", ".join(names[i] for i in idx) for idx in split)


def log_line(names: Sequence[str], processes: int, out_dir: Path) -> None:
    """The ensemble's start line on stderr, naming each process's members."""
    print(f"ensemble: {len(names)} members in {out_dir}, {processes} processes, one batched step each "
          f"({describe(names, parts(len(names), processes))})", file=sys.stderr, flush=True)
