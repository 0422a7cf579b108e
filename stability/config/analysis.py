"""The analysis' names and options: the stages in the order they run (the names only: torch-free; the registry,
:mod:`stability.analysis.stages`, is held to them), and :class:`AnalysisOptions` with its flags (:class:`Flag`)."""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal, Optional

from pydantic import BeforeValidator, model_validator

from stability.config.base import _Config, is_device_name, to_dict
from stability.config.fields import MAX_DIRECTIONS, MAX_ITERATIONS, MAX_PROBES, MAX_SAMPLES, MAX_SEED, MAX_WORKERS, _f
from stability.errors import ConfigError


#: the analysis stages, in the order they run: the names only (this module stays torch-free); each stage is a
#: module of :mod:`stability.analysis.stages`, listed once by its registry, which tests/house/test_stages.py holds
#: this tuple to
STAGES = ("reachability", "rho", "prop4", "rho_wx", "prop5", "input", "a8", "path_independence", "repelling",
          "accuracy", "geometry")
#: the stage run only when asked for (it perturbs the parameters and re-solves): a grid's ``analyze_geometry``, a
#: caller's ``stages``, ``stability figures region``
GEOMETRY_STAGE = "geometry"
#: the asymptotic-alignment stage of Anil et al. 2022 (issue 38): asked for by name (``--only``, ``stages``) or by a
#: grid's ``analyze_path_independence``, so that every analysis and record written before it keeps its shape
PATH_STAGE = "path_independence"
#: the stages run only when asked for by name, by ``stability analyze`` too
OPT_IN_STAGES = (PATH_STAGE,)
#: the stages ``stability analyze`` and ``stability demo`` run without ``--only``: all but the opt-in ones
ANALYZE_STAGES = tuple(s for s in STAGES if s not in OPT_IN_STAGES)
#: the stages of ``AnalysisOptions()`` (the library's and the sweep's default): all but geometry, which a grid or
#: a caller asks for (``stability analyze`` runs :data:`ANALYZE_STAGES`), and the opt-in ones
DEFAULT_STAGES = tuple(s for s in ANALYZE_STAGES if s != GEOMETRY_STAGE)
#: the one route of the ρ(J*) eigensolver (the Krylov–Schur method), under the name it had when it was an option:
#: ``AnalysisOptions.to_dict`` still writes it as ``eig_route`` (the key of every analysis written then), and that
#: key is read back when it holds this value; the value is a file format's word, not the method's name
EIG_ROUTE = "arnoldi"


def parse_stages(text) -> tuple:
    """``"rho,prop5"`` (or a sequence of names) → the stages to run, in run order, ``reachability`` included."""
    names = [s.strip() for s in (text.split(",") if isinstance(text, str) else text) if s.strip()]
    bad = [s for s in names if s not in STAGES]
    if bad or not names:
        what = f"unknown stage {', '.join(map(repr, bad))}" if bad else "no stage given"
        raise ConfigError(f"{what}; allowed: {', '.join(STAGES)}")
    return tuple(s for s in STAGES if s in names or s == "reachability")


def _stages(value: Any) -> Any:
    return parse_stages(value) if isinstance(value, (str, list, tuple)) else value


def _device(value: Any) -> Any:
    if not isinstance(value, str) and hasattr(value, "type"):  # a torch.device
        value = str(value)
    if isinstance(value, str) and not is_device_name(value):
        raise ConfigError(f"device {value!r}: expected auto, cpu, cuda or cuda:N")
    return value


class Flag(typing.NamedTuple):
    """How a field of :class:`AnalysisOptions` is a flag of ``stability analyze`` (:attr:`AnalysisOptions.FLAGS`):
    ``group``, the heading it is listed under (a key of ``FLAG_GROUPS``; None: the main list); ``positive``: the
    flag refuses 0 where the library takes it; ``command_default``: where the command's default differs from the
    library's, what the help says of it (the flag then defaults to None and the command decides)."""

    group: Optional[str] = None
    positive: bool = False
    command_default: Optional[str] = None


