"""Ensembles (stability/train/ensemble.py, ``stability train --seeds``): members against their solo runs, their
checkpoints, resume after a real kill, bad input."""

import signal
import subprocess
import sys
import time

import pytest
import torch

import stability
from stability.config import AnalysisOptions, ModelConfig, RunConfig, TaskConfig, TrainConfig
from stability.errors import ConfigError
from stability.train.ensemble import member_name, parse_lrs, parse_seeds, train_ensemble
from stability.train.loop import metrics_path, train
from tests.conftest import run_process

SMALL = ["--task", "prefix-sums", "--width", "16", "--heads", "2", "--train-size", "200", "--val-size", "20",
         "--hard-size", "20", "--train-length", "8", "--hard-length", "12", "--batch-size", "50",
         "--iterations", "6", "--test-iterations", "8", "--quiet"]


def small_config(epochs=2, **train) -> RunConfig:
    return RunConfig(model=ModelConfig(width=16, heads=2),
                     task=TaskConfig(train_size=200, val_size=20, hard_size=20, train_length=8, hard_length=12),
                     train=TrainConfig(epochs=epochs, batch_size=50, iterations=6, test_iterations=8, device="cpu",
                                       **train))


def test_seeds_and_rates_parse_and_name_the_members():
    assert parse_seeds("0-4") == [0, 1, 2, 3, 4]
    assert parse_seeds("0,2,7") == [0, 2, 7] and parse_seeds("0-1,9") == [0, 1, 9]
    assert parse_lrs("1e-3,2.5e-3") == [1e-3, 2.5e-3]
    assert member_name(3) == "s3.pt" and member_name(3, 2.5e-3) == "lr2.5e-3-s3.pt"
    for bad in ("3-1", "a", "1,1", "-1", ""):
        with pytest.raises(ConfigError):
            parse_seeds(bad)
    for bad in ("x", "0", "-1e-3", "1e-3,1e-3"):
        with pytest.raises(ConfigError):
            parse_lrs(bad)


def test_members_agree_with_their_solo_runs(tmp_path):
    """Same initialisation, data order and (n, k) draws as the solo run; only the reduction shapes differ: the
    first epoch's loss within 1e-4 relative, the weights after it close."""
    cfg = small_config(epochs=2)
    results = train_ensemble(cfg, tmp_path / "ens", [0, 1], [1e-3, 3e-3], progress=False)
    assert [r.path.name for r in results] == ["lr1e-3-s0.pt", "lr1e-3-s1.pt", "lr3e-3-s0.pt", "lr3e-3-s1.pt"]
    for r in results:
        obj = torch.load(r.path, weights_only=True)
        seed, lr = obj["config"]["train"]["seed"], obj["config"]["train"]["lr"]
        solo = train(cfg.replace(train=cfg.train.replace(seed=seed, lr=lr)), tmp_path / f"solo-{r.path.name}",
                     progress=False)
        for a, b in zip(r.history, solo.history):
            assert abs(a["loss"] - b["loss"]) <= 1e-4 * b["loss"], (r.path.name, a["loss"], b["loss"])
            assert a["lr"] == b["lr"] and a["step"] == b["step"]
        s = torch.load(solo.path, weights_only=True)
        for key in s["model"]:
            assert torch.allclose(obj["model"][key], s["model"][key], rtol=1e-3, atol=1e-5), key
        # an ordinary checkpoint: the solo run's keys plus the ensemble note
        assert set(obj) == set(s) | {"ensemble"}
        assert obj["ensemble"]["members"] == [x.path.name for x in results]
        assert obj["rng"]["data"].shape == s["rng"]["data"].shape
        assert torch.equal(obj["optimizer"]["state"][0]["step"], s["optimizer"]["state"][0]["step"])


def test_a_member_loads_and_analyses_like_a_solo_checkpoint(tmp_path):
    results = train_ensemble(small_config(epochs=1), tmp_path / "ens", [0, 1], progress=False)
    loaded = stability.load(results[1].path)
    assert loaded.config.train.seed == 1
    a = stability.analyze(results[1].path, options=AnalysisOptions(samples=2, stages=("reachability",), max_iter=20),
                          splits=("val",))
    assert a["val"]["samples"] == 2 and a["val"]["fixed_point"] is not None


def test_an_ensemble_is_deterministic(tmp_path):
    cfg = small_config(epochs=1)
    a = train_ensemble(cfg, tmp_path / "a", [0, 1], progress=False)
    b = train_ensemble(cfg, tmp_path / "b", [0, 1], progress=False)
    for x, y in zip(a, b):
        p, q = torch.load(x.path, weights_only=True)["model"], torch.load(y.path, weights_only=True)["model"]
        assert all(torch.equal(p[k], q[k]) for k in p)


