"""How a sweep summarises each cell after training: :class:`SweepSummary` (a grid file's ``[summary]`` table)."""

from __future__ import annotations

import typing
from typing import Any, Literal

from stability.config.base import _Config
from stability.config.fields import MAX_ITERATIONS, MAX_SAMPLES, _f
from stability.errors import ConfigError


class SweepSummary(_Config):
    """How a sweep summarises each cell after training (a grid file's ``[summary]`` table; ``stability sweep``'s
    flags of the same names override it): ``summary`` analyze (the analysis pipeline on the first
    ``analyze_samples`` samples of ``analyze_splits``, its solver budget ``analyze_max_iter``) or monitor (the
    stability monitor's four quantities only); ``reproducible``: every cell with pinned CPU kernels (the global
    ``--reproducible``); ``analyze_geometry``: the analysis adds the geometry stage; ``analyze_path_independence``
    and ``analyze_drift`` (issue 38): the path-independence stage and the drifting status; ``ensemble`` (issue 37):
    ``auto`` trains each group of cells that differ only in seeds and learning rates as one batched ensemble. The
    same options reach the runner, each cell file and each record's ``options`` (:meth:`to_record`,
    :meth:`from_record`: the splits as a list; ``ensemble`` stays out)."""

    owner_name: typing.ClassVar[str] = "summary"
    #: the fields with a flag of ``stability sweep`` (the others: ``--reproducible``, or the grid file only)
    FLAGS: typing.ClassVar[tuple[str, ...]] = ("summary", "analyze_samples", "analyze_splits", "analyze_max_iter",
                                               "ensemble")

    summary: Literal["analyze", "monitor"] = _f("analyze", "after training: the analysis pipeline, or only the "
                                                "monitor's four quantities")
    analyze_samples: int = _f(8, "samples per split of the analysis (0: the monitor summary only)", metavar="N",
                              ge=0, le=MAX_SAMPLES)
    analyze_splits: Literal["val", "hard", "both"] = _f("val", "splits the analysis covers")
    analyze_max_iter: int = _f(500, "fixed-point solver budget of the analysis", metavar="N", ge=1,
                              le=MAX_ITERATIONS)
    reproducible: bool = _f(False, "every cell with pinned CPU kernels (README: Reproducibility)")
    analyze_geometry: bool = _f(False, "the analysis adds the geometry stage (docs/analysis.md)")
    # issue 38, the third edition's grid: off for every grid before it (their records keep their shape and bits)
    analyze_path_independence: bool = _f(False, "the analysis adds the path_independence stage (Anil et al. 2022's "
                                         "asymptotic alignment; docs/analysis.md)")
    analyze_drift: bool = _f(False, "the analysis names drifting states in reachability (AnalysisOptions.drift; "
                             "docs/analysis.md)")
    # issue 37: how cells are trained, not summarised; never in a record's options (a member's record has its own
    # ``ensemble`` note), so records of every other sweep keep their shape and bits
    ensemble: Literal["off", "auto"] = _f("off", "auto: the cells that differ only in seed, learning rate and data "
                                          "seed train as one batched ensemble per group (docs/experiments.md)")

    #: ``analyze_splits`` -> the splits it analyses, in order (the record's form of it)
    SPLITS: typing.ClassVar[dict[str, tuple[str, ...]]] = {"val": ("val",), "hard": ("hard",), "both": ("val", "hard")}

    @property
    def splits(self) -> tuple[str, ...]:
        """The splits the analysis covers, in order."""
        return self.SPLITS[self.analyze_splits]

    def to_record(self) -> dict:
        """The form a sweep record's ``options`` and a cell file hold: ``analyze_splits`` as the list of splits,
        ``reproducible``, ``analyze_geometry`` and issue 38's two only when set (the records of grids that never
        asked for them keep their shape); ``ensemble`` never (how the cells trained, not how they were summarised: an
        ensemble member's record says so in its own ``ensemble`` note)."""
        out = {"summary": self.summary, "analyze_samples": self.analyze_samples,
               "analyze_splits": list(self.splits), "analyze_max_iter": self.analyze_max_iter}
        out.update({k: True for k in ("reproducible", "analyze_geometry", "analyze_path_independence",
                                      "analyze_drift") if getattr(self, k)})
        return out

    @classmethod
    def from_record(cls, data: Any) -> "SweepSummary":
        """The summary a record's ``options`` (or a cell file's) holds, :meth:`to_record`'s inverse."""
        if not isinstance(data, dict):
            raise ConfigError(f"summary: expected a table of options, got {data!r}")
        splits = data.get("analyze_splits")
        if isinstance(splits, list):
            names = [k for k, v in cls.SPLITS.items() if list(v) == splits]
            if not names:
                raise ConfigError(f"summary.analyze_splits: {splits!r} is not allowed; allowed: "
                                  + ", ".join(str(list(v)) for v in cls.SPLITS.values()))
            data = {**data, "analyze_splits": names[0]}
        return cls(**data)
