"""``stability data``: make (progress, resume, determinism), info (sizes, statistics, checksums), bad input.

Every test runs the real command line in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from stability.config import TaskConfig
from stability.errors import DataError
from stability.tasks import cache, make_task
from tests.conftest import run_cli


def stability(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_cli(*args, check=False, timeout=300, env=env)


def _shard_hashes(directory: Path) -> dict:
    manifest = json.loads((directory / "manifest.json").read_text())
    return {(s, e["index"]): e["sha256"] for s, entries in manifest["shards"].items() for e in entries}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A small sudoku dataset built in one go with two workers."""
    root = tmp_path_factory.mktemp("one-go")
    r = stability("data", "make", "--task", "sudoku", "--out", str(root), "--sizes", "30", "10", "2", "--cut", "4",
                  "--seed", "1", "--workers", "2")
    assert r.returncode == 0, r.stderr
    return root, r


def test_make_builds_the_asked_sizes_with_a_progress_bar(built):
    root, r = built
    directory = root / "sudoku-seed1"
    assert "train 30, val 10, hard 2" in r.stdout
    assert "puzzle" in r.stderr and "100%" in r.stderr  # tqdm's bar on stderr
    manifest = cache.read_manifest(directory)
    assert {s: cache.available_rows(manifest, s) for s in cache.SPLITS} == {"train": 30, "val": 10, "hard": 2}
    for entries in manifest["shards"].values():
        for e in entries:
            assert cache.sha256_file(directory / e["file"]) == e["sha256"]


def test_make_resumes_after_a_kill_and_gives_the_same_bytes(built, tmp_path):
    root, _ = built
    reference = _shard_hashes(root / "sudoku-seed1")
    args = ["data", "make", "--task", "sudoku", "--out", str(tmp_path), "--sizes", "30", "10", "2", "--cut", "4",
            "--seed", "1", "--quiet"]
    assert stability(*args).returncode == 0
    directory = tmp_path / "sudoku-seed1"
    assert _shard_hashes(directory) == reference  # one worker or two: the same dataset
    # a kill between writing a shard and recording it, and a kill before another shard was written
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["shards"]["val"] = []
    (directory / "manifest.json").write_text(json.dumps(manifest))
    (directory / manifest["shards"]["hard"][0]["file"]).unlink()
    untouched = (directory / manifest["shards"]["train"][0]["file"]).stat().st_mtime_ns
    r = stability(*args)
    assert r.returncode == 0, r.stderr
    assert _shard_hashes(directory) == reference
    assert (directory / manifest["shards"]["train"][0]["file"]).stat().st_mtime_ns == untouched  # not redone


def test_make_grows_a_dataset_keeping_its_first_rows(built, tmp_path):
    root, _ = built
    args = ["data", "make", "--task", "sudoku", "--out", str(tmp_path), "--cut", "4", "--seed", "1", "--quiet"]
    assert stability(*args, "--sizes", "12", "4", "1").returncode == 0
    assert stability(*args, "--sizes", "30", "10", "2").returncode == 0
    assert _shard_hashes(tmp_path / "sudoku-seed1") == _shard_hashes(root / "sudoku-seed1")


def test_info_shows_sizes_statistics_and_checksums_and_flags_corruption(built, tmp_path):
    root, _ = built
    r = stability("data", "info", "--dir", str(root))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    train = next(line for line in lines if line.strip().startswith("train"))
    assert "30 rows (complete" in train and "rating min" in train and "p80" in train and "sha256" in train
    hard = next(line for line in lines if line.strip().startswith("hard"))
    assert float(hard.split("rating min ")[1].split()[0]) >= 4.0
    as_json = json.loads(stability("data", "info", "--dir", str(root), "--json").stdout)
    (entry,) = as_json["datasets"]
    assert entry["splits"]["val"]["rows"] == 10 and entry["describe"]["cut"] == 4.0

    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    shard = next((copy / "sudoku-seed1").glob("train-*.npz"))
    shard.write_bytes(shard.read_bytes() + b"tampered")
    r = stability("data", "info", "--dir", str(copy))
    assert r.returncode == 1 and "CORRUPT" in r.stdout
    config = TaskConfig(name="sudoku", train_size=30, val_size=10, hard_size=2, seed=1, sudoku_cut=4.0,
                        cache_dir=str(copy))
    with pytest.raises(DataError, match="checksum"):
        make_task(config).dataset("train")


