"""The printed report's text layout: :data:`WIDTH` columns, the VERDICT with its reasons wrapped under each line,
and a split's table in three columns (:mod:`stability.analysis.report` prints them)."""

from __future__ import annotations

from stability.analysis.verdict import AXES

#: the verdict's axes as the report labels them
_AXES = tuple((axis, axis.replace("_", "-")) for axis in AXES)
#: the printed report's width: no line of the verdict or of a split's table is longer
WIDTH = 100
#: where the verdict's rule is stated in full
RULE = "docs/analysis.md#the-verdicts-rule"


def _wrap(text: str, first: str, indent: int = 9) -> list:
    """``first`` + ``text`` wrapped at :data:`WIDTH`, the lines after the first indented by ``indent``."""
    import textwrap

    return textwrap.wrap(text, width=WIDTH, initial_indent=first, subsequent_indent=" " * indent,
                         break_long_words=False, break_on_hyphens=False) or [first.rstrip()]


def verdict_text(report: dict) -> str:
    """The VERDICT: for each split, the paper's three axes (reachable, input-dependent, geometry), each a word and
    its reason in short (the full reason is the JSON's ``verdict.reasons``) wrapped under it, at most
    :data:`WIDTH` columns; then the thresholds and where the rule is stated. Each share and median carries its n and
    its interval. A.8's "from every start" is a fact of the reachable line, not an axis. A report written before the
    geometry stage (schema 2) shows its axes as they were."""
    lines, th, conf = [], None, None
    for split in report["splits"]:
        v = report[split].get("verdict")
        if not v:
            continue
        th, conf = v["thresholds"], v.get("confidence") or conf
        axes = _AXES if AXES[2] in v else (*_AXES[:2], ("independent_of_e", "independent of e"))
        for key, label in axes:
            why = (v.get("brief") or {}).get(key) or v["reasons"].get(key, "")
            lines += _wrap(why, f"  {split:<6} {label + ':':<17} {v[key].upper():<7} ")
    if th:
        text = (f"thresholds: reachable if ≥ {th['reachable_share']:.0%} of the samples converge under plain "
                f"iteration and median ρ(J*) < {1 - th['rho_margin']:g}; input-dependent if median ‖dx*/dx0‖_F ≥ "
                f"{th['input_grad_min']:g} and more than one fixed point"
                + (f"; geometry if median radius ≥ {th['geometry_radius_min']:g} and IQR of log r ≤ "
                   f"{th['geometry_log_iqr_max']:g}" if "geometry_radius_min" in th else "") + ".")
        if conf:
            text += (" YES: every interval on the good side; NO: a share's interval wholly below, or a median on "
                     "the bad side; else PARTLY")
        lines += _wrap(text + f" (the rule: {RULE})", "  ", 2)
    head = "VERDICT (the paper's three axes, Section 3.2"
    head += (f"; [lo, hi]: {conf['interval']:.0%} interval, each end a {conf['each_end']:.0%} bound)"
             if conf else ")")
    return "\n".join([head, *lines])


def table_lines(rows: list) -> list:
    """Rows (quantity, value, meaning) in three columns within :data:`WIDTH`: a meaning too long for its column is
    wrapped in it; a value wider than the value column is wrapped under the quantity's line, its meaning on the
    lines below. The value column's width is the one (of the values' widths, at most 60) giving fewest lines."""
    w0 = max(len(r[0]) for r in rows)

    def lay(w1: int) -> list:
        out = []
        for a, b, c in rows:
            if len(b) <= w1:
                out += _wrap(c, f"{a:<{w0}}  {b:<{w1}}  ", w0 + w1 + 4) if c else [f"{a:<{w0}}  {b}".rstrip()]
            else:
                out += _wrap(b, f"{a:<{w0}}  ", w0 + 2)
                out += _wrap(c, " " * (w0 + 4), w0 + 4) if c else []
        return out

    widths = sorted({len(r[1]) for r in rows if len(r[1]) <= 60}) or [0]
    return min((lay(w) for w in widths), key=len)
