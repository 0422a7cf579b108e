"""The one configuration schema (stability/config.py, docs/configuration.md): every field is reachable from the
command line and from ``--config run.toml``, and what a run file sets is what its checkpoint records.

The field lists are read from the schema, so a field added later cannot escape these tests: it fails them until it
has a non-default value below.
"""

import json

import pytest
import torch

from stability.config import METHOD_CLASSES, SECTIONS, RunConfig, TrainConfig, field_extra
from stability.errors import StabilityError
from tests.conftest import ROOT, toml_value

#: a valid non-default value of every field of model, task and train (the method has its own table)
VALUES = {
    "model": {"recall": "internal", "norm": "pre", "width": 16, "heads": 2, "mlp_ratio": 2, "depth": 3,
              "in_channels": 3, "out_channels": 4, "spatial_ndim": 2, "attention_window": 5, "rope_base": 100.0,
              "qk_norm": False, "share_norms": False, "initial_state": "noise", "noise_std": 0.5, "norm_eps": 1e-6,
              "window_edges": "cut", "rope_precision": "float64", "flip_rows": True, "damping": 0.9,
              "residual_scale": 0.5, "conv": 3},
    "task": {"name": "chess", "train_size": 40, "val_size": 8, "hard_size": 8, "train_length": 6, "hard_length": 8,
             "seed": 3, "data_path": "puzzles.csv", "cache_dir": "cache", "engine": "stockfish", "sudoku_cut": 40.0,
             "chess_easy_max": 1500, "chess_hard_min": 1700, "chess_hard_max": 2100},
    "train": {"lr": 3e-3, "epochs": 1, "batch_size": 20, "iterations": 3, "weight_decay": 0.02, "adam_eps": 1e-7,
              "betas": [0.8, 0.99], "decay_exempt": "norms", "warmup_epochs": 2, "cooldown_at": 0.5,
              "cooldown_factor": 0.2, "grad_clip": 0.5, "seed": 4, "device": "cpu", "compile": True, "bf16": False,
              "eval_every": 1, "eval_iterations": 3, "test_iterations": 4, "eval_batch_size": 8, "monitor_every": 1,
              "monitor_samples": 4, "train_accuracy_samples": 3},
}
METHOD_VALUES = {
    "progressive": {"alpha": 0.5},
    "deep-supervision": {"bptt_steps": 2, "supervision_interval": 3, "halt_tol": 0.05},
    "implicit": {"solver_tol": 1e-2, "anderson_memory": 3, "implicit_backward": "neumann", "backward_tol": 1e-3,
                 "backward_iterations": 5, "backward_max_iterations": 7, "jac_reg": 0.1, "jac_reg_probes": 2},
}
#: what a tiny prefix-sums training run cannot take, and why (the config round trip below covers these fields)
NOT_IN_A_PREFIX_SUMS_RUN = {
    ("model", "in_channels"): "set by the task", ("model", "out_channels"): "set by the task",
    ("model", "spatial_ndim"): "set by the task", ("model", "attention_window"): "set by the task",
    ("model", "flip_rows"): "set by the release import (boards only)",
    ("task", "name"): "the run is prefix sums", ("task", "data_path"): "not a prefix-sums option",
    ("task", "cache_dir"): "not a prefix-sums option", ("task", "engine"): "not a prefix-sums option",
    ("task", "sudoku_cut"): "not a prefix-sums option", ("task", "chess_easy_max"): "not a prefix-sums option",
    ("task", "chess_hard_min"): "not a prefix-sums option", ("task", "chess_hard_max"): "not a prefix-sums option",
    ("train", "compile"): "torch.compile on the CPU takes minutes (tests/train/test_gpu_paths_on_cpu.py runs it)",
}


def _run_file(path, sections: dict, method: str) -> None:
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    lines += ["[train.method]", f'name = "{method}"']
    lines += [f"{k} = {toml_value(v)}" for k, v in METHOD_VALUES[method].items()]
    path.write_text("\n".join(lines) + "\n")


def _schema_fields() -> set:
    out = {(s, n) for s, cls in SECTIONS.items() for n in cls.model_fields if (s, n) != ("train", "method")}
    return out | {(m, n) for m, cls in METHOD_CLASSES.items() for n in cls.model_fields if n != "name"}


