"""Stage ``a8`` (App. A.8 and basins), the two questions reported apart (:mod:`stability.analysis.initial_iterate`).
Local (A.8): ‖dx_T/de·u‖ at the largest T per converged sample, against T on the first (from stage prop5's unroll
where it ran). Global (basins): x* solved from e ∈ {x0, zeros, noise} besides the model's e, compared between
converged solves only.

A torch-free module (:mod:`stability.analysis.stages.base`): torch and the routines are imported where the stage
runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from stability.analysis.stages.base import Cost, Stage, last
from stability.analysis.thresholds import THRESHOLDS, distinct_tol

if TYPE_CHECKING:
    from stability.analysis.fixed_point import AtFixedPoint

NAME = "a8"
KEY = "initial_iterate"


@dataclass
class InitialIterate:
    """App. A.8 and basins: the fixed points reached from e ∈ {x0, zeros, noise} and ‖dx_T/de‖ against T on one
    sample, and the two questions apart (:mod:`stability.analysis.initial_iterate`): ``local`` (A.8's ‖dx_T/de·u‖
    per converged sample, against a threshold) and ``global_`` (JSON ``global``: x* from different starts, compared
    between converged solves only, against a tolerance relative to ‖x*‖∞). ``fixed_point_distance``: as before, the
    largest distance per sample where every start converged."""

    starts: list
    fixed_point_distance: list
    converged_fraction: dict
    noise_std: float
    T: list = field(default_factory=list)
    dxT_de_norm: list = field(default_factory=list)
    sample: Optional[int] = None
    local: Optional[dict] = None
    global_: Optional[dict] = None

    def to_dict(self) -> dict:
        out = {"starts": self.starts, "fixed_point_distance": self.fixed_point_distance,
               "fixed_point_distance_max": max([d for d in self.fixed_point_distance if d is not None],
                                               default=None),
               "converged_fraction": self.converged_fraction, "noise_std": self.noise_std}
        if self.sample is not None:
            out.update({"T": self.T, "dxT_de_norm": self.dxT_de_norm, "sample": self.sample})
        if self.local is not None:
            out["local"] = self.local
        if self.global_ is not None:
            out["global"] = self.global_
        return out


def _other_starts(at: AtFixedPoint, K: int) -> tuple:
    """The starts besides the model's e (x0, zeros, noise of std ``noise_std``; e = x0 needs a state shaped like x0),
    solved together as one batch of len(new) · B samples (the samples of step are independent, so this is the same
    per-sample iteration at a fraction of the per-iteration overhead). Returns (std, starts, new, x_best, conv)."""
    import torch  # a torch-free module: torch and the solver where the stage runs

    from stability.solvers import Solve, solve

    o = at.options
    x0, e, x_star, converged = at.x0[:K], at.e[:K], at.x_star[:K], at.converged[:K]
    std = 1.0 if o.noise_std is None else float(o.noise_std)
    gen = torch.Generator().manual_seed(o.seed)
    starts = {"x0": x0 if x0.shape == e.shape else None, "zeros": torch.zeros_like(e),
              "noise": torch.randn(e.shape, generator=gen, dtype=torch.float64).to(e) * std}
    starts = {k: v for k, v in starts.items() if v is not None}
    new = [k for k, v in starts.items() if not torch.equal(v, e)]
    B = e.shape[0]
    both = (solve(at.f, torch.cat([starts[k] for k in new]), torch.cat([x0] * len(new)),
                  Solve(method=o.solver, tol=o.tol, max_iter=o.max_iter, name="a8 starts",
                        batched=o.solver_batched)) if new else None)
    x_best, conv = {}, {}
    for k in starts:
        if k in new:
            i = new.index(k)
            x_best[k], conv[k] = both.x_best[i * B:(i + 1) * B], both.converged[i * B:(i + 1) * B]
        else:
            x_best[k], conv[k] = x_star, converged
    return std, starts, new, x_best, conv


def _local(at: AtFixedPoint, a8: InitialIterate, K: int) -> None:
    """A.8's ‖dx_T/de·u‖ at the largest T on every converged sample (the first one's from stage prop5's unroll)."""
    import torch  # a torch-free module: torch and the routines where the stage runs

    from stability.analysis.initial_iterate import initial_iterate_sensitivity_batched, local_dependence

    e, x0, converged = at.e[:K], at.x0[:K], at.converged[:K]
    first, norms = at.first_converged, [None] * e.shape[0]
    if first is not None:
        sens = at.initial_iterate_tangent.sample(0)  # from stage prop5's unroll, or computed now
        a8.T, a8.dxT_de_norm, a8.sample = sens["T"], sens["norm"], first
        if first < K:
            norms[first] = sens["norm"][-1]
        rest = [b for b in converged.nonzero().flatten().tolist() if b != first]
        if rest:
            sel = torch.tensor(rest, device=e.device)
            more = initial_iterate_sensitivity_batched(at.f, e[sel], x0[sel], at.T_grid, seed=at.options.seed)
            for j, b in enumerate(rest):
                norms[b] = float(more.norm[j, -1])
    a8.local = local_dependence(norms, at.T_grid[-1], THRESHOLDS["e_local_max"])


