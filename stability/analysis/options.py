"""What the analysis runs and how: the stages, their JSON blocks, and :class:`AnalysisOptions`.

``reachability`` always runs (every other stage reads x*); ``repelling`` searches for the fixed points plain
iteration cannot reach (:mod:`stability.analysis.repelling`). ``geometry`` perturbs the parameters and re-solves, so
it is not among the library's and the sweep's default stages (:data:`DEFAULT_STAGES`); ``stability analyze`` runs
every stage (:data:`STAGES`) unless ``--only`` says otherwise. What each stage computes:
:mod:`stability.analysis.stages`. The options and the stage names are part of the one configuration schema
(:class:`stability.config.AnalysisOptions`), imported here under their names of this module.
"""

from __future__ import annotations

from stability.config import DEFAULT_STAGES, STAGES, AnalysisOptions, parse_stages

__all__ = ["STAGES", "DEFAULT_STAGES", "FEW_SAMPLE_STAGES", "STAGE_KEYS", "FORMAT", "SCHEMA_VERSION",
           "AnalysisOptions", "parse_stages"]

#: the stages that measure only the first ``few_samples`` samples of a large state (their cost is a Krylov solve,
#: two solves or a root search per sample; :meth:`AnalysisOptions.measured`)
FEW_SAMPLE_STAGES = ("rho", "prop4", "input", "a8", "repelling")
#: the JSON block of each stage
STAGE_KEYS = {"reachability": "fixed_point", "rho": "jacobian", "prop4": "prop4", "rho_wx": "recall",
              "prop5": "prop5", "input": "input_dependence", "a8": "initial_iterate", "repelling": "repelling",
              "accuracy": "accuracy", "geometry": "geometry"}
FORMAT = "stability-analysis"
#: 3: the geometry stage and the verdict on the paper's three axes (reachable, input-dependent, geometry); A.8's
#: independence of e is a fact of the reachable line. 2 (and files without a version) are still read by compare.
SCHEMA_VERSION = 3
