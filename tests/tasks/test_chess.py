"""Chess: the canonical encoding, the Lichess loader, the scoring, and both offline generators."""

from __future__ import annotations

import csv

import chess
import numpy as np
import pytest
import torch

from stability.config import TaskConfig
from stability.errors import ConfigError, DataError
from stability.tasks import cache, make_task
from stability.tasks import chess_generate as C
from stability.tasks.chess import (
    board_codes,
    decode_planes,
    encode_board,
    encode_puzzle,
    orientation,
    read_lichess,
    target_map,
    transform_square,
)
from tests.conftest import FIXTURES, ROOT

REAL = ROOT.parent / "shared" / "data"  # shared/ lies beside the checkout
BIG = {"train": 1000, "val": 1000, "hard": 1000}


def _fixture_puzzles() -> list[tuple[str, list[str], int]]:
    out = []
    with open(FIXTURES / "lichess-fen-moves-rating.csv") as f:
        for fen, moves, rating in csv.reader(f):
            try:
                encode_puzzle(fen, moves.split())
                out.append((fen, moves.split(), int(rating)))
            except ValueError:
                pass
    return out


def _canonical_by_python_chess(board: chess.Board) -> chess.Board:
    """The canonical orientation made with python-chess's own transforms (an independent reference)."""
    b = board.copy()
    if b.turn == chess.BLACK:
        b = b.mirror().transform(chess.flip_horizontal)  # mirror() flips ranks and swaps colours: + files = 180°
    if chess.square_file(b.king(chess.WHITE)) <= 3:
        b = b.transform(chess.flip_horizontal)
    return b


# ---- encoding -------------------------------------------------------------------------------------------------
def test_encoding_round_trips_board_to_planes_to_board():
    boards = [chess.Board()]
    for fen, moves, _ in _fixture_puzzles()[:12]:
        b = chess.Board(fen)
        boards.append(b.copy())
        b.push_uci(moves[0])
        boards.append(b)
    assert {b.turn for b in boards} == {chess.WHITE, chess.BLACK}
    for board in boards:
        planes = encode_board(board)
        assert planes.shape == (8, 8, 12) and planes.dtype == np.float32 and planes.sum() == len(board.piece_map())
        decoded = decode_planes(planes)
        assert decoded.board_fen() == _canonical_by_python_chess(board).board_fen()
        assert chess.square_file(decoded.king(chess.WHITE)) >= 4  # the side to move's king on files e–h
        flip, mirror = orientation(board)
        back = {transform_square(sq, flip, mirror): chess.Piece(p.piece_type, p.color != flip)
                for sq, p in decoded.piece_map().items()}
        assert back == board.piece_map()  # the inverse transform recovers the original board


def test_planes_follow_the_facts_file_order():
    planes = encode_board(chess.Board())  # white to move, white king on e1: no transform
    assert planes[0, 4, 5] == 1 and planes[7, 4, 11] == 1  # K on e1 (plane 5), k on e8 (plane 11)
    assert planes[1, :, 0].sum() == 8 and planes[6, :, 6].sum() == 8  # pawns: planes 0 (white) and 6 (black)


def test_puzzle_target_marks_from_and_to_of_the_answer():
    fen, moves, _ = _fixture_puzzles()[0]
    codes, squares = encode_puzzle(fen, moves)
    board = chess.Board(fen)
    board.push_uci(moves[0])
    answer = chess.Move.from_uci(moves[1])
    flip, mirror = orientation(board)
    assert list(squares) == [transform_square(answer.from_square, flip, mirror),
                             transform_square(answer.to_square, flip, mirror)]
    target = target_map(squares[None])[0]
    assert target.sum() == 2 and target.reshape(64)[squares[0]] == 1 and target.reshape(64)[squares[1]] == 1
    canonical = decode_planes(encode_board(board))
    assert canonical.piece_at(int(squares[0])) is not None  # the moving piece stands on the from-square
    assert canonical.piece_at(int(squares[0])).color == chess.WHITE
    assert np.array_equal(board_codes(board)[0], codes)


