"""Stage ``repelling`` (App. A.1 case 2): the search for repelling fixed points, roots of g(x) = f(x, x0) − x that
plain iteration cannot reach.

Why a search: a fixed point x* with ρ(J*) > 1, J* = ∂f/∂x at x* (App. A.1, case 2: the center-stable manifold has
measure zero, so almost every start is repelled; Props. 3–4), is practically never reached by Picard iteration,
so "no repelling fixed point" is not a measurement when the fixed points were found by iterating. A root-finder
on g can converge to one. :func:`search` runs limited-memory Broyden (``solve(method="broyden")``,
:mod:`stability.solvers`) per sample from the Picard iterate x_best (x* where the solve converged, else its
lowest-residual iterate) and from ``starts`` Gaussian perturbations of it, δ = s · max(‖x_best‖₂, √n) · ξ / ‖ξ‖₂
(relative size s, ξ seeded), each with a budget of ``budget`` iterations and the analysis' residual τ. The roots
found are merged up to ``distinct_tol`` (relative L∞, :func:`stability.stats.distinct_clusters`) and each
distinct root is classified by ρ(J) there: *repelling* ρ > 1 + m, *attracting* ρ < 1 − m, else *marginal*
(App. A.1 case 3, non-hyperbolic; m = max(1e-4, 10 τ): a root known to residual τ cannot be told from ρ = 1
closer than that, and a neutral direction of f gives a continuum of roots with ρ = 1 to about 1e-6). ρ is
computed by :func:`stability.numerics.spectra.spectral_radius` (route ``auto``: dense for small states,
Krylov–Schur on Jᵀ above); at the Picard x* itself stage ``rho``'s value is reused. A start that ends without a
root after spending its budget (max-iterations or stalled) makes the sample ``ran_out``: the search there is
incomplete. Finding no repelling root is evidence only up to these starts and
this budget, which is what the report says.

A torch-free module (:mod:`stability.analysis.stages.base`): torch, the solver and the numerics are imported where
the search runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from stability.analysis.stages.base import Cost, Stage
from stability.analysis.thresholds import distinct_tol
from stability.stats import linked_clusters

if TYPE_CHECKING:
    import torch

    from stability.analysis.fixed_point import AtFixedPoint

NAME = "repelling"
KEY = "repelling"

#: the band |ρ − 1| ≤ max(MARGIN, 10 τ) of roots classified marginal (neither repelling nor attracting)
MARGIN = 1e-4
#: statuses of a start that spent its whole budget without reaching a root (the search there ran out)
RAN_OUT = ("max-iterations", "stalled")


@dataclass
class RepellingSearch:
    """Per sample: the distinct roots found, ρ(J) at each, how many repel (ρ > 1 + m), attract (ρ < 1 − m) or are
    marginal, the status
    of every start, and whether a start ran out of budget; the split's summary in :meth:`to_dict`."""

    starts: int  # perturbed starts per sample (besides the Picard iterate)
    scale: float
    budget: int
    tol: float
    distinct_tol: float
    roots: list = field(default_factory=list)  # per sample: number of distinct roots found
    rho: list = field(default_factory=list)  # per sample: ρ(J) at each distinct root
    repelling: list = field(default_factory=list)  # per sample: roots with ρ > 1 + margin
    attracting: list = field(default_factory=list)  # per sample: roots with ρ < 1 − margin
    marginal: list = field(default_factory=list)  # per sample: roots with |ρ − 1| ≤ margin (or ρ not finite)
    margin: float = MARGIN
    ran_out: list = field(default_factory=list)  # per sample: a start spent its budget without a root
    start_status: list = field(default_factory=list)  # per sample: the solver's status of each start
    nfe: list = field(default_factory=list)  # per sample: evaluations of f over its starts
    rho_products: int = 0
    points: list = field(default_factory=list, repr=False)  # per sample: the distinct roots (tensors; not in JSON)

    @property
    def searched(self) -> int:
        return len(self.roots)

    def summary(self) -> dict:
        """The split's numbers: samples searched, with a repelling root found, that ran out; roots in all."""
        return {"searched": self.searched, "samples_with_repelling": sum(1 for r in self.repelling if r),
                "samples_ran_out": sum(1 for r in self.ran_out if r), "roots_total": sum(self.roots),
                "repelling_total": sum(self.repelling), "attracting_total": sum(self.attracting),
                "marginal_total": sum(self.marginal), "samples_with_marginal": sum(1 for r in self.marginal if r),
                "starts_per_sample": 1 + self.starts}

    def to_dict(self) -> dict:
        m = self.margin
        return {"method": "broyden on g(x) = f(x, x0) − x", "starts": 1 + self.starts,
                "start_points": f"x_best (the Picard iterate) and {self.starts} Gaussian perturbations of relative "
                                f"size {self.scale:g} (‖δ‖₂ = {self.scale:g} · max(‖x_best‖₂, √n))",
                "perturbation_scale": self.scale, "budget": self.budget, "tol": self.tol,
                "distinct_tol": self.distinct_tol, "margin": m,
                "classified_by": f"ρ(J) at the root: repelling > 1 + {m:g}, attracting < 1 − {m:g}, else marginal",
                **self.summary(), "roots": self.roots, "repelling": self.repelling, "attracting": self.attracting,
                "marginal": self.marginal, "rho": self.rho, "ran_out": self.ran_out,
                "start_status": self.start_status, "nfe": self.nfe, "rho_products": self.rho_products}


