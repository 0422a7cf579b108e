"""Chess puzzles (App. B.1.1): find the from- and to-square of the best move.

Encoding (as in the paper's release; docs/data.md): the position is the puzzle's FEN with the opponent's move
``Moves[0]`` pushed; the target is an 8×8 map with 1 on the from- and to-squares of the answer ``Moves[1]``. The
input has 12 piece planes, white P, N, B, R, Q, K then black in the same order, in a *canonical orientation*: if
black is to move the board is rotated 180° and the colours swapped, so the side to move is always white and plays
up the board; then, if the (side to move's) king stands on files a–d, the board is mirrored left-right. Squares
are laid out ``[rank, file]`` of the canonical board, rank 0 at the bottom (python-chess square = 8·rank + file).
Castling and en-passant rights are not encoded (the paper's planes do not carry them). A prediction is the top-2
squares of the class-1 logit; a sample is correct only if both are right.

Sources, in order: a Lichess puzzle CSV given by ``TaskConfig.data_path`` (train/val: rating ≤ 1600, hard:
1601–2000, in file order; the split is cached); else a dataset built by ``stability data make --task chess`` in
the cache; else a small offline set generated now (with a one-line message). See ``docs/data.md``. Whatever the
source, val never holds a training input: a val puzzle whose encoded position is a train input is skipped (and
counted in ``describe()["val_repeats_dropped"]`` when there are any).
"""

from __future__ import annotations

import csv
import os
import sys
from dataclasses import dataclass, field
from typing import Iterable, Optional

import numpy as np
import torch

from stability.errors import DataError
from stability.extras import require
from stability.tasks import cache
from stability.tasks.base import SPLITS, ArrayTask
from stability.tasks.splits import TrainVal

PIECE_SYMBOLS = "PNBRQKpnbrqk"  # plane order: white P N B R Q K, then black
PAPER_SIZES = {"train": 40000, "val": 10000, "hard": 10000}
HEADER_COLUMNS = ("PuzzleId", "FEN", "Moves", "Rating", "RatingDeviation", "Popularity", "NbPlays", "Themes",
                  "GameUrl", "OpeningTags", "DailyDate")


def python_chess():
    """The python-chess package (the ``data`` extra), or one line saying how to install it."""
    return require("chess", "reading chess puzzles")


# ---- encoding -------------------------------------------------------------------------------------------------
def orientation(board) -> tuple[bool, bool]:
    """(flip, mirror) that bring ``board`` to the canonical orientation: flip = rotate 180° and swap colours
    (black to move); mirror = left-right, when the side to move's king stands on files a–d after the flip."""
    chess = python_chess()

    flip = board.turn == chess.BLACK
    king = board.king(board.turn)
    if king is None:
        raise ValueError("the side to move has no king")
    if flip:
        king ^= 63
    return flip, (king & 7) <= 3


def transform_square(square: int, flip: bool, mirror: bool) -> int:
    """A square in the canonical orientation. Rotating 180° is s → 63 − s (= s XOR 63), mirroring is the file
    f → 7 − f (s XOR 7); both are involutions and commute, so the same call maps back."""
    if flip:
        square ^= 63
    if mirror:
        square ^= 7
    return square


def board_codes(board) -> tuple[np.ndarray, bool, bool]:
    """(codes, flip, mirror): 64 uint8 piece codes of the canonical board (0 empty, 1 + plane index)."""
    flip, mirror = orientation(board)
    codes = np.zeros(64, np.uint8)
    for square, piece in board.piece_map().items():
        white = piece.color != flip  # colours swap with the flip
        codes[transform_square(square, flip, mirror)] = 1 + (0 if white else 6) + piece.piece_type - 1
    return codes, flip, mirror


