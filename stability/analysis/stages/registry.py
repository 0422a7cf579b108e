"""The one ordered registry of the analysis' stages: the order they run in, the order a split's table and its JSON
blocks list them. Each line is a stage module's :data:`STAGE` (its :class:`~stability.analysis.stages.base.Stage`);
everything else the package knows of a stage — the names ``config.STAGES`` lists (checked against this by
tests/house/test_stages.py), the JSON keys, the stages measured on the first few samples of a large state, the
cost model, the report's rows and the headline's numbers — is read from here.
"""

from __future__ import annotations

from stability.analysis.stages import (a8, accuracy, geometry, input, path_independence, prop4, prop5,
                                       reachability, repelling, rho, rho_wx)
from stability.analysis.stages.base import Stage

REGISTRY: tuple[Stage, ...] = (
    reachability.STAGE,
    rho.STAGE,
    prop4.STAGE,
    rho_wx.STAGE,
    prop5.STAGE,
    input.STAGE,
    a8.STAGE,
    path_independence.STAGE,
    repelling.STAGE,
    accuracy.STAGE,
    geometry.STAGE,
)

_BY_NAME = {s.name: s for s in REGISTRY}

#: the stage names in run order (what ``config.STAGES`` must list)
NAMES = tuple(_BY_NAME)
#: the JSON block of each stage
STAGE_KEYS = {s.name: s.key for s in REGISTRY}
#: the stages that measure only the first ``few_samples`` samples of a large state (their cost is a Krylov solve,
#: two solves or a root search per sample; :meth:`AnalysisOptions.measured`)
FEW_SAMPLE_STAGES = tuple(s.name for s in REGISTRY if s.per_sample)


def stage(name: str) -> Stage:
    """The stage of a name of ``config.STAGES``."""
    return _BY_NAME[name]


def stages(names) -> tuple[Stage, ...]:
    """The stages of ``names``, in run order."""
    return tuple(s for s in REGISTRY if s.name in set(names))
