"""The claims file's schema (docs/experiments.md, "Claims as code"): each claim, its arms, the design, the test and
the rule, on the project's one config base (:class:`stability.config._Config`: frozen, unknown keys refused, strict
types, one :class:`~stability.errors.ConfigError` line naming the place, ``claim 'id'.a.norm[0]``)."""

from __future__ import annotations

import hashlib
import typing
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import Field, model_validator

from stability.config import Norm, Recall, TaskName, _Config, parse_toml
from stability.errors import ConfigError

FORMAT = "stability-claims"
VERDICTS_FORMAT = "stability-claims-verdicts"

Metric = Literal[
    "val.accuracy", "hard.accuracy", "val-hard.accuracy",
    "val.accuracy_at_train_depth", "hard.accuracy_at_train_depth", "val.overthinking", "hard.overthinking",
    "rho_Wx", "monitor.rho_Wx.max",
    "val.geometry.anisotropy_log_range", "hard.geometry.anisotropy_log_range",
    "val.geometry.median_radius", "hard.geometry.median_radius",
    # version 2: the analysis summary's fields (records.ANALYSIS_FIELDS)
    "val.analysis.samples", "hard.analysis.samples", "val.analysis.converged_fraction",
    "hard.analysis.converged_fraction", "hard.analysis.rho_J_median", "hard.analysis.rho_J_median_all",
    "hard.analysis.input_grad_norm_median", "val.analysis.path_alignment", "hard.analysis.path_alignment",
]
LrSymbol = Literal["lowest", "middle", "highest"]
UnitKey = Literal["model.norm", "model.recall", "train.lr", "train.seed"]
Test = Literal["sign", "wilcoxon", "mann-whitney", "fisher", "bootstrap", "t", "universal", "spearman"]
Design = Literal["paired", "one-sample", "unpaired"]
Direction = Literal["greater", "less"]

METRICS = typing.get_args(Metric)
#: metric -> unit of its values (and of an effect computed from them)
UNITS = {m: "points" for m in METRICS if "accuracy" in m or "overthinking" in m}
UNITS.update({"rho_Wx": "ρ(W_x)", "monitor.rho_Wx.max": "ρ(W_x)",
              "val.geometry.anisotropy_log_range": "log-range", "hard.geometry.anisotropy_log_range": "log-range",
              "val.geometry.median_radius": "radius", "hard.geometry.median_radius": "radius",
              "val.analysis.samples": "inputs", "hard.analysis.samples": "inputs",
              "val.analysis.converged_fraction": "share", "hard.analysis.converged_fraction": "share",
              "hard.analysis.rho_J_median": "ρ(J*)", "hard.analysis.rho_J_median_all": "ρ(J*)",
              "hard.analysis.input_grad_norm_median": "‖dx*/dx0‖",
              "val.analysis.path_alignment": "cosine", "hard.analysis.path_alignment": "cosine"})
TESTS_OF = {"paired": ("sign", "wilcoxon", "bootstrap"), "one-sample": ("sign", "wilcoxon", "bootstrap"),
            "unpaired": ("mann-whitney", "fisher", "bootstrap")}
#: version 2's tests (one frame: configurations as units, two-sided p, Holm across the file)
TESTS_OF_V2 = {"paired": ("t", "universal"), "one-sample": ("t", "universal", "spearman"), "unpaired": ("t",)}
#: the fields only a version-2 claim may set
V2_FIELDS = ("floor", "holds", "predictors", "seeds", "confirmatory")


# ---- schema --------------------------------------------------------------------------------------------------
class _Claims(_Config):
    """The claims file's tables: errors name their place by its path from the file's root."""

    error_style: typing.ClassVar[str] = "path"


class Condition(_Claims):
    """A run is kept only if its ``metric`` is ≥ ``at_least`` and < ``below`` (either may be absent)."""

    metric: Metric
    at_least: Optional[float] = None
    below: Optional[float] = None

    @model_validator(mode="after")
    def _check(self):
        if self.at_least is None and self.below is None:
            raise ValueError("a condition needs at_least, below or both")
        if self.at_least is not None and self.below is not None and self.at_least >= self.below:
            raise ValueError(f"at_least {self.at_least} must be below {self.below}")
        return self