def test_the_value_tables_set_every_field_of_the_schema_to_a_non_default():
    given = {(s, n) for s, v in VALUES.items() for n in v} | {(m, n) for m, v in METHOD_VALUES.items() for n in v}
    assert given == _schema_fields()
    for section, values in VALUES.items():
        for name, value in values.items():
            default = SECTIONS[section].model_fields[name].default
            assert value != (list(default) if isinstance(default, tuple) else default), (section, name)
    for method, values in METHOD_VALUES.items():
        for name, value in values.items():
            assert value != METHOD_CLASSES[method].model_fields[name].default, (method, name)


def _stored_fields(config: dict, method: str) -> dict:
    out = {(s, n): v for s in ("model", "task", "train") for n, v in config[s].items() if n != "method"}
    block = config["train"]["method"]
    assert block["name"] == method
    return out | {(method, n): v for n, v in block.items() if n != "name"}


@pytest.mark.parametrize("method", list(METHOD_CLASSES))
def test_a_run_file_that_sets_every_field_round_trips_into_the_checkpoint_config(method, tmp_path):
    """Train one epoch from a run file setting every field a prefix-sums run takes; the checkpoint records each
    value as given (the fields the task decides are the task's)."""
    from stability.cli import main
    from stability.tasks import make_task

    sections = {s: {n: v for n, v in vals.items() if (s, n) not in NOT_IN_A_PREFIX_SUMS_RUN}
                for s, vals in VALUES.items()}
    run = tmp_path / "run.toml"
    _run_file(run, sections, method)
    out = tmp_path / "run.pt"
    assert main(["train", "--config", str(run), "--out", str(out), "--quiet"]) == 0
    stored = torch.load(out, weights_only=True)["config"]
    got = _stored_fields(stored, method)
    expected = {(s, n): v for s, vals in sections.items() for n, v in vals.items()}
    expected |= {(method, n): v for n, v in METHOD_VALUES[method].items()}
    for key, value in expected.items():
        assert got[key] == value, key
    task = make_task(SECTIONS["task"](**stored["task"]))
    for name, value in task.model_options().items():
        assert got[("model", name)] == value, name
    # every stored field is one the file set, or one named (with its reason) in NOT_IN_A_PREFIX_SUMS_RUN
    assert set(got) - set(expected) <= set(NOT_IN_A_PREFIX_SUMS_RUN)


@pytest.mark.parametrize("method", list(METHOD_CLASSES))
def test_a_run_file_that_sets_every_field_round_trips_through_the_checkpoint_config_block(method, tmp_path):
    """Every field of the schema, the ones a prefix-sums run cannot take included: run file -> the command line's
    RunConfig -> the checkpoint's config block on disk -> the RunConfig a checkpoint loads with."""
    from stability import checkpoint as ckpt
    from stability.cli import build_parser
    from stability.commands.train import config_from_args

    values = {s: dict(v) for s, v in VALUES.items()}
    if method != "progressive":
        values["train"]["compile"] = False  # compile only with progressive (a checked rule)
    run = tmp_path / "run.toml"
    _run_file(run, values, method)
    args = build_parser("train").parse_args(["train", "--config", str(run), "--out", str(tmp_path / "x.pt")])
    config = config_from_args(args)
    path = tmp_path / "block.pt"
    ckpt.atomic_save({"config": config.to_dict()}, path)
    block = torch.load(path, weights_only=True)
    loaded = ckpt.run_config(block, path)
    got = _stored_fields(loaded.to_dict(), method)
    expected = {(s, n): v for s, vals in values.items() for n, v in vals.items()}
    expected |= {(method, n): v for n, v in METHOD_VALUES[method].items()}
    assert got == expected


