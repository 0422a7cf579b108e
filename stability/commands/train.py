"""``stability train``: train a looped transformer (or the fixed-depth baseline) and write a checkpoint."""

from __future__ import annotations

import argparse
import typing

from stability.atomic import check_writable
from stability.commands._types import auto_or_positive_int, check_maxima, schema_argument
from stability.config import (METHOD_CLASSES, METHODS, OPTION_METHOD, PRESETS, SECTIONS, EnsembleOptions, RunConfig,
                              dotted, field_extra, preset, read_toml, to_dict)
from stability.errors import ConfigError, DivergenceError
from stability.tasks import make_task
from stability.train.report import accuracy_table


HELP = ("train a looped transformer (progressive loss, deep supervision or equilibrium training) and write a "
        "self-describing checkpoint")

#: field names whose flag refuses 0 as well (a tolerance, a strictly positive scale)
_POSITIVE = {"damping", "residual_scale", "norm_eps", "halt_tol", "solver_tol", "backward_tol"}
#: argument groups: section or method -> title
_GROUPS = {"task": "task", "model": "model", "train": "training",
           "progressive": "progressive loss (--method progressive)",
           "deep-supervision": "deep supervision (--method deep-supervision)",
           "implicit": "implicit (--method implicit)"}


class Flag(typing.NamedTuple):
    """One command-line flag of a schema field: ``--flag`` sets ``section.name`` (``method``: only that method
    has it)."""

    flag: str
    section: str
    name: str
    info: typing.Any
    method: typing.Optional[str] = None

    @property
    def dest(self) -> str:
        return self.flag.replace("-", "_")

    @property
    def key(self) -> str:
        """The option's path in the config (:func:`stability.config.dotted`): ``train.lr``,
        ``train.method.solver_tol``; ``--method`` sets ``train.method.name``."""
        if self.method is not None or (self.section, self.name) == ("train", "method"):
            return f"train.method.{'name' if self.method is None else self.name}"
        return f"{self.section}.{self.name}"


def flags() -> list[Flag]:
    """Every flag, derived from the schema (stability/config/): each field of model, task and train that the task
    does not decide, and each option of each method."""
    out = []
    for section, cls in SECTIONS.items():
        for name, info in cls.model_fields.items():
            extra = field_extra(info)
            if not extra.get("derived"):
                out.append(Flag(extra.get("flag", name.replace("_", "-")), section, name, info))
    for method, cls in METHOD_CLASSES.items():
        for name, info in cls.model_fields.items():
            if name != "name":
                out.append(Flag(field_extra(info).get("flag", name.replace("_", "-")), "train", name, info, method))
    return out


def _argument(f: Flag) -> tuple[tuple, dict]:
    """argparse's (args, kwargs) of a flag (:func:`stability.commands._types.schema_argument`; ``--method``
    chooses the method block by name)."""
    args, kw = schema_argument(f.flag, f.name, f.info, dest=f.dest, positive=f.name in _POSITIVE)
    if f.section == "train" and f.name == "method":
        kw.update(choices=list(METHODS))
    return args, kw


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="RUN.TOML",
                   help="options from a TOML file with tables [model], [task], [train] and [train.method] (docs/"
                        "configuration.md); flags given here override it")
    p.add_argument("--preset", choices=list(PRESETS),
                   help="start from a named set of options, under --config and the flags (cpu: the demo's size, "
                        "minutes on a laptop's CPU; docs/training.md, \"Presets\")")
    groups = {key: p.add_argument_group(title) for key, title in _GROUPS.items()}
    for f in flags():
        args, kw = _argument(f)
        groups[f.method or f.section].add_argument(*args, **kw)
    p.add_argument("--out", required=True, metavar="PATH",
                   help="checkpoint file to write (metrics go beside it: PATH's stem + .metrics.jsonl, .metrics.csv, "
                        ".accuracy.csv)")
    p.add_argument("--seeds", metavar="SEEDS",
                   help="train an ensemble: one member per seed (0-4, or 0,2,7) in one batched step (per process: "
                        "see --processes); "
                        "--out is then a directory of member checkpoints s{seed}.pt (docs/training.md, \"Ensembles\")")
    p.add_argument("--lrs", metavar="RATES",
                   help="with --seeds: also one member per learning rate (1e-3,2.5e-3), files lr{rate}-s{seed}.pt")
    for name in EnsembleOptions.FLAGS:  # derived from the schema, as the run's flags
        info = EnsembleOptions.model_fields[name]
        args, kw = schema_argument(field_extra(info).get("flag", name.replace("_", "-")), name, info, dest=name)
        if name in ("processes", "max_members"):
            kw.update(type=auto_or_positive_int, help=kw["help"].replace("(default none)", "(default auto)"))
        p.add_argument(*args, **kw)
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out if it exists (its stored options; with a larger --epochs: "
                        "extend a finished run)")
    p.add_argument("--tensorboard", metavar="DIR",
                   help="also log the per-epoch scalars to TensorBoard in DIR (needs the tensorboard package)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.epilog = ("exit status: 0 trained; 2 bad usage or input (one line on stderr, nothing written), or --out is "
                "being written by another run; 3 the run diverged (a non-finite loss or gradient: training stopped, "
                "the last good checkpoint is kept); 130 interrupted, 143 terminated (SIGTERM): the lock is released and the "
                "last finished epoch's checkpoint kept for --resume")