class Arm(_Claims):
    """One side of a comparison: the cells (norm × recall × lr; every lr when ``lr`` is absent), then the runs of
    those cells that meet every ``require`` condition."""

    label: str = Field(min_length=1)
    norm: list[Norm] = Field(min_length=1)
    recall: list[Recall] = Field(min_length=1)
    lr: Optional[list[Union[float, LrSymbol]]] = Field(None, min_length=1)
    require: list[Condition] = []
    depth: Optional[list[int]] = Field(None, min_length=1)  # version 2: the fixed-depth runs' model.depth


class Exclude(_Claims):
    """A cell the paper itself excepts from the claim (e.g. Section 5.1's footnote 4)."""

    norm: Optional[Norm] = None
    recall: Optional[Recall] = None
    lr: Optional[Union[float, LrSymbol]] = None
    note: str = Field(min_length=1)


class Success(_Claims):
    """Fisher's outcome: a unit succeeds when its ``metric`` (the mean of the unit's runs) is ≥ ``at_least``."""

    metric: Metric
    at_least: float


class Select(_Claims):
    """A selection fixed in advance, applied to arm a: its runs grouped by ``over``; the group with the largest
    mean of ``by[0]`` is kept (ties: ``by[1]``, …; then the first group in sorted order)."""

    rule: Literal["max-mean"]
    over: list[UnitKey] = Field(min_length=1)
    by: list[Metric] = Field(min_length=1)


class Predictor(_Claims):
    """A term of a correlation claim's prediction score: a metric and the sign the framework gives it."""

    metric: Metric
    sign: Literal[1, -1]


class Claim(_Claims):
    """One empirical claim of the paper and the rule that decides it."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    paper: str = Field(min_length=1)
    where: str = Field(min_length=1)
    task: Optional[TaskName] = None
    design: Design
    test: Test
    metric: Optional[Union[Metric, list[Metric]]] = None
    success: Optional[Success] = None
    a: Arm
    b: Optional[Arm] = None
    unit: list[UnitKey] = Field(min_length=1)
    cluster: Optional[list[UnitKey]] = None
    direction: Direction
    null: float = 0.0
    effect: Literal["mean", "median"] = "mean"
    select: Optional[Select] = None
    exclude: list[Exclude] = []
    untrained: Literal["include", "exclude"] = "include"
    untestable_untrained_fraction: Optional[float] = Field(None, ge=0.0, le=1.0)
    min_n: int = Field(ge=1)
    note: str = ""
    # version 2 only (V2_FIELDS): a universal claim's noise floor and side, a correlation claim's prediction
    # score, and the seeds a claim is judged on (confirmatory: seeds the second edition did not run)
    floor: Optional[float] = None
    holds: Optional[Literal["below", "above"]] = None
    predictors: list[Predictor] = []
    seeds: Optional[list[int]] = Field(None, min_length=1)
    confirmatory: bool = False

    @model_validator(mode="after")
    def _check(self):
        if self.test not in TESTS_OF[self.design] + TESTS_OF_V2[self.design]:
            raise ValueError(f"test {self.test!r} does not fit design {self.design!r}; allowed: "
                             f"{', '.join(TESTS_OF[self.design])}")
        if (self.b is None) != (self.design == "one-sample"):
            raise ValueError("a one-sample claim has no arm b" if self.b is not None
                             else f"a {self.design} claim needs arm b")
        if self.test == "fisher":
            if self.success is None or self.metric is not None:
                raise ValueError("a fisher claim names its outcome in success (metric, at_least), not metric")
            if self.null != 0.0 or self.effect != "mean":
                raise ValueError("a fisher claim compares success rates: leave null and effect at their defaults")
        elif self.success is not None and self.test in ("t", "universal"):
            if self.metric is not None:
                raise ValueError("a claim with a success block names its outcome there, not in metric")
        elif self.metric is None or self.success is not None:
            raise ValueError(f"a {self.test} claim needs metric and no success block")
        _check_v2(self)
        if len(set(self.unit)) != len(self.unit):
            raise ValueError("unit names a key twice")
        if self.cluster is not None and not set(self.cluster) <= set(self.unit):
            raise ValueError("cluster keys must be among the unit keys (a configuration holds whole units)")
        if self.design == "paired":
            differ = _arm_differences(self.a, self.b)
            clash = [k for k in self.unit if k in differ]
            if clash:
                raise ValueError(f"unit key {clash[0]} is what the arms differ in, so no unit would have both arms")
        return self


def _check_v2(c: "Claim") -> None:
    """The version-2 rule types' own requirements (the version is checked by :class:`ClaimsFile`)."""
    if c.test == "universal" and (c.floor is None or c.holds is None):
        raise ValueError("a universal claim needs floor and holds (below or above)")
    if c.test == "universal" and c.direction != {"below": "less", "above": "greater"}[c.holds]:
        raise ValueError(f"a universal claim that holds {c.holds} its floor has direction "
                         f"{'less' if c.holds == 'below' else 'greater'}")
    if c.test != "universal" and (c.floor is not None or c.holds is not None):
        raise ValueError("floor and holds belong to a universal claim")
    if (c.test == "spearman") != bool(c.predictors):
        raise ValueError("a spearman claim needs predictors, and only it has them")
    if c.test == "spearman" and not -1.0 < c.null < 1.0:
        raise ValueError(f"a spearman claim's null (its floor for ρ) must lie in (-1, 1), got {c.null:g}")
    if c.confirmatory and c.seeds is None:
        raise ValueError("a confirmatory claim names the fresh seeds it is judged on (seeds)")


