"""Shared test helpers: the ``stability`` command line run in-process (fast) or as a real process.

``run_cli`` calls :func:`stability.cli.main` in this interpreter, which saves the ~1.6 s of ``import torch`` a
fresh ``python -m stability`` pays. It captures stdout and stderr at the file-descriptor level (so output of
tqdm, warnings, C code and child processes is caught too), honours ``cwd`` and ``env`` and restores them, and
turns ``SystemExit`` (argparse exits 2) and uncaught exceptions (exit 1, traceback on stderr) into a return code,
as a real process would. Global state a command may change (RNG states, torch threads and default dtype, the
warning filters, ``sys.argv``) is restored afterwards, so one in-process run cannot leak into the next test.

``run_cli(..., process=True)`` (or ``run_process``) starts a real ``python -m stability`` instead: use it for what
only a process shows (``python -m`` itself, import-time behaviour, being killed and resumed).
"""

import contextlib
import importlib.util
import io
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

#: the repository's root (a test reads the committed files through it, wherever its own directory is)
ROOT = Path(__file__).resolve().parents[1]
#: the committed test files: real formats, release checkpoints, the small trained checkpoint
FIXTURES = ROOT / "tests" / "fixtures"

@dataclass
class CliResult:
    """What a finished command left: the attributes of :class:`subprocess.CompletedProcess` the tests use."""

    args: list
    returncode: int
    stdout: str
    stderr: str


def toml_value(v) -> str:
    """A Python value (bool, str, number, list of them) as a TOML value, for the grid and config files tests write."""
    import json

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return repr(v)


def run_process(*args, check=True, timeout=600, env=None, cwd=None, module="stability"):
    """Run ``python -m MODULE ARGS`` as a real process; returns the CompletedProcess."""
    proc = subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          encoding="utf-8", timeout=timeout, cwd=cwd,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    _check(proc, args, check)
    return proc


def _check(proc, args, check):
    if check and proc.returncode != 0:
        raise AssertionError(f"stability {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}")


@contextlib.contextmanager
def _fd_capture():
    """Redirect fds 1 and 2 (and sys.stdout/sys.stderr over them) to temporary files; yields a dict filled on exit."""
    texts = {}
    files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]
    saved_py = sys.stdout, sys.stderr
    for stream in saved_py:
        with contextlib.suppress(Exception):
            stream.flush()
    saved_fds = [os.dup(1), os.dup(2)]
    streams = []
    try:
        for fd, f in zip((1, 2), files):
            os.dup2(f.fileno(), fd)
            streams.append(io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding="utf-8",
                                            errors="backslashreplace", write_through=True))
        sys.stdout, sys.stderr = streams
        yield texts
    finally:
        for stream in streams:
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = saved_py
        for fd, saved in zip((1, 2), saved_fds):
            os.dup2(saved, fd)
            os.close(saved)
        for name, f in zip(("stdout", "stderr"), files):
            f.seek(0)
            texts[name] = f.read().decode("utf-8", errors="backslashreplace")
            f.close()


@contextlib.contextmanager
def _isolated(env, cwd):
    """Temporarily apply ``env`` and ``cwd``; restore them and the global state a command may change."""
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_argv = sys.argv[:]
    saved_threads = torch.get_num_threads()
    saved_dtype = torch.get_default_dtype()
    saved_rng = random.getstate(), torch.random.get_rng_state()
    try:
        import numpy as np

        saved_np = np.random.get_state()
    except ImportError:  # pragma: no cover - numpy is a dependency
        np = saved_np = None
    try:
        os.environ.update({"OMP_NUM_THREADS": "1", **{k: str(v) for k, v in (env or {}).items()}})
        if cwd is not None:
            os.chdir(cwd)
        with warnings.catch_warnings():
            yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv[:] = saved_argv
        torch.set_num_threads(saved_threads)
        torch.set_default_dtype(saved_dtype)
        random.setstate(saved_rng[0])
        torch.random.set_rng_state(saved_rng[1])
        if np is not None:
            np.random.set_state(saved_np)


