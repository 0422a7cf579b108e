"""Sudoku: the solver, the generator, the encoding, the sudoku-extreme loader and the task's sources."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from stability.config import TaskConfig
from stability.errors import ConfigError, DataError
from stability.tasks import cache, make_task
from stability.tasks import sudoku_generate as G
from stability.tasks import sudoku_solver as S
from stability.tasks.sudoku import one_hot, read_sudoku_extreme
from tests.conftest import FIXTURES



def _hard_fixture():
    with open(FIXTURES / "sudoku-hard.csv") as f:
        rows = list(csv.DictReader(f))
    return [(S.parse_board(r["puzzle"]), S.parse_board(r["solution"]), float(r["rating"])) for r in rows]


@pytest.fixture(scope="module")
def easy_set():
    rng = np.random.default_rng(5)
    return [G.easy_puzzle(rng) for _ in range(30)]


# ---- the solver -----------------------------------------------------------------------------------------------
def test_solver_counts_match_between_numba_and_python_paths(easy_set):
    hard = _hard_fixture()
    boards = [p for p, _ in easy_set[:4]] + [p for p, _, _ in hard[:2]] + [np.zeros(81, np.int64)]
    two_solutions = easy_set[0][0].copy()
    two_solutions[np.flatnonzero(two_solutions)[:3]] = 0
    boards.append(two_solutions)
    for board in boards:
        for limit in (1, 2):
            fast = S.solve(board, limit=limit, backend="numba")
            slow = S.solve(board, limit=limit, backend="python")
            assert (fast.solutions, fast.backtracks, fast.aborted) == (slow.solutions, slow.backtracks, slow.aborted)
            assert np.array_equal(fast.solution, slow.solution)
    perms, relabels = S.symmetries(3, 1)
    stack = np.stack([p for p, _, _ in hard[:2]])
    assert np.array_equal(S.backtracks_under(stack, perms, relabels, backend="numba"),
                          S.backtracks_under(stack, perms, relabels, backend="python"))
    assert S.backtracks_under(stack, perms, relabels).min() > 0  # hard puzzles need guesses


def test_solver_finds_valid_solutions_and_counts_them(easy_set):
    puzzle, solution = easy_set[0]
    result = S.solve(puzzle, limit=2)
    assert result.solutions == 1 and np.array_equal(result.solution, solution)
    assert S.is_valid_solution(puzzle, result.solution)
    clash = puzzle.copy()
    clash[:2] = [5, 5]  # two equal clues in the first row
    assert S.solve(clash).solutions == 0
    assert S.solve(np.zeros(81, np.int64), limit=2).solutions == 2
    aborted = S.solve(_hard_fixture()[0][0], max_backtracks=0)
    assert aborted.aborted and aborted.solution is None


def test_symmetries_preserve_validity_and_uniqueness(easy_set):
    rng = np.random.default_rng(0)
    puzzle, solution = easy_set[1]
    for _ in range(5):
        perm, relabel = S.random_symmetry(rng)
        p2, s2 = S.apply_symmetry(puzzle, perm, relabel), S.apply_symmetry(solution, perm, relabel)
        assert S.is_valid_solution(p2, s2)
        assert S.count_solutions(p2)[0][0] == 1


# ---- the generator ------------------------------------------------------------------------------------------------
def test_generated_puzzles_are_valid_unique_and_minimal(easy_set):
    for puzzle, solution in easy_set:
        assert S.is_valid_solution(puzzle, solution)
        assert S.count_solutions(puzzle, backend="python")[0][0] == 1
    for puzzle, _ in easy_set[:3]:  # minimal: no clue can go
        for i in np.flatnonzero(puzzle):
            fewer = puzzle.copy()
            fewer[i] = 0
            assert S.count_solutions(fewer)[0][0] == 2


def test_generation_is_deterministic_from_the_seed():
    a = G.make_shard("train", 0, 4, 3, {"cut": 38.0})
    b = G.make_shard("train", 0, 4, 3, {"cut": 38.0})
    c = G.make_shard("train", 0, 4, 4, {"cut": 38.0})
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["puzzles"], c["puzzles"])
    assert np.array_equal(G.make_shard("train", 0, 2, 3, {"cut": 38.0})["puzzles"], a["puzzles"][:2])


def test_hard_search_yields_puzzles_at_or_above_its_cut():
    rng = np.random.default_rng(0)
    stream = G.hard_puzzles(rng, cut=6.0)
    for _ in range(2):
        puzzle, solution, r = next(stream)
        assert r >= 6.0 and S.rating(puzzle[None])[0] == pytest.approx(r)
        assert S.count_solutions(puzzle)[0][0] == 1 and S.is_valid_solution(puzzle, solution)


def test_hard_split_is_harder_than_easy_split_by_the_rating(easy_set):
    easy = S.rating(np.stack([p for p, _ in easy_set]))
    hard = _hard_fixture()
    rated = S.rating(np.stack([p for p, _, _ in hard]))
    assert np.allclose(rated, [r for _, _, r in hard], atol=0.01)  # the fixture's ratings are the solver's
    assert rated.min() >= G.PAPER_CUT > easy.max()
    assert np.median(rated) > 10 * np.median(easy)
    for p, s, _ in hard:
        assert S.count_solutions(p)[0][0] == 1 and S.is_valid_solution(p, s)


# ---- encoding and the real files ------------------------------------------------------------------------------
def test_one_hot_encoding_round_trips(easy_set):
    puzzles = np.stack([p for p, _ in easy_set[:5]])
    x = one_hot(puzzles)
    assert x.shape == (5, 9, 9, 10) and x.dtype == np.float32
    assert np.array_equal(x.argmax(-1).reshape(5, 81), puzzles) and np.all(x.sum(-1) == 1)


def _copy_fixture(tmp_path: Path) -> Path:
    target = tmp_path / "sudoku-extreme"
    shutil.copytree(FIXTURES / "sudoku-extreme", target)
    return target


def _csv_rows(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_sudoku_extreme_loader_cuts_at_the_80th_percentile_in_file_order(tmp_path, capsys):
    folder = _copy_fixture(tmp_path)
    train_rows = _csv_rows(folder / "train.csv")
    ratings = [int(r["rating"]) for r in train_rows if r["rating"].isdigit()]
    cut = float(np.percentile(ratings, 80))
    sizes = {"train": 12, "val": 6, "hard": 4}
    config = TaskConfig(name="sudoku", train_size=12, val_size=6, hard_size=4, data_path=str(folder),
                        cache_dir=str(tmp_path / "cache"))
    task = make_task(config)
    x, y = task.dataset("train")
    assert x.shape == (12, 9, 9, 10) and y.shape == (12, 9, 9) and y.dtype == torch.int64
    info = task.describe()
    assert info["cut"] == cut
    err = capsys.readouterr().err
    assert "malformed" in err and "bad question" in err and "answer does not solve the question" in err
    # file order: train then val are the first valid rows below the cut
    arrays, meta = read_sudoku_extreme(str(folder), sizes)
    expected = [S.parse_board(r["question"].replace("0", ".")) for r in train_rows
                if r["rating"].isdigit() and int(r["rating"]) < cut and len(r["question"]) == 81
                and S.is_valid_solution(S.parse_board(r["question"].replace("0", ".")), S.parse_board(r["answer"]))]
    assert np.array_equal(arrays["train/puzzles"], np.stack(expected[:12]))
    assert np.array_equal(arrays["val/puzzles"], np.stack(expected[12:18]))
    assert np.all(arrays["hard/rating"] >= cut) and np.all(arrays["val/rating"] < cut)
    assert meta["malformed"] == {"answer does not solve the question": 1, "bad question": 1, "bad rating": 1,
                                 "bad answer": 1}
    assert torch.equal(x.argmax(-1).reshape(12, 81), torch.from_numpy(np.stack(expected[:12])))


def test_sudoku_extreme_split_is_cached_and_not_read_again(tmp_path, monkeypatch):
    folder = _copy_fixture(tmp_path)
    config = TaskConfig(name="sudoku", train_size=10, val_size=5, hard_size=3, data_path=str(folder),
                        cache_dir=str(tmp_path / "cache"))
    first = make_task(config).dataset("hard")
    assert list((tmp_path / "cache" / "real").glob("sudoku-*.npz"))

    def refuse(*args, **kwargs):
        raise AssertionError("the real file was read again")

    monkeypatch.setattr("stability.tasks.sudoku.read_sudoku_extreme", refuse)
    again = make_task(config).dataset("hard")
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


def test_loader_refuses_a_folder_without_the_csvs(tmp_path):
    config = TaskConfig(name="sudoku", data_path=str(tmp_path), cache_dir=str(tmp_path / "c"))
    with pytest.raises(DataError, match="train.csv"):
        make_task(config).dataset("train")


def test_sudoku_rejects_options_of_other_tasks():
    with pytest.raises(ConfigError, match="chess_easy_max"):
        make_task(TaskConfig(name="sudoku", chess_easy_max=1500))


# ---- the task's sources: cache, else a small offline set -----------------------------------------------------
def test_task_uses_the_cache_when_built(tmp_path, capsys):
    cache.build("sudoku", tmp_path, 2, {"train": 6, "val": 3, "hard": 1}, options={"cut": 5.0}, progress=False)
    config = TaskConfig(name="sudoku", train_size=6, val_size=3, hard_size=1, seed=2, sudoku_cut=5.0,
                        cache_dir=str(tmp_path))
    task = make_task(config)
    x, y = task.dataset("hard")
    assert capsys.readouterr().err == ""
    direct = G.make_shard("hard", 0, 1, 2, {"cut": 5.0})
    assert np.array_equal(x.argmax(-1).reshape(1, 81).numpy(), direct["puzzles"])
    assert np.array_equal(y.reshape(1, 81).numpy(), direct["solutions"])
    assert task.describe()["splits"]["hard"]["min"] >= 5.0


def test_task_without_data_generates_a_small_set_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cache, "PACKAGE_DATA", tmp_path / "no-package-data")
    config = TaskConfig(name="sudoku", train_size=5, val_size=2, hard_size=1, seed=9, sudoku_cut=4.0,
                        cache_dir=str(tmp_path / "empty"))
    task = make_task(config)
    x, y = task.dataset("train")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "generating a small offline set" in err[0] and "stability data make" in err[0]
    assert x.shape == (5, 9, 9, 10)
    for p, s in zip(x.argmax(-1).reshape(5, 81).numpy(), y.reshape(5, 81).numpy()):
        assert S.is_valid_solution(p, s) and S.count_solutions(p)[0][0] == 1
    hard_x, _ = task.dataset("hard")
    assert S.rating(hard_x.argmax(-1).reshape(1, 81).numpy())[0] >= 4.0


def test_packaged_small_set_is_intact_and_honest():
    directory = cache.PACKAGE_DATA / "sudoku-seed0"
    manifest = cache.read_manifest(directory)
    hard = cache.read_split(directory, manifest, "hard", cache.available_rows(manifest, "hard"))
    train = cache.read_split(directory, manifest, "train", cache.available_rows(manifest, "train"))
    assert hard["rating"].min() >= G.PAPER_CUT > train["rating"].max()
    sample = hard["puzzles"][:3].astype(np.int64)
    assert np.allclose(S.rating(sample), hard["rating"][:3], rtol=1e-5)
    rebuilt = G.make_shard("train", 0, 5, 0, {"cut": G.PAPER_CUT})  # the package holds seed 0's first rows
    assert np.array_equal(rebuilt["puzzles"], train["puzzles"][:5])


def test_generator_gives_the_same_puzzles_with_numba_and_pure_python():
    fast = G.easy_puzzle(np.random.default_rng(8), backend="numba")
    slow = G.easy_puzzle(np.random.default_rng(8), backend="python")
    assert np.array_equal(fast[0], slow[0]) and np.array_equal(fast[1], slow[1])