#: the largest finite float32: the model and AdamW compute in float32, so a larger option overflows there
_FLOAT32_MAX = 3.4028234663852886e38


def check_float32(config) -> None:
    """Refuse (one line) an option too large for the float32 arithmetic of training: ``--lr 1e300`` would
    otherwise end in a traceback from inside AdamW."""
    values = dotted(config)
    for f in flags():
        v = values.get(f.key)
        if isinstance(v, float) and abs(v) > _FLOAT32_MAX:
            raise ConfigError(f"--{f.flag} {v:g}: too large: training computes in float32, whose largest number is "
                              f"{_FLOAT32_MAX:.3g}")
    lr, decay = values.get("train.lr"), values.get("train.weight_decay")
    if isinstance(lr, float) and isinstance(decay, float) and lr * decay > _FLOAT32_MAX:
        raise ConfigError(f"--lr {lr:g} with --weight-decay {decay:g}: their product, AdamW's decay step, is "
                          f"larger than float32's largest number {_FLOAT32_MAX:.3g}")


def _given(args: argparse.Namespace) -> list[tuple[Flag, typing.Any]]:
    return [(f, getattr(args, f.dest)) for f in flags() if getattr(args, f.dest, None) is not None]


def config_from_args(args: argparse.Namespace, base=None):
    """RunConfig from, in this order, ``base`` (a stored config) or the defaults, the ``--preset``
    (:data:`stability.config.PRESETS`), the ``--config`` file, and the flags that were given. A layer that changes the method starts its method table afresh; a flag of another
    method than the run's is refused naming its method, and so is a ``--method`` that would drop options the file
    set for its own method."""
    sections: dict[str, dict] = {"model": {}, "task": {}, "train": {"method": {"name": "progressive"}}}
    if base is not None:
        sections = to_dict(base)
    config_file = getattr(args, "config", None)
    layers = []
    if config_file:
        layers.append((f"--config {config_file}", read_toml(config_file)))
    given = _given(args)
    flag_layer: dict[str, dict] = {"model": {}, "task": {}, "train": {}}
    for f, value in given:
        value = list(value) if isinstance(value, list) else value
        if f.key.startswith("train.method."):
            flag_layer["train"].setdefault("method", {})[f.key.rsplit(".", 1)[1]] = value
        else:
            flag_layer[f.section][f.name] = value
    layers.append(("flags", flag_layer))
    if getattr(args, "preset", None):  # under the file and the flags; its task options for the run's task
        task = next((layer["task"]["name"] for _, layer in reversed(layers) if "name" in layer.get("task", {})),
                    sections["task"].get("name", "prefix-sums"))
        layers.insert(0, (f"--preset {args.preset}", preset(args.preset, task)))
    from_file: list[str] = []  # the method options the file set
    for label, layer in layers:
        block = dict(layer.get("train", {}).get("method", {}))
        method = sections["train"]["method"].get("name", "progressive")
        if block.get("name", method) != method:
            if from_file and label == "flags":
                raise ConfigError(f"--method {block['name']}: {config_file} sets options of the "
                                  f"{OPTION_METHOD.get(from_file[0], method)} method ({', '.join(sorted(from_file))}); "
                                  "remove them, or its [train.method]")
            sections["train"]["method"] = {}
        for section, options in layer.items():
            sections[section].update({k: v for k, v in options.items() if k != "method"})
        sections["train"]["method"] = {**sections["train"]["method"], **block}
        if label != "flags":
            from_file = [k for k in block if k != "name"]
    method = sections["train"]["method"].get("name", "progressive")
    for f, _ in given:
        if f.method is not None and f.method != method:
            raise ConfigError(f"--{f.flag}: only the {f.method} method uses it, not {method} (give --method "
                              f"{f.method} to set it)")
    return RunConfig(**sections)


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    check_maxima(args, [(f.flag, f.dest, f.info) for f in flags()])  # a count past its maximum names its flag
    config = config_from_args(args)  # validated before anything heavy is imported
    check_float32(config)
    if getattr(args, "seeds", None) is not None or getattr(args, "lrs", None) is not None:
        return _run_ensemble(args, config)
    if getattr(args, "processes", None) is not None:
        raise ConfigError("--processes needs --seeds (it splits an ensemble's members across processes)")
    if getattr(args, "step", None) is not None:
        raise ConfigError("--ensemble-step needs --seeds (it chooses how an ensemble's members are batched)")
    if getattr(args, "max_members", None) is not None:
        raise ConfigError("--max-members needs --seeds (it chunks an ensemble's members)")
    out = check_writable(args.out, "file", "--out")
    tensorboard = check_writable(args.tensorboard, "dir", "--tensorboard") if args.tensorboard else None
    if tensorboard is not None:
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("--tensorboard: the tensorboard package is not installed (pip install tensorboard), "
                              "or leave --tensorboard out")

    make_task(config.task)  # sizes the task cannot make (prefix sums: val disjoint from train) end here, one line

    # lazy: torch; `stability --help` imports this module without it
    from stability.train.loop import EXIT_DIVERGED, check_resumable, schedule_warning, train

    if args.resume and out.exists():
        from stability import checkpoint as ckpt  # lazy: torch, as above

        # the stored options, with the flags given now on top (only a larger --epochs may differ: extension)
        obj = ckpt.read(out)
        stored = ckpt.run_config(obj, out)
        config = config_from_args(args, base=stored)
        check_float32(config)
        check_resumable(stored, config, int(obj["epoch"]), out)
    warning = schedule_warning(config.train)
    if warning:
        print(f"stability train: warning: {warning}", file=sys.stderr, flush=True)
    try:
        result = train(config, out, resume=args.resume, progress=not args.quiet, tensorboard=tensorboard)
    except DivergenceError as exc:  # a result of the run, not bad usage: its own exit status
        print(f"stability train: diverged: {exc}", file=sys.stderr, flush=True)
        return EXIT_DIVERGED
    print(f"checkpoint: {result.path}")
    if result.final:
        print(accuracy_table(result.final))
    return 0