def planes_from_codes(codes: np.ndarray) -> np.ndarray:
    """(N, 64) piece codes → (N, 8, 8, 12) float32 one-hot planes."""
    codes = np.asarray(codes).reshape(-1, 64).astype(np.int64)
    eye = np.concatenate([np.zeros((1, 12), np.float32), np.eye(12, dtype=np.float32)])
    return eye[codes].reshape(-1, 8, 8, 12)


def encode_board(board) -> np.ndarray:
    """The 12 canonical piece planes of ``board``: (8, 8, 12) float32 indexed [rank, file, plane]."""
    return planes_from_codes(board_codes(board)[0])[0]


def decode_planes(planes) -> "chess.Board":
    """The canonical board (white to move, no castling rights) that ``planes`` (8, 8, 12) describe."""
    chess = python_chess()

    planes = np.asarray(planes)
    board = chess.Board(None)
    for rank, file, plane in zip(*np.nonzero(planes > 0.5)):
        board.set_piece_at(8 * int(rank) + int(file), chess.Piece.from_symbol(PIECE_SYMBOLS[int(plane)]))
    board.turn = chess.WHITE
    return board


def target_map(squares: np.ndarray) -> np.ndarray:
    """(N, 2) canonical from/to squares → (N, 8, 8) int64 maps with 1 on both squares."""
    squares = np.asarray(squares, dtype=np.int64).reshape(-1, 2)
    out = np.zeros((len(squares), 64), np.int64)
    rows = np.arange(len(squares))
    out[rows, squares[:, 0]] = 1
    out[rows, squares[:, 1]] = 1
    return out.reshape(-1, 8, 8)


