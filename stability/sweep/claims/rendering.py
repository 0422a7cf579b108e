"""The verdicts in words: one line per claim, the Markdown tables docs/replication.md and the README include
(generated, spliced into their pages' generated blocks), and the JSON of every number."""

from __future__ import annotations

import math
import re
from typing import Optional

from stability.sweep.claims.evaluation import Result
from stability.sweep.claims.schema import VERDICTS_FORMAT, Arm, Claim, ClaimsFile
from stability.sweep.claims.statistics import format_p as _p


def _num(v: Optional[float]) -> str:
    if v is None:
        return "–"
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.3e}"


def _ci(ci: Optional[tuple]) -> str:
    return "–" if ci is None else f"[{_num(ci[0])}, {_num(ci[1])}]"


def _n(r: Result) -> str:
    if r.n is None:
        return "–"
    return f"{r.n_a}+{r.n_b}" if r.n_a is not None else str(r.n)


def _effect(r: Result) -> str:
    return "–" if r.effect is None else f"{r.effect:+.3g} {r.unit}"


def hypothesis(claim: Claim) -> str:
    """What the one-sided test asks, in the effect's own terms (a positive effect is A > B): ``A > B (A external, B autonomous)``, ``A − B > -10 (...)`` against a null, or
    ``A < 1 (A lowest lr)`` for one sample."""
    sym = ">" if claim.direction == "greater" else "<"
    if claim.b is None:
        return f"A {sym} {claim.null:g} (A {claim.a.label})"
    arms = f"(A {claim.a.label}, B {claim.b.label})"
    if claim.null == 0:
        return f"A {sym} B {arms}"
    return f"A − B {sym} {claim.null:g} {arms}"


#: what each test weighs, in words (``{d}``: the values it tests, A − B or A)
_WEIGHS = {"sign": "the signs of {d} against the null", "wilcoxon": "the signed ranks of {d}",
           "mann-whitney": "the ranks of A's values among B's", "fisher": "the success rates",
           "bootstrap": "the effect's interval"}


def _effect_is(claim: Claim) -> str:
    """What the effect is: the mean or median of A − B (paired) or of A (one sample), the difference of the two
    arms' means or medians (unpaired), of their success rates (fisher)."""
    if claim.test == "fisher":
        return "A's success rate − B's"
    if claim.design == "paired":
        return f"the {claim.effect} of A − B"
    if claim.design == "one-sample":
        return f"the {claim.effect} of A"
    return f"A's {claim.effect} − B's"


def direction_text(claim: Claim, r: Result) -> str:
    """``test: one-sided sign test, A > B (A ..., B ...); effect +1.7 points (the mean of A − B), in that
    direction``: the direction the test took and on which side of it the effect lies; where the verdict and the
    effect's side disagree, it says why (the test weighs signs or ranks, the effect is a mean or median), so a
    "contradicted" next to an effect of the predicted sign reads as what it is."""
    text = f"test: one-sided {claim.test}, {hypothesis(claim)}"
    if r.effect is None or not math.isfinite(r.effect):
        return text
    gap = (r.effect - claim.null) * (1 if claim.direction == "greater" else -1)
    side = "in that direction" if gap > 0 else "against it" if gap < 0 else f"at {claim.null:g}"
    text += f"; effect {_effect(r)} ({_effect_is(claim)}), {side}"
    if (r.verdict == "contradicted" and gap >= 0) or (r.verdict == "supported" and gap <= 0):
        d = "A − B" if claim.design == "paired" else "A"
        text += (f", yet the test went the other way: it weighs {_WEIGHS[claim.test].format(d=d)}, not the "
                 f"effect's {claim.effect}")
    return text


def lines(results: list[Result], claims: Optional[list[Claim]] = None) -> list[str]:
    """One line per claim: id, verdict, n, effect (unit), CI, p, then, with ``claims`` (the file's), the direction
    the test took (:func:`direction_text`), and the reason."""
    width = max(len(r.id) for r in results)
    by_id = {c.id: c for c in claims or ()}
    out = []
    for r in results:
        effect = _effect(r)
        test = f"{direction_text(by_id[r.id], r)}; " if r.id in by_id else ""
        out.append(f"{r.id:<{width}}  {r.verdict:<12}  n={_n(r):<6}  effect={effect:<20}  CI={_ci(r.ci):<18}  "
                   f"p={_p(r.p):<6}  {test}{r.reason}")
    return out


def _arm_text(arm: Arm) -> str:
    lr = "every lr" if arm.lr is None else "lr " + ", ".join(v if isinstance(v, str) else f"{v:g}" for v in arm.lr)
    req = "".join(f"; {c.metric}" + (f" ≥ {c.at_least:g}" if c.at_least is not None else "")
                  + (f" < {c.below:g}" if c.below is not None else "") for c in arm.require)
    return f"{'/'.join(arm.recall)} × {'/'.join(arm.norm)} × {lr}{req}"


