"""One figure per registered claim (issue 27, item 5): the values the verdict rests on, read at a glance.

Each figure shows every unit's value as the claim's test sees it (the mean of an arm's runs in the unit), with the
verdict, n, effect, its interval and p in the title:

* paired claims: arm a against arm b, one point per unit, on the line y = x + null where the arms are level, so a
  claim that a is greater is a cloud above the line;
* one-sample claims: the units' values beside the null the test compares them with;
* unpaired claims: each arm's values side by side (Fisher's claims: with the success threshold and the k/n above it).

Drawn from :class:`stability.sweep.claims.Result` (``detail["values"]``), never from the records directly, so a
figure cannot disagree with the table it illustrates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stability.sweep.claims import Claim, ClaimsFile, Result

COLOURS = {"supported": "#1b7837", "contradicted": "#b2182b", "inconclusive": "#777777"}


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.3g}"


def _title(result: Result) -> str:
    n = result.n if result.n_a is None else f"{result.n_a}+{result.n_b}"
    ci = "–" if result.ci is None else f"[{_fmt(result.ci[0])}, {_fmt(result.ci[1])}]"
    p = "" if result.p is None else f", p = {result.p:.2g}"
    return (f"{result.id}: {result.verdict.upper()}\n"
            f"n = {n}, effect {_fmt(result.effect)} {result.unit}, 90% CI {ci}{p}")


def _metric(claim: Claim) -> str:
    if claim.test == "fisher":
        return claim.success.metric
    return ", ".join(claim.metric) if isinstance(claim.metric, list) else claim.metric


def _jitter(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-0.12, 0.12, n)


def draw(claim: Claim, result: Result, path: Path) -> bool:
    """Write ``path`` (PNG) for one claim; False (nothing written) when the claim has no values to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = result.detail.get("values") or {}
    a = dict((tuple(u), v) for u, v in values.get("a", []))
    b = dict((tuple(u), v) for u, v in values.get("b", []))
    if not a:
        return False
    colour = COLOURS[result.verdict]
    fig, ax = plt.subplots(figsize=(5.2, 4.4), layout="constrained")
    metric = _metric(claim)
    if claim.design == "paired":
        common = sorted(set(a) & set(b), key=repr)
        if not common:
            plt.close(fig)
            return False
        xs, ys = np.array([b[u] for u in common]), np.array([a[u] for u in common])
        lo, hi = float(min(xs.min(), ys.min())), float(max(xs.max(), ys.max()))
        pad = 0.05 * (hi - lo or 1.0)
        line = np.array([lo - pad, hi + pad])
        ax.plot(line, line + claim.null, color="black", lw=0.8, ls="--",
                label="level" if claim.null == 0 else f"a = b + {claim.null:g}")
        ax.scatter(xs, ys, s=22, color=colour, alpha=0.75, edgecolor="none", label=f"{len(common)} pairs")
        ax.set_xlabel(f"{claim.b.label}: {metric}")
        ax.set_ylabel(f"{claim.a.label}: {metric}")
        ax.legend(loc="best", fontsize=8)
    elif claim.design == "one-sample":
        ys = np.array([a[u] for u in sorted(a, key=repr)])
        ax.scatter(_jitter(len(ys), 0), ys, s=22, color=colour, alpha=0.75, edgecolor="none")
        ax.axhline(claim.null, color="black", lw=0.8, ls="--", label=f"null {claim.null:g} ({claim.direction} "
                                                                          "predicted)")
        ax.set_xlim(-0.5, 0.5)
        ax.set_xticks([0], [claim.a.label])
        ax.set_ylabel(metric)
        ax.legend(loc="best", fontsize=8)
    else:
        arms = [(claim.a.label, [a[u] for u in sorted(a, key=repr)]),
                (claim.b.label, [b[u] for u in sorted(b, key=repr)])]
        ticks = []
        for i, (label, vals) in enumerate(arms):
            ax.scatter(i + _jitter(len(vals), i), vals, s=22, color=colour, alpha=0.75, edgecolor="none")
            if claim.test == "fisher":
                k = sum(v >= claim.success.at_least for v in vals)
                label = f"{label}\n{k}/{len(vals)} ≥ {claim.success.at_least:g}"
            ticks.append(label)
        if claim.test == "fisher":
            ax.axhline(claim.success.at_least, color="black", lw=0.8, ls="--", label="success threshold")
            ax.legend(loc="best", fontsize=8)
        ax.set_xticks(range(len(ticks)), ticks)
        ax.set_xlim(-0.6, len(ticks) - 0.4)
        ax.set_ylabel(metric)
    ax.set_title(_title(result), fontsize=9, color=colour, loc="left")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def draw_all(spec: ClaimsFile, results: list[Result], out: Path) -> list[Path]:
    """One PNG per claim with values under ``out`` (created); returns the files written."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    claims = {c.id: c for c in spec.claim}
    written = []
    for result in results:
        path = out / f"{result.id}.png"
        if draw(claims[result.id], result, path):
            written.append(path)
    return written