def _arm_differences(a: Arm, b: Arm) -> set:
    out = set()
    if sorted(a.norm) != sorted(b.norm):
        out.add("model.norm")
    if sorted(a.recall) != sorted(b.recall):
        out.add("model.recall")
    if (a.lr is None) != (b.lr is None) or (a.lr is not None and sorted(map(str, a.lr)) != sorted(map(str, b.lr))):
        out.add("train.lr")
    return out


class Bootstrap(_Claims):
    resamples: int = Field(ge=100)
    seed: int = Field(ge=0)


class ClaimsFile(_Claims):
    """The claims file: one α, the never-trained rule, the bootstrap settings and the claims."""

    format: Literal["stability-claims"]
    version: Literal[1, 2]
    title: str = Field(min_length=1)
    task: TaskName
    alpha: float = Field(gt=0.0, lt=0.5)
    untrained_loss_fraction: float = Field(gt=0.0, le=1.0)
    bootstrap: Bootstrap
    claim: list[Claim] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self):
        seen = set()
        for c in self.claim:
            if c.id in seen:
                raise ValueError(f"claim id {c.id!r} is used twice")
            seen.add(c.id)
            _check_version(self.version, c)
        return self


def _check_version(version: int, c: Claim) -> None:
    """A version-1 claim uses version 1's tests and fields; a version-2 claim only version 2's tests."""
    if version == 1:
        extra = [k for k in V2_FIELDS if k in c.model_fields_set] + (["a.depth"] if c.a.depth else []) + (
            ["b.depth"] if c.b is not None and c.b.depth else [])
        if c.test not in TESTS_OF[c.design] or extra:
            what = f"test {c.test!r}" if c.test not in TESTS_OF[c.design] else ", ".join(extra)
            raise ValueError(f"claim {c.id!r}: {what} needs a version-2 claims file")
    elif c.test not in TESTS_OF_V2[c.design]:
        raise ValueError(f"claim {c.id!r}: a version-2 file decides by {', '.join(TESTS_OF_V2[c.design])} for "
                         f"design {c.design!r}, not {c.test!r}")
    elif c.effect != "mean":
        raise ValueError(f"claim {c.id!r}: a version-2 effect is the mean over configurations; leave effect out")


def parse_claims(data: dict, where: str = "claims") -> ClaimsFile:
    """A :class:`ClaimsFile` from a parsed TOML dict; one ConfigError line on any unknown key or wrong value."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a table, got {data!r}")
    try:
        return ClaimsFile(**data)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def load_claims(path) -> tuple[ClaimsFile, str]:
    """The claims file at ``path`` and the SHA-256 of its bytes (what the verdicts were computed against)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--claims {path}: no such file" if not path.exists() else f"--claims {path}: not a file")
    data = parse_toml(path, f"--claims {path}")
    return parse_claims(data, str(path)), hashlib.sha256(path.read_bytes()).hexdigest()
