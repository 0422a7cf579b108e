"""Offline sudoku puzzles with a unique solution: easy ones, and ones made hard on purpose.

* :func:`full_grid`: a random solved grid (11 random consistent clues completed by the solver, then a random
  symmetry).
* :func:`minimal_puzzle`: clues removed from a full grid in random order while the solution stays unique, so no
  clue can be removed: a random *minimal* puzzle (≈ 24 clues). Almost all are easy for a solver with singles
  propagation: of 8,000, the rating's 80th percentile is about 1.5 and none reaches 11 (the paper's cut is 38).
  The easy splits (train, val) are such puzzles rated below the cut.
* :func:`hard_puzzles`: puzzles rated at or above the cut, made by a search scored with the solver (simulated
  annealing with restarts, see its docstring). They are graded by :func:`~stability.tasks.sudoku_solver.rating`
  on 32 fixed orderings that the search never sees.

Every function takes a ``numpy.random.Generator``: the same generator state gives the same puzzles, with numba or
in pure Python (``backend``).
"""

from __future__ import annotations

import numpy as np

from stability.tasks import sudoku_solver as S
from stability.tasks.cache import shard_rng
from stability.tasks.sudoku_solver import _LEVEL, _search, register_jitable

PAPER_CUT = 38.0
SEARCH_SYMMETRIES = 16
REDRAW = 50
TEMPERATURE = 0.05
CHECK = 500
RAMP = 4000
PATIENCE = 1500
PER_CLIMB = 64
MIN_DISTANCE = 6
TRIGGER = 0.75


@register_jitable
def _minimize(puzzle, order, stk, bcell, brem, sol, tab, units, stats):
    """Remove clues of ``puzzle`` in ``order`` wherever the solution stays unique (in place). One pass suffices:
    a clue that cannot go now cannot go later, when fewer clues remain."""
    for k in range(81):
        i = order[k]
        v = puzzle[i]
        if v != 0:
            puzzle[i] = 0
            if _search(puzzle, 2, -1, stk, bcell, brem, sol, tab, units, stats) != 1:
                puzzle[i] = v


if S.numba is not None:
    _minimize_nb = S.numba.njit(cache=True, nogil=True)(_minimize)


def _scratch(backend: str):
    if backend == "numba":
        z = np.zeros
        return z(82 * _LEVEL, np.int64), z(82, np.int64), z(82, np.int64), z(81, np.int64), z(3, np.int64)
    return [0] * (82 * _LEVEL), [0] * 82, [0] * 82, [0] * 81, [0] * 3


def minimize(puzzle, order, *, backend: str = "auto") -> np.ndarray:
    """A minimal puzzle from ``puzzle`` (unique solution assumed), trying the cells in ``order``."""
    backend = S._backend(backend)
    if backend == "numba":
        p = np.array(puzzle, dtype=np.int64).reshape(81)
        _minimize_nb(p, np.asarray(order, np.int64), *_scratch(backend)[:4], S.TAB, S.UNITS, _scratch(backend)[4])
        return p
    p = [int(v) for v in np.asarray(puzzle).reshape(81)]
    stk, bcell, brem, sol, stats = _scratch(backend)
    _minimize(p, [int(v) for v in order], stk, bcell, brem, sol, S.TAB_LIST, S.UNITS_LIST, stats)
    return np.array(p, dtype=np.int64)


