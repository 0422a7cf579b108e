"""``stability halt HF_DIR``: the exit rules of a looped language model audited on token ids, per token
(:mod:`stability.lm.exits`; docs/language-models.md, "Exit rules").

The model is iterated ``passes`` passes from its own first iterate e (the analysis copy, float64, as ``stability
analyze`` reads it); every rule is applied at each of its thresholds to that one trajectory, and for each the share
of the full depth it spends (``compute``) is set against how often its answer is the last pass's (``agreement``)
and, where targets are scored, the token accuracy at exit: one curve per rule (:func:`plot_exits`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from stability.atomic import atomic_path
from stability.lm import exits
from stability.lm.analyze import as_adapter
from stability.lm.inputs import unpack
from stability.lm.scoring import next_token_targets
from stability.protocols import check_contract, differentiable_attention


def halt_lm(source, packed: torch.Tensor, targets: Optional[torch.Tensor] = None, *, passes: Optional[int] = None,
            rules: Optional[dict] = None, device: str = "cpu", seed: int = 0) -> dict:
    """The exit-rule audit of ``source`` (a directory, a loaded directory or an LM adapter) on packed inputs
    (B, 3, T): targets default to the next tokens (pads unscored); ``rules``: rule → thresholds (default
    :data:`~stability.lm.exits.DEFAULT_RULES`)."""
    model, desc = as_adapter(source, torch.float64)
    model = model.to(device)
    check_contract(model)
    packed = packed.to(device)
    if targets is None:
        ins = unpack(packed)
        targets = next_token_targets(ins.ids, ins.mask)
    n = passes or exits.default_passes(model)
    with differentiable_attention(), torch.no_grad():
        x0 = model.embed(packed)
        e = model.initial_state(x0, generator=torch.Generator(device=x0.device).manual_seed(seed))
        audit = exits.audit_exits(exits.exit_trace(model, x0, e, n), rules, targets=targets.to(device))
    return {**audit, "source": desc, "inputs": list(packed.shape), "model_steps": int(getattr(model, "model_steps",
                                                                                              0))}


def format_audit(audit: dict) -> str:
    """The audit as a table: a row per rule and threshold."""
    acc = "full_depth_accuracy" in audit
    head = (f"exit rules over {audit['passes']} passes, {audit['tokens']} real tokens"
            + (f" (token accuracy at pass {audit['passes']}: {audit['full_depth_accuracy']:.1%})" if acc else ""))
    lines = [head, f"{'rule':<9} {'threshold':>9} {'compute':>8} {'fired':>7} {'agreement':>9}"
             + (f" {'accuracy':>9}" if acc else "")]
    for r in audit["rules"]:
        lines.append(f"{r['rule']:<9} {r['threshold']:>9g} {r['compute']:>8.1%} {r['fired']:>7.1%} "
                     f"{r['agreement']:>9.1%}" + (f" {r['accuracy_at_exit']:>9.1%}" if "accuracy_at_exit" in r
                                                 else ""))
    return "\n".join(lines)


def plot_exits(audit: dict, path) -> Path:
    """Agreement with the last pass against the compute spent, one curve per rule over its thresholds (PNG)."""
    import matplotlib.pyplot as plt  # lazy: matplotlib only where a picture is drawn

    fig, ax = plt.subplots(figsize=(6, 4.2))
    for rule in dict.fromkeys(r["rule"] for r in audit["rules"]):
        pts = sorted((r["compute"], r["agreement"]) for r in audit["rules"] if r["rule"] == rule)
        ax.plot([100 * c for c, _ in pts], [100 * a for _, a in pts], marker="o", label=rule)
    ax.set_xlabel(f"compute spent (% of {audit['passes']} passes)")
    ax.set_ylabel("answer = the last pass's (% of tokens)")
    ax.set_title("exit rules: one curve per rule, a point per threshold")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:  # whole or not at all
            fig.savefig(tmp, format="png", dpi=120)
    finally:
        plt.close(fig)
    return Path(path)
