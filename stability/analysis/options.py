"""What the analysis runs and how: the stages, their JSON blocks, and :class:`AnalysisOptions`.

``reachability`` always runs (every other stage reads x*); ``repelling`` searches for the fixed points plain
iteration cannot reach (:mod:`stability.analysis.repelling`). ``geometry`` perturbs the parameters and re-solves, so
it is not among the library's and the sweep's default stages (:data:`DEFAULT_STAGES`); ``stability analyze`` runs
every stage (:data:`STAGES`) unless ``--only`` says otherwise. What each stage computes:
:mod:`stability.analysis.stages`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

from stability.errors import StabilityError

#: stage names, in the order they run
STAGES = ("reachability", "rho", "prop4", "rho_wx", "prop5", "input", "a8", "repelling", "accuracy", "geometry")
#: the stages of ``AnalysisOptions()`` (the library's and the sweep's default): all but geometry, which a grid or
#: a caller asks for (``stability analyze`` runs :data:`STAGES`)
DEFAULT_STAGES = tuple(s for s in STAGES if s != "geometry")
#: the stages that measure only the first ``few_samples`` samples of a large state (their cost is a Krylov solve,
#: two solves or a root search per sample)
FEW_SAMPLE_STAGES = ("rho", "prop4", "input", "a8", "repelling")
#: the JSON block of each stage
STAGE_KEYS = {"reachability": "fixed_point", "rho": "jacobian", "prop4": "prop4", "rho_wx": "recall",
              "prop5": "prop5", "input": "input_dependence", "a8": "initial_iterate", "repelling": "repelling",
              "accuracy": "accuracy", "geometry": "geometry"}
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
    prop4_probes: int = 4  # Prop. 4 on states too large for dense matrices: Gaussian probes of M against J
    seed: int = 0
    eig_route: str = field(default="arnoldi", metadata={
        "choices": ("arnoldi",), "help": "ρ(J*) and σ_max by the package's one route choice (stability.numerics: "
        "dense for small states, batched Krylov–Schur above; scipy's per-sample ARPACK is the tests' reference)"})
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
    # the repelling stage (stability/analysis/repelling.py): Broyden on f(x) − x from x_best and repelling_starts
    # Gaussian perturbations of it (relative size repelling_scale), each for at most repelling_budget iterations
    repelling_starts: int = field(default=3, metadata={
        "metavar": "K", "help": "repelling: perturbed starts of the root-finder per sample, besides the Picard "
        "iterate"})
    repelling_scale: float = field(default=0.5, metadata={
        "metavar": "F", "help": "repelling: relative size of each perturbation, ‖δ‖₂ = F · max(‖x_best‖₂, √n)"})
    repelling_budget: int = field(default=100, metadata={
        "metavar": "N", "help": "repelling: Broyden iterations per start"})
    # large states: above few_samples_above (the state size n; above every committed record's n) the per-sample
    # stages of FEW_SAMPLE_STAGES (rho and σ_max, prop4, input, a8, repelling) measure the first few_samples only; 0: all
    few_samples: int = 8
    few_samples_above: int = 8192
    # the ρ(J*) picture over the plane of two directions, N × N cells (0: none); not a flag with this default:
    # `stability analyze --geometry-plane N` defaults to 15 with --plots and to 0 without
    geometry_plane: int = 0

    def __post_init__(self):
        for name, allowed in (("eig_route", ("arnoldi",)), ("eig_precision", ("mixed", "float64")),
                              ("solver", ("picard", "anderson"))):
            if getattr(self, name) not in allowed:
                raise StabilityError(f"unknown {name} {getattr(self, name)!r}; allowed: {', '.join(allowed)}")
        object.__setattr__(self, "stages", parse_stages(self.stages))
        if self.noise_std is not None and not (np.isfinite(self.noise_std) and self.noise_std >= 0):
            raise StabilityError(f"noise_std must be a finite number ≥ 0, got {self.noise_std!r}")
        for name in ("geometry_directions", "geometry_samples", "repelling_budget"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 1):
                raise StabilityError(f"{name} must be an integer ≥ 1, got {getattr(self, name)!r}")
        for name in ("geometry_group_directions", "geometry_certify", "geometry_plane", "repelling_starts",
                     "few_samples", "few_samples_above"):
            if not (isinstance(getattr(self, name), int) and getattr(self, name) >= 0):
                raise StabilityError(f"{name} must be an integer ≥ 0, got {getattr(self, name)!r}")
        if not (np.isfinite(self.repelling_scale) and self.repelling_scale > 0):
            raise StabilityError(f"repelling_scale must be a finite number > 0, got {self.repelling_scale!r}")
        if not (np.isfinite(self.geometry_accuracy) and 0 < self.geometry_accuracy < 1):
            raise StabilityError(f"geometry_accuracy must be in (0, 1), got {self.geometry_accuracy!r}")
        if self.workers is not None and not (isinstance(self.workers, int) and self.workers >= 1):
            raise StabilityError(f"workers must be an integer ≥ 1, got {self.workers!r}")
        from stability.config import is_device_name

        if not is_device_name(str(self.device)):
            raise StabilityError(f"device {self.device!r}: expected auto, cpu, cuda or cuda:N")

    def measured(self, n: int, samples: int) -> int:
        """How many samples (the first ones) the stages of :data:`FEW_SAMPLE_STAGES` measure at state size ``n``:
        all ``samples``, or ``few_samples`` of them where ``n > few_samples_above`` (0: all)."""
        if self.few_samples and n > self.few_samples_above:
            return min(samples, self.few_samples)
        return samples

    def to_dict(self) -> dict:
        out = asdict(self)
        out["stages"] = list(self.stages)
        return out
