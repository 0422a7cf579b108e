"""A bitmask sudoku solver that counts backtracks: the difficulty measure of the sudoku task.

The paper's sudoku-extreme ratings (App. B.1.1) are the backtrack counts of the tdoku solver. This solver is of
the same family: constraint propagation by naked singles (a cell with one candidate) and hidden singles (a digit
with one place in a row, column or box), then depth-first branching on a cell with the fewest candidates
(lowest cell index among ties, lowest digit first). ``backtracks`` is the number of dead ends (contradictions)
met before the first solution. On tdoku's "forum_hardest" lists it gives a median of 59 where tdoku reports
about 65 guesses (docs/data.md), so it is on the scale of the paper's cut of 38.

A single count depends on the cell and digit ordering (the paper's label is one tdoku run on the puzzle as
given: one draw). The toolkit's *rating* of a puzzle is the **median** of the backtrack count over
``RATING_SYMMETRIES`` validity-preserving symmetries drawn from a fixed seed (:func:`rating`): a function of the
puzzle alone, and the value a single ordering's count exceeds half of the time, so "rating ≥ 38" is the
ordering-free counterpart of the paper's "count ≥ 38". (The geometric mean, :func:`geometric_rating`, is
smoother and scores the hard-puzzle search; it runs about 20 % below the median on hard puzzles.)

The search is written once, in :func:`_search`, using only integer indexing of flat buffers. The fast path runs it
compiled by numba (``njit(cache=True)``); the pure-Python path runs the very same function on Python lists.
Both give identical counts (tested).

Boards are 81 integers in row-major order, 0 for a blank, 1–9 for a digit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

from stability.extras import missing_extra

try:
    import numba
    from numba.extending import register_jitable  # plain Python when called from Python, compiled inside njit
except ImportError:  # numba is the optional ``data`` extra: without it the same search runs in Python
    numba = None

    def register_jitable(fn):
        return fn


RATING_SYMMETRIES = 32
RATING_SEED = 38  # fixed: the rating is a function of the puzzle, not of the dataset seed

_SOLVED, _CONTRADICTION, _BRANCH = 1, 0, 2
_LEVEL = 108  # per search level: 81 cell bits + 9 row + 9 column + 9 box masks


def _tables() -> tuple[list[int], list[int]]:
    """``tab``: popcount of each 9-bit mask at [m], digit of each one-bit mask at [512 + m]; ``units``: 27×9 cells."""
    tab = [0] * 1024
    for m in range(512):
        tab[m] = bin(m).count("1")
    for d in range(9):
        tab[512 + (1 << d)] = d + 1
    units = []
    for r in range(9):
        units += [r * 9 + c for c in range(9)]
    for c in range(9):
        units += [r * 9 + c for r in range(9)]
    for b in range(9):
        r0, c0 = 3 * (b // 3), 3 * (b % 3)
        units += [(r0 + i) * 9 + c0 + j for i in range(3) for j in range(3)]
    return tab, units


TAB_LIST, UNITS_LIST = _tables()
TAB = np.array(TAB_LIST, dtype=np.int64)
UNITS = np.array(UNITS_LIST, dtype=np.int64)


@register_jitable
def _search(grid, limit, max_backtracks, stk, bcell, brem, sol, tab, units, stats):
    """Depth-first search with singles propagation; the one implementation both paths run.

    grid: 81 ints (0 blank). limit: stop after this many solutions. max_backtracks: give up beyond this many
    (negative: never). stk: 82·108 ints of scratch (level d holds the state before its guess). bcell, brem: 82
    ints each (branch cell and untried candidates per level). sol: 81 ints, receives the first solution.
    stats: 3 ints, receives [solutions, backtracks, aborted]. Returns the number of solutions found.
    """
    for k in range(_LEVEL):
        stk[k] = 0
    stats[0] = 0
    stats[1] = 0
    stats[2] = 0
    for i in range(81):
        v = grid[i]
        if v != 0:
            bit = 1 << (v - 1)
            r = i // 9
            c = i % 9
            b = (r // 3) * 3 + c // 3
            if (stk[81 + r] | stk[90 + c] | stk[99 + b]) & bit:
                return 0  # two equal clues in one unit: no solution, nothing to search
            stk[i] = bit
            stk[81 + r] |= bit
            stk[90 + c] |= bit
            stk[99 + b] |= bit
    nsol = 0
    backtracks = 0
    d = 0
    while True:
        # ---- propagate at level d -----------------------------------------------------------------------
        o = d * _LEVEL
        status = _BRANCH
        bestc = -1
        bestm = 0
        while True:
            placed = False
            bestn = 10
            empty = 0
            for i in range(81):
                if stk[o + i] == 0:
                    r = i // 9
                    c = i % 9
                    b = (r // 3) * 3 + c // 3
                    m = 511 & ~(stk[o + 81 + r] | stk[o + 90 + c] | stk[o + 99 + b])
                    if m == 0:
                        status = _CONTRADICTION
                        break
                    n = tab[m]
                    if n == 1:  # naked single
                        stk[o + i] = m
                        stk[o + 81 + r] |= m
                        stk[o + 90 + c] |= m
                        stk[o + 99 + b] |= m
                        placed = True
                    else:
                        empty += 1
                        if n < bestn:
                            bestn = n
                            bestc = i
                            bestm = m
            if status == _CONTRADICTION:
                break
            if placed:
                continue
            if empty == 0:
                status = _SOLVED
                break
            for u in range(27):  # hidden singles
                once = 0
                twice = 0
                done = 0
                for k in range(9):
                    i = units[u * 9 + k]
                    if stk[o + i] != 0:
                        done |= stk[o + i]
                    else:
                        r = i // 9
                        c = i % 9
                        b = (r // 3) * 3 + c // 3
                        m = 511 & ~(stk[o + 81 + r] | stk[o + 90 + c] | stk[o + 99 + b])
                        twice |= once & m
                        once |= m
                if (once | done) != 511:
                    status = _CONTRADICTION
                    break
                h = once & ~twice & ~done
                while h != 0:
                    bit = h & -h
                    h ^= bit
                    if stk[o + 81 + u] & bit:  # unit u's mask sits at 81 + u (rows, columns, boxes)
                        continue  # placed meanwhile by another unit's hidden single
                    found = False
                    for k in range(9):
                        i = units[u * 9 + k]
                        if stk[o + i] == 0:
                            r = i // 9
                            c = i % 9
                            b = (r // 3) * 3 + c // 3
                            m = 511 & ~(stk[o + 81 + r] | stk[o + 90 + c] | stk[o + 99 + b])
                            if m & bit:
                                stk[o + i] = bit
                                stk[o + 81 + r] |= bit
                                stk[o + 90 + c] |= bit
                                stk[o + 99 + b] |= bit
                                found = True
                                placed = True
                                break
                    if not found:
                        status = _CONTRADICTION
                        break
                if status == _CONTRADICTION:
                    break
            if status == _CONTRADICTION:
                break
            if not placed:
                break  # stuck: branch on bestc
        # ---- act on the outcome -------------------------------------------------------------------------
        if status == _BRANCH:
            bit = bestm & -bestm
            bcell[d] = bestc
            brem[d] = bestm ^ bit
            o2 = o + _LEVEL
            for k in range(_LEVEL):
                stk[o2 + k] = stk[o + k]
            r = bestc // 9
            c = bestc % 9
            b = (r // 3) * 3 + c // 3
            stk[o2 + bestc] = bit
            stk[o2 + 81 + r] |= bit
            stk[o2 + 90 + c] |= bit
            stk[o2 + 99 + b] |= bit
            d += 1
            continue
        if status == _SOLVED:
            nsol += 1
            if nsol == 1:
                for i in range(81):
                    sol[i] = tab[512 + stk[o + i]]
            if nsol >= limit:
                break
        else:
            backtracks += 1
            if max_backtracks >= 0 and backtracks > max_backtracks:
                stats[2] = 1
                break
        # ---- backtrack to the deepest level with an untried candidate ----------------------------------
        d -= 1
        while d >= 0 and brem[d] == 0:
            d -= 1
        if d < 0:
            break
        bit = brem[d] & -brem[d]
        brem[d] ^= bit
        o = d * _LEVEL
        o2 = o + _LEVEL
        for k in range(_LEVEL):
            stk[o2 + k] = stk[o + k]
        i = bcell[d]
        r = i // 9
        c = i % 9
        b = (r // 3) * 3 + c // 3
        stk[o2 + i] = bit
        stk[o2 + 81 + r] |= bit
        stk[o2 + 90 + c] |= bit
        stk[o2 + 99 + b] |= bit
        d += 1
    stats[0] = nsol
    stats[1] = backtracks
    return nsol


if numba is not None:  # the fast path
    _search_nb = numba.njit(cache=True, nogil=True)(_search)

    @numba.njit(cache=True, nogil=True)
    def _backtracks_nb(puzzles, perms, relabels, max_backtracks, out, tab, units):  # pragma: no cover - compiled
        stk = np.zeros(82 * _LEVEL, np.int64)
        bcell = np.zeros(82, np.int64)
        brem = np.zeros(82, np.int64)
        sol = np.zeros(81, np.int64)
        stats = np.zeros(3, np.int64)
        grid = np.zeros(81, np.int64)
        for n in range(puzzles.shape[0]):
            for s in range(perms.shape[0]):
                for i in range(81):
                    grid[i] = relabels[s, puzzles[n, perms[s, i]]]
                _search_nb(grid, 1, max_backtracks, stk, bcell, brem, sol, tab, units, stats)
                out[n, s] = stats[1] if stats[2] == 0 else -1

    @numba.njit(cache=True, nogil=True)
    def _count_nb(puzzles, limit, out, sols, tab, units):  # pragma: no cover - compiled
        stk = np.zeros(82 * _LEVEL, np.int64)
        bcell = np.zeros(82, np.int64)
        brem = np.zeros(82, np.int64)
        sol = np.zeros(81, np.int64)
        stats = np.zeros(3, np.int64)
        grid = np.zeros(81, np.int64)
        for n in range(puzzles.shape[0]):
            for i in range(81):
                grid[i] = puzzles[n, i]
                sol[i] = 0
            out[n] = _search_nb(grid, limit, -1, stk, bcell, brem, sol, tab, units, stats)
            for i in range(81):
                sols[n, i] = sol[i]

HAVE_NUMBA = numba is not None


def _backend(backend: str) -> str:
    if backend == "auto":
        return "numba" if HAVE_NUMBA else "python"
    if backend not in ("numba", "python"):
        raise ValueError(f"backend must be auto, numba or python, not {backend!r}")
    if backend == "numba" and not HAVE_NUMBA:
        raise missing_extra("numba", "the compiled sudoku solver (backend='numba')")
    return backend


@dataclass(frozen=True)
class SolveResult:
    """``solutions``: how many were found (≤ limit); ``backtracks``: dead ends met; ``solution``: the first one
    (81 ints, or None); ``aborted``: the search passed ``max_backtracks``."""

    solutions: int
    backtracks: int
    solution: Optional[np.ndarray]
    aborted: bool


def _as_board(puzzle) -> np.ndarray:
    board = np.asarray(puzzle, dtype=np.int64).reshape(-1)
    if board.shape != (81,) or board.min() < 0 or board.max() > 9:
        raise ValueError("a sudoku board is 81 integers in 0..9")
    return board


def solve(puzzle, *, limit: int = 1, max_backtracks: int = -1, backend: str = "auto") -> SolveResult:
    """Search ``puzzle`` (81 ints, 0 = blank) for up to ``limit`` solutions, counting backtracks."""
    board = _as_board(puzzle)
    if _backend(backend) == "numba":
        stk, bcell, brem = np.zeros(82 * _LEVEL, np.int64), np.zeros(82, np.int64), np.zeros(82, np.int64)
        sol, stats = np.zeros(81, np.int64), np.zeros(3, np.int64)
        _search_nb(board, limit, max_backtracks, stk, bcell, brem, sol, TAB, UNITS, stats)
    else:
        stk, bcell, brem, sol, stats = [0] * (82 * _LEVEL), [0] * 82, [0] * 82, [0] * 81, [0] * 3
        _search(board.tolist(), limit, max_backtracks, stk, bcell, brem, sol, TAB_LIST, UNITS_LIST, stats)
    n = int(stats[0])
    return SolveResult(n, int(stats[1]), np.asarray(sol, dtype=np.int64) if n else None, bool(stats[2]))


def count_solutions(puzzles, *, limit: int = 2, backend: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """For each puzzle of ``puzzles`` (N, 81): (number of solutions up to ``limit``, first solution or zeros)."""
    puzzles = np.asarray(puzzles, dtype=np.int64).reshape(-1, 81)
    out = np.zeros(len(puzzles), np.int64)
    sols = np.zeros((len(puzzles), 81), np.int64)
    if _backend(backend) == "numba":
        _count_nb(puzzles, limit, out, sols, TAB, UNITS)
    else:
        for n, p in enumerate(puzzles):
            r = solve(p, limit=limit, backend="python")
            out[n] = r.solutions
            if r.solution is not None:
                sols[n] = r.solution
    return out, sols


# ---- symmetries and the rating ----------------------------------------------------------------------------
def random_symmetry(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A uniformly random validity-preserving symmetry: (perm, relabel) with new[i] = relabel[old[perm[i]]].

    Composes: a permutation of the three bands and of the rows inside each, the same for stacks and columns,
    an optional transpose, and a relabelling of the digits (0 stays blank).
    """
    rows = np.concatenate([3 * b + rng.permutation(3) for b in rng.permutation(3)])
    cols = np.concatenate([3 * s + rng.permutation(3) for s in rng.permutation(3)])
    perm = (rows[:, None] * 9 + cols[None, :]).reshape(81)
    if rng.random() < 0.5:
        perm = perm.reshape(9, 9).T.reshape(81)
    relabel = np.concatenate([[0], 1 + rng.permutation(9)])
    return perm.astype(np.int64), relabel.astype(np.int64)