class AnalysisOptions(_Config):
    """What the analysis runs and how (:func:`stability.analyze`, ``stability analyze``; reported in the JSON's
    ``options``). The fields of :attr:`FLAGS` are ``stability analyze``'s flags, with the default, help and
    metavar read from here; the others are the numerical settings below them.

    ``noise_std``: std of the Gaussian start of App. A.8 (None: the checkpoint's configured ``noise_std``, 1 for a
    model of one's own). ``stages``: which stages to run (:data:`STAGES`, or ``"rho,prop5"``; ``reachability``
    always runs). ``workers``: 1 in the library, since a spawned process re-imports the caller's main module,
    which a script without ``if __name__ == "__main__":`` cannot survive (``stability analyze`` and ``demo`` use
    None). ``geometry_*``: the geometry stage (stability/analysis/stages/geometry.py); ``repelling_*``: the
    repelling stage (stability/analysis/stages/repelling.py).
    """

    #: ``stability analyze``'s flags of this schema, the one table of them (stability/commands/analyze.py adds a
    #: ``--NAME`` for each, in this order, with its type, choices, metavar and help from the field): the field's
    #: name → its :class:`Flag`. ``--only`` (``stages``) is the command's own; the other fields are the library's.
    FLAGS: typing.ClassVar[dict[str, Flag]] = {
        "samples": Flag(), "solver": Flag(), "tol": Flag(), "max_iter": Flag(), "iterations": Flag(), "probes": Flag(),
        "noise_std": Flag(positive=True), "eig_precision": Flag(), "few_samples": Flag(), "batch": Flag(),
        "device": Flag(), "workers": Flag(command_default="one per split, up to the thread count; 1: one split after "
                                                          "the other; the numbers do not depend on it"),
        "geometry_directions": Flag("geometry"), "geometry_samples": Flag("geometry"),
        "geometry_accuracy": Flag("geometry"), "geometry_group_directions": Flag("geometry"),
        "geometry_certify": Flag("geometry"),
        "geometry_plane": Flag("geometry", command_default="15 with --plots, otherwise none"),
        "repelling_starts": Flag("repelling"), "repelling_scale": Flag("repelling"),
        "repelling_budget": Flag("repelling"), "drift": Flag()}
    #: the headings of the flags' groups in ``stability analyze --help``
    FLAG_GROUPS: typing.ClassVar[dict[str, str]] = {
        "geometry": "geometry (the third axis: radii of stability along random directions in parameter space, "
                    "docs/analysis.md)",
        "repelling": "repelling (the root-finder search for fixed points with ρ(J) > 1, which plain iteration "
                     "cannot reach; docs/analysis.md)"}

    samples: int = _f(32, "analyse the first N samples of each split (or of --inputs), in order", metavar="N",
                      ge=1, le=MAX_SAMPLES)
    solver: Literal["picard", "anderson"] = _f("picard", "fixed-point solver (picard: plain iteration, the "
                                               "reachability the paper means)")
    tol: float = _f(1e-5, "relative L∞ residual τ for convergence", metavar="F", gt=0.0)
    max_iter: int = _f(500, "solver iterations", metavar="N", ge=1, le=MAX_ITERATIONS,
                       why="the solver keeps a residual per sample and iteration")
    iterations: int = _f(500, "accuracy is measured at iterations 1..T", metavar="T", ge=1,
                         le=MAX_ITERATIONS, why="the accuracy curve runs the loop map T times per sample")  # T_max of the curve
    device: Annotated[str, BeforeValidator(_device)] = _f(
        "cpu", "where to compute: cpu, auto (cuda when available), cuda or cuda:N", metavar="DEV")
    eig_k: int = _f(3, "leading eigenvalues the ρ(J*) eigensolver computes per sample", ge=1,
                   le=MAX_PROBES)
    eig_tol: float = _f(1e-6, "Ritz residual below which ρ(J*) is certified", gt=0.0)
    gmres_tol: float = _f(1e-10, "relative tolerance of the linear solves (Prop. 5, ‖dx*/dx0‖_F)", gt=0.0)
    probes: int = _f(4, "random probes of the ‖dx*/dx0‖_F estimate", metavar="K", ge=1,
                    le=MAX_PROBES, why="each probe is one more linear solve per sample, all held in memory at once")
    prop4_probes: int = _f(4, "Prop. 4 on states too large for dense matrices: Gaussian probes of M against J",
                           ge=1, le=MAX_PROBES)
    seed: int = _f(0, "seed of every random start, probe and direction of the analysis")
    eig_batch: Optional[int] = _f(None, "samples per Krylov–Schur batch (none: 1 on the CPU, all on CUDA or with "
                                  "batch all)", ge=1, le=MAX_SAMPLES)
    eig_precision: Literal["mixed", "float64"] = _f(
        "mixed", "products of the ρ(J*) eigensolver: mixed (float32, every result certified by a float64 residual "
        "and re-solved in float64 where it misses) or float64")
    noise_std: Optional[float] = _f(None, "std of the noise start of App. A.8 (default: the checkpoint's "
                                    "noise_std; 1 for --model)", metavar="F", ge=0.0)
    workers: Optional[int] = _f(1, "splits analysed side by side on the CPU, one process each, sharing torch's "
                                "threads (none: one per split, up to the thread count)", metavar="N",
                                ge=1, le=MAX_WORKERS)
    stages: Annotated[tuple[str, ...], BeforeValidator(_stages)] = _f(
        DEFAULT_STAGES, "the stages to run, of STAGES (reachability always runs)")
    geometry_directions: int = _f(8, "geometry: random directions in all loop parameters, each measured with both "
                                  "signs", metavar="K", ge=1, le=MAX_DIRECTIONS)
    geometry_samples: int = _f(4, "geometry: radii are measured on up to N samples of each split, the first N "
                               "whose x* attracts at θ* (1 on states above n = 8,192)", metavar="N", ge=1,
                               le=MAX_SAMPLES)
    geometry_pick: Literal["attracting", "first"] = _f(
        "attracting", "geometry: which samples: the first geometry_samples whose x* attracts at θ* (converged, "
        "ρ(J*) < 1; the first sample where none does), or the first geometry_samples whatever they do (the "
        "replication grid's records were measured so)")
    geometry_accuracy: float = _f(0.1, "geometry: bisect each radius until its bracket [lo, hi] has hi/lo ≤ 1 + F",
                                  metavar="F", gt=0.0, lt=1.0)
    geometry_group_directions: int = _f(1, "geometry: directions within each parameter group (W_x, attention, "
                                        "MLP, norms, embedding, ...), both signs; 0: no per-group radii",
                                        metavar="K", ge=0, le=MAX_DIRECTIONS)
    geometry_certify: int = _f(4, "geometry: radii whose ρ(J*) is certified at both ends of the final bracket "
                               "(the first N that ρ decided)", metavar="N", ge=0,
                               le=MAX_DIRECTIONS)
    repelling_starts: int = _f(3, "repelling: perturbed starts of the root-finder per sample, besides the Picard "
                               "iterate", metavar="K", ge=0, le=MAX_DIRECTIONS)
    repelling_scale: float = _f(0.5, "repelling: relative size of each perturbation, ‖δ‖₂ = F · max(‖x_best‖₂, "
                                "√n)", metavar="F", gt=0.0)
    repelling_budget: int = _f(100, "repelling: Broyden iterations per start", metavar="N", ge=1,
                               le=MAX_ITERATIONS)
    # large states (issue 25): above few_samples_above (the state size n, above every committed record's) the
    # stages whose cost is per sample (a Stage's per_sample: analysis.stages.registry.FEW_SAMPLE_STAGES) measure the
    # first few_samples only
    few_samples: int = _f(8, "on states above n = 8,192: the stages whose cost is per sample (rho and σ_max, prop4, "
                          "input, a8, repelling) measure the first K samples only, said in the report; 0: all",
                          metavar="K", ge=0, le=MAX_SAMPLES)
    few_samples_above: int = _f(8192, "the state size n above which few_samples applies", ge=0,
                                  le=MAX_SEED)
    # issue 35: the GPU's way of batching, selectable on the CPU (where auto keeps every committed number)
    batch: Literal["auto", "all"] = _f(
        "auto", "how the stages batch their samples: all (every sample in one batch, the eigensolver's restarts "
        "batched too, as on a GPU) or auto (per device: the CPU's per-sample eigensolver batches and restarts)")
    # issue 38: off, every analysis keeps the solver's statuses (to_dict writes it only when set, so an analysis
    # and a record written without it keep their shape)
    drift: bool = _f(False, "reachability: test the samples that neither converged nor closed an orbit for a state "
                     "norm growing without bound (max_iter further Picard steps; ‖x_t‖ ∝ t^p with p ≥ 0.5 over "
                     "[T, 2T]) and name them drifting (docs/analysis.md)")
    # not a flag with this default: `stability analyze --geometry-plane N` defaults to 15 with --plots, else 0
    geometry_plane: int = _f(0, "geometry: the ρ(J*) picture over the plane of two directions, N × N cells (0: "
                             "none)", metavar="N", ge=0, le=1000)

    @model_validator(mode="before")
    @classmethod
    def _route(cls, data: Any) -> Any:
        """An analysis written when the eigensolver's route was an option stores ``eig_route``: read its one
        value, refuse any other."""
        if isinstance(data, dict) and "eig_route" in data:
            data = dict(data)
            route = data.pop("eig_route")
            if route != EIG_ROUTE:
                raise ConfigError(f"AnalysisOptions.eig_route: {route!r} is not allowed; allowed: {EIG_ROUTE}")
        return data

    def measured(self, n: int, samples: int) -> int:
        """How many samples (the first ones) the stages of ``FEW_SAMPLE_STAGES`` measure at state size ``n``: all
        ``samples``, or ``few_samples`` of them where ``n > few_samples_above`` (``few_samples`` 0: all)."""
        if self.few_samples and n > self.few_samples_above:
            return min(samples, self.few_samples)
        return samples

    def geometry_count(self, n: int, samples: int) -> int:
        """How many samples the geometry stage measures at state size ``n``: up to ``geometry_samples``, 1 where
        ``n > few_samples_above`` and ``few_samples`` is set (the large-state mode: each sample costs minutes)."""
        k = 1 if self.few_samples and n > self.few_samples_above else self.geometry_samples
        return min(k, samples)

    def live_check_every(self, device_type: str) -> int:
        """GMRES's Krylov steps between the host's checks whether a system is still stepping
        (:func:`stability.numerics.gmres.solve_I_minus_J`; the same result for any value): 1 on the CPU's default
        (no product wasted), 4 with ``batch`` all or on CUDA (a host sync every 4 products instead of every one, at
        most 3 products of a 60-step cycle wasted; issue 35)."""
        return 4 if self.batch == "all" or device_type == "cuda" else 1

    def eig_chunk(self, samples: int, device_type: str) -> int:
        """Samples per batch of the matrix-free eigensolver: ``eig_batch``, else all of ``samples`` with ``batch``
        all or on CUDA, else 1 (the CPU's default)."""
        if self.eig_batch:
            return self.eig_batch
        return samples if self.batch == "all" or device_type == "cuda" else 1

    def batched_path(self, device_type: str) -> bool:
        """The analysis runs the batched path here (the eigensolver's restarts batched: ``batch`` all, or any
        device but the CPU; :func:`stability.numerics.eigen_batched.restart_mode`): what the forecast's costs
        follow (``Cost.batched``)."""
        return self.batch == "all" or device_type != "cpu"

    @property
    def eig_restart(self) -> str:
        """The Krylov–Schur restart (:func:`stability.numerics.eigen.krylov_schur`): ``batched`` with ``batch`` all,
        else ``auto`` (per-sample on the CPU, batched on a GPU)."""
        return "batched" if self.batch == "all" else "auto"

    @property
    def solver_batched(self) -> Optional[bool]:
        """The solvers' row bookkeeping (``stability.solvers.Solve.batched``): batched with ``batch`` all, else
        None (batched on a GPU, per row on the CPU)."""
        return True if self.batch == "all" else None

    def to_dict(self) -> dict:
        """The JSON's ``options``: every field, ``stages`` a list, and ``eig_route`` after ``seed`` (the keys and
        order of every analysis written so far); ``drift`` only when set."""
        out = {}
        for name, value in to_dict(self).items():
            if name == "drift" and not value:  # written only when set: the options of every analysis before it
                continue
            out[name] = value
            if name == "seed":
                out["eig_route"] = EIG_ROUTE
        return out
