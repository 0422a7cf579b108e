"""Issue 27: a split called "val" never holds a training input — for every task and every source (prefix sums:
distinct strings; sudoku and chess: distinct puzzles, from generated sets and from the real files' formats), while
hard stays as it was; sizes no split can satisfy are refused in one line before any work."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from stability.config import TaskConfig
from stability.errors import ConfigError
from stability.tasks import cache, make_task
from stability.tasks.chess import read_lichess
from stability.tasks.prefix_sums import draw_strings, shortest_length
from stability.tasks.splits import TrainVal, disjoint_val, row_keys
from stability.tasks.sudoku import read_sudoku_extreme

from tests.conftest import FIXTURES, ROOT, run_process

REAL = ROOT.parent / "shared" / "data"  # shared/ lies beside the checkout


def _rows(x: torch.Tensor) -> list[bytes]:
    """One key per sample of a split's inputs (the whole input tensor of the sample)."""
    return row_keys(x.numpy())


def _assert_val_disjoint(task) -> None:
    train = set(_rows(task.dataset("train")[0]))
    val = _rows(task.dataset("val")[0])
    assert not train.intersection(val), f"{sum(v in train for v in val)} val inputs are train inputs"


# ---- prefix sums ----------------------------------------------------------------------------------------------
PREFIX_CASES = [  # (train, val, bits): crowded and sparse, up to every string there is
    (1000, 200, 11), (200, 56, 8), (50, 14, 6), (3000, 1000, 12), (500, 100, 32), (40, 8, 70)]


@pytest.mark.parametrize("train,val,bits", PREFIX_CASES)
def test_prefix_sums_val_holds_no_training_string(train, val, bits):
    task = make_task(TaskConfig(train_size=train, val_size=val, hard_size=4, train_length=bits, hard_length=bits + 4))
    _assert_val_disjoint(task)


@pytest.mark.parametrize("train,val,bits", PREFIX_CASES)
def test_prefix_sums_train_and_val_each_hold_distinct_strings_of_the_asked_size(train, val, bits):
    task = make_task(TaskConfig(train_size=train, val_size=val, hard_size=4, train_length=bits, hard_length=bits + 4))
    for split, n in (("train", train), ("val", val)):
        x, y = task.dataset(split)
        assert x.shape == (n, bits, 1) and y.shape == (n, bits)
        assert len(set(_rows(x))) == n
        assert torch.equal(y, torch.cumsum((x.squeeze(-1) > 0).long(), -1) % 2)  # targets still the prefix sums


def test_prefix_sums_taking_every_string_gives_each_exactly_once():
    task = make_task(TaskConfig(train_size=200, val_size=56, hard_size=4, train_length=8, hard_length=12))
    strings = _rows(task.dataset("train")[0]) + _rows(task.dataset("val")[0])
    assert len(set(strings)) == 256


def test_prefix_sums_hard_of_another_length_is_the_old_draw_with_replacement():
    config = TaskConfig(train_size=60, val_size=20, hard_size=300, train_length=8, hard_length=6, seed=3)
    x, y = make_task(config).dataset("hard")
    gen = torch.Generator().manual_seed(3 * 1000 + 2)
    bits = torch.randint(0, 2, (300, 6), generator=gen, dtype=torch.int64)
    assert torch.equal(x, (bits.float() - 0.5).unsqueeze(-1)) and torch.equal(y, torch.cumsum(bits, -1) % 2)
    assert len(set(_rows(x))) < 300  # with replacement: 300 draws of 64 strings repeat, as before


def test_prefix_sums_hard_at_the_train_length_holds_no_train_or_val_string():
    task = make_task(TaskConfig(train_size=150, val_size=50, hard_size=100, train_length=8, hard_length=8))
    seen = set(_rows(task.dataset("train")[0])) | set(_rows(task.dataset("val")[0]))
    x, _ = task.dataset("hard")
    assert x.shape == (100, 8, 1) and not seen.intersection(_rows(x))


def test_prefix_sums_without_collisions_every_split_is_the_old_draw():
    """At 32 bits nothing collides: train, val and hard are the draws of before (per-split generators)."""
    config = TaskConfig(train_size=2000, val_size=500, hard_size=50, train_length=32, hard_length=48, seed=1)
    task = make_task(config)
    for split, (n, length) in {"train": (2000, 32), "val": (500, 32), "hard": (50, 48)}.items():
        gen = torch.Generator().manual_seed(1000 + ("train", "val", "hard").index(split))
        bits = torch.randint(0, 2, (n, length), generator=gen, dtype=torch.int64)
        assert torch.equal(task.dataset(split)[0], (bits.float() - 0.5).unsqueeze(-1)), split