# ---- the Lichess loader ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["lichess-db.csv", "lichess-db-10col.csv", "lichess-fen-moves-rating.csv"])
def test_lichess_loader_counts_malformed_rows_and_splits_by_rating(name):
    out = read_lichess(str(FIXTURES / name), BIG)
    expected = {"bad FEN": 1, "illegal move": 2, "fewer than two moves": 1, "bad rating": 1, "illegal position": 1}
    if name == "lichess-db.csv":
        expected["wrong number of columns"] = 1
    assert out.malformed == expected
    good = _fixture_puzzles()
    easy = [p for p in good if p[2] <= 1600]
    hard = [p for p in good if 1601 <= p[2] <= 2000]
    n_train = round(len(easy) * 0.5)
    assert len(out.codes["train"]) == n_train and len(out.codes["val"]) == len(easy) - n_train
    assert len(out.codes["hard"]) == len(hard)
    assert list(out.ratings["train"]) == [p[2] for p in easy[:n_train]]  # file order
    assert list(out.ratings["hard"]) == [p[2] for p in hard]
    assert np.array_equal(out.squares["hard"][0], encode_puzzle(hard[0][0], hard[0][1])[1])


def test_lichess_task_reports_malformed_rows_and_caches_the_split(tmp_path, capsys):
    config = TaskConfig(name="chess", train_size=6, val_size=2, hard_size=3,
                        data_path=str(FIXTURES / "lichess-db.csv"), cache_dir=str(tmp_path))
    task = make_task(config)
    x, y = task.dataset("train")
    assert x.shape == (6, 8, 8, 12) and y.shape == (6, 8, 8) and (y.sum((1, 2)) == 2).all()
    err = capsys.readouterr().err
    assert "skipped" in err and "illegal move" in err and "bad FEN" in err
    assert task.describe()["malformed"]["illegal move"] >= 1  # reading stops once the splits are full
    assert list((tmp_path / "real").glob("chess-*.npz"))
    again = make_task(config).dataset("train")
    assert torch.equal(again[0], x)


def test_lichess_loader_refuses_files_that_are_not_puzzles(tmp_path):
    bad = tmp_path / "x.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match="not a Lichess puzzle CSV"):
        read_lichess(str(bad), BIG)
    with pytest.raises(DataError, match="does not exist"):
        make_task(TaskConfig(name="chess", data_path=str(tmp_path / "missing.csv"))).dataset("val")


def test_chess_rejects_options_of_other_tasks():
    with pytest.raises(ConfigError, match="sudoku_cut"):
        make_task(TaskConfig(name="chess", sudoku_cut=20.0))


@pytest.mark.skipif(not all((REAL / n).is_file() for n in ("lichess-puzzles-sample-1499.csv",
                                                          "lichess-puzzles-fen-moves-rating-10000.csv")),
                    reason=f"optional real-data test: the two real Lichess sample CSVs are not in {REAL}")
def test_real_lichess_samples_load(tmp_path):
    for name, sizes in (("lichess-puzzles-sample-1499.csv", (1000, 200, 100)),
                        ("lichess-puzzles-fen-moves-rating-10000.csv", (4000, 1000, 2000))):
        out = read_lichess(str(REAL / name), dict(zip(("train", "val", "hard"), sizes)))
        assert not out.malformed
        assert [len(out.codes[s]) for s in ("train", "val", "hard")] == list(sizes)
        assert out.ratings["train"].max() <= 1600 and out.ratings["hard"].min() >= 1601


# ---- scoring --------------------------------------------------------------------------------------------------
def test_prediction_is_the_top_two_squares_of_the_class_one_logit():
    task = make_task(TaskConfig(name="chess", train_size=1, val_size=1, hard_size=1))
    targets = torch.from_numpy(target_map(np.array([[12, 28], [6, 21]])))
    logits = torch.zeros(2, 8, 8, 2)
    logits[0].view(64, 2)[[12, 28], 1] = 5.0
    logits[1].view(64, 2)[[6, 50], 1] = 5.0  # one square wrong
    correct, position = task.score(logits, targets)
    assert correct.tolist() == [True, False]
    assert position[0] == 1.0 and position[1] == pytest.approx(62 / 64)
    assert task.model_options() == {"in_channels": 12, "out_channels": 2, "spatial_ndim": 2,
                                    "attention_window": None}