def compared(claim: Claim) -> str:
    """The cells a claim compares, in words (for the generated table)."""
    text = f"{claim.a.label}: {_arm_text(claim.a)}"
    if claim.b is not None:
        text += f" vs {claim.b.label}: {_arm_text(claim.b)}"
    else:
        text += f" vs {claim.null:g}"
    if claim.select is not None:
        text += f"; selected: max mean {', then '.join(claim.select.by)} over {', '.join(claim.select.over)}"
    for ex in claim.exclude:
        text += f"; except {ex.note}"
    return text


def test_text(claim: Claim) -> str:
    metric = (f"{claim.success.metric} ≥ {claim.success.at_least:g}" if claim.test == "fisher"
              else ", ".join(claim.metric) if isinstance(claim.metric, list) else claim.metric)
    design = f"paired by {', '.join(claim.unit)}" if claim.design == "paired" else claim.design
    return f"{claim.test} ({design}), {metric}, {claim.direction}"


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(spec: ClaimsFile, results: list[Result], *, claims_path: str = "", sha256: str = "",
             records: int = 0, source: str = "") -> str:
    """The verdict table docs/replication.md includes (generated by ``stability claims --markdown``)."""
    alpha = spec.alpha
    head = (f"**Claims of the paper and their verdicts**, computed by `stability claims {source}` from {records} "
            f"records against `{claims_path}` (sha256 {sha256[:12]}). Decision: one-sided tests at α = {alpha:g} "
            f"(supported: p < α in the predicted direction; contradicted: p < α in the opposite one; else "
            f"inconclusive); effects with their {1 - 2 * alpha:.0%} percentile bootstrap interval resampling whole "
            f"configurations ({spec.bootstrap.resamples} resamples, seed {spec.bootstrap.seed}; a `bootstrap` claim "
            f"is decided by that interval against its null); fewer units than the claim's minimum n: inconclusive "
            f"(n too small), with the numbers still shown; a run counts as never trained when its final loss is "
            f"≥ {spec.untrained_loss_fraction:g} × the chance loss. "
            "Generated, never edited by hand.")
    rows = ["| claim | the paper (where) | compared | test | verdict | n | effect | CI | p | reason |",
            "|---|---|---|---|---|---:|---:|---|---:|---|"]
    by_id = {c.id: c for c in spec.claim}
    for r in results:
        c = by_id[r.id]
        effect = _effect(r)
        rows.append("| " + " | ".join(_md(x) for x in (
            f"`{r.id}`", f"“{c.paper}” ({c.where})", compared(c), test_text(c), f"**{r.verdict}**", _n(r), effect,
            _ci(r.ci), _p(r.p), r.reason)) + " |")
    counts: dict[str, int] = {}
    for r in results:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    tail = ", ".join(f"{counts[v]} {v}" for v in ("supported", "contradicted", "inconclusive") if v in counts)
    return head + "\n\n" + "\n".join(rows) + f"\n\n{len(results)} claims: {tail}.\n"


def compact_markdown(results: list[Result], *, records: int = 0, source: str = "", sha256: str = "") -> str:
    """The short verdict table the README shows: claim, verdict, n, effect, interval, p (generated)."""
    rows = [f"Computed by `stability claims {source}` from {records} records (claims file sha256 {sha256[:12]}); "
            "generated, never edited by hand.", "",
            "| claim | verdict | n | effect | 90% CI | p |", "|---|---|---:|---:|---|---:|"]
    for r in results:
        effect = _effect(r)
        rows.append("| " + " | ".join(_md(x) for x in (f"`{r.id}`", f"**{r.verdict}**", _n(r), effect, _ci(r.ci),
                                                        _p(r.p))) + " |")
    return "\n".join(rows) + "\n"


#: a generated block inside a hand-written page: ``<!-- stability claims RESULTS: begin [compact] -->`` ... end
BLOCK = re.compile(r"(<!-- stability claims (?P<source>\S+): begin(?P<compact> compact)? -->\n)(?P<body>.*?)"
                   r"(<!-- stability claims: end -->)", re.S)


def generated_blocks(text: str) -> list[tuple[str, bool]]:
    """(results source, compact?) of every generated claims block of a page."""
    return [(m["source"], bool(m["compact"])) for m in BLOCK.finditer(text)]


def splice(text: str, render) -> str:
    """``text`` with every generated block's body replaced by ``render(source, compact)`` (None: left as it is)."""
    def one(m) -> str:
        body = render(m["source"], bool(m["compact"]))
        return m[0] if body is None else m[1] + body + m[5]

    return BLOCK.sub(one, text)


def verdicts_json(spec: ClaimsFile, results: list[Result], *, claims_path: str = "", sha256: str = "",
                  records: int = 0, source: str = "") -> dict:
    return {"format": VERDICTS_FORMAT, "claims_file": claims_path, "claims_sha256": sha256, "records": records,
            "results_source": source, "alpha": spec.alpha, "ci_level": 1 - 2 * spec.alpha,
            "bootstrap": spec.bootstrap.model_dump(), "untrained_loss_fraction": spec.untrained_loss_fraction,
            "claims": [r.to_dict() for r in results]}
