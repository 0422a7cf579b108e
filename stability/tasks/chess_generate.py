"""Offline chess puzzles: python-chess plus a UCI engine (Stockfish), or a python-chess-only fallback.

Engine path (:func:`engine_puzzles`). Games are played from the start position: a few random opening moves,
then moves the engine likes at a shallow depth, with noise; now and then a side plays a random move (checks and
captures favoured), the *mistake*: the puzzle's ``Moves[0]``, as in the Lichess database. The position after it
becomes a puzzle when the engine at ``DEPTH`` (two lines) finds one clearly best move for the side to move: the
best line is winning (≥ +``WINNING_CP`` cp, or a mate) and the *gap*, the best line's win probability minus the
second line's (Lichess's logistic of the centipawns), is ≥ ``GAP`` (for a mate: no other move mates as fast).
The solution goes on along the engine's line while each of the solver's moves is again clearly best. Measured
the same way on real puzzles and on generated ones (:func:`examine`):

* ``found_at``: the first depth from which the engine's best move stays the answer (1..``DEPTH``);
* ``gap``: as above (small gap = the alternatives look almost as good = harder);
* ``length``: the solver's moves in the solution (recorded; it adds nothing to the fit below).

The *difficulty proxy* is ``rating = a + b·found_at + c·gap`` with (a, b, c) fitted by least squares to the
ratings of real Lichess puzzles (:func:`calibrate`, ``stability data calibrate``; measured numbers in
``docs/data.md``). Train/val keep puzzles whose proxy is ≤ 1600, hard those in 1601–2000 (the bounds of
``TaskConfig``).

Fallback (:func:`fallback_puzzles`, used only when no engine is found or ``--engine none``, and announced as the
fallback): random games biased towards checks and captures; a position where the side to move has exactly one
mating move (from/to squares; promotions to different pieces count once) is an easy puzzle (*mate in 1*), one
with no mate in 1 and exactly one first move that mates in 2 against every reply a hard one (*mate in 2*). The
split is by mate depth, not by rating; the ``rating`` column is the proxy at (found_at = depth, gap = 1), a
label, not a measurement.
"""

from __future__ import annotations

import math
import os
import shutil
import sys
from typing import Iterator, Optional

import numpy as np

from stability.errors import ConfigError, DataError
from stability.extras import require
from stability.tasks.cache import shard_rng

GENERATOR = "stability-chess-v1"
#: the array holding a row's input (the 64 canonical piece codes): val keeps no row whose input is a train input
INPUT_KEY = "codes"
DEPTH = 12
GAP = 0.15
WINNING_CP = 150
MAX_LENGTH = 6
# rating ≈ a + b·found_at + c·gap: `stability data calibrate --rows 600` on the 10,000-row Lichess sample
# (fit on 300, Spearman 0.59 with the real rating on the other 300; docs/data.md)
CALIBRATION = {"a": 1741.45, "b": 59.33, "c": -662.45}
SHARD_ROWS = {"train": 100, "val": 100, "hard": 25}
SMALL_SIZES = {"train": 200, "val": 50, "hard": 25}
FALLBACK_NOTE = ("no UCI engine found: using the python-chess-only FALLBACK generator (mate in 1 = easy, mate in 2 "
                 "= hard); install Stockfish (Debian: apt-get install stockfish) or pass --engine for the real one")


# ---- the engine ------------------------------------------------------------------------------------------------
def _python_chess():
    """python-chess with its engine module (the ``data`` extra), or one line saying how to install it."""
    return require("chess.engine", "generating chess puzzles")


def find_engine(path: Optional[str] = None) -> Optional[str]:
    """The UCI engine to use: ``path`` if given (must exist; "none" asks for the fallback), else ``stockfish``
    on PATH or in /usr/games."""
    if path == "none":
        return None
    if path:
        found = shutil.which(path) or (path if os.path.isfile(path) and os.access(path, os.X_OK) else None)
        if found is None:
            raise ConfigError(f"engine {path} is not an executable file")
        return found
    return shutil.which("stockfish") or shutil.which("stockfish", path="/usr/games:/usr/local/games")


