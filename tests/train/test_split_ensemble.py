"""An ensemble split across processes (stability/train/split.py, ``stability train --seeds --processes``): its
members against the one-process ensemble's, how members are dealt out, ``auto``, a real Ctrl-C / SIGTERM / kill."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from stability.errors import ConfigError
from stability.train import split
from stability.train.ensemble import train_ensemble
from stability.train.loop import metrics_path
from tests.conftest import run_process
from tests.train.test_ensemble import SMALL, small_config


def test_a_split_ensembles_members_equal_the_one_process_ensembles_bit_for_bit(tmp_path):
    """Bitwise, at one thread in every process: a member's arithmetic in the batched step is its own (the stacked
    products and every reduction run per member), so which members share its process cannot change its bits."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = small_config(epochs=2)
        one = train_ensemble(cfg, tmp_path / "one", [0, 1, 2], progress=False)
        two = train_ensemble(cfg, tmp_path / "two", [0, 1, 2], progress=False, processes=2)
    finally:
        torch.set_num_threads(old)
    assert [r.path.name for r in two] == ["s0.pt", "s1.pt", "s2.pt"]
    for a, b in zip(one, two):
        x, y = torch.load(a.path, weights_only=True), torch.load(b.path, weights_only=True)
        assert x["model"].keys() == y["model"].keys()
        for key in x["model"]:
            assert torch.equal(x["model"][key], y["model"][key]), (a.path.name, key)
        assert [h["loss"] for h in x["history"]] == [h["loss"] for h in y["history"]] == [h["loss"] for h in b.history]
        assert x["final"] == y["final"] == b.final
        # the note names the whole ensemble, not the process's share of it
        assert y["ensemble"] == x["ensemble"] and y["ensemble"]["members"] == ["s0.pt", "s1.pt", "s2.pt"]


@pytest.mark.parametrize("count, processes, expected", [
    (5, 2, [[0, 1, 2], [3, 4]]), (7, 3, [[0, 1, 2], [3, 4], [5, 6]]), (3, 3, [[0], [1], [2]]), (4, 1, [[0, 1, 2, 3]]),
])
def test_members_are_dealt_out_contiguously_in_parts_differing_by_at_most_one(count, processes, expected):
    assert split.parts(count, processes) == expected


def test_auto_is_one_process_per_core_torch_may_use_up_to_the_members_and_one_on_cuda(monkeypatch):
    cfg = small_config()
    monkeypatch.setattr(split, "cores", lambda: 2)
    monkeypatch.setattr(split.torch, "get_num_threads", lambda: 2)
    assert split.resolve_processes(None, 5, cfg) == 2
    assert split.resolve_processes(None, 1, cfg) == 1
    monkeypatch.setattr(split.torch, "get_num_threads", lambda: 1)  # OMP_NUM_THREADS=1: the ensemble on one core
    assert split.resolve_processes(None, 5, cfg) == 1
    monkeypatch.setattr(split, "cores", lambda: 16)
    monkeypatch.setattr(split.torch, "get_num_threads", lambda: 16)
    assert split.resolve_processes(None, 5, cfg) == 5
    monkeypatch.setattr(split, "resolve_device", lambda name: torch.device("cuda"))
    assert split.resolve_processes(None, 5, cfg) == 1
    assert split.resolve_processes(3, 5, cfg) == 3
    with pytest.raises(ConfigError, match="--processes 6: more than the ensemble's 5 members"):
        split.resolve_processes(6, 5, cfg)


def test_the_commands_default_is_auto(monkeypatch):
    """``stability train --seeds`` without ``--processes`` (the options' default) splits its members as
    ``--processes auto`` does: two processes on two cores."""
    from stability.config import EnsembleOptions

    monkeypatch.setattr(split, "cores", lambda: 2)
    monkeypatch.setattr(split.torch, "get_num_threads", lambda: 2)
    assert EnsembleOptions().processes is None
    assert split.resolve_processes(EnsembleOptions().processes, 5, small_config()) == 2


def test_every_process_of_a_split_ensemble_shows_its_training_bar(tmp_path):
    """Each process draws its own training bar, named by its members (process 0 alone drew one before)."""
    args = [a for a in SMALL if a != "--quiet"] + ["--epochs", "1", "--seeds", "0-2", "--processes", "2"]
    proc = run_process("train", *args, "--out", tmp_path / "d")
    assert "train s0, s1:" in proc.stderr and "train s2:" in proc.stderr, proc.stderr


@pytest.mark.parametrize("extra, message", [
    (["--seeds", "0-1", "--processes", "0"], "argument --processes: expected auto or a positive integer, got '0'"),
    (["--seeds", "0-1", "--processes", "two"], "expected auto or a positive integer, got 'two'"),
    (["--seeds", "0-1", "--processes", "3"], "--processes 3: more than the ensemble's 2 members"),
    (["--processes", "2"], "--processes needs --seeds"),
])
def test_a_bad_processes_value_is_one_line_exit_2(tmp_path, cli, extra, message):
    proc = cli("train", *SMALL, *extra, "--out", tmp_path / "d", check=False)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "d").exists()


def _start(args, out, **kw):
    return subprocess.Popen([sys.executable, "-m", "stability", "train", *args, "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, **kw)


def _wait_for_an_epoch(proc, out, names):
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if all(metrics_path(out / n).exists() for n in names):
            return
        time.sleep(0.02)
    raise AssertionError(f"no epoch written before the run ended ({proc.poll()})")


@pytest.mark.slow
@pytest.mark.parametrize("how, status", [("sigterm", 143), ("ctrl-c", 130)])
def test_a_split_ensemble_stopped_keeps_its_checkpoints_and_resumes_to_the_uninterrupted_result(tmp_path, cli, how,
                                                                                              status):
    """SIGTERM to the parent (passed on to its children) or Ctrl-C (SIGINT to the terminal's whole group): exit
    143 / 130, no lock or temporary file left, every member's last finished epoch kept; resumed, each member ends
    with bitwise the uninterrupted run's weights (members in their own processes: none waits on another's batch
    shape, see the test above)."""
    args = SMALL + ["--epochs", "10", "--train-size", "400", "--train-length", "10", "--seeds", "0-1",
                    "--processes", "2"]
    cli("train", *args, "--out", tmp_path / "whole")
    out = tmp_path / "stopped"
    proc = _start(args, out, start_new_session=True)
    _wait_for_an_epoch(proc, out, ["s0.pt", "s1.pt"])
    assert proc.poll() is None, "the run finished before it could be stopped"
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err
    assert not (tmp_path / ".stopped.lock").exists() and not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    epochs = [torch.load(out / n, weights_only=True)["epoch"] for n in ("s0.pt", "s1.pt")]
    assert all(1 <= e < 10 for e in epochs), (epochs, err)
    cli("train", *args, "--out", out, "--resume")
    for name in ("s0.pt", "s1.pt"):
        a = torch.load(tmp_path / "whole" / name, weights_only=True)
        b = torch.load(out / name, weights_only=True)
        assert b["epoch"] == 10 and b["ensemble"] == a["ensemble"]
        for key in a["model"]:
            assert torch.equal(a["model"][key], b["model"][key]), (name, key)
        assert [r["loss"] for r in a["history"]] == [r["loss"] for r in b["history"]]