class _Timeout(BaseException):
    """Raised in the main thread when an in-process command runs past its ``timeout``."""


@contextlib.contextmanager
def _alarm(timeout):
    if not timeout or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise _Timeout(f"timed out after {timeout} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(*args, check=True, timeout=600, env=None, cwd=None, process=False):
    """Run ``stability ARGS``: in-process through :func:`stability.cli.main` unless ``process`` is set.

    Returns an object with ``args``, ``returncode``, ``stdout`` and ``stderr``; with ``check`` a non-zero exit
    fails the test with the command's stderr.
    """
    if process:
        return run_process(*args, check=check, timeout=timeout, env=env, cwd=cwd)
    from stability.cli import main

    argv = [str(a) for a in args]
    with _fd_capture() as out:
        with _isolated(env, cwd):
            sys.argv[:] = ["stability", *argv]
            try:
                with _alarm(timeout):
                    code = main(argv)
            except SystemExit as exc:
                code = exc.code
            except _Timeout as exc:
                raise subprocess.TimeoutExpired(["stability", *argv], timeout) from exc
            except Exception:  # an uncaught exception: a real process prints the traceback and exits 1
                traceback.print_exc(file=sys.stderr)
                code = 1
            if code is None:
                code = 0
            elif not isinstance(code, int):  # SystemExit("message"): printed to stderr, exit 1
                print(code, file=sys.stderr)
                code = 1
    proc = CliResult(["stability", *argv], code, out["stdout"], out["stderr"])
    _check(proc, args, check)
    return proc


def kill_when_ready(cmd: list, ready, *, deadline_s: float, what: str) -> None:
    """Start ``cmd`` (a real process in its own session, one OMP thread), poll ``ready()`` every 20 ms and, once it
    is true, SIGKILL the process group (the command and every worker it started). Fails the test when the command
    ends first (with its stderr) or when ``ready()`` is still false after ``deadline_s`` seconds (``no WHAT within
    the deadline``); the group is killed and reaped either way."""
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + deadline_s
    try:
        while time.time() < deadline:
            if ready():
                return
            assert proc.poll() is None, f"the command ended before it could be killed: {proc.stderr.read()}"
            time.sleep(0.02)
        pytest.fail(f"no {what} within the deadline")
    finally:
        with contextlib.suppress(ProcessLookupError):  # a group that already ended has nothing left to kill
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture
def cli():
    """:func:`run_cli` (in-process by default)."""
    return run_cli


#: the committed small trained checkpoint (tests/fixtures/make_checkpoint.py says how it is made)
SMALL_CHECKPOINT = FIXTURES / "small-prefix-sums.pt"


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory) -> Path:
    """A copy of the committed small trained checkpoint (prefix sums, width 16, val n = 512): for the tests that
    analyse a trained model and whose property does not depend on training it at test time."""
    out = tmp_path_factory.mktemp("small-checkpoint") / SMALL_CHECKPOINT.name
    shutil.copyfile(SMALL_CHECKPOINT, out)
    return out


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Path:
    """A tiny prefix-sums run trained for 2 epochs (checkpoint and metrics), read-only: the checkpoint tests."""
    from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
    from stability.train import train

    out = tmp_path_factory.mktemp("ck") / "run.pt"
    cfg = RunConfig(model=ModelConfig(width=16, heads=2),
                    task=TaskConfig(train_size=40, val_size=8, hard_size=8, train_length=8, hard_length=12),
                    train=TrainConfig(epochs=2, batch_size=20, iterations=4, test_iterations=6, device="cpu"))
    train(cfg, out, progress=False)
    return out


def load_benchmark(path: Path, name: str):
    """The benchmark script at ``path`` imported as module ``name`` (registered in sys.modules: dataclasses look
    their module up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