def apply_symmetry(board, perm: np.ndarray, relabel: np.ndarray) -> np.ndarray:
    """The board seen through the symmetry (works on (81,) or (N, 81))."""
    board = np.asarray(board)
    return relabel[board[..., perm]]


def symmetries(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` random symmetries from ``seed``, stacked: perms (count, 81), relabels (count, 10)."""
    rng = np.random.default_rng(seed)
    pairs = [random_symmetry(rng) for _ in range(count)]
    return np.stack([p for p, _ in pairs]), np.stack([r for _, r in pairs])


_RATING_SYMS: Optional[tuple[np.ndarray, np.ndarray]] = None


def backtracks_under(puzzles, perms, relabels, *, max_backtracks: int = -1, backend: str = "auto") -> np.ndarray:
    """Backtracks to the first solution of each puzzle under each symmetry: (N, S) ints (−1 where aborted)."""
    puzzles = np.asarray(puzzles, dtype=np.int64).reshape(-1, 81)
    out = np.zeros((len(puzzles), len(perms)), np.int64)
    if _backend(backend) == "numba":
        _backtracks_nb(puzzles, np.asarray(perms, np.int64), np.asarray(relabels, np.int64), max_backtracks, out,
                       TAB, UNITS)
    else:
        for n, p in enumerate(puzzles):
            for s in range(len(perms)):
                r = solve(apply_symmetry(p, perms[s], relabels[s]), limit=1, max_backtracks=max_backtracks,
                          backend="python")
                out[n, s] = -1 if r.aborted else r.backtracks
    return out


def geometric_rating(counts: np.ndarray) -> np.ndarray:
    """exp(mean log(1 + b)) − 1 along the last axis: the geometric mean of 1 + backtracks, minus 1."""
    return np.expm1(np.log1p(np.asarray(counts, dtype=np.float64)).mean(axis=-1))


def rating(puzzles, *, backend: str = "auto") -> np.ndarray:
    """The toolkit's difficulty of each puzzle (N, 81) → (N,) floats: the median backtrack count over the
    ``RATING_SYMMETRIES`` fixed symmetries of seed ``RATING_SEED`` (the first is the identity)."""
    global _RATING_SYMS
    if _RATING_SYMS is None:
        perms, relabels = symmetries(RATING_SYMMETRIES, RATING_SEED)
        perms[0], relabels[0] = np.arange(81), np.arange(10)
        _RATING_SYMS = perms, relabels
    return np.median(backtracks_under(puzzles, *_RATING_SYMS, backend=backend), axis=-1)


def parse_board(text: str) -> np.ndarray:
    """81 characters, '.' or '0' for a blank → 81 ints."""
    text = text.strip()
    if len(text) != 81 or any(ch not in ".0123456789" for ch in text):
        raise ValueError("a sudoku board is 81 characters of '.', 0–9")
    return np.array([0 if ch == "." else int(ch) for ch in text], dtype=np.int64)


def format_board(board: Iterable[int]) -> str:
    """81 ints → 81 characters with '.' for a blank (the sudoku-extreme format)."""
    return "".join("." if int(v) == 0 else str(int(v)) for v in board)


def is_valid_solution(puzzle, solution) -> bool:
    """``solution`` is a full valid grid that agrees with every clue of ``puzzle``."""
    p, s = _as_board(puzzle), _as_board(solution)
    if (s == 0).any() or ((p != 0) & (p != s)).any():
        return False
    units = UNITS.reshape(27, 9)
    return all(sorted(s[u].tolist()) == list(range(1, 10)) for u in units)