def perturbed_starts(x_best: torch.Tensor, starts: int, scale: float, seed: int) -> torch.Tensor:
    """(1 + starts, B, *S): x_best, then ``starts`` Gaussian perturbations of relative size ``scale`` each
    (‖δ‖₂ = scale · max(‖x_best‖₂, √n) per sample; ξ from ``Generator().manual_seed(seed)``, drawn on the CPU)."""
    import torch  # a torch-free module: torch where the search runs

    B, n = x_best.shape[0], x_best[0].numel()
    gen = torch.Generator().manual_seed(seed)
    ref = x_best.flatten(1).double().norm(dim=1).clamp_min(math.sqrt(n)).cpu()  # (B,)
    out = [x_best]
    for _ in range(starts):
        xi = torch.randn((B, n), generator=gen, dtype=torch.float64)
        delta = xi * (scale * ref / xi.norm(dim=1)).unsqueeze(1)
        out.append(x_best + delta.view_as(x_best).to(x_best))
    return torch.stack(out)


def search(f: Callable, x_best: torch.Tensor, x0: torch.Tensor, *, starts: int = 3, scale: float = 0.5,
           budget: int = 100, tol: float = 1e-5, distinct_tol: float = 1e-3, seed: int = 0,
           rho_at_best: Optional[list] = None, eig_tol: float = 1e-6, eig_k: int = 3,
           restart: str = "auto", batched: Optional[bool] = None) -> RepellingSearch:
    """Roots of f(x, x0) − x from x_best and ``starts`` perturbations of it, per sample, classified by ρ(J)
    (module docstring). ``rho_at_best``: ρ(J) at x_best per sample where already known (stage ``rho``), reused
    for a root that is x_best itself. Every start of every sample is one row of one batched Broyden solve; the
    distinct roots of every sample are told apart at once on the device, and ρ at them is one eigensolver batch
    (``restart``: :func:`~stability.numerics.eigen.krylov_schur`'s, ``AnalysisOptions.eig_restart``; ``batched``:
    the solver's, ``AnalysisOptions.solver_batched``)."""
    import torch  # a torch-free module: torch, the numerics and the solver where the search runs

    from stability.numerics import Linearisation, spectral_radius
    from stability.solvers import solve

    B = x_best.shape[0]
    S = 1 + starts
    X = perturbed_starts(x_best, starts, scale, seed)  # (S, B, *shape)
    sol = solve(f, X.flatten(0, 1), torch.cat([x0] * S), method="broyden", tol=tol, max_iter=budget,
                max_period=0, certify_rho=False, batched=batched)
    roots = sol.x_best.view(S, B, *x_best.shape[1:])
    conv = sol.converged.view(S, B)
    status = [sol.status[k * B:(k + 1) * B] for k in range(S)]
    nfe = sol.nfe.view(S, B).sum(0).tolist()
    m = max(MARGIN, 10 * tol)
    out = RepellingSearch(starts=starts, scale=scale, budget=budget, tol=tol, distinct_tol=distinct_tol, nfe=nfe,
                          margin=m)
    reps, known = _distinct_roots(roots, conv, x_best, rho_at_best, distinct_tol, out, status)
    todo = [i for i, r in enumerate(known) if r is None]
    rho = list(known)
    if todo:
        bs = torch.tensor([reps[i][0] for i in todo], device=roots.device)
        ks = torch.tensor([reps[i][1] for i in todo], device=roots.device)
        spec = spectral_radius(Linearisation(f, roots[ks, bs], x0[bs]), tol=eig_tol, k=eig_k, seed=seed,
                               restart=restart)
        for i, v in zip(todo, spec.rho.detach().double().cpu().tolist()):
            rho[i] = float(v)
        out.rho_products = int(getattr(spec, "matvecs", 0) or 0)
    mine: list = [[] for _ in range(B)]
    for (b, _), r in zip(reps, rho):
        mine[b].append(r)
    out.rho = mine
    out.repelling = [sum(1 for r in rs if r > 1.0 + m) for rs in mine]
    out.attracting = [sum(1 for r in rs if r < 1.0 - m) for rs in mine]
    out.marginal = [len(rs) - a - c for rs, a, c in zip(mine, out.repelling, out.attracting)]
    out.points = _Points(roots, reps, B)
    return out


