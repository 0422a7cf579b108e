"""The text of the ``lm`` block: what :meth:`stability.lm.analyze.LMAnalysis.summary` prints after the stages'
report (each row explained in docs/language-models.md, "Reading the numbers")."""

from __future__ import annotations

import statistics
import textwrap

RULE = "-" * 100


def _f(v, spec: str = ".4g") -> str:
    return "—" if v is None else format(v, spec)


def _few(values, spec: str = ".4g", n: int = 8) -> str:
    vals = [("—" if v is None else format(v, spec)) for v in values[:n]]
    return ", ".join(vals) + (f", … ({len(values)} in all)" if len(values) > n else "")


def _row(name: str, value: str, note: str = "") -> str:
    """One row: the name, the value, the note wrapped at 100 columns under itself."""
    head = f"{name:<22} {value:<15} "
    if len(head) > 39:  # a long value: the note on the lines below
        head, note = head.rstrip() + "\n" + " " * 39, note
    lines = textwrap.wrap(note, width=100 - 39) or [""]
    return (head + ("\n" + " " * 39).join(lines)).rstrip()


def _tokens(t: dict) -> list:
    c = t["status_counts"]
    parts = ", ".join(f"{k} {v}" for k, v in c.items() if v and k != "pad")
    steps = [s for row in t["steps"] for s in row if s is not None and s >= 0]
    return [_row("tokens converged", f"{100 * t['converged_tokens']:.1f}%",
                 f"of {t['tokens']} real tokens ({parts}); sequences {100 * t['converged_sequences']:.1f}%"),
            _row("passes to τ", _f(statistics.median(steps) if steps else None, ".0f"),
                 f"median over converged tokens (τ = {t['tol']:g}); slowest token per sample: "
                 f"{_few(t['slowest_token'], 'd')}")]


def _rho(r: dict) -> list:
    rho = r["rho"]
    exact = all(r["exact"])
    return [_row("token ρ max", _f(max((v for v in rho if v is not None), default=None)),
                 f"per sample: {_few(rho)}; bottleneck token: {_few(r['bottleneck'], 'd')}"),
            _row("ρ(J*) by blocks", "exact" if exact else "not exact",
                 "causal: no block above the diagonal, so ρ(J*) = max token ρ" if exact else
                 f"a block above the diagonal is nonzero (largest {_few(r['acausal'], '.2g')}): not causal here"),
            *_route(r.get("route"))]


def _route(route) -> list:
    """The per-token ρ's route: dense blocks, one forward-mode pass per Krylov step, or one product per position."""
    if not route or route.get("route") == "blocks":
        return [_row("token ρ route", "blocks", "every diagonal block formed (T·D products), dense eigenvalues")]
    if route["route"] == "one-pass":
        return [_row("token ρ route", "one-pass", f"one product per Krylov step ({route['applications']}), checked "
                     f"against the per-position products: relative {route['check_rel_diff']:.1e}")]
    return [_row("token ρ route", "per-position", f"{route['note']} ({route['applications']} applications)")]


def _scoring(s: dict) -> list:
    a, m = s["at_fixed_point"], s["at_model_depth"]
    return [_row("loss / perplexity", f"{_f(a['loss'])} / {_f(a['perplexity'])}",
                 f"at x*; at the model's depth {_f(m['loss'])} / {_f(m['perplexity'])} ({a['scored_tokens']} tokens)"),
            _row("token accuracy", _f(a["token_accuracy"], ".1%"),
                 f"at x*; at the model's depth {_f(m['token_accuracy'], '.1%')}; sequences all right "
                 f"{a['sequence_accuracy']:.1%}")]


def _routing(r: dict) -> list:
    p2 = [i for i, v in enumerate(r["period2"]) if v]
    return [_row("routing changes", _few(r["changes"], "d"),
                 f"per sample, along the last {r['iterates']} passes ({len(r['routers'])} routers)"),
            _row("alternating", _few(r["alternating"], "d"),
                 f"(router, token) flipping with period 2; state on a period-2 orbit: "
                 f"{'samples ' + _few(p2, 'd') if p2 else 'none'}")]


def _exits(x: dict) -> list:
    out = [_row("exit rules", f"{x['passes']} passes", "rule threshold: compute spent, agreement with the last pass"
                + (", accuracy at exit" if "full_depth_accuracy" in x else ""))]
    for r in x["rules"]:
        acc = f", {r['accuracy_at_exit']:.1%}" if "accuracy_at_exit" in r else ""
        out.append(" " * 23 + f"{r['rule']:<9} {r['threshold']:<8g} {r['compute']:6.1%}  {r['agreement']:6.1%}{acc}")
    return out


def lm_summary(lm: dict) -> str:
    """The ``lm`` block as text, one row per number."""
    lines = ["", "LANGUAGE MODEL (per token, pads left out; docs/language-models.md)", RULE]
    prec = lm.get("precision", {})
    lines.append(_row("precision", prec.get("dtype", "?"), prec.get("checked") or prec.get("note", "")))
    lines.append(_row("model depth", str(lm.get("model_steps")), "passes after the initial state"))
    for key, fn in (("tokens", _tokens), ("token_rho", _rho), ("scoring", _scoring), ("routing", _routing),
                    ("exits", _exits)):
        if lm.get(key):
            lines += fn(lm[key])
    lines.append(RULE)
    return "\n".join(lines) + "\n"