def test_make_refuses_to_mix_datasets_of_other_options(built):
    root, _ = built
    r = stability("data", "make", "--task", "sudoku", "--out", str(root), "--sizes", "30", "10", "2", "--cut", "5",
                  "--seed", "1", "--quiet")
    assert r.returncode == 2 and "choose another --out" in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, message", [
    (["--task", "sudoku", "--sizes", "0", "1", "1"], "--sizes"),
    (["--task", "chess", "--cut", "3"], "--cut applies to --task sudoku only"),
    (["--task", "sudoku", "--engine", "x"], "--engine applies to --task chess only"),
    (["--task", "chess", "--engine", "/nonexistent/engine", "--sizes", "1", "1", "1"], "not an executable"),
    (["--task", "sudoku", "--workers", "0"], "--workers"),
])
def test_bad_arguments_give_one_line_and_exit_2(tmp_path, args, message):
    r = stability("data", "make", "--out", str(tmp_path), *args)
    assert r.returncode == 2 and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_info_of_an_empty_cache_says_how_to_build(tmp_path):
    r = stability("data", "info", "--dir", str(tmp_path))
    assert r.returncode == 0 and "stability data make" in r.stdout
    r = stability("data", "info", "--dir", str(tmp_path / "nothing"))  # a mistyped folder is not an empty cache
    assert r.returncode == 2 and "no such directory" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_chess_make_uses_the_fallback_when_asked_and_says_so(tmp_path):
    r = stability("data", "make", "--task", "chess", "--engine", "none", "--out", str(tmp_path), "--sizes", "3",
                  "2", "1", "--seed", "2", "--quiet")
    assert r.returncode == 0, r.stderr
    assert "FALLBACK" in r.stderr
    directory = tmp_path / "chess-seed2"
    manifest = cache.read_manifest(directory)
    assert manifest["options"]["mode"] == "fallback"
    hard = cache.read_split(directory, manifest, "hard", 1)
    assert hard["length"][0] == 2 and len(hard["moves"][0].split()) == 4  # mistake, key, reply, mate
    info = stability("data", "info", "--dir", str(tmp_path))
    assert "FALLBACK" in info.stdout and "chess, seed 2" in info.stdout
    task = make_task(TaskConfig(name="chess", train_size=3, val_size=2, hard_size=1, seed=2, cache_dir=str(tmp_path)))
    x, y = task.dataset("train")
    assert x.shape == (3, 8, 8, 12) and np.all(y.sum((1, 2)).numpy() == 2)


def test_make_progress_moves_after_every_puzzle_and_leaves_the_data_unchanged():
    """The bars' granularity: one tick per puzzle (so a slow hard shard shows its own rate and ETA), and a shard
    made with ticks is byte for byte the shard made without."""
    from stability.tasks import chess_generate, sudoku_generate

    options = sudoku_generate.resolve_options({"cut": 4})
    ticks: list = []
    with_ticks = sudoku_generate.make_shard("hard", 0, 3, 1, options, progress=ticks.append)
    assert ticks == [1, 1, 1]
    plain = sudoku_generate.make_shard("hard", 0, 3, 1, options)
    assert all(np.array_equal(with_ticks[k], plain[k]) for k in plain)
    ticks.clear()
    chess_options = chess_generate.resolve_options({"engine": "none"})
    chess_generate.make_shard("train", 0, 2, 1, chess_options, progress=ticks.append)
    assert ticks == [1, 1]


def test_make_shows_one_bar_per_split(tmp_path, capsys):
    from stability.cli import main

    assert main(["data", "make", "--task", "sudoku", "--out", str(tmp_path), "--sizes", "3", "2", "1", "--cut", "4",
                 "--seed", "2"]) == 0
    err = capsys.readouterr().err
    for split in ("train", "val  ", "hard "):
        assert f"sudoku seed 2 {split}: 100%" in err