class _Points:
    """Per sample, the distinct roots (tensors, views of the solve's batch), made when read: ``points[b]``."""

    def __init__(self, roots, reps: list, B: int):
        self.roots, self.reps, self.B = roots, reps, B

    def __getitem__(self, b: int) -> list:
        return [self.roots[k, s] for (s, k) in self.reps if s == b]

    def __len__(self) -> int:
        return self.B


def _distinct_roots(roots, conv, x_best, rho_at_best, tol: float, out: RepellingSearch, status: list) -> tuple:
    """The distinct converged roots of every sample, with one transfer to the host: the linked graph
    (:func:`stability.stats.distinct_clusters`' metric, atol 1e-8, rtol ``tol``) between its starts, and which
    root is x_best itself, computed for all samples at once. Fills ``out.roots``, ``start_status``, ``ran_out``;
    returns the (sample, start) of each distinct root and ρ where it is known (x_best itself, stage rho's)."""
    import torch  # a torch-free module: torch where the search runs

    S, B = roots.shape[:2]
    flat = roots.flatten(2).double()  # (S, B, n)
    finite = torch.isfinite(flat).all(2)
    scale = flat.abs().amax(2)
    linked = torch.zeros(S, S, B, dtype=torch.bool, device=roots.device)
    for i in range(S):  # a pair of starts at a time: S² / 2 steps whatever the batch, B · n memory each
        for j in range(i + 1, S):
            d = (flat[i] - flat[j]).abs().amax(1)
            linked[i, j] = linked[j, i] = (d <= 1e-8 + tol * torch.maximum(scale[i], scale[j])) & finite[i] & finite[j]
    same = (roots == x_best.unsqueeze(0)).flatten(2).all(2)  # torch.equal per (start, sample)
    linked, conv, same = (t.cpu().tolist() for t in (linked.permute(2, 0, 1), conv.T, same.T))
    reps, known = [], []
    for b in range(B):
        found = [k for k in range(S) if conv[b][k]]
        _, labels = linked_clusters([[linked[b][i][j] for j in found] for i in found]) if found else (0, [])
        firsts = [found[labels.index(c)] for c in range(len(set(labels)))]
        for k in firsts:
            r = None if rho_at_best is None else rho_at_best[b]
            reps.append((b, k))
            known.append(float(r) if same[b][k] and r is not None and math.isfinite(r) else None)
        out.roots.append(len(firsts))
        out.start_status.append([status[k][b] for k in range(S)])
        out.ran_out.append(any(status[k][b] in RAN_OUT for k in range(S)))
    return reps, known


