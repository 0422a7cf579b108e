"""A tiny sudoku and chess training run on the CPU, end to end through ``stability train``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import FIXTURES, run_cli

TINY = ["--width", "32", "--epochs", "1", "--batch-size", "8", "--iterations", "2", "--eval-iterations", "2",
        "--test-iterations", "2", "--eval-batch-size", "16", "--device", "cpu", "--quiet"]

pytestmark = pytest.mark.slow


def _train(*args: str) -> subprocess.CompletedProcess:
    return run_cli("train", *args, *TINY, check=False, timeout=600)


def test_sudoku_trains_end_to_end_on_the_sudoku_extreme_format(tmp_path):
    out = tmp_path / "sudoku.pt"
    r = _train("--task", "sudoku", "--data-path", str(FIXTURES / "sudoku-extreme"), "--cache-dir",
               str(tmp_path / "cache"), "--train-size", "16", "--val-size", "4", "--hard-size", "4", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.is_file() and "checkpoint:" in r.stdout and "hard" in r.stdout
    assert "malformed" in r.stderr  # the fixture's bad rows are reported, not kept
    assert list((tmp_path / "cache" / "real").glob("sudoku-*.npz"))  # the split was cached for the next run


def test_sudoku_trains_end_to_end_on_the_generated_set(tmp_path):
    out = tmp_path / "sudoku-generated.pt"
    r = _train("--task", "sudoku", "--cache-dir", str(tmp_path / "empty"), "--train-size", "64", "--val-size", "16",
               "--hard-size", "8", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.is_file() and "checkpoint:" in r.stdout
    assert "stability data make --task sudoku" in r.stderr  # says where the data came from and how to build more


def test_chess_trains_end_to_end_on_a_generated_set(tmp_path):
    out = tmp_path / "chess.pt"
    r = _train("--task", "chess", "--engine", "none", "--data-seed", "5", "--cache-dir", str(tmp_path / "cache"),
               "--train-size", "8", "--val-size", "4", "--hard-size", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert out.is_file() and "checkpoint:" in r.stdout
    assert "generating a small offline set" in r.stderr and "FALLBACK" in r.stderr
