"""Looped (recurrent-depth) language models: Hugging Face models adapted to the model contract, structured inputs,
per-token statistics, LM scoring, routing discontinuities and exit rules (docs/language-models.md).

* ``load_pretrained(dir)`` / ``stability.load(dir)``: a local ``save_pretrained`` directory, adapted
  (:mod:`stability.lm.pretrained`); ``adapt(model)``, ``register_adapter(model_type, factory)``;
* adapters: ``InklingLoopAdapter`` (``inkling2_loop``), ``HrmTextAdapter`` (``hrm_text``), the base ``LMAdapter``,
  and the reference model ``stability.lm.huginn`` (``Huginn``, ``tiny``);
* inputs: ``pack(ids, attention_mask, position_ids)``, ``unpack`` (:mod:`stability.lm.inputs`);
* precision: ``float64_mode``, ``precision_audit``, ``check_float64`` (:mod:`stability.lm.precision`);
* per token: ``token_convergence``, ``token_spectra``, ``token_residuals`` (:mod:`stability.lm.tokens`);
* scoring: ``next_token_targets``, ``lm_score``, ``score_lm``, ``token_losses``, ``token_accuracy``;
* ``routing_changes`` (routed MoE), ``exit_trace`` / ``audit_exits`` (exit rules);
* ``analyze_lm(source, ids, attention_mask)``: everything, as ``stability analyze HF_DIR --inputs ids.pt``.

Names are loaded on first use.
"""

_LAZY = {
    "LMAdapter": "stability.lm.adapter",
    "InklingLoopAdapter": "stability.lm.inkling",
    "HrmTextAdapter": "stability.lm.hrm",
    "Huginn": "stability.lm.huginn",
    "load_pretrained": "stability.lm.pretrained",
    "adapt": "stability.lm.pretrained",
    "register_adapter": "stability.lm.pretrained",
    "is_pretrained_dir": "stability.lm.pretrained",
    "PretrainedLoaded": "stability.lm.pretrained",
    "pack": "stability.lm.inputs",
    "unpack": "stability.lm.inputs",
    "IGNORE_INDEX": "stability.lm.inputs",
    "float64_mode": "stability.lm.precision",
    "precision_audit": "stability.lm.precision",
    "check_float64": "stability.lm.precision",
    "token_convergence": "stability.lm.tokens",
    "token_spectra": "stability.lm.tokens",
    "token_residuals": "stability.lm.tokens",
    "next_token_targets": "stability.lm.scoring",
    "lm_score": "stability.lm.scoring",
    "score_lm": "stability.lm.scoring",
    "token_losses": "stability.lm.scoring",
    "token_accuracy": "stability.lm.scoring",
    "routing_changes": "stability.lm.routing",
    "exit_trace": "stability.lm.exits",
    "audit_exits": "stability.lm.exits",
    "analyze_lm": "stability.lm.analyze",
    "LMAnalysis": "stability.lm.analyze",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'stability.lm' has no attribute {name!r}")


__all__ = sorted(_LAZY)