def run(at: AtFixedPoint) -> RepellingSearch:
    """The search on the first K samples (a few on large states); stage rho's ρ is reused at x* itself."""
    o, spec, K = at.options, at.jacobian_spectra, at.few
    return search(at.f, at.x_star[:K], at.x0[:K], starts=o.repelling_starts, scale=o.repelling_scale,
                  budget=o.repelling_budget, tol=o.tol, distinct_tol=distinct_tol(o.tol), seed=o.seed,
                  rho_at_best=None if spec is None else spec.rhos[:K], eig_tol=o.eig_tol, eig_k=o.eig_k,
                  restart=o.eig_restart, batched=o.solver_batched)


def rows(block: Optional[dict], split: dict) -> list:
    """The text report's row of the stage (quantity, value, meaning); none when the stage did not run."""
    if block is None:
        return []
    n, k = block.get("searched", 0), block.get("samples_with_repelling", 0)
    value = (f"{k} of {n} samples" if k else f"none found in {n} samples") + (
        f" ({block.get('repelling_total', 0)} of {block.get('roots_total', 0)} distinct roots"
        + (f", {block['marginal_total']} marginal" if block.get("marginal_total") else "") + ")")
    out = block.get("samples_ran_out", 0)
    return [("repelling fixed points", value,
             f"Broyden on f(x) − x from x_best + {block.get('starts', 1) - 1} perturbations (relative size "
             f"{block.get('perturbation_scale', 0):g}), ≤ {block.get('budget')} iterations each; ρ(J) > 1 + "
             f"{block.get('margin', 0):g} at the root" + (f"; {out} sample(s) ran out of budget" if out else ""))]


def headline(block: Optional[dict], split: dict) -> dict:
    if block is None:  # the root-finder search for repelling fixed points, where the stage ran
        return {}
    return {"repelling_found": block.get("samples_with_repelling"), "repelling_searched": block.get("searched"),
            "repelling_starts": block.get("starts"), "repelling_budget": block.get("budget"),
            "repelling_ran_out": block.get("samples_ran_out"), "repelling_roots": block.get("roots_total")}


@dataclass(frozen=True)
class Evidence:
    """What the verdict reads of the stage: of ``searched`` samples, ``found`` with a repelling root and ``ran_out``
    of budget, by ``starts`` root-finder starts each; the marginal roots (|ρ − 1| ≤ ``margin``)."""

    searched: Optional[int]
    found: Optional[int]
    ran_out: Optional[int]
    starts: Optional[int]
    marginal_total: Optional[int]
    samples_with_marginal: Optional[int]
    margin: Optional[float]

    @classmethod
    def from_block(cls, block: Optional[dict]) -> Optional[Evidence]:
        if block is None:
            return None
        return cls(searched=block.get("searched"), found=block.get("samples_with_repelling"),
                   ran_out=block.get("samples_ran_out"), starts=block.get("starts"),
                   marginal_total=block.get("marginal_total"), samples_with_marginal=block.get("samples_with_marginal"),
                   margin=block.get("margin"))


#: its cost fitted on untrained models (benchmarks/forecast_fit.py); the ρ(J) at every distinct root found dominates
#: where there are many (measured before on two width-32 prefix-sums checkpoints: 0.13–1.1 s a split)
STAGE = Stage(NAME, KEY, per_sample=True,
              cost=Cost(0.0307, 0.90, "sample", "batch", batched=(0.0342, 0.89)),
              run=run, rows=rows, headline=headline,
              what="repelling fixed points: roots of f(x) − x by Broyden, classified by ρ(J) (App. A.1)")