def test_every_schema_field_has_a_flag_except_those_the_task_or_the_release_import_decides():
    from stability.cli import build_parser
    from stability.commands.train import flags

    parser = build_parser("train")
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    options = {o for a in sub.choices["train"]._actions for o in a.option_strings}
    by_field = {(f.method or f.section, f.name): f"--{f.flag}" for f in flags()}
    derived = {(s, n) for s, cls in SECTIONS.items() for n, info in cls.model_fields.items()
               if field_extra(info).get("derived")}
    assert derived == {("model", n) for n in ("in_channels", "out_channels", "spatial_ndim", "attention_window",
                                              "flip_rows")}
    assert set(by_field) == (_schema_fields() - derived) | {("train", "method")}
    assert set(by_field.values()) <= options
    # the names of today's flags
    assert by_field[("task", "seed")] == "--data-seed" and by_field[("task", "name")] == "--task"
    assert by_field[("progressive", "alpha")] == "--alpha" and by_field[("implicit", "solver_tol")] == "--solver-tol"


def test_every_flag_sets_its_field(tmp_path):
    """Each flag, given a non-default value, lands in its field (the method flags in the method block)."""
    from stability.cli import build_parser
    from stability.commands.train import config_from_args, flags

    def text(v):
        return ",".join(map(str, v)) if isinstance(v, list) else str(v)

    for method, opts in METHOD_VALUES.items():
        argv = ["train", "--method", method, "--out", str(tmp_path / "x.pt")]
        for f in flags():
            if f.method not in (None, method) or (f.section, f.name) == ("train", "method"):
                continue
            value = METHOD_VALUES[method][f.name] if f.method else VALUES[f.section][f.name]
            if f.name == "compile" and method != "progressive":
                continue
            if isinstance(value, bool):
                argv.append(f"--{f.flag}" if value else f"--no-{f.flag}")
            else:
                argv += [f"--{f.flag}", text(value)]
        cfg = config_from_args(build_parser("train").parse_args(argv)).to_dict()
        for f in flags():
            if f.method is None and (f.section, f.name) != ("train", "method"):
                if not (f.name == "compile" and method != "progressive"):
                    assert cfg[f.section][f.name] == VALUES[f.section][f.name], f.flag
        assert cfg["train"]["method"] == {"name": method, **opts}


def test_flags_override_the_run_file(tmp_path):
    from stability.cli import build_parser
    from stability.commands.train import config_from_args

    run = tmp_path / "run.toml"
    run.write_text('[model]\nwidth = 32\nheads = 4\n[train]\nlr = 0.01\n[train.method]\nname = "implicit"\n'
                   'solver_tol = 0.01\n')
    args = build_parser("train").parse_args(["train", "--config", str(run), "--width", "64", "--solver-tol", "0.001",
                                             "--out", str(tmp_path / "x.pt")])
    cfg = config_from_args(args)
    assert (cfg.model.width, cfg.model.heads, cfg.train.lr) == (64, 4, 0.01)
    assert cfg.train.method.name == "implicit" and cfg.train.method.solver_tol == 0.001