# ---- generators -----------------------------------------------------------------------------------------------
def test_fallback_generator_makes_unique_mates_and_says_it_is_the_fallback(capsys):
    rng = np.random.default_rng(3)
    easy = next(C.fallback_puzzles(rng, "easy"))
    board = chess.Board(easy["fen"])
    board.push_uci(easy["moves"][0])
    assert len(C.mating_moves(board)) == 1
    board.push_uci(easy["moves"][1])
    assert board.is_checkmate()
    hard = next(C.fallback_puzzles(rng, "hard"))
    board = chess.Board(hard["fen"])
    board.push_uci(hard["moves"][0])
    assert not C.mating_moves(board)
    assert [m.uci() for m in C.mate_in_two_keys(board)] == [hard["moves"][1]]
    for move in hard["moves"][1:]:
        board.push_uci(move)
    assert board.is_checkmate()
    options = C.resolve_options({"engine": "none"})
    assert options["mode"] == "fallback" and "FALLBACK" in capsys.readouterr().err


def test_chess_task_without_data_generates_a_small_fallback_set(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cache, "PACKAGE_DATA", tmp_path / "none")
    task = make_task(TaskConfig(name="chess", train_size=3, val_size=2, hard_size=1, engine="none", seed=4,
                                cache_dir=str(tmp_path)))
    x, y = task.dataset("val")
    err = capsys.readouterr().err
    assert "generating a small offline set" in err and "FALLBACK" in err
    assert x.shape == (2, 8, 8, 12) and (y.sum((1, 2)) == 2).all()
    assert x[..., 5].sum() == 2  # one white king (the side to move) per board


def test_engine_is_found_and_its_puzzles_have_one_clear_answer():
    path = C.find_engine()
    if path is None:
        pytest.skip("no UCI engine installed (CI installs Debian's stockfish)")
    with pytest.raises(ConfigError, match="not an executable"):
        C.find_engine("/nonexistent/engine")
    engine = C.open_engine(path)
    try:
        fen, moves, _ = _fixture_puzzles()[0]  # a mate in one
        board = chess.Board(fen)
        board.push_uci(moves[0])
        view = C.examine(engine, board, depth=8)
        assert view["clear"] and view["move"].uci() == moves[1] and view["found_at"] <= 2
        puzzle = next(C.engine_puzzles(engine, np.random.default_rng(1), depth=8))
    finally:
        engine.quit()
    again = C.open_engine(path)  # a fresh engine, the same seed: the same puzzle (fixed depth, cleared hash)
    try:
        assert next(C.engine_puzzles(again, np.random.default_rng(1), depth=8)) == puzzle
    finally:
        again.quit()
    codes, squares = encode_puzzle(puzzle["fen"], puzzle["moves"])
    assert puzzle["length"] == (len(puzzle["moves"])) // 2 and puzzle["found_at"] >= 1
    assert squares[0] != squares[1]


def test_packaged_small_set_is_intact_and_within_its_rating_bounds():
    directory = cache.PACKAGE_DATA / "chess-seed0"
    manifest = cache.read_manifest(directory)
    easy = cache.read_split(directory, manifest, "train", cache.available_rows(manifest, "train"))
    hard = cache.read_split(directory, manifest, "hard", cache.available_rows(manifest, "hard"))
    assert easy["rating"].max() <= 1600 < 1601 <= hard["rating"].min() and hard["rating"].max() <= 2000
    assert np.allclose(C.proxy_rating(hard["found_at"], hard["gap"]), hard["rating"], atol=0.1)
    for split in (easy, hard):
        for fen, moves, codes, squares in list(zip(split["fen"], split["moves"], split["codes"], split["squares"]))[:5]:
            c, s = encode_puzzle(str(fen), str(moves).split())
            assert np.array_equal(c, codes) and np.array_equal(s, squares)
