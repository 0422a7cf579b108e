"""``stability analyze``: are a looped model's fixed points reachable, input-dependent, and is their stable region
in parameter space broad (geometry)?

Two ways in: a checkpoint of this toolkit (``stability analyze CKPT``), or a model of one's own
(``stability analyze --model PACKAGE.MODULE:FACTORY [--weights FILE] --inputs FILE.pt [--targets FILE.pt]``), checked
against the :class:`~stability.protocols.LoopedModel` contract first. Finds x* per sample (Picard by default:
reachability is about plain iteration), then reports ρ(J*), σ_max, Prop. 4's ρ(M) checked against autograd, ρ(W_x),
the Prop. 5 check, ‖dx*/dx0‖_F, the A.8 check from every start, accuracy against iteration (Sections 4–5, App. A)
and the radii of stability in parameter space with their anisotropy (geometry, Section 3.2, App. B.2), headed by a
verdict on the paper's three axes: reachable, input-dependent, geometry. ``--only`` selects stages. See
docs/analysis.md and docs/python-api.md.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

from stability.analysis.publish import publish
from stability.atomic import check_writable
from stability.commands._types import check_maxima, schema_argument
from stability.config import ANALYZE_STAGES, OPT_IN_STAGES, STAGES, AnalysisOptions, parse_stages
from stability.errors import ConfigError, StabilityError, first_line

HELP = ("analyse a looped model's fixed points on the paper's three axes: reachability (spectra, Props. 3-4), "
        "input-dependence (Prop. 5) and geometry (radii of stability in parameter space), and accuracy")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="CKPT", nargs="?", help="a checkpoint written by `stability train`, "
                   "one of the paper's release checkpoints (RUN_DIR/model_best.pth), or a Hugging Face "
                   "save_pretrained directory of a looped language model (with --inputs: its token ids; "
                   "docs/language-models.md)")
    p.add_argument("--release-config", metavar="PATH", help="a release checkpoint's Hydra config, where it is not "
                   "RUN_DIR/.hydra/config.yaml (docs/release-differences.md)")
    own = p.add_argument_group("a model of one's own (instead of CKPT)")
    own.add_argument("--model", metavar="PACKAGE.MODULE:FACTORY",
                     help="build the model by calling FACTORY() from an importable module (the current directory "
                          "is on the path); it must satisfy the LoopedModel contract (docs/python-api.md)")
    own.add_argument("--weights", metavar="FILE", help="a state dict to load into the model (torch.save)")
    own.add_argument("--inputs", metavar="FILE.pt", help="a tensor of inputs (B, ...) saved with torch.save; for a "
                     "language model: token ids (B, T), or a dict with input_ids, attention_mask, position_ids, "
                     "token_type_ids, labels")
    own.add_argument("--text", metavar="FILE", help="for a Hugging Face directory with a tokenizer: one sequence a "
                     "line, encoded by the directory's own tokenizer (instead of --inputs)")
    own.add_argument("--targets", metavar="FILE.pt",
                     help="class indices (B, *positions) for the accuracy (argmax of readout, per position and "
                          "whole answer)")
    p.add_argument("--split", choices=["val", "hard", "both"], default=None, help="which split(s) of CKPT (both)")
    p.add_argument("--only", metavar="STAGES",
                   help=f"comma-separated stages to run, of: {', '.join(STAGES)} (reachability always runs; "
                        f"default: all but {', '.join(OPT_IN_STAGES)})")
    p.add_argument("--json", metavar="PATH", help="write the full results as JSON")
    p.add_argument("--plots", metavar="DIR", help="write PNG plots (residuals, eigenvalues, accuracy, Prop. 5, "
                   "and the geometry stage's stability region)")
    _schema_flags(p)
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


#: the cells per side of the geometry stage's region picture when --plots is given and --geometry-plane is not
PLOT_PLANE = 15


def _schema_flags(p: argparse.ArgumentParser) -> None:
    """A ``--NAME`` for each field of ``AnalysisOptions.FLAGS`` (the one table of them,
    stability/config/analysis.py), as train's and sweep's flags (:func:`~stability.commands._types.schema_argument`):
    type, choices and metavar from the schema, the field's default (None where the command decides it), help
    ``description (default)``; each in its group."""
    groups = {key: p.add_argument_group(title) for key, title in AnalysisOptions.FLAG_GROUPS.items()}
    for name, flag in AnalysisOptions.FLAGS.items():
        info = AnalysisOptions.model_fields[name]
        args, kw = schema_argument(name.replace("_", "-"), name, info, dest=name, positive=flag.positive)
        d = None if flag.command_default else info.default
        kw["default"] = d
        if d is False:  # a switch that is off unless given: --NAME alone
            kw["action"] = "store_true"
        kw["help"] = info.description + (f" (default: {flag.command_default})" if flag.command_default
                                         else "" if d is None else f" ({d:g})" if isinstance(d, float)
                                         else f" ({d})")
        (groups[flag.group] if flag.group else p).add_argument(*args, **kw)


def check_feasible(args) -> None:
    """Refuse, before any work, a count the analysis cannot finish (above its field's maximum in the schema,
    stability/config/analysis.py), in one line."""
    check_maxima(args, [(n.replace("_", "-"), n, AnalysisOptions.model_fields[n]) for n in AnalysisOptions.FLAGS])
    if getattr(args, "only", None) is not None:
        try:
            parse_stages(args.only)
        except StabilityError as exc:  # e.g. --only "" is not "every stage"
            raise ConfigError(f"--only {args.only!r}: {exc}") from None


# ---- a model of one's own ------------------------------------------------------------------------------------

def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {first_line(exc)}" if str(exc).strip() else type(exc).__name__


def build_from_spec(spec: str):
    """Import ``PACKAGE.MODULE`` and call ``FACTORY()``; every failure is one :class:`StabilityError` line."""
    module_name, sep, factory_name = spec.partition(":")
    if not sep or not module_name or not factory_name:
        raise StabilityError(f"--model expects PACKAGE.MODULE:FACTORY, got {spec!r}")
    if os.getcwd() not in sys.path:  # as `python -m` does: modules in the current directory are importable
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise StabilityError(f"--model {spec}: no module named {exc.name!r} (is it importable from here?)") \
                from None
        raise StabilityError(f"--model {spec}: importing {module_name} failed: {_one_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - a user's module
        raise StabilityError(f"--model {spec}: importing {module_name} failed: {_one_line(exc)}") from None
    factory = getattr(module, factory_name, None)
    if factory is None:
        raise StabilityError(f"--model {spec}: module {module_name} has no attribute {factory_name!r}")
    if not callable(factory):
        raise StabilityError(f"--model {spec}: {module_name}.{factory_name} is not callable")
    try:
        model = factory()
    except Exception as exc:  # noqa: BLE001
        raise StabilityError(f"--model {spec}: calling {factory_name}() failed: {_one_line(exc)}") from None
    return model


def _torch_load(path: str, what: str):
    # lazy: torch; `stability --help` imports this module without it
    from stability.stored import load_plain

    p = Path(path)
    if not p.exists():
        raise StabilityError(f"{what} {path}: no such file")
    if not p.is_file():
        raise StabilityError(f"{what} {path}: not a file")

    # refused in one line as the checkpoint path refuses: code-executing ("loading it would execute code"; torch's
    # advice to pass weights_only=False is never passed on), truncated, or not written by torch.save
    return load_plain(p, f"{what} {path}", "tensor file", "not a tensor file saved with torch.save")


def load_tensor(path: str, what: str, key: str):
    """A tensor saved with ``torch.save`` (or a dict holding it under ``key``), checked finite."""
    import torch

    obj = _torch_load(path, what)
    if isinstance(obj, dict) and key in obj:
        obj = obj[key]
    if not isinstance(obj, torch.Tensor):
        raise StabilityError(f"{what} {path}: expected a tensor, found {type(obj).__name__}")
    if obj.dim() < 1 or obj.shape[0] < 1:
        raise StabilityError(f"{what} {path}: expected a batch (B, ...), found shape {tuple(obj.shape)}")
    if (obj.is_floating_point() or obj.is_complex()) and not bool(torch.isfinite(obj).all()):
        raise StabilityError(f"{what} {path}: holds NaN or infinite values")
    return obj


def load_weights(model, path: str) -> None:
    """Load a state dict (or a dict holding one under "state_dict", "model" or "net") into ``model``, strictly."""
    import torch

    obj = _torch_load(path, "--weights")
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "net"):
            if isinstance(obj.get(key), dict):
                obj = obj[key]
                break
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise StabilityError(f"--weights {path}: not a state dict (a mapping of parameter names to tensors)")
    if not hasattr(model, "load_state_dict"):
        raise StabilityError(f"--weights {path}: the model is not a torch.nn.Module")
    try:
        result = model.load_state_dict(obj, strict=False)
    except RuntimeError as exc:
        raise StabilityError(f"--weights {path}: does not fit the model ({_one_line(exc)})") from None
    missing, unexpected = list(result.missing_keys), list(result.unexpected_keys)
    if missing or unexpected:
        parts = ([f"missing {', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}"] if missing else []) + \
                ([f"unexpected {', '.join(unexpected[:4])}{' …' if len(unexpected) > 4 else ''}"] if unexpected else [])
        raise StabilityError(f"--weights {path}: does not fit the model ({'; '.join(parts)})")


def _own_model(args, options, log):
    # lazy: torch; `stability --help` imports this module without it
    from stability.analysis.pipeline import analyze_model

    if args.checkpoint:
        raise StabilityError("give either CKPT or --model, not both")
    if not args.inputs:
        raise StabilityError("--model needs --inputs FILE.pt (a tensor of inputs, batch first)")
    if args.split is not None:
        raise StabilityError("--split applies to checkpoints; with --model the samples are --inputs")
    obj = _torch_load(args.inputs, "--inputs")
    token_dict = isinstance(obj, dict) and "input_ids" in obj  # a language model's ids, mask and labels
    inputs = None if token_dict else load_tensor(args.inputs, "--inputs", "inputs")
    targets = load_tensor(args.targets, "--targets", "targets") if args.targets and not token_dict else None
    model = build_from_spec(args.model)
    if args.weights:
        load_weights(model, args.weights)
    if getattr(model, "lm_adapter", False) is True:  # a looped language model: token ids, scored per token
        from stability.lm.analyze import analyze_inputs_file  # lazy: torch, as above

        return analyze_inputs_file(model, args.inputs, args.targets, options, log=log)
    if token_dict:
        inputs = load_tensor(args.inputs, "--inputs", "inputs")  # not a tensor: refused as before
    source = {"model": args.model, "weights": args.weights, "inputs": args.inputs, "targets": args.targets}
    return analyze_model(model, inputs, targets, options, source=source, log=log)


def _pretrained(args) -> bool:
    """CKPT is a Hugging Face ``save_pretrained`` directory (a looped language model, :mod:`stability.lm`): it is
    analysed on the token ids of ``--inputs`` (required), with ``--targets`` or the next tokens."""
    if args.model or not args.checkpoint or not os.path.isfile(os.path.join(args.checkpoint, "config.json")):
        return False
    if not args.inputs and not args.text:
        raise StabilityError(f"{args.checkpoint} is a language model: give its token ids with --inputs FILE.pt (a "
                             "tensor (B, T), or a dict with input_ids, attention_mask, labels) or its text with "
                             "--text FILE")
    if args.weights or args.split is not None or args.release_config:
        raise StabilityError("--weights, --split and --release-config do not apply to a Hugging Face model "
                             "directory")
    return True


def run(args: argparse.Namespace) -> int:
    # lazy: torch; `stability --help` imports this module without it
    from stability.analysis.pipeline import analyze_checkpoint

    if not args.checkpoint and not args.model:
        raise StabilityError("give a checkpoint (CKPT) or a model of one's own (--model PACKAGE.MODULE:FACTORY "
                             "--inputs FILE.pt)")
    pretrained = _pretrained(args)  # a Hugging Face save_pretrained directory: token ids as --inputs
    if not args.model and not pretrained and (args.inputs or args.targets or args.weights):
        raise StabilityError("--inputs, --targets and --weights go with --model")
    if args.text and not pretrained:
        raise StabilityError("--text needs a Hugging Face save_pretrained directory with its tokenizer (CKPT)")
    if args.text and args.inputs:
        raise StabilityError("give --inputs FILE.pt or --text FILE, not both")
    check_feasible(args)
    library = {name: getattr(args, name) for name, flag in AnalysisOptions.FLAGS.items() if not flag.command_default}
    options = AnalysisOptions(**library, workers=args.workers,
                              stages=ANALYZE_STAGES if args.only is None else args.only,  # --only "": refused
                              geometry_plane=(args.geometry_plane if args.geometry_plane is not None
                                              else PLOT_PLANE if args.plots else 0))
    if args.json:
        check_writable(args.json, "file", "--json")
    if args.plots:
        check_writable(args.plots, "dir", "--plots")
    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    # lazy: torch; `stability --help` imports this module without it
    from stability.analysis.pool import keep_freed_memory

    keep_freed_memory()  # this process only analyses from here on: keep its large blocks for reuse
    if args.model:
        analysis = _own_model(args, options, log)
    elif pretrained:
        from stability.lm.analyze import analyze_inputs_file  # lazy: torch, as above

        analysis = analyze_inputs_file(args.checkpoint, args.inputs, args.targets, options, log=log,
                                       text_path=args.text)
    else:
        splits = ("val", "hard") if args.split in (None, "both") else (args.split,)
        analysis = analyze_checkpoint(Path(args.checkpoint), splits=splits, options=options, log=log,
                                      release_config=args.release_config)
    publish(analysis, json_path=args.json, plots=args.plots)
    return 0