@pytest.mark.parametrize("content, needle", [
    ("[model]\nwidthh = 3\n", "[model]: unknown key(s) widthh; allowed: recall, norm, width"),
    ("[modle]\n", "unknown key(s) modle; allowed: model, task, train"),
    ('[train.method]\nname = "implicit"\nalpha = 0.5\n',
     "TrainConfig.alpha: only the progressive method uses it, not implicit"),
    ('[train.method]\nname = "implicit"\nsolver = 1\n', "[train].method: unknown key(s) solver"),
    ("[train]\nlr = -1.0\n", "TrainConfig.lr: -1.0 must be greater than 0.0"),
    ("[train\n", "not valid TOML"),
])
def test_a_bad_run_file_is_one_error_line_and_exit_2(content, needle, tmp_path, capsys):
    from stability.cli import main

    run = tmp_path / "run.toml"
    run.write_text(content)
    out = tmp_path / "x.pt"
    assert main(["train", "--config", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("argv, needle", [
    (["--solver-tol", "0.01"], "--solver-tol: only the implicit method uses it, not progressive"),
    (["--method", "implicit", "--alpha", "0.5"], "--alpha: only the progressive method uses it, not implicit"),
    (["--method", "deep-supervision", "--jac-reg", "0.1"], "--jac-reg: only the implicit method uses it"),
])
def test_a_flag_of_another_method_exits_2_with_one_line(argv, needle, tmp_path, capsys):
    from stability.cli import main

    assert main(["train", *argv, "--out", str(tmp_path / "x.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_a_flag_method_that_drops_options_of_the_run_file_is_refused(tmp_path, capsys):
    from stability.cli import main

    run = tmp_path / "run.toml"
    run.write_text('[train.method]\nname = "implicit"\nsolver_tol = 0.01\n')
    assert main(["train", "--config", str(run), "--method", "progressive", "--out", str(tmp_path / "x.pt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sets options of the implicit method (solver_tol)" in err[0], err


def test_an_explicit_value_of_the_methods_own_option_is_never_an_error():
    """Recording a method's option at its default (schema 1 refused nothing here, but other methods' defaults
    were policed); the other methods' options cannot be given at all."""
    for method, cls in METHOD_CLASSES.items():
        defaults = {n: f.default for n, f in cls.model_fields.items() if n != "name"}
        cfg = TrainConfig(method={"name": method, **defaults})
        assert cfg.method == cls()


@pytest.mark.parametrize("kwargs, needle", [
    (dict(method="implicit"), "TrainConfig.method: expected a table of options, got 'implicit'"),
    (dict(solver_tol=1e-4), "TrainConfig.solver_tol: an option of the implicit method; it goes in the method table"),
    (dict(method={"name": "progressive", "solver_tol": 1e-4}),
     "TrainConfig.solver_tol: only the implicit method uses it, not progressive"),
])
def test_a_method_option_lives_only_in_its_method_table(kwargs, needle):
    from stability.config import Implicit
    from stability.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        TrainConfig(**kwargs)
    assert needle in str(err.value) and "\n" not in str(err.value)
    block = TrainConfig(method={"name": "implicit", "solver_tol": 1e-4}, lr=1e-3)
    assert block == TrainConfig(method=Implicit(solver_tol=1e-4), lr=1e-3) and block.method.solver_tol == 1e-4
    assert TrainConfig().replace(method={"name": "deep-supervision", "bptt_steps": 2}).method.bptt_steps == 2


def test_a_record_written_before_the_method_block_is_refused_naming_migrate(tmp_path):
    import json

    from stability.sweep.export import read_jsonl
    from stability.sweep.runner import RECORD_FORMAT, RECORD_SCHEMA, read_record

    cfg = RunConfig(train=TrainConfig(method={"name": "deep-supervision", "bptt_steps": 2})).to_dict()
    flat = {**cfg, "train": {**{k: v for k, v in cfg["train"].items() if k != "method"},
                             "method": "deep-supervision", "bptt_steps": 2, "alpha": 1.0}}
    rec = {"format": RECORD_FORMAT, "schema_version": RECORD_SCHEMA, "id": "x--0123456789", "config": flat}
    (tmp_path / "r.json").write_text(json.dumps(rec))
    (tmp_path / "r.jsonl").write_text(json.dumps(rec) + "\n")
    for read, path in ((read_record, tmp_path / "r.json"), (read_jsonl, tmp_path / "r.jsonl")):
        with pytest.raises(StabilityError, match=r"written before the method block.*stability migrate"):
            read(path)


def _analyze_actions() -> dict:
    from stability.cli import build_parser

    return {a.dest: a for a in build_parser("analyze")._subparsers._group_actions[0].choices["analyze"]._actions}


def test_analyze_flags_are_derived_from_the_analysis_options_schema():
    import typing

    from stability.cli import build_parser
    from stability.config import AnalysisOptions, unwrap

    actions = _analyze_actions()
    for name, flag in AnalysisOptions.FLAGS.items():
        info, action = AnalysisOptions.model_fields[name], actions[name]
        assert action.option_strings == [f"--{name.replace('_', '-')}"], name
        assert action.help.startswith(info.description), name  # the help is the schema's, said once
        assert action.default == (None if flag.command_default else info.default), name
        assert (f"(default: {flag.command_default})" in action.help) == bool(flag.command_default), name
        assert action.metavar == field_extra(info).get("metavar"), name
        choices = typing.get_args(unwrap(info.annotation))
        assert action.choices == (list(choices) if typing.get_origin(unwrap(info.annotation)) is typing.Literal
                                  else None), name
    args = build_parser("analyze").parse_args(["analyze", "ckpt.pt"])
    library = [n for n, flag in AnalysisOptions.FLAGS.items() if not flag.command_default]
    assert AnalysisOptions(**{n: getattr(args, n) for n in library}) == AnalysisOptions()


def test_every_analysis_options_field_has_one_flag_exactly_when_the_flag_table_lists_it():
    from stability.config import AnalysisOptions

    parser_actions = list(_analyze_actions().values())
    for name in AnalysisOptions.model_fields:
        flags = [a for a in parser_actions if a.dest == name or a.option_strings == [f"--{name.replace('_', '-')}"]]
        assert len(flags) == (1 if name in AnalysisOptions.FLAGS else 0), (name, [a.option_strings for a in flags])
    assert set(AnalysisOptions.FLAGS) <= set(AnalysisOptions.model_fields)
    groups = {flag.group for flag in AnalysisOptions.FLAGS.values()} - {None}
    assert groups == set(AnalysisOptions.FLAG_GROUPS)
    assert "stages" not in AnalysisOptions.FLAGS and _analyze_actions()["only"].option_strings == ["--only"]


def test_analysis_options_round_trip_through_their_dict_and_read_the_stored_demo_options():
    from stability.config import STAGES, AnalysisOptions

    for options in (AnalysisOptions(), AnalysisOptions(samples=8, stages=("rho",)),
                    AnalysisOptions(solver="anderson", tol=1e-9, eig_batch=3, eig_precision="float64",
                                    noise_std=0.5, workers=None, stages=STAGES, geometry_plane=15)):
        d = options.to_dict()
        assert AnalysisOptions(**d) == options and AnalysisOptions(**json.loads(json.dumps(d))) == options
        assert options.replace(samples=2) == AnalysisOptions(**{**d, "samples": 2})
    # the options a committed demo run stored (eig_route, a flag then, included) read back to the same values in
    # the same order; what a stored run may lack is an option written since (the large-state ones of issue 25, the
    # geometry sample choice of issue 33, the batching of issue 35), at its default
    stored = json.loads((ROOT / "docs" / "demo-sample.json").read_text())
    found = [v["options"] for v in stored.values() if isinstance(v, dict) and "options" in v]
    assert found
    for d in found:
        again = AnalysisOptions(**d).to_dict()
        assert json.dumps({k: v for k, v in again.items() if k in d}) == json.dumps(d)
        added = {k: v for k, v in again.items() if k not in d}
        assert added.items() <= {"few_samples": 8, "few_samples_above": 8192, "geometry_pick": "attracting",
                                 "batch": "auto"}.items()


def test_analysis_options_are_frozen_and_refuse_unknown_keys_and_bad_values_in_one_line():
    from stability.config import AnalysisOptions
    from stability.errors import ConfigError

    options = AnalysisOptions()
    with pytest.raises(ValueError):
        options.samples = 3
    with pytest.raises(ConfigError, match=r"^AnalysisOptions: unknown key\(s\) sampels; allowed: samples, solver"):
        AnalysisOptions(sampels=3)
    for bad, message in (({"samples": 0}, r"AnalysisOptions.samples: 0 is outside \[1, 10000000\]"),
                         ({"geometry_accuracy": 1.0},
                          r"AnalysisOptions.geometry_accuracy: 1.0 is outside \(0.0, 1.0\)"),
                         ({"tol": 0.0}, "AnalysisOptions.tol: 0.0 must be greater than 0.0"),
                         ({"solver": "newton"}, "'newton' is not allowed; allowed: picard, anderson"),
                         ({"samples": True}, "AnalysisOptions.samples: expected an integer, got True"),
                         ({"noise_std": float("nan")}, "AnalysisOptions.noise_std: expected a finite number"),
                         ({"device": "tpu"}, "device 'tpu': expected auto, cpu, cuda or cuda:N"),
                         ({"stages": "rho,bogus"}, "unknown stage 'bogus'; allowed: reachability, rho"),
                         ({"eig_route": "arpack"}, "AnalysisOptions.eig_route: 'arpack' is not allowed")):
        with pytest.raises(ConfigError, match=message) as err:
            AnalysisOptions(**bad)
        assert "\n" not in str(err.value)
        with pytest.raises(ConfigError, match=message):
            options.replace(**bad)


@pytest.mark.parametrize("flag, value, message", [
    ("--samples", "0", "argument --samples: expected a positive integer, got '0'"),
    ("--geometry-accuracy", "1", "argument --geometry-accuracy: expected a number in (0, 1), got '1'"),
    ("--repelling-starts", "-1", "argument --repelling-starts: expected a non-negative integer, got '-1'"),
    ("--tol", "nan", "argument --tol: expected a positive number, got 'nan'"),
    ("--solver", "newton", "argument --solver: invalid choice: 'newton'"),
    ("--device", "tpu", "argument --device: expected auto, cpu, cuda or cuda:N, got 'tpu'"),
    ("--eig-route", "arnoldi", "unrecognized arguments: --eig-route arnoldi"),
])
def test_a_bad_analysis_option_on_the_command_line_is_one_line_and_exit_2(flag, value, message, cli):
    proc = cli("analyze", "ckpt.pt", flag, value, check=False)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and message in err[0], proc.stderr


def test_a_grid_writes_a_method_and_its_options_in_the_method_table():
    from stability.errors import ConfigError
    from stability.sweep import grid

    base = {"fixed": {"task": {"train_size": 40}}}
    table = grid.parse({**base, "fixed": {**base["fixed"], "train": {"method": {"name": "implicit",
                                                                                "solver_tol": 1e-4}}},
                        "axes": {"train": {"method": {"jac_reg": [0.0, 0.1]}}}})
    assert [c.config.train.method.jac_reg for c in table.cells] == [0.0, 0.1]
    assert {c.config.train.method.solver_tol for c in table.cells} == {1e-4}
    assert list(table.axes) == ["train.method.jac_reg"] and table.cells[1].cell_id.endswith("-jacreg1e-1")
    assert table.cells[1].id.startswith("prefix-sums_jac-reg1e-1--")
    assert len(grid.select(table.cells, ["train.method.jac_reg=0.1"])) == 1
    assert len(grid.select(table.cells, ["train.method.name=implicit"])) == 2
    with pytest.raises(ConfigError, match=r"fixed.train: TrainConfig.solver_tol: an option of the implicit method"):
        grid.parse({"fixed": {"train": {"method": {"name": "implicit"}, "solver_tol": 1e-4}}})
    with pytest.raises(ConfigError, match=r"fixed.train.method: expected a table"):
        grid.parse({"fixed": {"train": {"method": "implicit"}}})
    with pytest.raises(ConfigError, match="TrainConfig.alpha: only the progressive method uses it, not implicit"):
        grid.parse({"fixed": {"train": {"method": {"name": "implicit", "alpha": 0.5}}}})
    with pytest.raises(ConfigError, match=r"fixed.train.method: unknown key\(s\) solvertol"):
        grid.parse({"fixed": {"train": {"method": {"name": "implicit", "solvertol": 0.5}}}})


def test_the_sweeps_summary_flags_and_its_grid_table_derive_from_one_schema(tmp_path, cli):
    from stability.cli import build_parser
    from stability.config import SweepSummary
    from stability.errors import ConfigError
    from stability.sweep import grid

    actions = {a.dest: a for a in build_parser("sweep")._subparsers._group_actions[0].choices["sweep"]._actions}
    for name in SweepSummary.FLAGS:
        info = SweepSummary.model_fields[name]
        assert actions[name].default is None and info.description in actions[name].help, name
    assert actions["analyze_splits"].choices == ["val", "hard", "both"]
    assert grid.SUMMARY_KEYS == tuple(SweepSummary.model_fields)
    with pytest.raises(ConfigError, match=r"summary.analyze_max_iter: 0 is outside \[1, 1000000\]"):
        grid.parse({"fixed": {"task": {"train_size": 40}}, "summary": {"analyze_max_iter": 0}})
    toml = tmp_path / "g.toml"
    toml.write_text('[fixed.task]\nname = "prefix-sums"\n[summary]\nanalyze_samples = 2\n')
    # the flag refuses what the schema's bounds refuse, naming the flag
    proc = cli("sweep", toml, "--analyze-samples", "-1", "--dry-run", "--results", tmp_path / "r", check=False)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1, proc.stderr
    assert "argument --analyze-samples: expected a non-negative integer, got '-1'" in err[0], err