def open_engine(path: str):
    """A UCI engine on one thread with a small hash (deterministic for a fixed depth and a cleared hash)."""
    chess = _python_chess()

    try:
        engine = chess.engine.SimpleEngine.popen_uci(path)
    except (OSError, chess.engine.EngineError) as exc:
        raise DataError(f"cannot start the chess engine {path}: {exc}") from None
    options = {k: v for k, v in (("Threads", 1), ("Hash", 16)) if k in engine.options}
    engine.configure(options)
    return engine


def win_probability(score) -> float:
    """Lichess's win probability of a python-chess ``Score`` (mates count as 0 or 1)."""
    if score.is_mate():
        return 1.0 if score.mate() > 0 else 0.0
    return 1.0 / (1.0 + math.exp(-0.00368208 * score.score()))


def examine(engine, board, depth: int = DEPTH) -> Optional[dict]:
    """The engine's view of ``board`` at ``depth`` with two lines: {"move", "pv", "score", "clear", "found_at"}.

    ``clear``: the best line is winning and clearly better than the second (see the module docstring);
    ``found_at``: the first depth from which the best move stays the final one. None if there is no legal move.
    """
    chess = _python_chess()

    if board.is_game_over():
        return None
    best_by_depth: dict[int, chess.Move] = {}
    lines: dict[int, dict] = {}
    with engine.analysis(board, chess.engine.Limit(depth=depth), multipv=2, game=object()) as analysis:
        for info in analysis:
            if "pv" not in info or not info["pv"] or "depth" not in info:
                continue
            k = info.get("multipv", 1)
            lines[k] = info
            if k == 1:
                best_by_depth[info["depth"]] = info["pv"][0]
    if 1 not in lines:
        return None
    best = lines[1]["pv"][0]
    found_at = depth
    for d in sorted(best_by_depth, reverse=True):
        if best_by_depth[d] != best:
            break
        found_at = d
    pov = board.turn
    s1 = lines[1]["score"].pov(pov)
    winning = s1.is_mate() and s1.mate() > 0 or (not s1.is_mate() and s1.score() >= WINNING_CP)
    if 2 in lines and (lines[2]["pv"][0].from_square, lines[2]["pv"][0].to_square) != (best.from_square,
                                                                                       best.to_square):
        s2 = lines[2]["score"].pov(pov)
        if s1.is_mate() and s1.mate() > 0:  # a mate is clearly best unless another move mates as fast
            gap = 0.0 if s2.is_mate() and 0 < s2.mate() <= s1.mate() else 1.0
        else:
            gap = win_probability(s1) - win_probability(s2)
    else:
        gap = 1.0  # a single legal move (or only promotions of one pawn to different pieces)
    only_move = board.legal_moves.count() == 1  # a forced move is no puzzle
    return {"move": best, "pv": list(lines[1]["pv"]), "score": s1,
            "clear": bool(winning and gap >= GAP and not only_move),
            "gap": gap, "found_at": found_at}


def solution_line(engine, board, first: Optional[dict] = None, depth: int = DEPTH) -> tuple[list, dict]:
    """The solver's clearly-best moves with the engine's replies between them, from ``board`` (solver to move).

    Returns (moves, first view); ``len(moves[::2])`` is the solution's length in the solver's moves.
    """
    chess = _python_chess()

    board = board.copy()
    first = first or examine(engine, board, depth)
    view, moves = first, []
    while view is not None and view["clear"] and len(moves) < 2 * MAX_LENGTH:
        board.push(view["move"])
        moves.append(view["move"])
        if board.is_game_over():
            break
        reply = view["pv"][1] if len(view["pv"]) > 1 else engine.play(board, chess.engine.Limit(depth=depth),
                                                                          game=object()).move
        board.push(reply)
        moves.append(reply)
        view = examine(engine, board, depth)
    if moves and len(moves) % 2 == 0:
        moves.pop()  # end on the solver's move
    return moves, first


