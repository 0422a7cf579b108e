"""Stage ``path_independence`` (Anil et al. 2022, Sec. 3: the asymptotic alignment score): every sample's map run
again from another input's x* and from noise, with the solver and budget of stage reachability, and the cosine of
the final state to x* from e (:mod:`stability.analysis.path_independence`, which says which variant and why). An
opt-in stage (``config.OPT_IN_STAGES``): asked for by name, or by a grid's ``analyze_path_independence``.

A torch-free module (:mod:`stability.analysis.stages.base`): the routine is imported where the stage runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from stability.analysis.intervals import format_interval
from stability.analysis.stages.base import Cost, Stage, fmt

if TYPE_CHECKING:
    from stability.analysis.fixed_point import AtFixedPoint

NAME = "path_independence"
KEY = "path_independence"

#: each restart's row: (label, meaning)
_ROWS = {"other": ("AA score, another input's x*", "cos(x* from e, from σ(b)'s x*), median [90 % CI]"),
         "noise": ("AA score, noise start", "cos(x* from e, from N(0, σ²)), median [90 % CI]")}


@dataclass
class PathIndependence:
    """The AA score per sample against each restart (``starts``: {start: block}, a block as
    :func:`stability.analysis.path_independence.alignment` builds it), the permutation σ of the samples whose x*
    the ``other`` restart starts from, the noise std, and the solve's options."""

    samples: int
    starts: dict
    source: Optional[list]
    noise_std: float
    solver: str
    tol: float
    max_iter: int

    def to_dict(self) -> dict:
        return {"samples": self.samples, "starts": list(self.starts), "source": self.source,
                "noise_std": self.noise_std, "solver": self.solver, "tol": self.tol, "max_iter": self.max_iter,
                **self.starts}


def run(at: AtFixedPoint) -> PathIndependence:
    """The AA score of every sample against another input's x* and a noise start (Anil et al. 2022)."""
    # a torch-free module: the routine and the solver's options where the stage runs
    from stability.analysis.path_independence import alignment
    from stability.solvers import Solve

    o = at.options
    std = 1.0 if o.noise_std is None else float(o.noise_std)
    how = Solve(method=o.solver, tol=o.tol, max_iter=o.max_iter, name="path independence")
    starts, source = alignment(at.f, at.x_star, at.x0, how, noise_std=std, seed=o.seed)
    return PathIndependence(samples=int(at.x_star.shape[0]), starts=starts, source=source, noise_std=std,
                            solver=o.solver, tol=o.tol, max_iter=o.max_iter)


def rows(block: Optional[dict], split: dict) -> list:
    """One row per restart: the median AA score with its interval, and the converged share of the restarts."""
    if block is None:
        return []
    out = []
    for start in block.get("starts", []):
        b = block[start]
        label, meaning = _ROWS.get(start, (f"AA score, {start}", "cosine to x* from e"))
        value = f"{fmt(b['median'])} {format_interval(b['interval'])}"
        out.append((label, value, f"{meaning}; {b['converged_fraction']:.0%} of restarts converged"))
    return out


def headline(block: Optional[dict], split: dict) -> dict:
    """The median AA score of each restart and the samples measured; nothing where the stage did not run (a record
    of an analysis without it keeps its shape)."""
    if block is None:
        return {}
    return {"path_aa_other_median": (block.get("other") or {}).get("median"),
            "path_aa_noise_median": (block.get("noise") or {}).get("median"),
            "path_measured": block.get("samples")}


STAGE = Stage(NAME, KEY, per_sample=False,
              cost=Cost(0.146, 0.29, "sample", "batch", batched=(0.136, 0.46)),
              run=run, rows=rows,
              headline=headline, what="asymptotic alignment: x* from another input's x* and from noise, cosine "
                                      "to x* from e (Anil et al. 2022)")
