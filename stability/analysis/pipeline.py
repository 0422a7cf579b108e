"""The analysis of one split, as a sequence of stages, gathered into one :class:`SplitAnalysis`.

A stage is a function of the run so far that returns its result object:

==================  ====================================================  =====================================
stage               what                                                  result (JSON key)
==================  ====================================================  =====================================
``reachability``    x* by the solver, statuses, cycles (Section 3.2)      :class:`Reachability` (fixed_point)
``rho``             ρ(J*), σ_max, leading eigenvalues (Props. 3–4)        :class:`JacobianSpectra` (jacobian)
``prop4``           ρ(M) from the named parts, against autograd           :class:`Prop4Result` (prop4)
``rho_wx``          ρ(W_x) of the recall weight (Figs. 6–7)               :class:`RecallWeight` (recall)
``prop5``           the unrolled input-gradient → the implicit one        :class:`Prop5Stage` (prop5)
``input``           ‖dx*/dx0‖_F (Prop. 5)                                 :class:`InputDependence`
``a8``              x* from e ∈ {x0, zeros, noise}, ‖dx_T/de‖ (App. A.8)  :class:`InitialIterate`
``accuracy``        accuracy against iteration and at x* (Fig. 3)         :class:`AccuracyCurve`
``geometry``        radii of stability in parameter space, anisotropy     :class:`~stability.analysis.geometry.Geometry`
                    (Section 3.2, App. B.2; opt-in in the library)        (geometry)
==================  ====================================================  =====================================

``reachability`` always runs (every other stage reads x*). ``geometry`` perturbs the parameters and re-solves, so
it is not among the library's and the sweep's default stages (:data:`DEFAULT_STAGES`); ``stability analyze`` runs
every stage (:data:`STAGES`) unless ``--only`` says otherwise. Prop. 4 and ρ(W_x) need a model with
:class:`~stability.protocols.RecallParts` and are :class:`NotApplicable` otherwise; accuracy needs targets.
The stages use the :class:`~stability.protocols.LoopedModel` contract only. ``SplitAnalysis.to_json()`` is the
JSON block ``stability analyze`` writes per split; the text report, the plots and the sweep summary read it.
"""

from __future__ import annotations

import copy
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import torch

from stability.errors import StabilityError, first_line
from stability.stats import median

#: stage names, in the order they run
STAGES = ("reachability", "rho", "prop4", "rho_wx", "prop5", "input", "a8", "accuracy", "geometry")
#: the stages of ``AnalysisOptions()`` (the library's and the sweep's default): all but geometry, which a grid or
#: a caller asks for (``stability analyze`` runs :data:`STAGES`)
DEFAULT_STAGES = tuple(s for s in STAGES if s != "geometry")
#: the JSON block of each stage
STAGE_KEYS = {"reachability": "fixed_point", "rho": "jacobian", "prop4": "prop4", "rho_wx": "recall",
              "prop5": "prop5", "input": "input_dependence", "a8": "initial_iterate", "accuracy": "accuracy",
              "geometry": "geometry"}
FORMAT = "stability-analysis"
#: 3: the geometry stage and the verdict on the paper's three axes (reachable, input-dependent, geometry); A.8's
#: independence of e is a fact of the reachable line. 2 (and files without a version) are still read by compare.
SCHEMA_VERSION = 3


def parse_stages(text) -> tuple:
    """``"rho,prop5"`` (or a sequence of names) → the stages to run, in run order, ``reachability`` included."""
    names = [s.strip() for s in (text.split(",") if isinstance(text, str) else text) if s.strip()]
    bad = [s for s in names if s not in STAGES]
    if bad or not names:
        what = f"unknown stage {', '.join(map(repr, bad))}" if bad else "no stage given"
        raise StabilityError(f"{what}; allowed: {', '.join(STAGES)}")
    return tuple(s for s in STAGES if s in names or s == "reachability")


