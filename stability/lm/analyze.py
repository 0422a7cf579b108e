"""The analysis of a looped language model on token ids: the toolkit's stages plus the numbers a language model
needs (docs/language-models.md).

:func:`analyze_lm` takes a ``save_pretrained`` directory, a :class:`~stability.lm.pretrained.PretrainedLoaded` or an
adapter (any LoopedModel with the LM members of :class:`~stability.lm.LMAdapter`), token ids with their attention
mask (and positions, and targets: default the next tokens, −100 where nothing is scored) and runs

* the stages of ``options`` (:func:`stability.analysis.pipeline.run_stages`: reachability, ρ(J*), Props. 4–5, A.8,
  accuracy, …) on the float64 model, scored per token with the ignore index (:func:`~stability.lm.scoring.lm_score`);
* the LM numbers (the ``lm`` block of the JSON): precision, per-token convergence (:mod:`stability.lm.tokens`),
  per-token ρ and the bottleneck token, loss / perplexity / token accuracy at x* and at the model's own depth,
  routing changes (:mod:`stability.lm.routing`) and the exit-rule audit (:mod:`stability.lm.exits`).

Precision: a directory is loaded in float64 directly (one copy of the model), a float32 model is copied to float64
once, and the float64 model is audited (:func:`~stability.lm.precision.check_float64`) before any work: a model that
still computes in float32 is refused in one line naming precision. ``precision="float32"`` instead analyses the
model at float32, with the tolerances scaled to it (said in the JSON and the report).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from stability.analysis.fixed_point import analysis_model
from stability.analysis.pipeline import check_finite_weights, run_stages
from stability.analysis.results import Analysis, JsonView
from stability.atomic import clean, write_json
from stability.config import AnalysisOptions, resolve_device
from stability.errors import StabilityError
from stability.lm import exits, routing, scoring, tokens
from stability.lm.inputs import IGNORE_INDEX, load_inputs, pack, unpack
from stability.lm.precision import check_float64, model_dtype, precision_hint
from stability.lm.pretrained import PretrainedLoaded, is_pretrained_dir, load_pretrained
from stability.lm.report import lm_summary
from stability.lm.scoring import lm_score, next_token_targets
from stability.lm.storage import analysis_copy
from stability.lm.text import text_inputs
from stability.protocols import check_contract, check_model, differentiable_attention
from stability.stored import load_plain

#: the LM numbers :func:`analyze_lm` computes (each can be left out with ``lm_stages``)
LM_STAGES = ("tokens", "token_rho", "scoring", "routing", "exits")
#: float32 analysis: the tolerances raised to (ε₃₂ ≈ 1.2e-7: a residual or a Krylov solve cannot go much below)
FLOAT32_TOLERANCES = {"tol": 1e-4, "gmres_tol": 1e-5, "eig_tol": 1e-4}


@dataclass
class LMAnalysis(JsonView):
    """What :func:`analyze_lm` returns: ``analysis`` (the stages, an :class:`~stability.analysis.results.Analysis`)
    and ``lm`` (the language-model numbers, the JSON's ``lm`` block); read like the JSON it writes
    (``a["lm"]["token_rho"]["rho"]``, ``a["inputs"]["jacobian"]``), printed by :meth:`summary`."""

    analysis: object
    lm: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {**self.analysis.to_json(), "lm": clean(self.lm)}

    def plot(self, directory) -> list:
        """The stages' plots (:meth:`stability.analysis.results.Analysis.plot`)."""
        return self.analysis.plot(directory)

    def summary(self) -> str:
        return self.analysis.summary() + lm_summary(self.lm)

    def write_json(self, path):
        return write_json(path, self.to_json(), indent=1)


def is_lm_source(source) -> bool:
    """A looped language model: a save_pretrained directory, its :class:`PretrainedLoaded`, or a model marked
    ``lm_adapter`` (every :class:`~stability.lm.LMAdapter`)."""
    if isinstance(source, PretrainedLoaded) or getattr(source, "lm_adapter", False) is True:
        return True
    return isinstance(source, (str, os.PathLike)) and is_pretrained_dir(source)


def analyze_inputs_file(source, inputs_path, targets_path=None, options=None, *, log=None,
                        text_path=None) -> LMAnalysis:
    """``stability analyze HF_DIR --inputs ids.pt [--targets FILE.pt]`` (and ``--model`` of an LM adapter):
    ``source`` (a directory or a model) on the token ids of the file (:func:`~stability.lm.inputs.load_inputs`:
    ids, or a dict with mask, positions and labels); or, with ``text_path`` (``--text``), on the lines of a text
    file encoded by the directory's tokenizer (:func:`~stability.lm.text.text_inputs`)."""
    packed, targets = read_lm_inputs(source, inputs_path, text_path)
    if targets_path is not None:
        targets = read_targets(targets_path)
    return analyze_lm(source, packed, targets=targets, options=options, log=log)


def read_lm_inputs(source, inputs_path=None, text_path=None) -> tuple:
    """(packed inputs, targets or None) of ``--inputs FILE.pt`` or ``--text FILE`` (one of them), read and checked
    before any model is loaded."""
    if inputs_path is not None and text_path is not None:
        raise StabilityError("give --inputs FILE.pt or --text FILE, not both")
    if inputs_path is None and text_path is None:
        raise StabilityError("give the token ids with --inputs FILE.pt or the text with --text FILE")
    if inputs_path is not None:
        return load_inputs(inputs_path)
    if not isinstance(source, (str, os.PathLike)) or not is_pretrained_dir(source):
        raise StabilityError("--text needs a Hugging Face save_pretrained directory with its tokenizer (CKPT); "
                             "for a model of one's own give token ids with --inputs FILE.pt")
    return text_inputs(source, text_path), None


def read_targets(targets_path) -> torch.Tensor:
    """The token ids of ``--targets FILE.pt`` (a tensor, or a dict with labels or targets)."""
    if not Path(targets_path).is_file():
        raise StabilityError(f"--targets {targets_path}: no such file")
    obj = load_plain(Path(targets_path), f"--targets {targets_path}", "tensor file",
                     "not a tensor file saved with torch.save")
    obj = obj.get("labels", obj.get("targets")) if isinstance(obj, dict) else obj
    if not isinstance(obj, torch.Tensor):
        raise StabilityError(f"--targets {targets_path}: expected a tensor of token ids (B, T)")
    return obj.long()


def as_adapter(source, dtype: torch.dtype = torch.float64):
    """(the model in ``dtype``, the source's description) of a directory, a loaded directory or a model; the model
    is copied only when it is not in ``dtype`` already (to float64: :func:`~stability.lm.storage.analysis_copy`,
    its vocabulary tables in float32)."""
    if isinstance(source, (str, os.PathLike)):
        loaded = load_pretrained(source, dtype=dtype)
        return loaded.model, {"pretrained": str(source), "model_type": loaded.model_type}
    if isinstance(source, PretrainedLoaded):
        desc = {"pretrained": str(source.path), "model_type": source.model_type}
        source = source.model
    else:
        desc = {"model": type(source).__name__}
    if not isinstance(source, torch.nn.Module):
        raise StabilityError(f"{type(source).__name__}: analyze_lm takes a save_pretrained directory, "
                             "stability.load's result or an adapter (a torch.nn.Module)")
    if model_dtype(source) == dtype:
        source.eval()
        for p in source.parameters():
            p.requires_grad_(False)
        return source, desc
    if dtype == torch.float64:  # the analysis copy with the vocabulary tables in float32 (stability.lm.storage)
        return analysis_copy(source), desc
    return analysis_model(source, dtype), desc


def lm_inputs(inputs, attention_mask=None, position_ids=None, targets=None, token_type_ids=None):
    """(packed inputs (B, 3, T), targets (B, T)) from ids (B, T) or packed inputs; the targets default to the next
    tokens (:func:`~stability.lm.scoring.next_token_targets`); pad positions are never scored."""
    if not isinstance(inputs, torch.Tensor):
        raise StabilityError("a language model is analysed on token ids: analyze_lm(model, ids (B, T), "
                             "attention_mask) or stability.analyze(model, stability.lm.pack(ids, attention_mask))")
    packed = pack(inputs, attention_mask, position_ids, token_type_ids) if inputs.dim() == 2 else inputs
    lm = unpack(packed)
    if targets is None:
        targets = next_token_targets(lm.ids, lm.mask)
    elif tuple(targets.shape) != tuple(lm.ids.shape):
        raise StabilityError(f"targets {tuple(targets.shape)} must have the shape of the ids {tuple(lm.ids.shape)}")
    # a pad position's state is 0 (its logits mean nothing): never scored
    targets = torch.where(lm.mask, targets.long().to(lm.mask.device), torch.full_like(lm.ids, IGNORE_INDEX))
    return packed, targets


def _options(options, N: int, precision: str):
    options = AnalysisOptions(samples=N) if options is None else options
    options = options.replace(device=str(resolve_device(options.device)))  # auto -> cpu or cuda, said in the JSON
    if precision == "float32":
        options = options.replace(**{k: max(getattr(options, k), v) for k, v in FLOAT32_TOLERANCES.items()})
    elif precision != "float64":
        raise StabilityError(f"precision must be float64 or float32, got {precision!r}")
    return options


def analyze_lm(source, inputs: torch.Tensor, attention_mask: Optional[torch.Tensor] = None, *,
               position_ids: Optional[torch.Tensor] = None, targets: Optional[torch.Tensor] = None,
               token_type_ids: Optional[torch.Tensor] = None, options=None, precision: str = "float64", lm_stages=LM_STAGES, exit_passes: Optional[int] = None,
               parameter_groups: Optional[dict] = None, log: Optional[Callable] = None) -> LMAnalysis:
    """The analysis of a looped language model on token ids (module docstring). ``inputs``: ids (B, T) (with
    ``attention_mask``, ``position_ids``, ``token_type_ids`` for a PrefixLM) or packed inputs (B, 3, T); ``targets``: (B, T) aligned with the logits,
    −100 unscored; ``options``: :class:`~stability.config.AnalysisOptions` (default: every sample, the default
    stages); ``exit_passes``: the passes of the exit audit (default the larger of 4 × the model's depth and 32,
    at most ``options.max_iter``); ``parameter_groups``: the geometry stage's groups, label → parameter-name
    prefixes (default: by module type, :meth:`~stability.lm.LMAdapter.parameter_groups`)."""
    packed, targets = lm_inputs(inputs, attention_mask, position_ids, targets, token_type_ids)
    options = _options(options, int(packed.shape[0]), precision)
    model, desc = as_adapter(source, torch.float32 if precision == "float32" else torch.float64)
    model = model.to(options.device)
    if parameter_groups is not None:
        set_user_groups(model, parameter_groups)
    check_contract(model)
    check_finite_weights(model, type(model).__name__)
    check_model(model, packed, targets)
    if precision == "float64":
        check_float64(model, packed[:1])
    N = min(options.samples, int(packed.shape[0]))
    packed, targets = packed[:N], targets[:N]
    try:
        split = run_stages(model, packed, targets, options, score=lm_score, log=log)
    except StabilityError as exc:
        if precision == "float32":  # a failed solve at float32 is rounding first: say so (precision_hint)
            raise StabilityError(precision_hint(exc, model, packed[:1])) from None
        raise
    analysis = Analysis(options=options, splits={split.split: split}, source={**desc, "inputs": list(packed.shape)})
    lm = lm_numbers(model, split.x0, split.x_star, targets, options, lm_stages=lm_stages, exit_passes=exit_passes,
                    log=log)
    lm["precision"] = _precision_block(precision, options)
    return LMAnalysis(analysis=analysis, lm=lm)


def set_user_groups(model, groups: dict) -> None:
    """Give an LM adapter the user's parameter groups (label → name prefixes), each prefix checked against the
    model's parameters first (one line naming the first that matches none)."""
    if not isinstance(groups, dict) or not all(isinstance(v, (list, tuple)) for v in groups.values()):
        raise StabilityError("parameter_groups: a dict of label -> list of parameter-name prefixes")
    names = [k for k, _ in model.named_parameters()]
    for label, prefixes in groups.items():
        for p in prefixes:
            if not any(k == p or k.startswith(str(p).rstrip(".") + ".") for k in names):
                raise StabilityError(f"parameter_groups[{label!r}]: no parameter of {type(model).__name__} "
                                     f"starts with {p!r} (e.g. {names[0]!r})")
    model.user_groups = {str(k): [str(p) for p in v] for k, v in groups.items()}


def _precision_block(precision: str, options) -> dict:
    if precision == "float64":
        return {"dtype": "float64", "checked": "no operation of embed, step or readout computes below float64 "
                                               "(stability.lm.precision_audit)"}
    return {"dtype": "float32", "tolerances": {k: getattr(options, k) for k in FLOAT32_TOLERANCES},
            "note": "analysed at float32 (ε ≈ 1.2e-7): tolerances raised; residuals and Krylov solves below ~1e-6 "
                    "are rounding, not the model"}


def lm_numbers(model, x0: torch.Tensor, x_star: torch.Tensor, targets: torch.Tensor, options, *,
               lm_stages=LM_STAGES, exit_passes: Optional[int] = None, log: Optional[Callable] = None) -> dict:
    """The ``lm`` block: every LM number of ``lm_stages`` for the float64 ``model`` at x0 and x*."""
    say = log or (lambda msg: None)
    out: dict = {"model_steps": int(getattr(model, "model_steps", 0)), "causal": tokens.is_causal(model, x0)}
    with differentiable_attention(), torch.no_grad():
        e = model.initial_state(x0, generator=torch.Generator(device=x0.device).manual_seed(options.seed))
        if "tokens" in lm_stages:
            say("lm: per-token convergence")
            out["tokens"] = tokens.token_convergence(model, x0, e, max_iter=options.max_iter,
                                                     tol=options.tol).to_dict()
        if "token_rho" in lm_stages and out["causal"]:
            say("lm: per-token ρ at x*")
            out["token_rho"] = tokens.token_spectra(model, x_star, x0).to_dict()
        if "scoring" in lm_stages:
            out["scoring"] = _scoring(model, x0, e, x_star, targets, scoring)
        if "routing" in lm_stages:
            rc = routing.routing_changes(model, x0, x_star)
            out["routing"] = None if rc is None else rc.to_dict()
        if "exits" in lm_stages:
            say("lm: exit rules")
            passes = exit_passes or exits.default_passes(model, options.max_iter)
            out["exits"] = exits.audit_exits(exits.exit_trace(model, x0, e, passes), targets=targets)
    return out


def _scoring(model, x0, e, x_star, targets, scoring) -> dict:
    x = e
    for _ in range(int(getattr(model, "model_steps", 0))):
        x = model.step(x, x0)
    return {"at_fixed_point": scoring.score_lm(model.readout(x_star), targets),
            "at_model_depth": scoring.score_lm(model.readout(x), targets),
            "targets": "the next token at each position; -100 (pads, the last position) not scored"}