def _processes(args: argparse.Namespace, config, members: int) -> int:
    """``--processes`` (:class:`stability.config.EnsembleOptions`): the number of processes, ``auto`` resolved."""
    from stability.train.split import resolve_processes  # lazy: torch, as in the callers

    given = getattr(args, "processes", None)
    options = EnsembleOptions() if given is None else EnsembleOptions(processes=None if given == "auto" else given)
    return resolve_processes(options.processes, members, config)


def _run_ensemble(args: argparse.Namespace, config) -> int:
    """``stability train --seeds ... [--lrs ...] --out DIR``: the ensemble (stability/train/ensemble.py)."""
    # lazy: torch; `stability --help` imports this module without it
    import sys

    from stability.train import ensemble

    if args.seeds is None:
        raise ConfigError("--lrs needs --seeds (the ensemble's members are its seeds × rates)")
    if args.tensorboard:
        raise ConfigError("--tensorboard with --seeds: not for ensembles; leave it out")
    seeds = ensemble.parse_seeds(args.seeds)
    lrs = ensemble.parse_lrs(args.lrs) if args.lrs is not None else None
    processes = _processes(args, config, len(seeds) * len(lrs or [None]))
    if lrs:
        check_float32(config.replace(train=config.train.replace(lr=max(lrs))))
    given = getattr(args, "max_members", None)
    options = EnsembleOptions(step=args.step or "auto", max_members=None if given in (None, "auto") else given)
    step = options.step
    ensemble.check_ensemble(config, step)
    plan = ensemble.members(config, seeds, lrs)
    out = ensemble.check_outputs(args.out, [name for name, _ in plan])
    if args.resume:  # the stored options, with the flags given now on top (as a solo --resume)
        from stability import checkpoint as ckpt  # lazy: torch, as above

        stored_path = next((out / name for name, _ in plan if (out / name).exists()), None)
        if stored_path is not None:
            stored = ckpt.run_config(ckpt.read(stored_path), stored_path)
            config = config_from_args(args, base=stored)
            check_float32(config)
    # lazy: torch; `stability --help` imports this module without it
    from stability.train.loop import EXIT_DIVERGED, schedule_warning

    make_task(config.task)
    warning = schedule_warning(config.train)
    if warning:
        print(f"stability train: warning: {warning}", file=sys.stderr, flush=True)
    try:
        results = ensemble.train_ensemble(config, out, seeds, lrs, resume=args.resume, progress=not args.quiet,
                                          processes=processes, step=step, max_members=options.max_members)
    except DivergenceError as exc:
        print(f"stability train: diverged: {exc}", file=sys.stderr, flush=True)
        return EXIT_DIVERGED
    for result in results:
        print(f"checkpoint: {result.path}")
        if result.final:
            print(accuracy_table(result.final))
    return 0
