"""What the analysis runs and how: the stage names and :class:`AnalysisOptions`, and the JSON's format.

``reachability`` always runs (every other stage reads x*); ``repelling`` searches for the fixed points plain
iteration cannot reach (:mod:`stability.analysis.stages.repelling`). ``geometry`` perturbs the parameters and
re-solves, so it is not among the library's and the sweep's default stages (:data:`DEFAULT_STAGES`); ``stability
analyze`` runs every stage but the opt-in ones (:data:`ANALYZE_STAGES`: all of :data:`STAGES` but
``path_independence``) unless ``--only`` says otherwise. What each stage computes, its JSON
block and its cost: :mod:`stability.analysis.stages` (the registry). The options and the stage names are part of
the one configuration schema (:class:`stability.config.AnalysisOptions`), imported here under their names of this
module.
"""

from __future__ import annotations

from stability.config import ANALYZE_STAGES, DEFAULT_STAGES, STAGES, AnalysisOptions, parse_stages

__all__ = ["STAGES", "ANALYZE_STAGES", "DEFAULT_STAGES", "FORMAT", "SCHEMA_VERSION", "AnalysisOptions", "parse_stages"]

FORMAT = "stability-analysis"
#: 3: the geometry stage and the verdict on the paper's three axes (reachable, input-dependent, geometry); A.8's
#: independence of e is a fact of the reachable line. 2 (and files without a version) are still read by compare.
SCHEMA_VERSION = 3
