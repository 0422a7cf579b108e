"""The analysis' result objects: every stage's result on one split (:class:`SplitResult`; each stage's result class
is its module's, :mod:`stability.analysis.stages`) and the analysis (:class:`Analysis`: one or several splits,
their JSON built once, the text report, the plots, the headline; what ``stability.analyze`` returns and
``stability analyze`` prints)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from stability import hardware
from stability.analysis.headline import headlines
from stability.analysis.options import FORMAT, SCHEMA_VERSION, AnalysisOptions
from stability.analysis.report import text_report, write_plots
from stability.analysis.stages.base import StageResult
from stability.analysis.stages.registry import REGISTRY
from stability.analysis.verdict import verdict
from stability.atomic import clean, write_json
from stability.config import OPT_IN_STAGES

# ---- one split, and the analysis ----------------------------------------------------------------------

@dataclass(eq=False)
class SplitResult:
    """Every stage's result on one split (or one batch of inputs): what :class:`Analysis` gathers, one per split.
    ``results``: stage name → its typed result (the registry's order; a stage that did not run has none, and its
    JSON block is null; :mod:`stability.analysis.stages`). ``x0`` and ``x_star`` keep the tensors the numbers were
    computed at (float64; not part of the JSON)."""

    split: str
    samples: int
    state_shape: list
    stages: tuple
    options: AnalysisOptions
    results: dict[str, StageResult] = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    measured_samples: Optional[dict] = None  # on large states: the stages that measured the first few samples only
    model: Optional[str] = None  # the model's class name
    x0: Optional[torch.Tensor] = field(default=None, repr=False)  # (B, *S0) the analysed inputs' x0 (not in JSON)
    x_star: Optional[torch.Tensor] = field(default=None, repr=False)  # (B, *S) x_best of the solve (not in JSON)

    def to_dict(self) -> dict:
        """The split's JSON block, as the report holds it under the split's name (non-finite numbers as null)."""
        return clean(self._block())

    def _block(self) -> dict:
        """The block before :func:`~stability.atomic.clean`: every stage's block (None for a stage that did not
        run; an opt-in stage's only where it ran, so that an analysis without it keeps its shape), the verdict on
        them and the timings."""
        got = {s.key: self.results.get(s.name) for s in REGISTRY
               if s.name in self.results or s.name not in OPT_IN_STAGES}
        blocks = {k: None if v is None else v.to_dict() for k, v in got.items()}
        few = {} if self.measured_samples is None else {"measured_samples": dict(self.measured_samples)}
        return {"split": self.split, "samples": self.samples, "state_shape": self.state_shape,
                "stages": list(self.stages), **few, **blocks,
                "verdict": verdict(blocks, tol=self.options.tol).to_dict(), "timings": dict(self.timings)}


class JsonView(Mapping):
    """A result read like the JSON it writes: ``result[key]``, iteration and length are its :meth:`to_json`'s."""

    def to_json(self) -> dict:  # pragma: no cover - every subclass defines it
        raise NotImplementedError

    def __getitem__(self, key):
        return self.to_json()[key]

    def __iter__(self):
        return iter(self.to_json())

    def __len__(self):
        return len(self.to_json())


@dataclass(eq=False)
class Analysis(JsonView):
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
    epoch: Optional[int] = None

    def to_json(self) -> dict:
        """The JSON ``stability analyze --json`` writes (strict: non-finite numbers as null): format,
        schema_version, where it came from (a checkpoint with its config and epoch, and the hardware signature;
        or the ``source`` of a model of one's own), options, the split names, one block per split under its
        name, and each split's verdict (docs/analysis.md)."""
        if self._json is None:
            self._json = self._build()
        return self._json

    def _build(self) -> dict:
        blocks = {name: split._block() for name, split in self.splits.items()}  # cleaned once, below
        if self.checkpoint is not None:
            head = {"checkpoint": self.checkpoint, "config": self.config, "options": self.options.to_dict(),
                    "epoch": self.epoch, "splits": list(blocks), "hardware": hardware.signature()}
        else:
            head = {"source": self.source, "options": self.options.to_dict(), "splits": list(blocks)}
        return clean({"format": FORMAT, "schema_version": SCHEMA_VERSION, **head, **blocks,
                      "verdict": {name: block["verdict"] for name, block in blocks.items()}})

    def __post_init__(self):
        self._json = None

    def summary(self) -> str:
        """The text report ``stability analyze`` prints: the verdict, then one table per split."""
        return text_report(self.to_json())

    def headline(self) -> dict:
        """The headline block of each split (:mod:`stability.analysis.headline`: the documented key set, one name
        per quantity), what a sweep's record keeps of the analysis."""
        return headlines(self.to_json())

    def write_json(self, path) -> Path:
        """Write :meth:`to_json` to ``path`` (atomically, :func:`stability.atomic.write_json`)."""
        return write_json(path, self.to_json())

    def plot(self, directory) -> list:
        """Write the PNG plots (residuals, eigenvalues, accuracy, Prop. 5, the geometry stage's region) into
        ``directory``; returns their paths."""
        return write_plots(self.to_json(), directory)
