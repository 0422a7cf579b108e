"""The analysis' result objects: each stage's result (where it has none of its own module), every stage's result
on one split (:class:`SplitResult`) and the analysis (:class:`Analysis`: one or several splits, their JSON built
once, the text report, the plots; what ``stability.analyze`` returns and ``stability analyze`` prints)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import torch

from stability.analysis.options import FORMAT, SCHEMA_VERSION, STAGE_KEYS, STAGES, AnalysisOptions
from stability.analysis.verdict import verdict
from stability.stats import median

if TYPE_CHECKING:
    from stability.numerics import Spectrum

#: the :class:`SplitResult` field that holds each stage's result
STAGE_FIELDS = {"reachability": "reachability", "rho": "spectra", "prop4": "prop4", "rho_wx": "recall",
                "prop5": "prop5", "input": "input_dependence", "a8": "initial_iterate", "repelling": "repelling",
                "accuracy": "accuracy", "geometry": "geometry"}


def _to_dict(obj) -> Any:
    return obj.to_dict() if hasattr(obj, "to_dict") else obj


# ---- the stages' results ------------------------------------------------------------------------------------

@dataclass
class NotApplicable:
    """A stage that does not apply to this model (e.g. Prop. 4 without named recall parts), and why."""

    reason: str

    def to_dict(self) -> dict:
        return {"applicable": False, "reason": self.reason}


@dataclass
class JacobianSpectra:
    """Stage rho's result (Props. 3–4, App. A.4) at x_best: ``spectrum``, the spectrum of J* = ∂f/∂x of the first
    ``len(spectrum)`` samples (all, or a few on large states) in the numerics' one type, σ_max(J*) of the same
    samples (``sigma``), which reached the Ritz tolerance (``eigen_flags``), and the solver's converged mask of
    every sample (for the medians). The JSON lists have None for the samples not measured."""

    method: str
    spectrum: Spectrum
    sigma: torch.Tensor
    eigen_flags: torch.Tensor
    converged: list

    def _padded(self, values: list) -> list:
        return list(values) + [None] * (len(self.converged) - len(values))

    @property
    def rhos(self) -> list:
        """ρ(J*) per sample (None where not measured)."""
        return self._padded(self.spectrum.rho.cpu().tolist())

    @property
    def sigmas(self) -> list:
        """σ_max(J*) per sample (None where not measured)."""
        return self._padded(self.sigma.cpu().tolist())

    @property
    def eigenvalues(self) -> list:
        return self._padded(self.spectrum.eigenvalue_lists())

    @property
    def eigen_converged(self) -> list:
        return self._padded(self.eigen_flags.cpu().tolist())

    def to_dict(self) -> dict:
        c, rho, sigma = self.converged, self.rhos, self.sigmas
        return {
            "evaluated_at": "x_best: the fixed point where status is converged, else the lowest-residual iterate",
            "method": self.method,
            "spectral_radius": rho,
            "spectral_radius_median": median([r for r, ok in zip(rho, c) if ok]),
            "spectral_radius_median_all": median(rho),
            "sigma_max": sigma,
            "sigma_max_median": median([s for s, ok in zip(sigma, c) if ok]),
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
        return {"frobenius": self.frobenius, "frobenius_median": median(self.frobenius), "probes": self.probes,
                "quantity": "‖dx*/dx0‖_F (Hutchinson estimate, Prop. 5)"}


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


# ---- one split, and the analysis ----------------------------------------------------------------------

@dataclass(eq=False)
class SplitResult:
    """Every stage's result on one split (or one batch of inputs): what :class:`Analysis` gathers, one per split.
    Stages that did not run are None; :data:`STAGE_FIELDS` names each stage's field (the table of
    :mod:`stability.analysis.stages`). ``x0`` and ``x_star`` keep the tensors the numbers were computed at
    (float64; not part of the JSON)."""

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
    repelling: Any = None
    accuracy: Any = None
    geometry: Any = None
    timings: dict = field(default_factory=dict)
    measured_samples: Optional[dict] = None  # on large states: the stages that measured the first few samples only
    model: Optional[str] = None  # the model's class name
    x0: Optional[torch.Tensor] = field(default=None, repr=False)  # (B, *S0) the analysed inputs' x0 (not in JSON)
    x_star: Optional[torch.Tensor] = field(default=None, repr=False)  # (B, *S) x_best of the solve (not in JSON)

    def to_dict(self) -> dict:
        """The split's JSON block, as the report holds it under the split's name (non-finite numbers as null)."""
        from stability.atomic import clean

        return clean(self._block())

    def _block(self) -> dict:
        """The block before :func:`~stability.atomic.clean`: every stage's block (None for a stage that did not
        run), the verdict on them and the timings."""
        objs = {STAGE_KEYS[s]: getattr(self, STAGE_FIELDS[s]) for s in STAGES}
        blocks = {k: None if v is None else _to_dict(v) for k, v in objs.items()}
        few = {} if self.measured_samples is None else {"measured_samples": dict(self.measured_samples)}
        return {"split": self.split, "samples": self.samples, "state_shape": self.state_shape,
                "stages": list(self.stages), **few, **blocks,
                "verdict": verdict(blocks, tol=self.options.tol).to_dict(), "timings": dict(self.timings)}


@dataclass(eq=False)
class Analysis(Mapping):
    """The result of ``stability.analyze`` and of ``stability analyze``: one :class:`SplitResult` per split
    (``splits``; ``"inputs"`` for a model analysed on inputs of one's own) and where they came from. Read like the
    JSON file it writes (``analysis["val"]["jacobian"]["spectral_radius"]``); :meth:`to_json` is that JSON, built
    once on first use and then shared by every read, :meth:`summary`, :meth:`plot` and :meth:`write_json` (the
    same dict each time: copy it before changing it).

    ``checkpoint``: the analysed checkpoint's path (then ``config`` and ``epoch`` are its own, and the JSON
    carries the hardware signature); otherwise ``source`` says what was analysed (``{"model": ...}``)."""

    options: AnalysisOptions
    splits: dict  # name → SplitResult
    source: dict = field(default_factory=dict)
    checkpoint: Optional[str] = None
    config: Optional[dict] = None
    epoch: Any = None

    def to_json(self) -> dict:
        """The JSON ``stability analyze --json`` writes (strict: non-finite numbers as null): format,
        schema_version, where it came from (a checkpoint with its config and epoch, and the hardware signature;
        or the ``source`` of a model of one's own), options, the split names, one block per split under its
        name, and each split's verdict (docs/analysis.md)."""
        if self._json is None:
            self._json = self._build()
        return self._json

    def _build(self) -> dict:
        from stability.atomic import clean

        blocks = {name: split._block() for name, split in self.splits.items()}  # cleaned once, below
        if self.checkpoint is not None:
            from stability import hardware

            head = {"checkpoint": self.checkpoint, "config": self.config, "options": self.options.to_dict(),
                    "epoch": self.epoch, "splits": list(blocks), "hardware": hardware.signature()}
        else:
            head = {"source": self.source, "options": self.options.to_dict(), "splits": list(blocks)}
        return clean({"format": FORMAT, "schema_version": SCHEMA_VERSION, **head, **blocks,
                      "verdict": {name: block["verdict"] for name, block in blocks.items()}})

    def __post_init__(self):
        self._json = None

    def __getitem__(self, key):
        return self.to_json()[key]

    def __iter__(self):
        return iter(self.to_json())

    def __len__(self):
        return len(self.to_json())

    def summary(self) -> str:
        """The text report ``stability analyze`` prints: the verdict, then one table per split."""
        from stability.analysis.report import text_report

        return text_report(self.to_json())

    def write_json(self, path) -> Path:
        """Write :meth:`to_json` to ``path`` (atomically, :func:`stability.atomic.write_json`)."""
        from stability.atomic import write_json

        return write_json(path, self.to_json())

    def plot(self, directory) -> list:
        """Write the PNG plots (residuals, eigenvalues, accuracy, Prop. 5, the geometry stage's region) into
        ``directory``; returns their paths."""
        from stability.analysis.report import write_plots

        return write_plots(self.to_json(), directory)