def proxy_rating(found_at, gap, calibration: Optional[dict] = None) -> np.ndarray:
    """The calibrated difficulty proxy a + b·found_at + c·gap (a rating on the Lichess scale)."""
    c = calibration or CALIBRATION
    return c["a"] + c["b"] * np.asarray(found_at, np.float64) + c["c"] * np.asarray(gap, np.float64)


def _weighted_move(board, rng: np.random.Generator, bias: float = 4.0):
    """A random legal move, checks and captures ``bias`` times as likely as quiet ones."""
    moves = list(board.legal_moves)
    weights = np.array([bias if board.is_capture(m) or board.gives_check(m) else 1.0 for m in moves])
    return moves[rng.choice(len(moves), p=weights / weights.sum())]


def engine_puzzles(engine, rng: np.random.Generator, *, depth: int = DEPTH) -> Iterator[dict]:
    """Yield puzzles forever: {"fen" (before the mistake), "moves" (UCI, mistake first), "length", "found_at",
    "gap"}."""
    chess = _python_chess()

    while True:
        board = chess.Board()
        for _ in range(int(rng.integers(2, 9))):  # a random opening
            if board.is_game_over():
                break
            board.push(_weighted_move(board, rng, 1.0))
        while not board.is_game_over() and board.fullmove_number < 80:
            before = board.fen()
            if rng.random() < 0.2:  # the mistake
                mistake = _weighted_move(board, rng)
                board.push(mistake)
                view = examine(engine, board, depth)
                if view is not None and view["clear"]:
                    moves, _ = solution_line(engine, board, view, depth)
                    if moves:
                        yield {"fen": before, "moves": [mistake.uci()] + [m.uci() for m in moves],
                               "length": (len(moves) + 1) // 2, "found_at": view["found_at"], "gap": view["gap"]}
                        board.push(moves[0])  # the game goes on past the puzzle
                continue
            infos = engine.analyse(board, chess.engine.Limit(depth=int(rng.integers(1, 6))), multipv=3,
                                   game=object())
            choices = [i["pv"][0] for i in infos if i.get("pv")]
            if not choices:
                break
            board.push(choices[min(int(rng.geometric(0.6)) - 1, len(choices) - 1)])


# ---- the python-chess-only fallback ----------------------------------------------------------------------------
def _squares(move) -> tuple[int, int]:
    return move.from_square, move.to_square


def mating_moves(board) -> set:
    """From/to squares of the moves that checkmate at once."""
    out = set()
    for move in board.legal_moves:
        board.push(move)
        if board.is_checkmate():
            out.add(_squares(move))
        board.pop()
    return out


def mate_in_two_keys(board, limit: int = 2) -> list:
    """First moves (one per from/to) after which every reply allows a mate in one; stops after ``limit``."""
    keys, seen = [], set()
    for move in board.legal_moves:
        sq = _squares(move)
        if sq in seen:
            continue
        board.push(move)
        forced = not board.is_game_over()  # a stalemate or an immediate mate is not a mate in 2
        if forced:
            for reply in board.legal_moves:
                board.push(reply)
                ok = bool(mating_moves(board))
                board.pop()
                if not ok:
                    forced = False
                    break
        board.pop()
        if forced:
            seen.add(sq)
            keys.append(move)
            if len(keys) >= limit:
                break
    return keys


def fallback_puzzles(rng: np.random.Generator, kind: str) -> Iterator[dict]:
    """Yield mate-in-1 (``kind`` = "easy") or mate-in-2 ("hard") puzzles forever, each with one answer."""
    chess = _python_chess()

    while True:
        board = chess.Board()
        while not board.is_game_over() and board.ply() < 160:
            before = board.fen()
            mistake = _weighted_move(board, rng)
            board.push(mistake)
            if board.ply() < 12 or board.is_game_over():
                continue
            mates = mating_moves(board)
            if kind == "easy":
                if len(mates) == 1:
                    (frm, to), = mates
                    move = next(m for m in board.legal_moves if _squares(m) == (frm, to))
                    yield {"fen": before, "moves": [mistake.uci(), move.uci()], "length": 1, "found_at": 1,
                           "gap": 1.0}
                    break
            elif not mates:
                keys = mate_in_two_keys(board)
                if len(keys) == 1:
                    key = keys[0]
                    board.push(key)
                    reply = min(board.legal_moves, key=lambda m: m.uci())
                    board.push(reply)
                    (frm, to) = sorted(mating_moves(board))[0]
                    mate = next(m for m in board.legal_moves if _squares(m) == (frm, to))
                    yield {"fen": before, "moves": [mistake.uci(), key.uci(), reply.uci(), mate.uci()],
                           "length": 2, "found_at": 2, "gap": 1.0}
                    break


# ---- the dataset interface used by stability.tasks.cache -------------------------------------------------------
def resolve_options(options: dict) -> dict:
    """Find the engine: {"engine": path or None, "engine_name", "mode": engine|fallback, "depth", bounds}."""
    _python_chess()  # before any work (or worker process) starts
    engine = find_engine(options.get("engine"))
    out = {"engine": engine, "mode": "engine" if engine else "fallback", "depth": int(options.get("depth", DEPTH)),
           "easy_max": int(options.get("easy_max", 1600)), "hard_min": int(options.get("hard_min", 1601)),
           "hard_max": int(options.get("hard_max", 2000)), "engine_name": None}
    if engine:
        out["engine_name"] = options.get("engine_name") or _engine_name(engine)
    else:
        print(f"stability: {FALLBACK_NOTE}", file=sys.stderr)
    return out


def _engine_name(path: str) -> str:
    engine = open_engine(path)
    try:
        return engine.id.get("name", os.path.basename(path))
    finally:
        engine.quit()


def options_from_config(config) -> dict:
    return {"engine": config.engine, "easy_max": config.chess_easy_max, "hard_min": config.chess_hard_min,
            "hard_max": config.chess_hard_max}


def signature(options: dict) -> dict:
    keys = ("mode", "engine_name", "depth", "easy_max", "hard_min", "hard_max")
    return {k: options[k] for k in keys}


def describe_options(options: dict) -> dict:
    if options["mode"] == "fallback":
        return {"generator": "FALLBACK (python-chess only): easy = mate in 1, hard = mate in 2"}
    return {"generator": f"{options['engine_name']} at depth {options['depth']}",
            "rating": "proxy a + b·found_at + c·gap calibrated on Lichess ratings",
            "bounds": f"train/val ≤ {options['easy_max']}, hard {options['hard_min']}–{options['hard_max']}"}


def usable(manifest: dict, options: dict) -> bool:
    """Any chess dataset of this generator with the same rating bounds serves for training (engine or not)."""
    sig = manifest.get("options", {})
    return manifest.get("generator") == GENERATOR and all(
        sig.get(k) == options.get(k) for k in ("easy_max", "hard_min", "hard_max"))


def make_shard(split: str, index: int, rows: int, seed: int, options: dict, progress=None) -> dict:
    """The first ``rows`` puzzles of shard ``index`` of ``split``, encoded (see :mod:`stability.tasks.chess`);
    ``progress(1)`` is called after each puzzle."""
    # lazy: torch; this module imports without it
    from stability.tasks.chess import encode_puzzle

    rng = shard_rng(seed, split, index)
    items = []
    engine = open_engine(options["engine"]) if options["mode"] == "engine" else None
    try:
        if engine is None:
            stream = fallback_puzzles(rng, "hard" if split == "hard" else "easy")
        else:
            stream = engine_puzzles(engine, rng, depth=options["depth"])
        while len(items) < rows:
            p = next(stream)
            p["rating"] = float(proxy_rating(p["found_at"], p["gap"]))
            if engine is not None:
                easy = p["rating"] <= options["easy_max"]
                hard = options["hard_min"] <= p["rating"] <= options["hard_max"]
                if not (hard if split == "hard" else easy):
                    continue
            items.append(p)
            if progress is not None:
                progress(1)
    finally:
        if engine is not None:
            engine.quit()
    encoded = [encode_puzzle(p["fen"], p["moves"]) for p in items]
    return {
        "codes": np.array([c for c, _ in encoded], np.uint8).reshape(-1, 64),
        "squares": np.array([s for _, s in encoded], np.uint8).reshape(-1, 2),
        "rating": np.array([p["rating"] for p in items], np.float32),
        "length": np.array([p["length"] for p in items], np.int16),
        "found_at": np.array([p["found_at"] for p in items], np.int16),
        "gap": np.array([p["gap"] for p in items], np.float32),
        "fen": np.array([p["fen"] for p in items], dtype="U100"),
        "moves": np.array([" ".join(p["moves"]) for p in items], dtype="U120"),
    }


# ---- calibration against real ratings ---------------------------------------------------------------------------
def measure_real(path: str, rows: int, *, engine_path: Optional[str] = None, depth: int = DEPTH,
                 seed: int = 0, progress: bool = True) -> dict:
    """Run the generator's measurements on ``rows`` random valid puzzles of a Lichess CSV: their rating, the
    engine's agreement with the answer, ``found_at``, ``gap``, ``length`` and whether the generator's rule
    would keep the puzzle (``clear``)."""
    chess = _python_chess()
    # lazy: torch; this module imports without it
    from tqdm import tqdm

    from stability.tasks.chess import iter_lichess_rows

    engine_path = find_engine(engine_path)
    if engine_path is None:
        raise DataError("calibration needs a UCI engine (install stockfish or pass --engine)")
    parsed = [p for _, p, err in iter_lichess_rows(path) if p is not None and len(p[1]) >= 2]
    pick = np.random.default_rng(seed).permutation(len(parsed))[:rows]
    out = {"rating": [], "found_at": [], "length": [], "agree": [], "real_length": [], "clear": [], "gap": []}
    engine = open_engine(engine_path)
    try:
        for i in tqdm(pick, disable=not progress, desc="calibrating", unit="puzzle"):
            fen, moves, rating = parsed[i]
            try:
                board = chess.Board(fen)
                board.push_uci(moves[0])
            except ValueError:
                continue
            view = examine(engine, board, depth)
            if view is None:
                continue
            line, _ = solution_line(engine, board, view, depth)
            out["rating"].append(rating)
            out["found_at"].append(view["found_at"] if view["move"].uci() == moves[1] else depth + 1)
            out["length"].append(max(1, (len(line) + 1) // 2))
            out["agree"].append(view["move"].uci() == moves[1])
            out["real_length"].append(len(moves) // 2)
            out["clear"].append(view["clear"])
            out["gap"].append(view["gap"])
    finally:
        engine.quit()
    return {k: np.asarray(v) for k, v in out.items()}


def calibrate(measured: dict, *, holdout: float = 0.5, seed: int = 0) -> dict:
    """Least-squares fit of rating on (1, found_at, gap) over a random part of ``measured``; the rank
    correlations (Spearman) of each feature and of the proxy with the real ratings on the held-out part (all of
    it, and the puzzles the generator's rule would keep)."""
    from scipy.stats import spearmanr

    n = len(measured["rating"])
    order = np.random.default_rng(seed).permutation(n)
    fit, test = order[: int(n * (1 - holdout))], order[int(n * (1 - holdout)):]
    X = np.stack([np.ones(n), measured["found_at"], measured["gap"]], axis=1).astype(np.float64)
    y = measured["rating"].astype(np.float64)
    coef, *_ = np.linalg.lstsq(X[fit], y[fit], rcond=None)
    calibration = {"a": float(coef[0]), "b": float(coef[1]), "c": float(coef[2])}
    proxy = proxy_rating(measured["found_at"], measured["gap"], calibration)
    kept = test[np.asarray(measured["clear"], bool)[test]]

    def rho(v, rows=test):
        return float(spearmanr(np.asarray(v)[rows], y[rows]).statistic)

    return {"calibration": calibration, "n_fit": len(fit), "n_test": len(test), "n_test_kept": len(kept),
            "spearman": {"proxy": rho(proxy), "proxy_on_kept": rho(proxy, kept), "found_at": rho(measured["found_at"]),
                         "gap": rho(measured["gap"]), "length": rho(measured["length"]),
                         "real_length": rho(measured["real_length"])},
            "agreement": float(np.mean(measured["agree"])), "kept": float(np.mean(measured["clear"]))}