def full_grid(rng: np.random.Generator, *, backend: str = "auto") -> np.ndarray:
    """A random solved grid: 11 random consistent clues completed by the solver, then a random symmetry."""
    while True:
        grid = np.zeros(81, np.int64)
        for i in rng.permutation(81)[:11]:
            r, c = divmod(int(i), 9)
            b = 27 * (r // 3) + 3 * (c // 3)
            used = set(grid[r * 9:(r + 1) * 9]) | set(grid[c::9]) | {grid[b + 9 * a + e] for a in range(3) for e in
                                                                   range(3)}
            free = [d for d in range(1, 10) if d not in used]
            grid[i] = free[rng.integers(len(free))]
        res = S.solve(grid, limit=1, max_backtracks=2000, backend=backend)
        if res.solution is not None:
            return S.apply_symmetry(res.solution, *S.random_symmetry(rng))


def minimal_puzzle(solution: np.ndarray, rng: np.random.Generator, *, backend: str = "auto") -> np.ndarray:
    """A random minimal puzzle whose unique solution is ``solution``."""
    return minimize(solution, rng.permutation(81), backend=backend)


def easy_puzzle(rng: np.random.Generator, *, backend: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """(puzzle, solution): a random minimal puzzle of a random grid."""
    solution = full_grid(rng, backend=backend)
    return minimal_puzzle(solution, rng, backend=backend), solution


def _log_score(puzzle, syms, backend) -> float:
    """mean log(1 + backtracks) over the symmetries ``syms`` (the log of the geometric-mean score, plus 1)."""
    return float(np.log1p(S.backtracks_under(puzzle[None], *syms, backend=backend)[0]).mean())


def neighbour(puzzle: np.ndarray, solution: np.ndarray, rng: np.random.Generator, *, backend: str = "auto"):
    """A random minimal puzzle near ``puzzle`` with the same unique solution: one or two clues removed, clues of
    the solution added at random blanks until the solution is unique again, then reminimised."""
    candidate = puzzle.copy()
    clues = np.flatnonzero(candidate)
    candidate[rng.choice(clues, size=1 + int(rng.integers(2)), replace=False)] = 0
    for i in rng.permutation(np.flatnonzero(candidate == 0)):
        candidate[i] = solution[i]
        if S.count_solutions(candidate, limit=2, backend=backend)[0][0] == 1:
            break
    return minimize(candidate, rng.permutation(81), backend=backend)


def hard_puzzles(rng: np.random.Generator, *, cut: float = PAPER_CUT, backend: str = "auto"):
    """Yield (puzzle, solution, rating) with rating ≥ ``cut``, forever: puzzles made hard on purpose.

    Simulated annealing over the minimal puzzles of one random grid (moves: :func:`neighbour`). A state is scored
    by mean log(1 + backtracks) over ``SEARCH_SYMMETRIES`` random symmetries, redrawn every ``REDRAW`` steps so
    the climb cannot tune itself to a few orderings; a worse move is taken with probability exp(Δ / TEMPERATURE).

    Climbs differ wildly (a few grids lead to hard puzzles, most do not), so every ``CHECK`` steps the current
    state is graded with the toolkit's :func:`~stability.tasks.sudoku_solver.rating` (32 fixed orderings, none
    of the search's) and a climb whose rating lags ``cut · min(0.85, step / RAMP)`` is abandoned for a new grid.
    A state whose search score (geometric mean) reaches ``TRIGGER · cut`` is seen through a random symmetry and
    graded the same way (the median runs about 20 % above the geometric mean on hard puzzles); it is
    yielded if that rating is ≥ ``cut`` and it differs in ≥ ``MIN_DISTANCE`` cells from the climb's earlier
    ones. The climb then goes on (``PATIENCE`` more steps after each find, at most ``PER_CLIMB`` finds): hard
    puzzles are mostly isolated peaks (the neighbours of a hard one are usually easy), but a region that held
    one sometimes holds more.
    """
    goal = np.log1p(TRIGGER * cut)
    while True:
        solution = full_grid(rng, backend=backend)
        puzzle = minimal_puzzle(solution, rng, backend=backend)
        seen = {puzzle.tobytes()}
        syms = S.symmetries(SEARCH_SYMMETRIES, int(rng.integers(2**63)))
        score = _log_score(puzzle, syms, backend)
        emitted: list[np.ndarray] = []
        step = last = 0
        while True:
            step += 1
            if emitted and step - last > PATIENCE:
                break
            if not emitted and step % CHECK == 0:
                if float(S.rating(puzzle[None], backend=backend)[0]) < cut * min(0.85, step / RAMP):
                    break  # a climb going nowhere
            if step % REDRAW == 0:
                syms = S.symmetries(SEARCH_SYMMETRIES, int(rng.integers(2**63)))
                score = _log_score(puzzle, syms, backend)
            candidate = neighbour(puzzle, solution, rng, backend=backend)
            new = _log_score(candidate, syms, backend)
            if new >= score or rng.random() < np.exp((new - score) / TEMPERATURE):
                puzzle, score = candidate, new
                key = puzzle.tobytes()
                if score >= goal and key not in seen and all(
                        np.count_nonzero(puzzle != e) >= MIN_DISTANCE for e in emitted):
                    seen.add(key)
                    perm, relabel = S.random_symmetry(rng)
                    shown, shown_solution = S.apply_symmetry(puzzle, perm, relabel), S.apply_symmetry(solution, perm,
                                                                                                     relabel)
                    r = float(S.rating(shown[None], backend=backend)[0])
                    if r >= cut:
                        yield shown, shown_solution, r
                        emitted.append(puzzle)
                        last = step
                        if len(emitted) >= PER_CLIMB:
                            break


def easy_puzzles(rng: np.random.Generator, *, cut: float = PAPER_CUT, backend: str = "auto"):
    """Yield (puzzle, solution, rating) with rating < ``cut``, forever: random minimal puzzles (the rare one at or
    above the cut is dropped, so the easy and hard splits never overlap)."""
    while True:
        puzzle, solution = easy_puzzle(rng, backend=backend)
        r = float(S.rating(puzzle[None], backend=backend)[0])
        if r < cut:
            yield puzzle, solution, r


# ---- the dataset interface used by stability.tasks.cache ------------------------------------------------------
GENERATOR = "stability-sudoku-v1"
#: the array holding a row's input (the 81 cells of the puzzle): val keeps no row whose input is a train input
INPUT_KEY = "puzzles"
SHARD_ROWS = {"train": 2000, "val": 2000, "hard": 10}
SMALL_SIZES = {"train": 2000, "val": 500, "hard": 20}


def resolve_options(options: dict) -> dict:
    return {"cut": float(options.get("cut") or PAPER_CUT)}


def options_from_config(config) -> dict:
    return resolve_options({"cut": config.sudoku_cut})


def signature(options: dict) -> dict:
    return {"cut": float(options["cut"])}


def describe_options(options: dict) -> dict:
    return {"rating": f"backtracks, median over {S.RATING_SYMMETRIES} orderings", "cut": options["cut"]}


def usable(manifest: dict, options: dict) -> bool:
    return manifest.get("generator") == GENERATOR and manifest.get("options") == signature(resolve_options(options))


def make_shard(split: str, index: int, rows: int, seed: int, options: dict, progress=None) -> dict:
    """The first ``rows`` puzzles of shard ``index`` of ``split`` (train/val: easy, hard: hard); ``progress(1)``
    is called after each puzzle."""
    rng = shard_rng(seed, split, index)
    stream = (hard_puzzles if split == "hard" else easy_puzzles)(rng, cut=options["cut"])
    items = []
    for _ in range(rows):
        items.append(next(stream))
        if progress is not None:
            progress(1)
    return {
        "puzzles": np.array([p for p, _, _ in items], np.uint8).reshape(-1, 81),
        "solutions": np.array([s for _, s, _ in items], np.uint8).reshape(-1, 81),
        "rating": np.array([r for _, _, r in items], np.float32),
    }