def run(at: AtFixedPoint) -> InitialIterate:
    """App. A.8 and basins on the first K samples (all, but on large states a few: AnalysisOptions.few_samples)."""
    import torch  # a torch-free module: torch and the routines where the stage runs

    from stability.analysis.initial_iterate import fixed_point_distance, global_dependence

    K = at.few
    std, starts, new, x_best, conv = _other_starts(at, K)
    all_conv = torch.stack(list(conv.values())).all(0)
    dist = fixed_point_distance(list(x_best.values()))
    a8 = InitialIterate(starts=list(starts), fixed_point_distance=[d if c else None for d, c in
                                                                   zip(dist.tolist(), all_conv.cpu().tolist())],
                        converged_fraction={k: float(c.double().mean()) for k, c in conv.items()},
                        noise_std=std)
    # global: the model's e and every other start, x* compared only between converged solves
    alias = [k for k in starts if k not in new]
    names = [f"e (= {alias[0]})" if alias else "e", *new]
    a8.global_ = global_dependence(names, [at.x_star[:K], *[x_best[k] for k in new]],
                                   [at.converged[:K], *[conv[k] for k in new]], tol=distinct_tol(at.options.tol))
    _local(at, a8, K)
    return a8


def rows(block: Optional[dict], split: dict) -> list:
    """The global (basins) and the local (A.8) questions on rows of their own, then ‖dx_T/de‖ against T on the
    first converged sample (a report without the two, written before them: its largest distance where every start
    converged, as it was shown then)."""
    if block is None:
        return []
    out = []
    glo, loc = block.get("global"), block.get("local")
    if glo is not None:
        out.append(("x* across starts (global)", f"{glo['differ']} of {glo['compared']} samples differ",
                    f"basins: e ∈ {{{', '.join(glo['starts'])}}}, converged starts only, > {glo['tol']:g} relative "
                    f"L∞ (max {glo['max']:.3g})" if glo.get("max") is not None else
                    "basins: no sample converged from two starts"))
    else:
        d = block.get("fixed_point_distance_max")
        out.append(("x* distance across e", "—" if d is None else f"{d:.3g}",
                    f"max over samples, e ∈ {{{', '.join(block.get('starts', []))}}} (A.8)"))
    if loc is not None:
        out.append(("x* sensitivity to e (local)",
                    f"{loc['exceed']} of {loc['measured']} samples > {loc['threshold']:g}",
                    f"A.8: ‖dx_T/de·u‖ at T = {loc['T']} per converged sample"
                    + (f" (median {loc['median']:.3g}, max {loc['max']:.3g})" if loc.get("max") is not None else "")))
    if block.get("dxT_de_norm"):
        out.append(("‖dx_T/de‖", f"{block['dxT_de_norm'][0]:.3g} (T={block['T'][0]}) → {block['dxT_de_norm'][-1]:.3g} "
                    f"(T={block['T'][-1]})", "A.8: → 0 in the stable regime"))
    return out


def headline(block: Optional[dict], split: dict) -> dict:
    b = block or {}
    out = {"fixed_point_distance_max": b.get("fixed_point_distance_max"),
           "dxT_de_norm_last": last(b.get("dxT_de_norm"))}
    loc, glo = b.get("local"), b.get("global")
    if loc is not None:  # App. A.8's local question: ‖dx_T/de·u‖ at the largest T, per converged sample
        out.update({"e_local_exceed": loc.get("exceed"), "e_local_measured": loc.get("measured"),
                    "e_local_threshold": loc.get("threshold"), "e_local_max": loc.get("max"),
                    "e_local_T": loc.get("T")})
    if glo is not None:  # the global one (basins): x* from different starts, converged solves only
        out.update({"e_global_differ": glo.get("differ"), "e_global_compared": glo.get("compared"),
                    "e_global_tol": glo.get("tol"), "e_global_distance_max": glo.get("max")})
    return out


@dataclass(frozen=True)
class Local:
    """A.8's local question as the verdict reads it: at T, ``exceed`` of ``measured`` samples above ``threshold``."""

    T: Optional[int]
    threshold: Optional[float]
    exceed: Optional[int]
    measured: Optional[int]


@dataclass(frozen=True)
class Global:
    """The global question (basins) as the verdict reads it: ``differ`` of ``compared`` samples by more than
    ``tol``, between the x* from ``starts``."""

    compared: Optional[int]
    differ: Optional[int]
    tol: Optional[float]
    starts: list


@dataclass(frozen=True)
class Evidence:
    """What the verdict reads of the stage: the converged share from each start, the largest distance where every
    start converged (reports written before the two questions), and the local and global questions."""

    converged_fraction: dict
    distance_max: Optional[float]
    local: Optional[Local]
    global_: Optional[Global]

    @classmethod
    def from_block(cls, block: Optional[dict]) -> Optional[Evidence]:
        if block is None:
            return None
        loc, glo = block.get("local"), block.get("global")
        return cls(converged_fraction=block.get("converged_fraction", {}),
                   distance_max=block.get("fixed_point_distance_max"),
                   local=None if loc is None else Local(loc.get("T"), loc.get("threshold"), loc.get("exceed"),
                                                        loc.get("measured")),
                   global_=None if glo is None else Global(glo.get("compared"), glo.get("differ"), glo.get("tol"),
                                                           glo.get("starts", [])))


STAGE = Stage(NAME, KEY, per_sample=True,
              cost=Cost(0.668, 0.33, "sample", "batch", batched=(0.604, 0.48)),
              run=run, rows=rows, headline=headline,
              what="App. A.8's local ‖dx_T/de·u‖ and the basins: x* from e ∈ {e, x0, zeros, noise}")