def test_prefix_sums_splits_are_deterministic_and_val_size_leaves_train_unchanged():
    a = make_task(TaskConfig(train_size=300, val_size=100, hard_size=8, train_length=9, hard_length=12))
    b = make_task(TaskConfig(train_size=300, val_size=100, hard_size=8, train_length=9, hard_length=12))
    c = make_task(TaskConfig(train_size=300, val_size=20, hard_size=8, train_length=9, hard_length=12))
    for split in ("train", "val", "hard"):
        assert torch.equal(a.dataset(split)[0], b.dataset(split)[0])
    assert torch.equal(a.dataset("train")[0], c.dataset("train")[0])
    assert torch.equal(a.dataset("val")[0][:20], c.dataset("val")[0])  # val is a prefix of its stream


def test_long_strings_are_compared_as_packed_bytes():
    gen = torch.Generator().manual_seed(0)
    bits, keys, skipped = draw_strings(gen, 3, 100, distinct=True)
    assert all(isinstance(k, bytes) and len(k) == 13 for k in keys) and skipped == 0
    again, _, skipped = draw_strings(torch.Generator().manual_seed(0), 3, 100, distinct=True, exclude={keys[0]})
    assert skipped == 1 and torch.equal(again[:2], bits[1:])


@pytest.mark.parametrize("train,val,bits,shortest", [(1000, 200, 8, 11), (1000, 200, 10, 11), (8, 2000, 8, 11),
                                                     (8000, 2000, 6, 14), (60, 5, 6, 7)])
def test_impossible_prefix_sums_sizes_are_a_config_error_naming_the_shortest_length(train, val, bits, shortest):
    assert shortest_length(train + val) == shortest
    with pytest.raises(ConfigError) as info:
        make_task(TaskConfig(train_size=train, val_size=val, train_length=bits))
    message = str(info.value)
    assert "\n" not in message
    assert f"train_size {train} + val_size {val}" in message and f"{2 ** bits} strings" in message
    assert f"train_length {shortest} or more" in message
    make_task(TaskConfig(train_size=train, val_size=val, hard_size=4, train_length=shortest))  # that one fits


def test_hard_at_the_train_length_with_every_string_taken_is_a_config_error():
    with pytest.raises(ConfigError, match="leaving none for the hard split"):
        make_task(TaskConfig(train_size=200, val_size=56, hard_size=4, train_length=8, hard_length=8))


def test_a_task_made_without_the_check_refuses_only_the_splits_it_cannot_make():
    """An old checkpoint's config (1,000 + 200 strings of 8 bits) still loads; its hard split is made as before,
    its train/val refuse."""
    task = make_task(TaskConfig(train_size=1000, val_size=200, hard_size=10, train_length=8, hard_length=16),
                     check=False)
    assert task.dataset("hard")[0].shape == (10, 16, 1)
    for split in ("train", "val"):
        with pytest.raises(ConfigError, match="do not fit"):
            task.dataset(split)


