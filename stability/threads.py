"""How the command line's CPU thread pools behave on a busy machine (issue 25).

torch runs its CPU kernels on an OpenMP thread pool (libgomp in the pip wheels), one thread per core by default.
Between two parallel regions libgomp's threads wait by spinning (``OMP_WAIT_POLICY`` unset: about 300,000 spins
before they sleep), which is free on an idle machine and ruinous on a busy one: when another process holds a core,
the spinning threads compete with it and with each other for the time slices the next region needs. Measured on a
2-core machine with other work on it: one step of a loop map took 80 ms with the default two spinning threads
instead of about 1 ms; with ``OMP_NUM_THREADS=1`` it took 1 ms, and with ``OMP_WAIT_POLICY=PASSIVE`` 0.86 ms, the
80-fold collapse avoided while keeping both threads. A whole ``analyze`` beside a one-core neighbour: 29–42 s with
the policy, not done in 180 s without it (benchmarks/busy_machine.py; benchmarks/RESULTS.md, "Busy machine").

The policy: the command line (:func:`stability.cli.main`, first thing, before anything imports torch) calls
:func:`apply`, which sets ``OMP_WAIT_POLICY=PASSIVE`` in ``os.environ``: waiting threads sleep at once (libgomp's
spin count becomes 0). libgomp reads the variable once, when it loads with torch, so it must be in the environment
before that; every process the command starts inherits it (``--reproducible``'s pinned re-run, ``analyze``'s
spawned split processes in stability/analysis/pool.py, a sweep's workers in stability/sweep/executors.py). The
thread count is not touched, nor are the numbers: the wait policy changes when a thread sleeps, not what it
computes, so a run gives the same bits with the policy and without it.

It is not applied where:

* the user set the wait (``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` in the environment, whatever the value): theirs
  is kept;
* ``STABILITY_THREAD_POLICY=off`` (or ``0``, ``no``, ``false``): the behaviour before the policy;
* torch is already loaded in the process, i.e. ``import stability`` from Python (or ``stability.cli.main([...])``
  called from a script that imported torch). Its OpenMP runtime read its settings when it loaded, so setting the
  variable then would only reach the processes started afterwards and make them differ from their parent;
  :func:`apply` does nothing and returns ``{}``, silently. ``import stability`` itself never changes the
  environment. From Python, set ``OMP_WAIT_POLICY=PASSIVE`` in the shell, or call ``stability.threads.apply()``
  before the first ``import torch`` (docs/python-api.md).

The sizes of the pools of processes started side by side (``analyze``'s split processes, an ensemble's processes in
stability/train/split.py): :func:`child_thread_env` while they start, :class:`limit_threads` inside them.
"""

from __future__ import annotations

import os
import sys
from typing import MutableMapping, Optional

#: set to ``off`` (or ``0``) to run the command line without the policy (the benchmark's "before")
SWITCH = "STABILITY_THREAD_POLICY"

#: what the policy puts in the environment, each only where the user has set none of :data:`USER_KEYS`
POLICY_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}

#: the user's own settings of the OpenMP wait: any one of them set and the policy leaves the wait alone
USER_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def policy_env(env: Optional[MutableMapping] = None) -> dict:
    """The settings the policy would add to ``env`` (default: this process's environment): :data:`POLICY_ENV`,
    or nothing where the user set the wait (:data:`USER_KEYS`) or switched the policy off (:data:`SWITCH`)."""
    env = os.environ if env is None else env
    if str(env.get(SWITCH, "")).strip().lower() in ("off", "0", "no", "false"):
        return {}
    if any(k in env for k in USER_KEYS):
        return {}
    return dict(POLICY_ENV)


def apply(env: Optional[MutableMapping] = None) -> dict:
    """Put :func:`policy_env` into ``env`` (default: ``os.environ``, where this process's libraries and every child
    it starts read it) and return what was added. Nothing while torch is already loaded in this process (its
    OpenMP runtime read its settings when it loaded; a caller in Python keeps the process it made)."""
    if env is None:
        if "torch" in sys.modules:
            return {}
        env = os.environ
    added = policy_env(env)
    env.update(added)
    return added


#: the environment variables that size the thread pools of OpenMP, MKL and OpenBLAS when a library loads
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class limit_threads:
    """Use ``threads`` threads in every thread pool of this process: torch's (OpenMP and its MKL) and, through
    threadpoolctl, the OpenBLAS copies of numpy and scipy, which torch.set_num_threads does not reach: two
    analyses side by side on a 2-core machine would otherwise each start a BLAS thread a core. Also a context
    manager that restores the previous sizes."""

    def __init__(self, threads: int):
        import torch  # lazy: this module is imported before torch loads (apply() must run first)
        from threadpoolctl import threadpool_limits

        self._torch = torch.get_num_threads()
        torch.set_num_threads(threads)
        self._blas = threadpool_limits(limits=threads, user_api="blas")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        import torch  # lazy, as in __init__ (already loaded there)

        self._blas.restore_original_limits()
        torch.set_num_threads(self._torch)


def child_thread_env(threads: int):
    """A context with ``THREAD_ENV`` set to ``threads`` while processes are started, so that a spawned process
    sizes its thread pools before its libraries load (the variables are restored afterwards)."""
    from unittest import mock  # lazy: a light import kept off the command line's start

    return mock.patch.dict(os.environ, {k: str(threads) for k in THREAD_ENV})
