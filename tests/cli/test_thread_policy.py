"""The command line's thread policy for a busy machine (stability/threads.py): the OpenMP wait it sets is in the
environment when torch (and with it the OpenMP runtime) loads, in the command's process and in every process it
starts; a user's own setting is kept; ``STABILITY_THREAD_POLICY=off`` leaves the environment alone.

What a process had when torch loaded is read by a probe, not from any library's output: a ``sitecustomize`` put
first on ``PYTHONPATH`` (so every Python process of the command runs it, spawned ones included) records the wait
variables at the moment ``import torch`` starts and prints them as one line then. Where the OpenMP runtime is
libgomp (torch's pip wheels) its own report (``OMP_DISPLAY_ENV=VERBOSE``) is checked as well, loosely: only that
its spin count is 0 under the policy and not 0 without it. Nothing here times anything."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from stability import threads
from tests.conftest import ROOT

MARK = "THREAD-POLICY-PROBE "
WATCHED = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")

#: the probe: prints WATCHED as they are when torch starts loading (stderr, one JSON line, once a process)
PROBE = f'''
import json, os, sys


class _AtTorch:
    done = False

    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not self.done:
            self.done = True
            seen = dict({{k: os.environ.get(k) for k in {WATCHED!r}}}, pid=os.getpid())
            sys.stderr.write({MARK!r} + json.dumps(seen) + "\\n")
            sys.stderr.flush()
        return None


sys.meta_path.insert(0, _AtTorch())
'''


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe")
    (d / "sitecustomize.py").write_text(PROBE)
    return d


def _command(probe_dir, *args, **extra):
    """``python -m stability ARGS`` as a real process in an environment without any thread or wait setting of its
    own (plus ``extra``); returns (what each process that loaded torch had then, libgomp's reports, the process)."""
    drop = set(threads.USER_KEYS) | {threads.SWITCH, "OMP_NUM_THREADS", "MKL_NUM_THREADS", "STABILITY_REPRODUCIBLE",
                                     "OMP_DISPLAY_ENV"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join([str(probe_dir), str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH")
                                                                       else []))
    env["OMP_DISPLAY_ENV"] = "VERBOSE"  # libgomp shows GOMP_SPINCOUNT only when verbose
    env.update(extra)
    proc = subprocess.run([sys.executable, "-m", "stability", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)
    seen = [json.loads(line[len(MARK):]) for line in proc.stderr.splitlines() if line.startswith(MARK)]
    assert seen, proc.stderr  # at least the command's own process loaded torch
    blocks = re.split(r"OPENMP DISPLAY ENVIRONMENT BEGIN", proc.stderr)[1:]
    spins = [m.group(1) for b in blocks for m in [re.search(r"GOMP_SPINCOUNT\W*=\W*(\d+)", b)] if m]
    return seen, spins, proc


def _halt(probe_dir, *flags, **extra):  # loads torch, then fails with one line: the cheapest command that loads it
    return _command(probe_dir, "halt", "/nonexistent/x.pt", *flags, **extra)


def test_the_policy_adds_the_passive_wait_only_where_the_user_set_no_wait_and_did_not_switch_it_off():
    assert threads.policy_env({}) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert threads.policy_env({"OMP_NUM_THREADS": "2"}) == threads.POLICY_ENV  # the thread count is not the wait
    for key in threads.USER_KEYS:
        assert threads.policy_env({key: "1000"}) == {}
    for off in ("off", "0", "OFF", " no "):
        assert threads.policy_env({threads.SWITCH: off}) == {}
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert threads.apply(env) == {} and env == {"OMP_WAIT_POLICY": "ACTIVE"}
    env = {}
    assert threads.apply(env) == threads.POLICY_ENV and env == threads.POLICY_ENV


def test_apply_in_a_process_that_already_loaded_torch_changes_nothing_and_says_nothing(monkeypatch, capsys):
    for key in threads.USER_KEYS + (threads.SWITCH,):
        monkeypatch.delenv(key, raising=False)
    assert "torch" in sys.modules and threads.apply() == {}
    assert not any(key in os.environ for key in threads.USER_KEYS)
    assert capsys.readouterr() == ("", "")


def test_importing_the_command_line_does_not_load_torch_so_the_policy_comes_first():
    code = "import sys, stability, stability.cli, stability.threads; print('torch' in sys.modules)"
    env = {k: v for k, v in os.environ.items() if k != "STABILITY_REPRODUCIBLE"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_by_default_torch_loads_in_the_command_with_the_passive_wait(probe_dir):
    seen, spins, _ = _halt(probe_dir)
    assert [s["OMP_WAIT_POLICY"] for s in seen] == ["PASSIVE"]
    assert seen[0]["GOMP_SPINCOUNT"] is None and seen[0]["OMP_NUM_THREADS"] is None  # the thread count: torch's own
    assert all(s == "0" for s in spins)  # libgomp's view, where libgomp is the runtime


def test_a_users_own_wait_is_kept(probe_dir):
    seen, spins, _ = _halt(probe_dir, OMP_WAIT_POLICY="ACTIVE", OMP_NUM_THREADS="3")
    assert [(s["OMP_WAIT_POLICY"], s["OMP_NUM_THREADS"]) for s in seen] == [("ACTIVE", "3")]
    assert all(s != "0" for s in spins)
    seen, spins, _ = _halt(probe_dir, GOMP_SPINCOUNT="12345")
    assert [(s["OMP_WAIT_POLICY"], s["GOMP_SPINCOUNT"]) for s in seen] == [(None, "12345")]
    assert all(s == "12345" for s in spins)


def test_switched_off_the_environment_is_left_untouched(probe_dir):
    seen, spins, _ = _halt(probe_dir, **{threads.SWITCH: "off"})
    assert [(s["OMP_WAIT_POLICY"], s["GOMP_SPINCOUNT"]) for s in seen] == [(None, None)]
    assert all(s != "0" for s in spins)  # libgomp's own default: threads spin before they sleep


def test_the_reproducible_rerun_inherits_the_policy_and_keeps_one_thread(probe_dir):
    seen, spins, _ = _halt(probe_dir, "--reproducible")
    assert seen and all(s["OMP_WAIT_POLICY"] == "PASSIVE" for s in seen)
    assert any(s["OMP_NUM_THREADS"] == "1" for s in seen)  # the pinned process (the command is replaced by it)
    assert all(s == "0" for s in spins)


def test_the_split_processes_of_analyze_inherit_the_policy(probe_dir, tmp_path):
    from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig
    from stability.train import train

    ckpt = tmp_path / "tiny.pt"
    cfg = RunConfig(model=ModelConfig(width=16, heads=2, recall="external", norm="pre"),
                    task=TaskConfig(train_size=40, val_size=8, hard_size=8, train_length=8, hard_length=12),
                    train=TrainConfig(epochs=1, batch_size=20, iterations=4, test_iterations=6, device="cpu"))
    old = torch.get_num_threads()
    try:
        train(cfg, ckpt, progress=False)
    finally:
        torch.set_num_threads(old)
    seen, spins, proc = _command(probe_dir, "analyze", ckpt, "--split", "both", "--workers", "2", "--samples", "2",
                                 "--only", "rho", "--max-iter", "20", "--iterations", "20", "--quiet",
                                 "--json", tmp_path / "a.json", OMP_NUM_THREADS="2")
    assert proc.returncode == 0, proc.stderr
    assert len({s["pid"] for s in seen}) == 2  # the command and the spawned process of its first split
    assert all(s["OMP_WAIT_POLICY"] == "PASSIVE" for s in seen)
    assert all(s == "0" for s in spins)
