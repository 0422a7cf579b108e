"""Splits analysed side by side on the CPU: one spawned process per split, each with its share of the threads, and
the process-wide settings that make that pay (thread pools sized before the libraries load:
:func:`stability.threads.child_thread_env`, :class:`stability.threads.limit_threads`; freed memory kept).

Every split's numbers are those of analysing it alone (tests/analysis/test_parallel_splits.py): each split seeds its own
generators and reads nothing another split computed.
"""

from __future__ import annotations

import sys
from typing import Callable

import torch

from stability.analysis.fixed_point import analysis_model
from stability.analysis.options import AnalysisOptions
from stability.checkpoint import load
from stability.errors import StabilityError, first_line
from stability.processes import die_with_parent
from stability.threads import child_thread_env, limit_threads


def keep_freed_memory() -> bool:
    """On glibc, serve tensors of up to 1 GiB from the heap and keep what is freed (``mallopt``), instead of a
    fresh ``mmap`` per large tensor whose pages the kernel zeroes on first touch: the dense Jacobians and the
    vmapped tangents of the analysis allocate and free the same large blocks over and over (measured on the demo's
    hard split: stages rho and prop4 5.9 s and 3.9 s in a fresh process without it, 5.5 s and 2.7 s with it;
    benchmarks/RESULTS.md). The process keeps its peak memory until it ends. False where there is no glibc."""
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def _split_worker(analyze_split: Callable, path, release_config, split: str, options: AnalysisOptions, threads: int,
                  queue) -> None:
    """A spawned process: load the checkpoint, analyse one split by ``analyze_split`` with ``threads`` torch threads,
    and put ("log", text) lines and then ("done", split, pickled SplitResult) or ("error", split, message) on
    ``queue``."""
    import multiprocessing
    import pickle

    parent = multiprocessing.parent_process()
    die_with_parent(parent.pid if parent is not None else None)  # no orphan when `analyze` is killed
    limit_threads(threads)
    keep_freed_memory()
    try:
        loaded = load(path, device=options.device, release_config=release_config)
        model = analysis_model(loaded.model, torch.float64, options.device)
        res = analyze_split(model, loaded.task, split, options, log=lambda m: queue.put(("log", m)))
        queue.put(("done", split, pickle.dumps(res)))
    except BaseException as exc:  # reported to the parent, which raises it there as one line
        kind = "" if isinstance(exc, StabilityError) else f"{type(exc).__name__}: "
        queue.put(("error", split, kind + (first_line(exc) if str(exc).strip() else "")))


def parallel_splits(analyze_split: Callable, path, release_config, model, task, splits: tuple,
                    options: AnalysisOptions, workers: int, threads: int, log) -> dict:
    """``analyze_split(model, task, split, options, log=...)`` (:func:`stability.analysis.pipeline.analyze_split`,
    passed in by its caller) of each split: each but the last in a spawned process that loads the checkpoint at
    ``path`` again, the last one here on ``model`` and ``task``; ``threads`` torch threads each, at most ``workers``
    at a time. Log lines of the processes reach ``log`` as they come. Returns split → SplitResult, in order."""
    import multiprocessing as mp
    import pickle
    import threading

    ctx = mp.get_context("spawn")  # fork after torch has started its thread pools is not safe
    queue = ctx.Queue()
    say = log or (lambda msg: None)
    results: dict = {}
    errors: dict = {}
    remote = list(splits[:-1])
    waiting = list(remote)
    running: list = []
    done = threading.Event()

    def start_next():
        while waiting and len([p for p in running if p.is_alive()]) < workers - 1:
            split = waiting.pop(0)
            proc = ctx.Process(target=_split_worker, args=(analyze_split, str(path), release_config, split, options,
                                                           threads, queue), daemon=True)
            with child_thread_env(threads):
                proc.start()
            running.append(proc)

    def drain():
        pending = len(remote)
        while pending:
            msg = queue.get()
            if msg[0] == "log":
                say(msg[1])
                continue
            pending -= 1
            if msg[0] == "done":
                results[msg[1]] = pickle.loads(msg[2])
            else:
                errors[msg[1]] = msg[2]
            start_next()
        done.set()

    old = torch.get_num_threads()
    reader = threading.Thread(target=drain, daemon=True)
    try:
        start_next()
        reader.start()
        with limit_threads(threads):
            results[splits[-1]] = analyze_split(model, task, splits[-1], options, log=log)
        while not done.wait(1.0):
            if not any(p.is_alive() for p in running) and not waiting and not done.wait(5.0):
                raise StabilityError("an analysis process ended without a result (out of memory?)")
    finally:
        torch.set_num_threads(old)
        for proc in running:
            if proc.is_alive():
                proc.terminate()
            proc.join(5)
    if errors:
        split, message = next(iter(errors.items()))
        raise StabilityError(f"{split}: {message}")
    return {split: results[split] for split in splits}