def test_stability_train_with_impossible_sizes_exits_2_with_one_line_before_training(tmp_path):
    out = tmp_path / "run" / "model.pt"
    proc = run_process("train", "--task", "prefix-sums", "--width", "16", "--heads", "2", "--train-size", "1000",
                       "--val-size", "200", "--hard-size", "8", "--train-length", "8", "--hard-length", "12",
                       "--epochs", "1", "--warmup-epochs", "0", "--cooldown-at", "1", "--out", str(out), check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "train_size 1000 + val_size 200" in lines[0] and "train_length 11" in lines[0]
    assert proc.stdout == ""
    assert not list(tmp_path.rglob("*"))  # nothing written: it stopped before training


def test_the_demo_trains_on_a_split_whose_val_holds_no_training_string():
    from stability.demo import demo_config

    task = make_task(demo_config().task)
    _assert_val_disjoint(task)
    assert len(task.dataset("val")[0]) == 200 and len(task.dataset("train")[0]) == 1000


# ---- the shared splitter --------------------------------------------------------------------------------------
def test_train_val_splitter_drops_val_repeats_of_train_and_reads_on():
    tv = TrainVal(3, 2)
    for key in "abcaXbY":
        if tv.full():
            break
        tv.offer(key, key)
    assert tv.finish() == (["a", "b", "c"], ["X", "Y"], 2)


def test_train_val_splitter_keeps_the_ratio_of_a_short_stream_and_still_drops_repeats():
    tv = TrainVal(6, 2)  # 3:1, but only 4 rows come: 3 train, then val without the repeat of a train row
    for key in "abca":
        tv.offer(key, key)
    assert tv.finish() == (["a", "b", "c"], [], 1)


def test_disjoint_val_refetches_more_rows_when_repeats_leave_it_short():
    train = np.array([[1], [2], [3]], np.uint8)
    stream = np.array([[2], [5], [3], [6], [7], [8]], np.uint8)
    asked = []

    def fetch(rows):
        asked.append(rows)
        return {"x": stream[:rows], "i": np.arange(rows)}

    val, dropped = disjoint_val(train, fetch, 3, "x", limit=6)
    assert val["x"].ravel().tolist() == [5, 6, 7] and val["i"].tolist() == [1, 3, 4] and dropped == 2
    assert asked == [3, 5]


# ---- sudoku ---------------------------------------------------------------------------------------------------
def test_sudoku_packaged_generated_set_val_holds_no_train_puzzle():
    task = make_task(TaskConfig(name="sudoku", train_size=2000, val_size=500, hard_size=20))
    _assert_val_disjoint(task)


def _with_repeats(source: Path, folder: Path, n_train: int, repeats: list[int], at_end: bool = False
                  ) -> list[list[str]]:
    """A copy of a sudoku-extreme folder whose train.csv has, right after its first ``n_train`` usable easy rows
    (or at its end), copies of the train rows numbered ``repeats``; returns the copied rows."""
    shutil.copytree(source, folder)
    with open(folder / "train.csv", newline="") as f:
        rows = list(csv.reader(f))
    header, body = rows[0], rows[1:]
    arrays, _ = read_sudoku_extreme(str(source), {"train": n_train, "val": 1, "hard": 1})
    first_val = arrays["val/puzzles"][0]
    # the row of the first val puzzle: insert the repeats just before it
    board = lambda r: r[1].replace(".", "0") if len(r) > 1 else None  # noqa: E731
    at = next(i for i, r in enumerate(body) if board(r) == "".join(map(str, first_val)))
    train_boards = ["".join(map(str, p)) for p in arrays["train/puzzles"]]
    copies = [next(r for r in body if board(r) == train_boards[k]) for k in repeats]
    at = len(body) if at_end else at
    body = body[:at] + copies + body[at:]
    with open(folder / "train.csv", "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([header] + body)
    return copies


def test_sudoku_extreme_val_drops_repeats_of_train_puzzles_and_says_how_many(tmp_path):
    folder = tmp_path / "se"
    _with_repeats(FIXTURES / "sudoku-extreme", folder, 10, [0, 4])
    before, _ = read_sudoku_extreme(str(FIXTURES / "sudoku-extreme"), {"train": 10, "val": 5, "hard": 3})
    arrays, meta = read_sudoku_extreme(str(folder), {"train": 10, "val": 5, "hard": 3})
    assert meta["val_repeats_dropped"] == 2
    for split in ("train", "val", "hard"):  # val read on past the repeats: the same rows as without them
        assert np.array_equal(arrays[f"{split}/puzzles"], before[f"{split}/puzzles"]), split
    config = TaskConfig(name="sudoku", train_size=10, val_size=5, hard_size=3, data_path=str(folder),
                        cache_dir=str(tmp_path / "cache"))
    task = make_task(config)
    _assert_val_disjoint(task)
    assert task.describe()["val_repeats_dropped"] == 2
    assert "val_repeats_dropped" not in make_task(config.replace(data_path=str(FIXTURES / "sudoku-extreme"),
                                                                 cache_dir=str(tmp_path / "c2"))).describe()


def test_sudoku_extreme_small_file_keeps_its_ratio_and_drops_repeats(tmp_path):
    folder = tmp_path / "se"
    _with_repeats(FIXTURES / "sudoku-extreme", folder, 10, [1], at_end=True)
    arrays, meta = read_sudoku_extreme(str(folder), {"train": 1000, "val": 1000, "hard": 3})  # fewer rows than asked
    assert meta["val_repeats_dropped"] == 1
    train = set(row_keys(arrays["train/puzzles"]))
    assert not train.intersection(row_keys(arrays["val/puzzles"]))
    n = len(arrays["train/puzzles"]) + len(arrays["val/puzzles"]) + meta["val_repeats_dropped"]
    assert len(arrays["train/puzzles"]) == round(n / 2)


def _cache_with_val_repeats(tmp_path: Path, task: str, key: str, positions: list[int]) -> Path:
    """A copy of the packaged generated dataset whose first val shard has train rows 0, 1, … at ``positions``
    (the val rows there are replaced), with its checksum in the manifest updated."""
    root = tmp_path / "cache"
    src = cache.dataset_dir(cache.PACKAGE_DATA, task, 0)
    dst = cache.dataset_dir(root, task, 0)
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    train = cache.load_npz(dst / manifest["shards"]["train"][0]["file"])
    entry = manifest["shards"]["val"][0]
    val = cache.load_npz(dst / entry["file"])
    for k, pos in enumerate(positions):
        for name in val:
            val[name][pos] = train[name][k]
    entry["sha256"] = cache.save_npz(dst / entry["file"], val)
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.mark.parametrize("task,key,sizes", [("sudoku", "puzzles", (30, 10, 2)), ("chess", "codes", (30, 10, 2))])
def test_generated_val_drops_repeats_of_train_reads_on_and_data_info_says_so(tmp_path, task, key, sizes, cli):
    root = _cache_with_val_repeats(tmp_path, task, key, [2, 5])
    train_size, val_size, hard_size = sizes
    config = TaskConfig(name=task, train_size=train_size, val_size=val_size, hard_size=hard_size, cache_dir=str(root))
    made = make_task(config)
    _assert_val_disjoint(made)
    assert made.describe()["val_repeats_dropped"] == 2
    val = made.arrays[f"val/{key}"]
    stream = cache.load_npz(cache.dataset_dir(root, task, 0) / "val-00000.npz")[key]
    assert len(val) == val_size and np.array_equal(val, np.delete(stream, [2, 5], axis=0)[:val_size])
    plain = make_task(config.replace(cache_dir=str(tmp_path / "none")))  # the packaged set: nothing to drop
    assert "val_repeats_dropped" not in plain.describe()
    out = cli("data", "info", "--dir", str(root)).stdout
    assert "val: 2 row(s) repeat a train puzzle" in out


@pytest.mark.parametrize("task", ["sudoku", "chess"])
def test_generated_hard_split_is_unchanged(task, tmp_path):
    config = TaskConfig(name=task, train_size=30, val_size=10, hard_size=5, cache_dir=str(tmp_path))
    made = make_task(config)
    directory = cache.dataset_dir(cache.PACKAGE_DATA, task, 0)
    manifest = cache.read_manifest(directory)
    hard = cache.read_split(directory, manifest, "hard", 5)
    for name, array in hard.items():
        assert np.array_equal(made.arrays[f"hard/{name}"], array), name


# ---- chess ----------------------------------------------------------------------------------------------------
def test_chess_packaged_generated_set_val_holds_no_train_puzzle():
    task = make_task(TaskConfig(name="chess", train_size=200, val_size=50, hard_size=25))
    _assert_val_disjoint(task)


def test_lichess_val_drops_positions_that_are_train_inputs_and_says_how_many(tmp_path):
    with open(FIXTURES / "lichess-fen-moves-rating.csv", newline="") as f:
        rows = list(csv.reader(f))
    before = read_lichess(str(FIXTURES / "lichess-fen-moves-rating.csv"), {"train": 4, "val": 3, "hard": 2})
    # the rows that became train puzzles, copied in right after the fourth of them
    easy = [r for r in rows if r[2].isdigit() and int(r[2]) <= 1600]
    from stability.tasks.chess import encode_puzzle

    train_rows = []
    for r in easy:
        try:
            codes, _ = encode_puzzle(r[0], r[1].split())
        except ValueError:
            continue
        train_rows.append(r)
        if len(train_rows) == 4:
            break
    at = rows.index(train_rows[-1]) + 1
    path = tmp_path / "repeats.csv"
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows[:at] + [train_rows[0], train_rows[2]] + rows[at:])
    out = read_lichess(str(path), {"train": 4, "val": 3, "hard": 2})
    assert out.val_repeats_dropped == 2
    for split in ("train", "val", "hard"):
        assert np.array_equal(out.codes[split], before.codes[split]), split
    task = make_task(TaskConfig(name="chess", train_size=4, val_size=3, hard_size=2, data_path=str(path),
                                cache_dir=str(tmp_path / "cache")))
    _assert_val_disjoint(task)
    assert task.describe()["val_repeats_dropped"] == 2


@pytest.mark.skipif(not (REAL / "lichess-puzzles-fen-moves-rating-10000.csv").is_file(),
                    reason=f"optional real-data test: the real Lichess sample CSV is not in {REAL}")
def test_real_lichess_sample_val_holds_no_train_position():
    out = read_lichess(str(REAL / "lichess-puzzles-fen-moves-rating-10000.csv"),
                       {"train": 4000, "val": 1000, "hard": 100})
    assert [len(out.codes[s]) for s in ("train", "val", "hard")] == [4000, 1000, 100]
    assert not set(row_keys(out.codes["train"])).intersection(row_keys(out.codes["val"]))