def test_a_reproducible_ensemble_gives_the_same_bits_twice(tmp_path):
    """``--reproducible`` (pinned kernels, one thread): two ensemble processes on one machine write bitwise the
    same members, and each member's checkpoint says it was computed in the pinned mode."""
    args = SMALL + ["--epochs", "1", "--seeds", "0-1", "--lrs", "1e-3,3e-3", "--reproducible"]
    for name in ("a", "b"):
        run_process("train", *args, "--out", tmp_path / name)
    names = [member_name(s, lr) for lr in (1e-3, 3e-3) for s in (0, 1)]
    for name in names:
        a, b = (torch.load(tmp_path / d / name, weights_only=True) for d in ("a", "b"))
        assert a["hardware"]["reproducible"] is True and b["hardware"]["reproducible"] is True
        assert a["model"].keys() == b["model"].keys()
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]), name
        assert [r["loss"] for r in a["history"]] == [r["loss"] for r in b["history"]]
    first = [torch.load(tmp_path / "a" / n, weights_only=True)["model"] for n in names]
    assert not torch.equal(first[0]["input.weight"], first[1]["input.weight"])  # members are distinct runs


@pytest.mark.slow
@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_killed_ensemble_resumes_to_the_uninterrupted_result(tmp_path, cli, processes):
    """SIGKILL to the command (with ``--processes 2`` its children die with it: stability/processes.py)."""
    args = SMALL + ["--epochs", "10", "--train-size", "400", "--train-length", "10", "--seeds", "0-1",
                    "--processes", processes]
    cli("train", *args, "--out", tmp_path / "whole")
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "stability", "train", *args, "--out", str(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    metrics = metrics_path(killed / "s1.pt")
    while time.time() < deadline:  # during epoch 2 or soon after, once both members have saved (with
        # --processes 2 they save in two processes, and under load one can lag the other by an epoch)
        saved = all((killed / n).exists() for n in ("s0.pt", "s1.pt"))
        if saved and metrics.exists() and len(metrics.read_text().splitlines()) >= 1:
            break
        time.sleep(0.02)
    time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    epochs = [torch.load(killed / n, weights_only=True)["epoch"] for n in ("s0.pt", "s1.pt")]
    assert all(1 <= e < 10 for e in epochs)
    cli("train", *args, "--out", killed, "--resume")
    for name in ("s0.pt", "s1.pt"):
        a = torch.load(tmp_path / "whole" / name, weights_only=True)
        b = torch.load(killed / name, weights_only=True)
        assert b["epoch"] == 10 and b["ensemble"] == a["ensemble"]
        same = epochs[0] == epochs[1]  # a kill between the two members' saves: the lagging one catches up alone
        for key in a["model"]:
            if same:
                assert torch.equal(a["model"][key], b["model"][key]), key
            else:
                assert torch.allclose(a["model"][key], b["model"][key], rtol=1e-3, atol=1e-5), key
        if same:
            assert [r["loss"] for r in a["history"]] == [r["loss"] for r in b["history"]]
            assert a["final"]["val"]["accuracy"] == b["final"]["val"]["accuracy"]


@pytest.mark.parametrize("extra, message", [
    (["--seeds", "3-1", "--out", "{tmp}/d"], "--seeds '3-1': the range 3-1 is empty"),
    (["--seeds", "0-1", "--out", "{tmp}/file"], "is a file, expected a directory"),
    (["--lrs", "1e-3", "--out", "{tmp}/d"], "--lrs needs --seeds"),
    (["--seeds", "0-1", "--method", "deep-supervision", "--out", "{tmp}/d"], "progressive loss only"),
    (["--ensemble-step", "fixed", "--out", "{tmp}/d"], "--ensemble-step needs --seeds"),
    (["--max-members", "2", "--out", "{tmp}/d"], "--max-members needs --seeds"),
    (["--seeds", "0-1", "--compile", "--ensemble-step", "subsets", "--out", "{tmp}/d"],
     "compile with --ensemble-step subsets"),
])
def test_bad_ensemble_input_is_one_line_exit_2(tmp_path, cli, extra, message):
    (tmp_path / "file").write_text("x")
    proc = cli("train", *SMALL, *[e.format(tmp=tmp_path) for e in extra], check=False)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "d").exists()


def test_existing_members_are_not_overwritten_without_resume(tmp_path, cli):
    cli("train", *SMALL, "--epochs", "1", "--seeds", "0", "--out", tmp_path / "e")
    proc = cli("train", *SMALL, "--epochs", "1", "--seeds", "0", "--out", tmp_path / "e", check=False)
    assert proc.returncode == 2 and "exists" in proc.stderr