def encode_puzzle(fen: str, moves: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """A Lichess puzzle → (64 piece codes, 2 canonical squares). ``fen`` is the position before the opponent's
    move ``moves[0]``; the answer is ``moves[1]``. Raises ValueError naming what is wrong."""
    chess = python_chess()

    if len(moves) < 2:
        raise ValueError("fewer than two moves")
    try:
        board = chess.Board(fen)
    except ValueError as exc:
        raise ValueError(f"bad FEN ({exc})") from None
    if not board.is_valid():
        raise ValueError("FEN is not a legal position")
    for k in (0, 1):
        try:
            move = chess.Move.from_uci(moves[k])
        except ValueError:
            raise ValueError(f"Moves[{k}] {moves[k]!r} is not a UCI move") from None
        if not board.is_legal(move):
            raise ValueError(f"Moves[{k}] {moves[k]} is illegal")
        if k == 0:
            board.push(move)
    codes, flip, mirror = board_codes(board)
    squares = np.array([transform_square(move.from_square, flip, mirror),
                        transform_square(move.to_square, flip, mirror)], np.uint8)
    return codes, squares


# ---- the Lichess CSV ------------------------------------------------------------------------------------------
@dataclass
class LichessSplits:
    """Encoded splits read from a Lichess CSV, with the malformed rows counted by reason."""

    codes: dict = field(default_factory=dict)      # split -> (N, 64) uint8
    squares: dict = field(default_factory=dict)    # split -> (N, 2) uint8
    ratings: dict = field(default_factory=dict)    # split -> (N,) int32
    rows_read: int = 0
    malformed: dict = field(default_factory=dict)  # reason -> count
    examples: dict = field(default_factory=dict)   # reason -> first line number
    val_repeats_dropped: int = 0                   # val rows skipped: their position is a train input


def _reason_key(message: str) -> str:
    for key in ("bad FEN", "not a legal position", "not a UCI move", "illegal", "fewer than two moves",
                "columns", "rating"):
        if key in message:
            return {"not a legal position": "illegal position", "not a UCI move": "bad move text",
                    "illegal": "illegal move", "columns": "wrong number of columns",
                    "rating": "bad rating"}.get(key, key)
    return message


def iter_lichess_rows(path: str) -> Iterable[tuple[int, Optional[tuple[str, list[str], int]], Optional[str]]]:
    """Yield (line number, (fen, moves, rating) or None, error or None) for every data row of a Lichess CSV: with
    the database's header (10 or 11 columns, found by name), or headerless FEN,Moves,Rating (3 columns) or
    headerless database rows (10 or 11 columns)."""
    try:
        handle = open(path, newline="", encoding="utf-8")
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None
    with handle:
        reader = csv.reader(handle)
        first = next(reader, None)
        if first is None:
            raise DataError(f"{path} is empty")
        columns: Optional[dict[str, int]] = None
        pending: list[tuple[int, list[str]]] = []
        if "FEN" in first and "Moves" in first and "Rating" in first:
            columns = {name: first.index(name) for name in ("FEN", "Moves", "Rating")}
            widths = (len(first),)
        else:
            pending.append((1, first))
            if len(first) == 3:
                columns, widths = {"FEN": 0, "Moves": 1, "Rating": 2}, (3,)
            elif len(first) in (10, 11):
                columns, widths = {"FEN": 1, "Moves": 2, "Rating": 3}, (10, 11)
            else:
                raise DataError(f"{path}: not a Lichess puzzle CSV (expected a header naming FEN, Moves, Rating, "
                                f"or rows of 3 or 10–11 columns; line 1 has {len(first)})")

        def rows():
            yield from pending
            for row in reader:
                yield reader.line_num, row

        for line, row in rows():
            if not row:
                continue
            if len(row) not in widths:
                yield line, None, f"wrong number of columns ({len(row)})"
                continue
            try:
                rating = int(row[columns["Rating"]])
            except ValueError:
                yield line, None, f"bad rating {row[columns['Rating']]!r}"
                continue
            yield line, (row[columns["FEN"]].strip(), row[columns["Moves"]].split(), rating), None


def read_lichess(path: str, sizes: dict[str, int], *, easy_max: int = 1600, hard_min: int = 1601,
                 hard_max: int = 2000) -> LichessSplits:
    """The paper's splits from a Lichess puzzle CSV, in file order: train then val from the rows rated
    ≤ ``easy_max``, hard from the rows rated in [``hard_min``, ``hard_max``]. Val skips a row whose position
    (the encoded input) is a train input, counted in ``val_repeats_dropped``, so val never holds a training
    input (:class:`stability.tasks.splits.TrainVal`). Reading stops once every split is full. Malformed rows
    (bad FEN, illegal move, wrong columns, bad rating) are counted, never kept."""
    out = LichessSplits()
    easy = TrainVal(sizes["train"], sizes["val"])
    hard: list = []
    for line, parsed, error in iter_lichess_rows(path):
        if easy.full() and len(hard) >= sizes["hard"]:
            break
        out.rows_read += 1
        if parsed is not None:
            fen, moves, rating = parsed
            group = "easy" if rating <= easy_max else "hard" if hard_min <= rating <= hard_max else None
            if group is None or (easy.full() if group == "easy" else len(hard) >= sizes["hard"]):
                continue  # not needed: skip without parsing the position
            try:
                codes, squares = encode_puzzle(fen, moves)
            except ValueError as exc:
                error = str(exc)
            else:
                if group == "easy":
                    easy.offer(codes.tobytes(), (codes, squares, rating))
                else:
                    hard.append((codes, squares, rating))
                continue
        key = _reason_key(error)
        out.malformed[key] = out.malformed.get(key, 0) + 1
        out.examples.setdefault(key, line)
    train, val, out.val_repeats_dropped = easy.finish()
    parts = {"train": train, "val": val, "hard": hard}
    for split, rows in parts.items():
        if not rows:
            raise DataError(f"{path}: no usable rows for the {split} split (train/val: rating ≤ {easy_max}, "
                            f"hard: {hard_min}–{hard_max}; {sum(out.malformed.values())} malformed rows)")
        out.codes[split] = np.stack([r[0] for r in rows])
        out.squares[split] = np.stack([r[1] for r in rows])
        out.ratings[split] = np.array([r[2] for r in rows], np.int32)
    return out


def malformed_message(path: str, malformed: dict, examples: dict) -> str:
    """One line: how many rows of ``path`` were skipped and why."""
    parts = [f"{n} {reason} (first at line {examples.get(reason, '?')})" for reason, n in sorted(malformed.items())]
    return f"skipped {sum(malformed.values())} malformed row(s) of {os.path.basename(path)}: {'; '.join(parts)}"


# ---- the task -------------------------------------------------------------------------------------------------
class Chess(ArrayTask):
    """Chess puzzles: 12 canonical piece planes on 8×8 → from/to squares of the best move (App. B.1.1)."""

    name = "chess"
    options = ("data_path", "cache_dir", "engine", "chess_easy_max", "chess_hard_min", "chess_hard_max")
    in_channels = 12
    out_channels = 2
    spatial_ndim = 2
    attention_window = None
    paper_sizes = PAPER_SIZES

    def _load_real(self) -> dict:
        c = self.config
        path, sizes = c.data_path, self.sizes()
        if not os.path.isfile(path):
            raise DataError(f"chess data file {path} does not exist")
        options = {"easy_max": c.chess_easy_max, "hard_min": c.chess_hard_min, "hard_max": c.chess_hard_max}

        def build() -> tuple[dict, dict]:
            splits = read_lichess(path, sizes, **options)
            arrays = {}
            for split in SPLITS:
                arrays[f"{split}/codes"] = splits.codes[split]
                arrays[f"{split}/squares"] = splits.squares[split]
                arrays[f"{split}/rating"] = splits.ratings[split]
            meta = {"rows_read": splits.rows_read, "malformed": splits.malformed, "examples": splits.examples,
                    "val_repeats_dropped": splits.val_repeats_dropped}
            return arrays, meta

        arrays, meta = cache.cached_real_split(self.name, path, {**sizes, **options}, build, c)
        if meta["malformed"]:
            print(f"stability: {malformed_message(path, meta['malformed'], meta['examples'])}", file=sys.stderr)
        got = {s: len(arrays[f"{s}/codes"]) for s in SPLITS}
        short = {s: (got[s], sizes[s]) for s in SPLITS if got[s] < sizes[s]}
        if short:
            print("stability: " + os.path.basename(path) + " holds fewer rows than asked: "
                  + ", ".join(f"{s} {g} of {w}" for s, (g, w) in short.items()), file=sys.stderr)
        self._info = {"source": f"Lichess CSV {path}", "rows_read": meta["rows_read"],
                      "malformed": meta["malformed"], **options}
        if meta.get("val_repeats_dropped"):
            self._info["val_repeats_dropped"] = meta["val_repeats_dropped"]
        return arrays

    def _build(self, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        codes = self.arrays[f"{split}/codes"]
        squares = self.arrays[f"{split}/squares"]
        return torch.from_numpy(planes_from_codes(codes)), torch.from_numpy(target_map(squares))

    def describe(self) -> dict:
        arrays = self.arrays
        out = {"task": self.name, **self._info, "splits": {}}
        for split in SPLITS:
            rating = arrays.get(f"{split}/rating")
            entry = {"size": int(len(arrays[f"{split}/codes"]))}
            if rating is not None and len(rating):
                entry["rating_mean"] = float(np.mean(rating))
            out["splits"][split] = entry
        return out

    # ---- scoring: the answer is the top-2 squares of the "1" channel -----------------------------------------
    def predict(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, 8, 8) maps with 1 on the two squares whose class-1 logit is highest (docs/data.md)."""
        flat = logits[..., 1].reshape(logits.shape[0], -1)
        top = flat.topk(2, dim=1).indices
        pred = torch.zeros_like(flat, dtype=torch.int64)
        pred.scatter_(1, top, 1)
        return pred.reshape(logits.shape[:-1])