@dataclass(frozen=True)
class AnalysisOptions:
    """What ``stability analyze`` exposes (samples, solver, tol, max_iter, iterations, device, stages) and the
    numerical settings below it (reported in the JSON). A field's ``metadata`` (help, metavar, choices) is what
    ``stability analyze`` shows for its flag, with the default read from here.

    ``noise_std``: std of the Gaussian start of App. A.8 (None: the checkpoint's configured ``noise_std``, 1 for a
    model of one's own). ``stages``: which stages to run (:data:`STAGES`; ``reachability`` always runs).
    """

    samples: int = field(default=32, metadata={
        "metavar": "N", "help": "analyse the first N samples of each split (or of --inputs), in order"})
    solver: str = field(default="picard", metadata={
        "choices": ("picard", "anderson"),
        "help": "fixed-point solver (picard: plain iteration, the reachability the paper means)"})
    tol: float = field(default=1e-5, metadata={"metavar": "F", "help": "relative L∞ residual τ for convergence"})
    max_iter: int = field(default=500, metadata={"metavar": "N", "help": "solver iterations"})
    iterations: int = field(default=500, metadata={  # T_max of the accuracy curve
        "metavar": "T", "help": "accuracy is measured at iterations 1..T"})
    device: str = field(default="cpu", metadata={
        "metavar": "DEV", "help": "where to compute: cpu, auto (cuda when available), cuda or cuda:N"})
    eig_k: int = 3
    eig_tol: float = 1e-6
    gmres_tol: float = 1e-10
    probes: int = field(default=4, metadata={"metavar": "K", "help": "random probes of the ‖dx*/dx0‖_F estimate"})
    prop4_columns: int = 256
    seed: int = 0
    eig_route: str = field(default="arnoldi", metadata={
        "choices": ("arnoldi", "arpack"), "help": "ρ(J*) and σ_max by the torch Krylov–Schur iteration (arnoldi: "
        "batched, GPU-capable) or by scipy's ARPACK per sample (arpack)"})
    eig_batch: Optional[int] = None  # samples per Arnoldi batch; None: 1 on the CPU, all on CUDA
    eig_precision: str = field(default="mixed", metadata={
        "choices": ("mixed", "float64"), "help": "products of the ρ(J*) eigensolver: mixed (float32, every result "
        "certified by a float64 residual and re-solved in float64 where it misses) or float64"})
    noise_std: Optional[float] = field(default=None, metadata={
        "metavar": "F", "help": "std of the noise start of App. A.8 (default: the checkpoint's noise_std; 1 for "
        "--model)"})
    # splits analysed side by side on the CPU, one process each, sharing torch's threads (None: one per split, up to
    # the thread count; ``stability analyze`` and ``demo`` use None). 1 in the library: a spawned process re-imports
    # the caller's main module, which a script without ``if __name__ == "__main__":`` cannot survive
    workers: Optional[int] = 1
    stages: tuple = DEFAULT_STAGES
    # the geometry stage (stability/analysis/geometry.py): radii along K directions (both signs) on the first
    # geometry_samples samples, to a relative bracket width geometry_accuracy
    geometry_directions: int = field(default=8, metadata={
        "metavar": "K", "help": "geometry: random directions in all loop parameters, each measured with both signs"})
    geometry_samples: int = field(default=1, metadata={
        "metavar": "N", "help": "geometry: radii are measured for the first N samples of each split"})
    geometry_accuracy: float = field(default=0.1, metadata={
        "metavar": "F", "help": "geometry: bisect each radius until its bracket [lo, hi] has hi/lo ≤ 1 + F"})
    geometry_group_directions: int = field(default=1, metadata={
        "metavar": "K", "help": "geometry: directions within each parameter group (W_x, attention, MLP, norms, "
        "embedding, ...), both signs; 0: no per-group radii"})
    geometry_certify: int = field(default=4, metadata={
        "metavar": "N", "help": "geometry: radii whose ρ(J*) is certified at both ends of the final bracket "
        "(the first N that ρ decided)"})
    # the ρ(J*) picture over the plane of two directions, N × N cells (0: none); not a flag with this default:
    # `stability analyze --geometry-plane N` defaults to 15 with --plots and to 0 without
    geometry_plane: int = 0

    def __post_init__(self):
        for name, allowed in (("eig_route", ("arnoldi", "arpack")), ("eig_precision", ("mixed", "float64")),
                              ("solver", ("picard", "anderson"))):
            if getattr(self, name) not in allowed:
                raise StabilityError(f"unknown {name} {getattr(self, name)!r}; allowed: {', '.join(allowed)}")
        object.__setattr__(self, "stages", parse_stages(self.stages))
        if self.noise_std is not None and not (np.isfinite(self.noise_std) and self.noise_std >= 0):
            raise StabilityError(f"noise_std must be a finite number ≥ 0, got {self.noise_std!r}")
        for name in ("geometry_directions", "geometry_samples"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise StabilityError(f"{name} must be an integer ≥ 1, got {getattr(self, name)!r}")
        for name in ("geometry_group_directions", "geometry_certify", "geometry_plane"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 0):
                raise StabilityError(f"{name} must be an integer ≥ 0, got {getattr(self, name)!r}")
        if not (np.isfinite(self.geometry_accuracy) and 0 < self.geometry_accuracy < 1):
            raise StabilityError(f"geometry_accuracy must be in (0, 1), got {self.geometry_accuracy!r}")
        if self.workers is not None and not (isinstance(self.workers, int) and self.workers >= 1):
            raise StabilityError(f"workers must be an integer ≥ 1, got {self.workers!r}")
        from stability.config import is_device_name

        if not is_device_name(str(self.device)):
            raise StabilityError(f"device {self.device!r}: expected auto, cpu, cuda or cuda:N")

    def to_dict(self) -> dict:
        out = asdict(self)
        out["stages"] = list(self.stages)
        return out


def analysis_model(model: torch.nn.Module, dtype: torch.dtype = torch.float64, device: Optional[str] = None):
    """A float64 (by default) copy of the model for analysis: eval mode, no parameter gradients."""
    m = copy.deepcopy(model).to(dtype=dtype)
    if device is not None:
        m = m.to(device)
    m.eval()
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def _median(values) -> Optional[float]:
    """The median of the finite values (:func:`stability.stats.median`, shared with the sweep and the monitor)."""
    return median(values)


def _to_dict(obj) -> Any:
    return obj.to_dict() if hasattr(obj, "to_dict") else obj


# ---- result objects of the stages that have none elsewhere ------------------------------------------------

@dataclass
class NotApplicable:
    """A stage that does not apply to this model (e.g. Prop. 4 without named recall parts), and why."""

    reason: str

    def to_dict(self) -> dict:
        return {"applicable": False, "reason": self.reason}


@dataclass
class JacobianSpectra:
    """ρ(J*), σ_max(J*) and the leading eigenvalues per sample (Props. 3–4, App. A.4), at x_best."""

    method: str
    spectral_radius: list
    sigma_max: list
    eigenvalues: list
    eigen_converged: list
    converged: list  # the solver's converged mask, for the medians

    def to_dict(self) -> dict:
        c = self.converged
        return {
            "evaluated_at": "x_best: the fixed point where status is converged, else the lowest-residual iterate",
            "method": self.method,
            "spectral_radius": self.spectral_radius,
            "spectral_radius_median": _median([r for r, ok in zip(self.spectral_radius, c) if ok]),
            "spectral_radius_median_all": _median(self.spectral_radius),
            "sigma_max": self.sigma_max,
            "sigma_max_median": _median([s for s, ok in zip(self.sigma_max, c) if ok]),
            "eigenvalues": self.eigenvalues,
            "eigen_converged": self.eigen_converged,
        }


@dataclass
class RecallWeight:
    """ρ(W_x) and the leading eigenvalues of the recall weight (bias ignored; Figs. 6–7)."""

    rho_Wx: float
    eigenvalues: list

    def to_dict(self) -> dict:
        return {"rho_Wx": self.rho_Wx, "eigenvalues": self.eigenvalues}


@dataclass
class Prop5Stage:
    """Prop. 5 on the first converged sample: :class:`~stability.analysis.prop5.Prop5Check`, or why not."""

    check: Any = None
    sample: Optional[int] = None
    x_star_residual: Optional[float] = None
    skipped: Optional[str] = None

    def to_dict(self) -> dict:
        base = ({"T": [], "rel_error": [], "gmres_residual": None} if self.check is None else self.check.to_dict())
        out = {**base, "sample": self.sample}
        if self.x_star_residual is not None:
            out["x_star_residual"] = self.x_star_residual
        if self.skipped:
            out["skipped"] = self.skipped
        out["note"] = "dx_T/dx0 unrolled from e held fixed, as Prop. 5 states it (by A.8 the limit is the same)"
        return out


@dataclass
class InputDependence:
    """‖dx*/dx0‖_F per converged sample (Hutchinson estimate; Prop. 5), None elsewhere."""

    frobenius: list
    probes: int

    def to_dict(self) -> dict:
        return {"frobenius": self.frobenius, "frobenius_median": _median(self.frobenius), "probes": self.probes,
                "quantity": "‖dx*/dx0‖_F (Hutchinson estimate, Prop. 5)"}


@dataclass
class InitialIterate:
    """App. A.8: the fixed points reached from e ∈ {x0, zeros, noise} and ‖dx_T/de‖ against T."""

    starts: list
    fixed_point_distance: list
    converged_fraction: dict
    noise_std: float
    T: list = field(default_factory=list)
    dxT_de_norm: list = field(default_factory=list)
    sample: Optional[int] = None

    def to_dict(self) -> dict:
        out = {"starts": self.starts, "fixed_point_distance": self.fixed_point_distance,
               "fixed_point_distance_max": max([d for d in self.fixed_point_distance if d is not None],
                                               default=None),
               "converged_fraction": self.converged_fraction, "noise_std": self.noise_std}
        if self.sample is not None:
            out.update({"T": self.T, "dxT_de_norm": self.dxT_de_norm, "sample": self.sample})
        return out


# ---- the verdict ------------------------------------------------------------------------------------------

#: thresholds of the verdict (stated in the report and in the JSON). The geometry ones are set between measured
#: references (benchmarks/RESULTS.md, "Geometry stage"): the toy regions of Figure 5 (internal recall's band, the
#: narrow one of Table 3, against external's) and the demo-sized prefix-sums checkpoints of both recall placements
#: with pre- and post-norm.
THRESHOLDS = {
    "reachable_share": 0.9,  # share of samples whose plain iteration converges
    "rho_margin": 0.0,  # median ρ(J*) over converged samples must be below 1 − margin
    "input_grad_min": 1e-3,  # median ‖dx*/dx0‖_F at least this
    "prop5_rel_error_max": 1e-4,  # the unrolled gradient at T_max within this of the implicit one
    "e_distance_max": 1e-3,  # largest relative distance between the x* from different e (or 100·τ if larger)
    "geometry_radius_min": 0.1,  # median radius of stability (relative step in parameter space) at least this
    "geometry_log_iqr_max": 0.4,  # anisotropy: interquartile range of log r over the directions at most this
}

#: the verdict's axes, in the paper's order (Section 3.2)
AXES = ("reachable", "input_dependent", "geometry")


@dataclass
class Verdict:
    """The paper's three axes (Section 3.2) in words and numbers: reachable, input-dependent, geometry.

    Each axis is "yes", "no", "partly" or "not measured", with the numbers it was decided on and the thresholds
    (:data:`THRESHOLDS`). Independence of the initial iterate (App. A.8) is a consequence of attraction, not an
    axis: it is a fact of the reachable line (``from_every_start``: yes, partly, no or None when not measured)."""

    reachable: str
    input_dependent: str
    geometry: str
    numbers: dict
    thresholds: dict
    reasons: dict
    from_every_start: Optional[str] = None

    def to_dict(self) -> dict:
        return {"reachable": self.reachable, "input_dependent": self.input_dependent, "geometry": self.geometry,
                "from_every_start": self.from_every_start, "numbers": self.numbers, "thresholds": self.thresholds,
                "reasons": self.reasons}


def _geometry_axis(geo: Optional[dict], th: dict) -> tuple:
    """(decision, reason, numbers) of the geometry axis from the stage's JSON block."""
    if geo is None:
        return ("not measured", "stage not run (stability analyze runs it unless --only leaves it out; --only "
                "geometry runs it alone)", {})
    summ = geo.get("summary") or {}
    r, iqr, lr = summ.get("median_radius"), summ.get("log_iqr"), summ.get("log_range")
    bal, t0 = summ.get("balance"), summ.get("unstable_t0")
    n_att, n = summ.get("attracting_samples", 0), summ.get("samples", len(geo.get("samples", [])))
    nums = {"geometry_median_radius": r, "geometry_log_iqr": iqr, "geometry_log_range": lr,
            "geometry_balance": bal, "geometry_unstable_t0": t0}
    groups = [g for g in geo.get("groups") or [] if g.get("median_radius") is not None]
    narrow = min(groups, key=lambda g: g["median_radius"]) if groups else None
    if narrow is not None:
        nums["geometry_narrowest_group"] = narrow["name"]
        nums["geometry_narrowest_group_radius"] = narrow["median_radius"]
    K = geo.get("directions")
    where = f"{n} sample(s) × {K} directions × ±"
    if not n_att:
        return "no", f"x* does not attract at θ* on the {n} geometry sample(s): every radius is 0", nums
    wide, round_ = r >= th["geometry_radius_min"], iqr is not None and iqr <= th["geometry_log_iqr_max"]
    dec = "yes" if wide and round_ else ("partly" if wide or round_ else "no")
    if n_att < n and dec == "yes":
        dec = "partly"
    text = (f"median radius {r:.3g} {'≥' if wide else '<'} {th['geometry_radius_min']:g}, anisotropy: IQR of log r "
            f"{iqr:.2g} {'≤' if round_ else '>'} {th['geometry_log_iqr_max']:g} (log max/min {lr:.2g}, balance "
            f"{bal:.2g}); {t0:.0%} unstable at t → 0 ({where})")
    if n_att < n:
        text += f"; x* attracts at θ* on {n_att} of {n} samples"
    if narrow is not None:
        text += f"; narrowest part: {narrow['name']} ({narrow['median_radius']:.3g})"
    return dec, text, nums


def verdict(results: dict, *, tol: float) -> Verdict:
    """Decide the three axes from the stages' JSON blocks (``results``: stage key → block or None)."""
    th = {**THRESHOLDS, "e_distance_max": max(THRESHOLDS["e_distance_max"], 100 * tol)}
    fp, jac = results.get("fixed_point") or {}, results.get("jacobian")
    ind, p5, a8 = results.get("input_dependence"), results.get("prop5"), results.get("initial_iterate")
    share = fp.get("converged_fraction")
    rho = (jac or {}).get("spectral_radius_median")
    nums = {"converged_fraction": share, "rho_J_median": rho, "rho_margin": None if rho is None else 1.0 - rho,
            "distinct_fixed_points": fp.get("distinct_fixed_points"),
            "converged": None if share is None else int(round(share * fp.get("samples", len(fp.get("status", []))))),
            "input_grad_median": (ind or {}).get("frobenius_median"),
            "prop5_rel_error": (p5 or {}).get("rel_error", [None])[-1] if (p5 or {}).get("rel_error") else None,
            "e_distance_max": (a8 or {}).get("fixed_point_distance_max")}
    reasons = {}
    # reachable: share converged, median ρ(J*) < 1 − margin
    limit = 1.0 - th["rho_margin"]
    if not share:
        reach, reasons["reachable"] = "no", "no sample converged under plain iteration"
    elif jac is None:
        reach = "yes" if share >= th["reachable_share"] else "partly"
        reasons["reachable"] = f"{share:.0%} converged; ρ(J*) not measured"
    elif rho is None:
        reach, reasons["reachable"] = "partly", f"{share:.0%} converged; ρ(J*) not available"
    elif rho >= limit:
        reach, reasons["reachable"] = "no", f"median ρ(J*) = {rho:.4g} ≥ {limit:g}: x* is not attracting"
    else:
        reach = "yes" if share >= th["reachable_share"] else "partly"
        reasons["reachable"] = (f"{share:.0%} converged (threshold {th['reachable_share']:.0%}), median ρ(J*) = "
                                f"{rho:.4g}, margin {1 - rho:.3g} to 1")
    # from every start (A.8): a fact of the reachable line, not an axis
    d = nums["e_distance_max"]
    every = None
    if a8 is not None and d is not None:
        fr = a8.get("converged_fraction", {})
        all_conv = all(v == 1.0 for v in fr.values())
        every = "no" if d > th["e_distance_max"] else ("yes" if all_conv else "partly")
        reasons["from_every_start"] = (f"x* from e ∈ {{{', '.join(fr)}}} within {d:.3g} "
                                       f"{'≤' if d <= th['e_distance_max'] else '>'} {th['e_distance_max']:g}"
                                       + ("" if all_conv else ", not every start converged"))
    elif a8 is not None:
        reasons["from_every_start"] = "no sample converged from every start"
    if "from_every_start" in reasons:
        reasons["reachable"] += f"; from every start (A.8): {every or 'not measured'}, {reasons['from_every_start']}"
    # input-dependent: ‖dx*/dx0‖_F, distinct fixed points, Prop. 5 agreement
    g = nums["input_grad_median"]
    distinct, conv_n = nums["distinct_fixed_points"], nums["converged"] or 0
    if ind is None or g is None:
        dep = "not measured"
        reasons["input_dependent"] = ("stage not run" if ind is None else "no converged sample with a solved "
                                      "implicit gradient")
    else:
        several = conv_n >= 2 and distinct is not None
        if g < th["input_grad_min"]:
            dep = "no"
            reasons["input_dependent"] = f"median ‖dx*/dx0‖_F = {g:.3g} < {th['input_grad_min']:g}"
        elif several and distinct == 1:
            dep = "partly"
            reasons["input_dependent"] = (f"‖dx*/dx0‖_F = {g:.3g}, but all {conv_n} converged samples share one "
                                          f"fixed point")
        else:
            dep = "yes"
            reasons["input_dependent"] = (f"median ‖dx*/dx0‖_F = {g:.3g} ≥ {th['input_grad_min']:g}"
                                          + (f"; {distinct} distinct fixed points among {conv_n}" if several else ""))
        e5 = nums["prop5_rel_error"]
        if e5 is not None:
            ok = e5 <= th["prop5_rel_error_max"]
            reasons["input_dependent"] += (f"; Prop. 5 {'agrees' if ok else 'does not agree'} (unrolled vs implicit "
                                           f"gradient {e5:.2g} {'≤' if ok else '>'} {th['prop5_rel_error_max']:g})")
    # geometry: the radii of stability and their anisotropy (stage geometry)
    geo_dec, reasons["geometry"], geo_nums = _geometry_axis(results.get("geometry"), th)
    nums.update(geo_nums)
    return Verdict(reachable=reach, input_dependent=dep, geometry=geo_dec, numbers=nums, thresholds=th,
                   reasons=reasons, from_every_start=every)


# ---- the split analysis --------------------------------------------------------------------------------------

class _JSONView(Mapping):
    """Read access to the object's JSON (``analysis["jacobian"]["spectral_radius"]``), as to the file it writes."""

    def __getitem__(self, key):
        return self.to_json()[key]

    def __iter__(self):
        return iter(self.to_json())

    def __len__(self):
        return len(self.to_json())


@dataclass(eq=False)
class SplitAnalysis(_JSONView):
    """Every stage's result on one split (or one batch of inputs): the object the report, the JSON, the plots and
    the sweep summary read. Stages that did not run are None; see the module docstring for the fields. ``x0`` and
    ``x_star`` keep the tensors the numbers were computed at (float64; not part of the JSON)."""

    split: str
    samples: int
    state_shape: list
    stages: tuple
    options: AnalysisOptions
    reachability: Any = None
    spectra: Any = None
    prop4: Any = None
    recall: Any = None
    prop5: Any = None
    input_dependence: Any = None
    initial_iterate: Any = None
    accuracy: Any = None
    geometry: Any = None
    timings: dict = field(default_factory=dict)
    model: Optional[str] = None  # the model's class name
    x0: Optional[torch.Tensor] = field(default=None, repr=False)  # (B, *S0) the analysed inputs' x0 (not in JSON)
    x_star: Optional[torch.Tensor] = field(default=None, repr=False)  # (B, *S) x_best of the solve (not in JSON)

    def blocks(self) -> dict:
        """The stage key → JSON block (None for a stage that did not run)."""
        objs = {"fixed_point": self.reachability, "jacobian": self.spectra, "prop4": self.prop4,
                "recall": self.recall, "prop5": self.prop5, "input_dependence": self.input_dependence,
                "initial_iterate": self.initial_iterate, "accuracy": self.accuracy, "geometry": self.geometry}
        return {k: None if v is None else _to_dict(v) for k, v in objs.items()}

    def to_dict(self) -> dict:
        """The per-split JSON block (the keys of ``stability analyze --json`` under each split's name)."""
        from stability.atomic import clean

        blocks = self.blocks()
        out = {"split": self.split, "samples": self.samples, "state_shape": self.state_shape,
               "stages": list(self.stages), **blocks,
               "verdict": verdict(blocks, tol=self.options.tol).to_dict(),
               "timings": dict(self.timings)}
        return clean(out)

    @property
    def verdict(self) -> Verdict:
        return verdict(self.blocks(), tol=self.options.tol)

    def report(self, source: Optional[dict] = None) -> dict:
        """A whole-report JSON with this one split (what ``stability analyze --model`` writes)."""
        from stability.atomic import clean

        block = self.to_dict()
        return clean({"format": FORMAT, "schema_version": SCHEMA_VERSION, "source": source or {"model": self.model},
                      "options": self.options.to_dict(), "splits": [self.split], self.split: block,
                      "verdict": {self.split: block["verdict"]}})

    def to_json(self) -> dict:
        """JSON-ready dict: ``format``, ``schema_version``, ``options`` and the split's block (NaN → null)."""
        return {"format": FORMAT, "schema_version": SCHEMA_VERSION, "options": self.options.to_dict(),
                **self.to_dict()}

    def write_json(self, path) -> None:
        from stability.analysis.report import write_json

        write_json(self.report(), path)

    def summary(self) -> str:
        """The text report: the verdict, then the table of every quantity."""
        from stability.analysis.report import text_report

        return text_report(self.report())

    def plot(self, directory) -> list:
        """Write the PNG plots (residuals, eigenvalues, accuracy, Prop. 5) into ``directory``; returns paths."""
        from stability.analysis.report import write_plots

        return write_plots(self.report(), directory)


# ---- the run: what the stages share -------------------------------------------------------------------------

@dataclass
class _Run:
    model: Any
    options: AnalysisOptions
    x0: torch.Tensor
    e: torch.Tensor
    targets: Optional[torch.Tensor]
    score: Optional[Callable]
    log: Callable
    split: str
    result: Any = None  # SolveResult
    shared: dict = field(default_factory=dict)  # what one stage computes for a later one
    inputs: Optional[torch.Tensor] = None  # the analysed inputs (stage geometry re-embeds them under perturbed θ)

    @property
    def f(self):
        return self.model.step

    @property
    def conv(self) -> torch.Tensor:
        return self.result.converged

    @property
    def x_star(self) -> torch.Tensor:
        return self.result.x_best

    @property
    def first(self) -> Optional[int]:
        c = self.conv
        return int(c.nonzero()[0]) if bool(c.any()) else None


def stage_reachability(run: _Run):
    """x* per sample by the solver from e (Def. 3.3), and the reachability summary (Section 3.2)."""
    from stability.analysis.reachability import reachability
    from stability.solvers import solve

    o = run.options
    curve = None
    if "accuracy" in o.stages and run.targets is not None and o.solver == "picard":
        # Picard from e is the iteration the accuracy curve scores: the solve's evaluations give it (stage accuracy)
        from stability.analysis.accuracy import CurveRecorder

        curve = CurveRecorder(run.model, run.score, o.iterations, run.targets)
    run.result = solve(run.f, run.e, run.x0, method=o.solver, tol=o.tol, max_iter=o.max_iter,
                       observe=curve.observe if curve else None, observe_steps=o.iterations if curve else 0)
    if curve is not None:
        run.shared["accuracy_curve"] = curve.curve()
    reach = reachability(run.result, solver=o.solver, max_iter=o.max_iter)
    run.log(f"{run.split}: {int(run.conv.sum())}/{run.conv.numel()} converged ({o.solver}, τ={o.tol:g})")
    return reach


def stage_rho(run: _Run) -> JacobianSpectra:
    """ρ(J*), σ_max and the leading eigenvalues of J = ∂step/∂x at x_best (Props. 3–4)."""
    from stability.analysis.operators import BatchedJacobian, JacobianOperator
    from stability.analysis.spectra import batched_sigma_max, jacobian_spectral_radius, sigma_max, spectral_radius

    from stability.analysis.operators import DENSE_BUDGET, batched_dense_jacobian
    from stability.analysis.recall import DenseSpectra
    from stability.analysis.spectra import DENSE_KRYLOV_MAX, DENSE_MAX, dense_batched_spectra, dense_krylov_spectra

    o, f, x_star, x0 = run.options, run.f, run.x_star, run.x0
    N, dtype, dev = x_star.shape[0], x_star.dtype, x_star.device
    n = int(np.prod(x_star.shape[1:]))
    rhos, sigmas, eigs, flags = [], [], [], []
    keep = N * n * n * 8 <= 4 * DENSE_BUDGET
    mid = n > DENSE_MAX and n <= DENSE_KRYLOV_MAX and keep and "prop4" in o.stages
    if o.eig_route == "arnoldi" and (n <= DENSE_MAX or mid):
        # small states: every sample's dense J (forward-mode columns, compressed where positions reach only their
        # neighbours, chunked by memory) and LAPACK, exact to rounding;
        # the dense J go to stage prop4 (its check against autograd) when they fit 4 × the chunk budget. Mid-size
        # states (``mid``): the same J, ρ by Krylov–Schur on the dense matrices, for Prop. 4 to reuse
        group = max(1, (DENSE_BUDGET // 4) // (8 * n * n))
        Js, specs = [], []
        for i in range(0, N, group):
            J = batched_dense_jacobian(f, x_star[i:i + group], x0[i:i + group])
            spec, sig = (dense_krylov_spectra(J, k=o.eig_k, tol=o.eig_tol, seed=o.seed) if mid
                         else dense_batched_spectra(J, k=o.eig_k))
            specs.append(spec)
            rhos += spec.rho.cpu().tolist()
            sigmas += sig.cpu().tolist()
            eigs += [[[float(z.real), float(z.imag)] for z in row] for row in spec.eigenvalues.cpu()]
            flags += (spec.ritz_residual < o.eig_tol).cpu().tolist() if mid else [True] * J.shape[0]
            if keep:
                Js.append(J)
        if keep:
            run.shared["dense_J"] = (x_star, torch.cat(Js))
            route = DenseSpectra.route_for(o.eig_k, o.eig_tol if mid else None, o.seed)
            run.shared["dense_J_spectra"] = DenseSpectra(
                torch.cat([sp.eigenvalues for sp in specs]), torch.cat([sp.ritz_residual for sp in specs]),
                torch.cat([sp.products for sp in specs]), route)
        method = (f"dense (n = {n} ≤ {DENSE_MAX}: every sample's Jacobian by batched forward-mode columns, "
                  f"eigenvalues by LAPACK, σ_max by λ_max(JᵀJ); exact to rounding, ritz_residual 0)" if not mid else
                  f"dense Jacobian (n = {n} ≤ {DENSE_KRYLOV_MAX}: every sample's J by batched forward-mode columns), "
                  f"ρ by ARPACK on each dense J (leading Ritz residual < {o.eig_tol:g}), σ_max by λ_max(JᵀJ)")
    elif o.eig_route == "arnoldi":
        chunk = o.eig_batch or (N if dev.type == "cuda" else 1)
        mixed = o.eig_precision == "mixed" and dtype == torch.float64
        fast_model = copy.deepcopy(run.model).float() if mixed else None
        for i in range(0, N, chunk):
            xs, xb = x_star[i:i + chunk], x0[i:i + chunk]
            bj = BatchedJacobian(f, xs, xb)
            spec = jacobian_spectral_radius(f, xs, xb, fast_f=fast_model.step if mixed else None, k=o.eig_k,
                                            tol=o.eig_tol, seed=o.seed)
            sig = batched_sigma_max(bj.apply_reuse, bj.rapply, tuple(xs.shape), dtype=dtype, device=dev,
                                    tol=o.eig_tol, seed=o.seed)
            rhos += spec.rho.cpu().tolist()
            sigmas += sig.cpu().tolist()
            eigs += [[[float(z.real), float(z.imag)] for z in row] for row in spec.eigenvalues.cpu()]
            flags += (spec.ritz_residual < o.eig_tol).cpu().tolist()
        method = (f"Krylov–Schur on Jᵀ (torch, {chunk} sample(s) per batch; "
                  + ("float32 products, each leading Ritz pair certified by float64 products)" if mixed
                     else "float64 products)"))
    else:
        for b in range(N):
            op = JacobianOperator(f, x_star[b], x0[b], mode="vjp")
            s = spectral_radius(op, k=o.eig_k, tol=o.eig_tol, transpose=True)
            rhos.append(s.rho)
            eigs.append(s.to_dict()["eigenvalues"])
            flags.append(s.converged)
            sigmas.append(sigma_max(op, tol=o.eig_tol))
        method = "ARPACK (scipy eigs on Jᵀ, reused vjp)"
    run.shared["rho_J"] = list(rhos)  # for stage geometry: which samples attract at θ*
    return JacobianSpectra(method=method, spectral_radius=rhos, sigma_max=sigmas, eigenvalues=eigs,
                           eigen_converged=flags, converged=run.conv.tolist())


def stage_prop4(run: _Run):
    """Prop. 4 / App. A.7: ρ(M) of the matrix assembled from the named parts, checked against autograd."""
    from stability.analysis.recall import prop4
    from stability.protocols import has_recall_parts, recall_parts_missing

    if not has_recall_parts(run.model):
        return NotApplicable(f"the model does not expose the named recall parts (RecallParts: missing "
                             f"{', '.join(recall_parts_missing(run.model))})")
    if run.model.recall == "none":
        return NotApplicable("no recall (recall none): Prop. 4 concerns recall models")
    o = run.options
    at, J = run.shared.get("dense_J", (None, None))  # stage rho's dense Jacobians, when it took the dense route
    mine = at is run.x_star
    return prop4(run.model, run.x_star, run.x0, columns=o.prop4_columns, k=o.eig_k, tol=o.eig_tol,
                 J=J if mine else None, J_spectra=run.shared.get("dense_J_spectra") if mine else None)


def stage_rho_wx(run: _Run):
    """ρ(W_x) of the recall weight (bias ignored), the one quantity the paper's release computes."""
    from stability.analysis.recall import rho_W_x
    from stability.protocols import has_recall_parts

    if not has_recall_parts(run.model):
        return NotApplicable("the model does not expose the named recall parts (RecallParts), so no W_x")
    w = rho_W_x(run.model)
    if w is None:
        return NotApplicable("no recall weight (W_x is None)")
    return RecallWeight(rho_Wx=w.rho, eigenvalues=w.to_dict()["eigenvalues"])


def stage_prop5(run: _Run) -> Prop5Stage:
    """Prop. 5 on the first converged sample: dx_T/dx0·u (unrolled from e, held fixed) against the implicit
    (I − J)⁻¹ ∂f/∂x0 u (GMRES), by the batched routes of :mod:`stability.analysis.prop5`."""
    from stability.analysis.initial_iterate import prop5_and_initial_iterate_batched
    from stability.analysis.prop5 import KrylovError, default_T_grid
    from stability.solvers import solve

    o, first = run.options, run.first
    if first is None:
        return Prop5Stage(skipped="no sample converged: Prop. 5 needs a fixed point")
    # polish x* of that sample by further Picard steps, so that the error floor is set by GMRES and the
    # unrolled T, not by the solver's τ
    sl = slice(first, first + 1)
    polish = solve(run.f, run.x_star[sl], run.x0[sl], tol=1e-13, max_iter=o.max_iter, max_period=0)
    Ts = default_T_grid(o.max_iter)
    # one unroll from e carries both tangents: dx_T/dx0·u here and A.8's dx_T/de·u (kept for stage a8)
    p5, a8 = prop5_and_initial_iterate_batched(run.f, polish.x_best, run.x0[sl], run.e[sl], Ts, tol=o.gmres_tol,
                                               seed=o.seed)
    run.shared["a8_sensitivity"] = (first, Ts, a8)
    try:
        chk = p5.sample(0)
    except KrylovError as exc:
        return Prop5Stage(sample=first, skipped=str(exc))
    return Prop5Stage(check=chk, sample=first, x_star_residual=float(polish.best_residual[0]))


def stage_input(run: _Run) -> InputDependence:
    """‖dx*/dx0‖_F per converged sample (Hutchinson; Prop. 5), every sample's probes in one batched solve."""
    from stability.analysis.input_dependence import input_dependence_frobenius_batched

    o, conv = run.options, run.conv
    frob: list = [None] * conv.numel()
    idx = conv.nonzero().flatten()
    if idx.numel():
        dev = run.x_star.device
        est = input_dependence_frobenius_batched(run.f, run.x_star[idx.to(dev)], run.x0[idx.to(dev)],
                                                 probes=o.probes, tol=max(o.gmres_tol, 1e-8), seed=o.seed)
        for j, b in enumerate(idx.tolist()):
            frob[b] = float(est.value[j]) if bool(est.converged[j]) else None
    return InputDependence(frobenius=frob, probes=o.probes)


def stage_a8(run: _Run) -> InitialIterate:
    """App. A.8: solve from e ∈ {x0, zeros, noise}; x* should not depend on e. Noise of std ``noise_std``;
    ‖dx_T/de·u‖ against T on the first converged sample (batched route)."""
    from stability.analysis.initial_iterate import fixed_point_distance, initial_iterate_sensitivity_batched
    from stability.analysis.prop5 import default_T_grid
    from stability.solvers import solve

    o, x0, e = run.options, run.x0, run.e
    std = 1.0 if o.noise_std is None else float(o.noise_std)
    gen = torch.Generator().manual_seed(o.seed)
    starts = {"x0": x0 if x0.shape == e.shape else None, "zeros": torch.zeros_like(e),
              "noise": torch.randn(e.shape, generator=gen, dtype=torch.float64).to(e) * std}
    starts = {k: v for k, v in starts.items() if v is not None}  # e = x0 needs a state shaped like x0
    # the starts other than e are solved together, as one batch of len(new) · B samples (the samples of step are
    # independent, so this is the same per-sample iteration at a fraction of the per-iteration overhead)
    new = [k for k, v in starts.items() if not torch.equal(v, e)]
    B = e.shape[0]
    both = (solve(run.f, torch.cat([starts[k] for k in new]), torch.cat([x0] * len(new)), method=o.solver, tol=o.tol,
                  max_iter=o.max_iter) if new else None)
    x_best, conv = {}, {}
    for k in starts:
        if k in new:
            i = new.index(k)
            x_best[k], conv[k] = both.x_best[i * B:(i + 1) * B], both.converged[i * B:(i + 1) * B]
        else:
            x_best[k], conv[k] = run.result.x_best, run.result.converged
    all_conv = torch.stack(list(conv.values())).all(0)
    dist = fixed_point_distance(list(x_best.values()))
    a8 = InitialIterate(starts=list(starts), fixed_point_distance=[float(d) if bool(c) else None
                                                                   for d, c in zip(dist, all_conv)],
                        converged_fraction={k: float(c.double().mean()) for k, c in conv.items()},
                        noise_std=std)
    first = run.first
    if first is not None:
        sl = slice(first, first + 1)
        Ts = default_T_grid(o.max_iter)
        first_p5, Ts_p5, sens = run.shared.get("a8_sensitivity", (None, None, None))
        if first_p5 != first or Ts_p5 != Ts:  # stage prop5 did not run (or on another sample)
            sens = initial_iterate_sensitivity_batched(run.f, e[sl], x0[sl], Ts, seed=o.seed)
        sens = sens.sample(0)
        a8.T, a8.dxT_de_norm, a8.sample = sens["T"], sens["norm"], first
    return a8


def stage_accuracy(run: _Run):
    """Accuracy against the iteration count 1..T and at x* (Fig. 3), by the task's (or argmax) scoring. With the
    Picard solver the curve was scored during stage reachability's solve (the same iterates from e; its time is in
    that stage's)."""
    from stability.analysis.accuracy import accuracy_at, accuracy_vs_iteration

    if run.targets is None:
        return NotApplicable("no targets given")
    acc = run.shared.pop("accuracy_curve", None)
    if acc is not None:
        acc.scored_in = "reachability"
    else:
        acc = accuracy_vs_iteration(run.model, run.score, run.x0, run.e, run.targets, run.options.iterations)
    acc.at_fixed_point = accuracy_at(run.model, run.score, run.x_star, run.targets)
    acc.at_fixed_point_converged = accuracy_at(run.model, run.score, run.x_star, run.targets, run.conv)
    return acc


def stage_geometry(run: _Run):
    """Section 3.2's third axis: radii of stability along random directions in parameter space, their anisotropy
    (App. B.2), per parameter group, and (``geometry_plane``) the ρ(J*) picture over a plane, on the first
    ``geometry_samples`` samples (:mod:`stability.analysis.geometry`)."""
    from stability.analysis.geometry import measure

    o = run.options
    N = run.x_star.shape[0]
    samples = list(range(min(o.geometry_samples, N)))
    rho = run.shared.get("rho_J")
    if rho is None:  # stage rho did not run: ρ(J*) at θ* of the geometry samples by its routine
        from stability.analysis.spectra import jacobian_spectral_radius

        sel = torch.tensor(samples, device=run.x_star.device)
        got = jacobian_spectral_radius(run.f, run.x_star[sel], run.x0[sel], tol=o.eig_tol, k=o.eig_k, seed=o.seed)
        rho = [None] * N
        for b, v in zip(samples, got.rho.tolist()):
            rho[b] = float(v)
    status = run.result.status
    attracting = [status[b] == "converged" and rho[b] is not None and np.isfinite(rho[b]) and rho[b] < 1.0
                  for b in range(N)]
    return measure(run.model, run.inputs, run.x_star, run.x0, attracting, rho, samples=samples,
                   directions=o.geometry_directions, accuracy=o.geometry_accuracy,
                   group_directions=o.geometry_group_directions, certify=o.geometry_certify,
                   plane=o.geometry_plane if o.geometry_directions >= 2 else 0, tol=o.tol, max_iter=o.max_iter,
                   eig_tol=o.eig_tol, eig_k=o.eig_k, seed=o.seed,
                   log=lambda m: run.log(f"{run.split}: {m}"))


STAGE_FUNCTIONS = {"reachability": stage_reachability, "rho": stage_rho, "prop4": stage_prop4,
                   "rho_wx": stage_rho_wx, "prop5": stage_prop5, "input": stage_input, "a8": stage_a8,
                   "accuracy": stage_accuracy, "geometry": stage_geometry}
_FIELDS = {"reachability": "reachability", "rho": "spectra", "prop4": "prop4", "rho_wx": "recall",
           "prop5": "prop5", "input": "input_dependence", "a8": "initial_iterate", "accuracy": "accuracy",
           "geometry": "geometry"}


def run_stages(model, inputs: torch.Tensor, targets: Optional[torch.Tensor], options: AnalysisOptions, *,
               score: Optional[Callable] = None, split: str = "inputs", log=None) -> SplitAnalysis:
    """Run ``options.stages`` on one batch of inputs. ``model`` is the analysis copy (:func:`analysis_model`);
    ``score(logits, targets) -> (correct, position_accuracy)`` defaults to
    :func:`~stability.analysis.accuracy.argmax_score`."""
    say = log or (lambda msg: None)
    param = next(iter(model.parameters()), None)
    dtype = param.dtype if param is not None else torch.float64
    dev = param.device if param is not None else torch.device(options.device)
    inputs = inputs.to(dev, dtype) if inputs.is_floating_point() else inputs.to(dev)
    if targets is not None:
        targets = targets.to(dev)
    with torch.no_grad():
        x0 = model.embed(inputs)
        e = model.initial_state(x0, generator=torch.Generator(device=dev).manual_seed(options.seed))
    run = _Run(model=model, options=options, x0=x0, e=e, targets=targets, score=score, log=say,
               split=split, inputs=inputs)
    out = SplitAnalysis(split=split, samples=int(x0.shape[0]), state_shape=list(e.shape[1:]), stages=options.stages,
                        options=options, model=type(model).__name__)
    for name in options.stages:
        t = time.perf_counter()
        setattr(out, _FIELDS[name], STAGE_FUNCTIONS[name](run))
        out.timings[name] = time.perf_counter() - t
    out.x0, out.x_star = x0, run.x_star
    return out


def analyze_split(model, task, split: str, options: AnalysisOptions, *, log=None) -> SplitAnalysis:
    """The stages on the first ``options.samples`` samples of a task's ``split``, in task order, scored by the
    task. ``model`` must be the analysis copy (:func:`analysis_model`)."""
    inputs, targets = task.dataset(split)
    N = min(options.samples, inputs.shape[0])
    if N < options.samples:
        # said, not clamped silently: the report then describes N samples, not the number asked for
        print(f"{split}: the split has {N} samples; analysing all {N} (asked for {options.samples})",
              file=sys.stderr)
    return run_stages(model, inputs[:N], targets[:N], options, score=task.score, split=split, log=log)


def analyze(model, inputs: torch.Tensor, targets: Optional[torch.Tensor] = None,
            options: Optional[AnalysisOptions] = None, *, log=None) -> SplitAnalysis:
    """The whole analysis of any :class:`~stability.protocols.LoopedModel` on ``inputs`` (all of them, or the first
    ``options.samples`` when options are given); accuracy, per position and whole answer (argmax over the last
    axis of ``readout``), when ``targets`` are given. The model is checked against the contract first
    (:func:`~stability.protocols.check_model`) and analysed as a float64 copy. Returns a :class:`SplitAnalysis`
    (``.to_json()``, ``.summary()``, ``.plot(dir)``)."""
    from stability.protocols import check_contract, check_model

    if options is None:
        options = AnalysisOptions(samples=int(inputs.shape[0]) if isinstance(inputs, torch.Tensor) else 1)
    options = _on_device(options)
    check_contract(model)
    if not isinstance(model, torch.nn.Module):
        raise StabilityError(f"{type(model).__name__} must be a torch.nn.Module (the analysis runs on a float64 "
                             f"copy of its parameters)")
    m = analysis_model(model, torch.float64, options.device)
    check_model(m, inputs, targets)
    N = min(options.samples, int(inputs.shape[0]))
    return run_stages(m, inputs[:N], None if targets is None else targets[:N], options, log=log)


# ---- a checkpoint: every split ------------------------------------------------------------------------------

@dataclass(eq=False)
class CheckpointAnalysis(_JSONView):
    """The analysis of a checkpoint: one :class:`SplitAnalysis` per split, with the checkpoint's config."""

    source: dict
    config: Optional[dict]
    options: AnalysisOptions
    epoch: Any
    splits: dict  # name → SplitAnalysis

    def to_json(self) -> dict:
        """``stability analyze --json``: format, schema_version, checkpoint, config, options, epoch, splits, one
        block per split under its name, and the verdict of each split."""
        from stability.atomic import clean

        from stability import hardware

        out = {"format": FORMAT, "schema_version": SCHEMA_VERSION, **self.source, "config": self.config,
               "options": self.options.to_dict(), "epoch": self.epoch, "splits": list(self.splits),
               "hardware": hardware.signature()}
        for name, split in self.splits.items():
            out[name] = split.to_dict()
        out["verdict"] = {name: out[name]["verdict"] for name in self.splits}
        return clean(out)

    def summary(self) -> str:
        from stability.analysis.report import text_report

        return text_report(self.to_json())

    def plot(self, directory) -> list:
        from stability.analysis.report import write_plots

        return write_plots(self.to_json(), directory)


def keep_freed_memory() -> bool:
    """On glibc, serve tensors of up to 1 GiB from the heap and keep what is freed (``mallopt``), instead of a
    fresh ``mmap`` per large tensor whose pages the kernel zeroes on first touch: the dense Jacobians and the
    vmapped tangents of the analysis allocate and free the same large blocks over and over (measured on the demo's
    hard split: stages rho and prop4 5.9 s and 3.9 s in a fresh process without it, 5.5 s and 2.7 s with it;
    benchmarks/RESULTS.md). The process keeps its peak memory until it ends. False where there is no glibc."""
    import ctypes
    import ctypes.util

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 1 << 30)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False


def _on_device(options: AnalysisOptions) -> AnalysisOptions:
    """The options with ``device`` resolved (``auto`` → cpu or cuda; a CUDA device that is not here: one line),
    so that the JSON records where the analysis ran."""
    import dataclasses

    from stability.config import resolve_device

    return dataclasses.replace(options, device=str(resolve_device(options.device)))


def analyze_checkpoint(path, *, splits=("val", "hard"), options: AnalysisOptions = AnalysisOptions(),
                       log=None, release_config=None) -> CheckpointAnalysis:
    """Load a checkpoint of this toolkit and analyse each split (the A.8 noise std defaults to the run's)."""
    import dataclasses

    from stability.checkpoint import load
    from stability.protocols import is_looped

    options = _on_device(options)
    loaded = load(path, device=options.device, release_config=release_config)
    if not is_looped(loaded.model):
        raise StabilityError(f"{path}: a fixed-depth baseline has no loop map, so it has no fixed points to analyse")
    if options.noise_std is None:
        options = dataclasses.replace(options, noise_std=float(getattr(loaded.config.model, "noise_std", 1.0)))
    model = analysis_model(loaded.model, torch.float64, options.device)
    out = CheckpointAnalysis(source={"checkpoint": str(path)}, config=loaded.config.to_dict(), options=options,
                             epoch=loaded.epoch, splits={})
    splits = tuple(splits)
    threads = torch.get_num_threads()
    workers = min(len(splits), options.workers or threads) if options.device == "cpu" else 1
    # (the numbers do not depend on it: tests/test_parallel_splits.py)
    if workers <= 1:
        for split in splits:
            out.splits[split] = analyze_split(model, loaded.task, split, options, log=log)
        return out
    out.splits = _parallel_splits(path, release_config, model, loaded.task, splits, options, workers,
                                  max(1, threads // workers), log)
    return out


# ---- splits in parallel: one process per split on the CPU ------------------------------------------------

#: the environment variables that size the thread pools of OpenMP, MKL and OpenBLAS when a library loads
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class limit_threads:
    """Use ``threads`` threads in every thread pool of this process: torch's (OpenMP and its MKL) and, through
    threadpoolctl, the OpenBLAS copies of numpy and scipy, which torch.set_num_threads does not reach: two
    analyses side by side on a 2-core machine would otherwise each start a BLAS thread a core. Also a context
    manager that restores the previous sizes."""

    def __init__(self, threads: int):
        from threadpoolctl import threadpool_limits

        self._torch = torch.get_num_threads()
        torch.set_num_threads(threads)
        self._blas = threadpool_limits(limits=threads, user_api="blas")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._blas.restore_original_limits()
        torch.set_num_threads(self._torch)


def _child_thread_env(threads: int):
    """A context with ``THREAD_ENV`` set to ``threads`` while processes are started, so that a spawned process
    sizes its thread pools before its libraries load (the variables are restored afterwards)."""
    from unittest import mock

    return mock.patch.dict(os.environ, {k: str(threads) for k in THREAD_ENV})


def _split_worker(path, release_config, split: str, options: AnalysisOptions, threads: int, queue) -> None:
    """A spawned process: load the checkpoint, analyse one split with ``threads`` torch threads, and put
    ("log", text) lines and then ("done", split, pickled SplitAnalysis) or ("error", split, message) on ``queue``."""
    import multiprocessing
    import pickle

    from stability.processes import die_with_parent

    parent = multiprocessing.parent_process()
    die_with_parent(parent.pid if parent is not None else None)  # no orphan when `analyze` is killed
    limit_threads(threads)
    keep_freed_memory()
    try:
        from stability.checkpoint import load

        loaded = load(path, device=options.device, release_config=release_config)
        model = analysis_model(loaded.model, torch.float64, options.device)
        res = analyze_split(model, loaded.task, split, options, log=lambda m: queue.put(("log", m)))
        queue.put(("done", split, pickle.dumps(res)))
    except BaseException as exc:  # reported to the parent, which raises it there as one line
        kind = "" if isinstance(exc, StabilityError) else f"{type(exc).__name__}: "
        queue.put(("error", split, kind + (first_line(exc) if str(exc).strip() else "")))


def _parallel_splits(path, release_config, model, task, splits: tuple, options: AnalysisOptions, workers: int,
                     threads: int, log) -> dict:
    """Each split but the last in a spawned process (the last one here), ``threads`` torch threads each, at most
    ``workers`` at a time. Every split's numbers are those of analysing it alone: each split seeds its own
    generators and reads nothing another split computed. Log lines of the processes reach ``log`` as they come."""
    import multiprocessing as mp
    import pickle
    import threading

    ctx = mp.get_context("spawn")  # fork after torch has started its thread pools is not safe
    queue = ctx.Queue()
    say = log or (lambda msg: None)
    results: dict = {}
    errors: dict = {}
    remote = list(splits[:-1])
    waiting = list(remote)
    running: list = []
    done = threading.Event()

    def start_next():
        while waiting and len([p for p in running if p.is_alive()]) < workers - 1:
            split = waiting.pop(0)
            proc = ctx.Process(target=_split_worker, args=(str(path), release_config, split, options, threads,
                                                           queue), daemon=True)
            with _child_thread_env(threads):
                proc.start()
            running.append(proc)

    def drain():
        pending = len(remote)
        while pending:
            msg = queue.get()
            if msg[0] == "log":
                say(msg[1])
                continue
            pending -= 1
            if msg[0] == "done":
                results[msg[1]] = pickle.loads(msg[2])
            else:
                errors[msg[1]] = msg[2]
            start_next()
        done.set()

    old = torch.get_num_threads()
    reader = threading.Thread(target=drain, daemon=True)
    try:
        start_next()
        reader.start()
        with limit_threads(threads):
            results[splits[-1]] = analyze_split(model, task, splits[-1], options, log=log)
        while not done.wait(1.0):
            if not any(p.is_alive() for p in running) and not waiting and not done.wait(5.0):
                raise StabilityError("an analysis process ended without a result (out of memory?)")
    finally:
        torch.set_num_threads(old)
        for proc in running:
            if proc.is_alive():
                proc.terminate()
            proc.join(5)
    if errors:
        split, message = next(iter(errors.items()))
        raise StabilityError(f"{split}: {message}")
    return {split: results[split] for split in splits}