def test_each_members_loss_gradient_in_the_batched_step_is_its_solo_progressive_losss(tmp_path):
    """In float64, members at different depths (from e itself, after frozen iterations, finished early while
    another runs on): each member's gradient from the summed batched losses equals the gradient of its own
    :func:`~stability.train.loop.progressive_loss` on its own batch, to 1e-12 relative. No member's gradient
    reaches another's parameters."""
    from stability.train import ensemble, loop

    cfg = small_config()
    runs = [loop._start(c, tmp_path / n, resume=False, progress=False) for n, c in ensemble.members(cfg, range(4))]
    for r in runs:
        r.model.double()
        r.model.attention_impl = "dense"
    task, B = runs[0].task, 20
    x, y = task.dataset("train")
    x = x.double() if x.is_floating_point() else x
    xb, yb = torch.stack([x[i * B:(i + 1) * B] for i in range(4)]), torch.stack([y[i * B:(i + 1) * B] for i in range(4)])
    depths = [(0, 3), (2, 1), (5, 1), (1, 5)]
    ensemble.batched_losses(runs, xb, yb, depths).sum().backward()
    batched = [[p.grad.clone() for p in r.model.parameters()] for r in runs]
    for i, (r, (n, k)) in enumerate(zip(runs, depths)):
        r.model.zero_grad()
        loop.progressive_loss(r.model, task, xb[i], yb[i], n, k, 1.0, cfg.train.iterations).backward()
        for g, p in zip(batched[i], r.model.parameters()):
            assert torch.allclose(g, p.grad, rtol=1e-12, atol=1e-12 * float(p.grad.abs().max())), (i, depths[i])


def test_a_one_member_ensemble_is_bitwise_its_solo_run_with_the_members_attention(tmp_path, monkeypatch):
    """Everything a member keeps of its own (initialisation, data order, (n, k) draws, learning-rate schedule,
    AdamW state, gradient clipping, the checkpoint's generator) is its solo run's to the bit: a one-member
    ensemble's weights, optimizer state and generators equal, bit for bit, those of the solo run whose attention
    is the members' written-out softmax (``dense``) instead of the fused kernel. So a member's distance from its solo run is the
    rounding of the attention kernel (and of the stacked products), grown by the training's own sensitivity
    (benchmarks/RESULTS.md, "Ensembles": a solo run perturbed at 1e-7 drifts apart as fast)."""
    from stability.model import attention

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = small_config(epochs=3)
        member = train_ensemble(cfg, tmp_path / "ens", [1], progress=False)[0]
        monkeypatch.setattr(attention.F, "scaled_dot_product_attention",
                            lambda q, k, v, attn_mask=None: attention._dense_exp_attention(q, k, v, attn_mask))
        solo = train(cfg.replace(train=cfg.train.replace(seed=1)), tmp_path / "solo.pt", progress=False)
    finally:
        torch.set_num_threads(old)
    a, b = (torch.load(r.path, weights_only=True) for r in (member, solo))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in b["model"])
    # the loss values reported: the vmapped mean sums in another order (its gradient, 1/N each, does not)
    for x, y in zip(a["history"], b["history"]):
        assert abs(x["loss"] - y["loss"]) <= 1e-6 * y["loss"] and x["step"] == y["step"] and x["lr"] == y["lr"]
    assert all(torch.equal(a["rng"][k], b["rng"][k]) for k in ("torch", "data"))
    for x, y in zip(a["optimizer"]["state"].values(), b["optimizer"]["state"].values()):
        assert all(torch.equal(x[k], y[k]) for k in y)


@pytest.mark.parametrize("window", [None, 5])
def test_the_dense_attention_the_members_run_equals_sdpa(window):
    from stability.model import build_model

    torch.manual_seed(0)
    model = build_model(ModelConfig(width=16, heads=2, attention_window=window)).double()
    x = torch.randn(3, 11, 1, dtype=torch.float64)
    model.attention_impl = "sdpa"
    a = model(x, 4)
    model.attention_impl = "dense"
    b = model(x, 4)
    model.attention_impl = "math"
    c = model(x, 4)
    assert torch.allclose(a, b, atol=1e-12) and torch.allclose(b, c, atol=1e-12)


def test_a_member_behind_the_others_catches_up_on_resume(tmp_path):
    """A kill between two members' checkpoints leaves one an epoch behind: resumed, it trains on alone until it
    catches up (another batch shape, so close to, not bitwise, the uninterrupted run)."""
    import shutil

    whole = train_ensemble(small_config(epochs=2, cooldown_at=1.0), tmp_path / "whole", [0, 1], progress=False)
    train_ensemble(small_config(epochs=1, cooldown_at=1.0), tmp_path / "cut", [0, 1], progress=False)
    for suffix in (".pt", ".metrics.jsonl", ".metrics.csv", ".accuracy.csv"):  # s0 finished, s1 one epoch behind
        shutil.copyfile(tmp_path / "whole" / f"s0{suffix}", tmp_path / "cut" / f"s0{suffix}")
    # the cut run's s1 was written by a 1-epoch run: extend it to 2 (s0 is already at 2; no cooldown, so the
    # extension changes no learning rate)
    resumed = train_ensemble(small_config(epochs=2, cooldown_at=1.0), tmp_path / "cut", [0, 1], resume=True,
                             progress=False)
    a, b = (torch.load(r.path, weights_only=True) for r in (whole[1], resumed[1]))
    assert b["epoch"] == 2 and len(b["history"]) == 2
    for key in a["model"]:
        assert torch.allclose(a["model"][key], b["model"][key], rtol=1e-3, atol=1e-5), key
    s0 = torch.load(resumed[0].path, weights_only=True)
    done = torch.load(whole[0].path, weights_only=True)["model"]
    assert all(torch.equal(s0["model"][k], v) for k, v in done.items())  # the member already done is untouched
