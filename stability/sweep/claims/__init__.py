"""Claims as code (issue 27, item 2): the paper's empirical claims, registered in a claims file before the grid
runs, and their verdicts computed from sweep records by the rule the file fixes.

A claims file (``experiments/claims.toml``; docs/experiments.md, "Claims as code") names, for each claim, the
paper's words and where they are, the two arms it compares (cells by their axes: norm, recall, learning rate, with
rates symbolic — ``lowest``, ``middle``, ``highest`` — where the grid is not fixed yet), the metric, the design
(``paired`` by the ``unit`` keys, ``one-sample`` against ``null``, ``unpaired``), the test, the predicted direction,
the selection rule where one is needed (Figure 3's "best configuration"), how runs that never trained are treated,
and the minimum n. :func:`load_claims` validates it (pydantic, one :class:`ConfigError` line on any unknown key
or wrong value); :func:`evaluate` computes every verdict; :func:`markdown` and :func:`verdicts_json` write them.

The decision rule, the same for every claim (α is stated once in the file):

* fewer than ``min_n`` units (pairs; in an unpaired claim, in either arm) → **inconclusive (n too small)**, its
  numbers still computed and shown; a metric absent from the records (an empty monitor series, no geometry
  block) → **inconclusive (not measured)**; more than ``untestable_untrained_fraction`` of an arm's runs never trained → **inconclusive (untestable)**.
* a test with a p-value (sign, Wilcoxon signed-rank, Mann–Whitney U, Fisher exact; ``scipy.stats``): one-sided
  in the predicted direction, p < α → **supported**; the same test one-sided in the opposite direction, p < α →
  **contradicted**; otherwise **inconclusive (not significant)**. The two-sided p is reported beside them.
* ``test = "bootstrap"``: the (1 − 2α) two-sided percentile interval (its bounds are the one-sided 1 − α bounds)
  entirely on the predicted side of ``null`` → supported, entirely on the other side → contradicted.

Every claim reports n, the effect (mean or median of the paired differences or of the values; the difference of
the arms' means; the difference of success rates for Fisher) in the metric's unit, its (1 − 2α) bootstrap CI
resampling whole configurations (the ``cluster`` keys; default: the unit's keys without the seed), and p.
Ties (differences within 1e-9) are dropped by the sign test and by Wilcoxon (``zero_method="wilcox"``).
A claims file of version 2 (issue 38, ``experiments/claims-v2.toml``) is judged by one statistical frame instead
(:mod:`~stability.sweep.claims.frame`: configurations as units, t-intervals, two-sided p, Holm across the file,
literal rules for universal claims, a rank correlation for the headline); version 1's rule and output are
unchanged. Pure functions: no plotting, no training. The package's modules: :mod:`~stability.sweep.claims.schema` (the claims
file, on the project's one config base), :mod:`~stability.sweep.claims.records` (what a record holds: a run's
coordinates, whether it trained, each metric), :mod:`~stability.sweep.claims.statistics` (the tests and the
bootstrap), :mod:`~stability.sweep.claims.evaluation` (the rule, claim by claim) and
:mod:`~stability.sweep.claims.rendering` (lines, Markdown, JSON).
"""

from __future__ import annotations

from stability.sweep.claims.evaluation import FIGURE3_RULE, Result, evaluate, evaluate_claim, resolve_lrs, select_runs
from stability.sweep.claims.records import GEOMETRY_FIELDS, metric_value, never_trained, read_results, run_keys
from stability.sweep.claims.rendering import (BLOCK, compact_markdown, compared, direction_text, generated_blocks,
                                              hypothesis, lines, markdown, splice, test_text, verdicts_json)
from stability.sweep.claims.schema import (FORMAT, METRICS, TESTS_OF, UNITS, VERDICTS_FORMAT, Arm, Bootstrap, Claim,
                                           ClaimsFile, Condition, Exclude, Select, Success, load_claims, parse_claims)
from stability.sweep.claims.frame import FrameResult, evaluate_v2, frame_compact, frame_json, frame_lines, frame_markdown
from stability.sweep.claims.statistics import TIE, holm

__all__ = ["ClaimsFile", "Claim", "Arm", "Condition", "Exclude", "Success", "Select", "Bootstrap", "Result",
           "load_claims", "parse_claims", "evaluate", "evaluate_claim", "metric_value", "never_trained", "run_keys",
           "select_runs", "resolve_lrs", "FIGURE3_RULE", "markdown", "compact_markdown", "splice",
           "generated_blocks", "lines", "verdicts_json", "read_results", "hypothesis", "direction_text", "compared",
           "test_text", "BLOCK", "METRICS", "UNITS", "TESTS_OF", "FORMAT", "VERDICTS_FORMAT", "TIE",
           "GEOMETRY_FIELDS", "FrameResult", "evaluate_v2", "frame_lines", "frame_markdown", "frame_compact",
           "frame_json", "holm"]
