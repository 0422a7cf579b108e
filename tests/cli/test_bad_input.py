"""Bad user input: every output path is checked before the work starts, every float option refuses NaN and ±inf,
and each mistake ends in one line on stderr and exit status 2 with nothing half-written."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from stability import atomic
from stability.errors import OutputError


def _can_create_in(d: Path) -> bool:
    try:
        fd, tmp = tempfile.mkstemp(dir=d)
    except OSError:
        return False
    os.close(fd)
    os.unlink(tmp)
    return True


@pytest.fixture
def unwritable_dir(tmp_path):
    """A directory nobody here may create files in: a read-only folder, or (as root, who ignores permission bits)
    the kernel's /sys, where no process can create a file."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        for d in (ro, Path("/sys"), Path("/proc")):
            if d.is_dir() and not _can_create_in(d):
                yield d
                return
        pytest.fail("found no unwritable directory to test with")
    finally:
        ro.chmod(0o755)


def test_check_writable_accepts_a_creatable_file_and_directory_and_creates_nothing(tmp_path):
    target = tmp_path / "a" / "b" / "out.json"
    assert atomic.check_writable(target) == target
    assert atomic.check_writable(tmp_path / "new-dir", kind="dir") == tmp_path / "new-dir"
    assert sorted(os.listdir(tmp_path)) == []  # no folder made, no probe file left


def test_check_writable_refuses_a_directory_where_a_file_is_expected(tmp_path):
    with pytest.raises(OutputError, match="is a directory; expected a file name"):
        atomic.check_writable(tmp_path, what="--out")


def test_check_writable_refuses_a_file_where_a_directory_is_expected(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(OutputError, match="is a file, expected a directory"):
        atomic.check_writable(f, kind="dir")
    with pytest.raises(OutputError, match="is a file, not a directory"):
        atomic.check_writable(f / "sub" / "out.json")


def test_check_writable_refuses_an_unwritable_location(unwritable_dir):
    with pytest.raises(OutputError, match="cannot write in") as info:
        atomic.check_writable(unwritable_dir / "x" / "out.json", what="--json")
    assert "\n" not in str(info.value) and str(info.value).startswith("--json ")
    with pytest.raises(OutputError, match="cannot write in"):
        atomic.check_writable(unwritable_dir, kind="dir")


def test_failed_write_is_one_error_and_removes_the_folders_it_made(tmp_path):
    target = tmp_path / "new" / "deeper" / "out.txt"

    def fail(tmp):
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputError, match=r"cannot write .*out.txt: No space left on device"):
        with atomic.atomic_path(target) as tmp:
            fail(tmp)
    assert os.listdir(tmp_path) == []


def test_failed_write_into_unwritable_location_is_an_output_error(unwritable_dir):
    with pytest.raises(OutputError, match="cannot write"):
        atomic.write_text(unwritable_dir / "out.txt", "x")


# ---- NaN and ±inf ---------------------------------------------------------------------------------------------
def _command_parsers():
    from stability.cli import COMMANDS, build_parser

    for name in COMMANDS:
        parser = build_parser(only=name)
        sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
        if name in sub.choices:
            yield name, sub.choices[name]


def _takes_a_number(kind) -> bool:
    """Whether an option's type reads "0.5" as a float (a float option, whatever function parses it)."""
    if kind is None:
        return False
    try:
        return isinstance(kind("0.5"), float)
    except Exception:  # an int, a device name, a pair: not a float option
        return False


def _float_options():
    out = []
    for name, parser in _command_parsers():
        for action in parser._actions:
            if action.option_strings and _takes_a_number(action.type):
                out.append((name, action.option_strings[-1]))
    return out


def test_no_option_of_any_command_is_a_plain_float():
    """``type=float`` accepts 'nan' and 'inf'; every float option parses with a type that refuses them (the next
    test runs each one)."""
    plain = [(name, a.option_strings) for name, p in _command_parsers() for a in p._actions if a.type is float]
    assert plain == []
    options = _float_options()
    assert ("train", "--lr") in options and ("train", "--alpha") in options and ("train", "--damping") in options
    assert ("halt", "--tol") in options and ("data", "--cut") not in options  # --cut belongs to `data make`


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_every_float_option_refuses_nan_and_infinity(value, capsys):
    from stability.cli import main

    options = _float_options()
    assert len(options) >= 12
    for command, option in options:
        with pytest.raises(SystemExit) as info:
            main([command, f"{option}={value}"])
        assert info.value.code == 2, (command, option)
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and option in err[0] and value in err[0], (command, option, err)


def test_data_make_cut_refuses_nan(capsys, tmp_path):
    from stability.cli import main

    with pytest.raises(SystemExit) as info:
        main(["data", "make", "--task", "sudoku", "--cut=nan", "--out", str(tmp_path / "d")])
    assert info.value.code == 2 and "--cut" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_configs_from_files_refuse_non_finite_numbers(value):
    """A TOML/dict config (sweep grids, checkpoints) goes through the same check as the flags."""
    import typing

    from stability.config import METHOD_CLASSES, ModelConfig, TaskConfig, TrainConfig, from_dict
    from stability.errors import ConfigError

    checked = 0
    for cls in (ModelConfig, TaskConfig, TrainConfig, *METHOD_CLASSES.values()):
        for name, info in cls.model_fields.items():
            if info.annotation in (float, typing.Optional[float]):
                data = {name: value}
                if cls in METHOD_CLASSES.values():  # a method's option, in its method block
                    cls_, data = TrainConfig, {"method": {"name": info and cls.model_fields["name"].default, **data}}
                else:
                    cls_ = cls
                with pytest.raises(ConfigError, match=rf"{cls_.__name__}\.{name}: expected a finite number"):
                    from_dict(cls_, data)
                checked += 1
    assert checked >= 15


# ---- every command checks its outputs before the work starts -------------------------------------------------
TINY_TRAIN = ["train", "--task", "prefix-sums", "--width", "16", "--heads", "2", "--train-size", "40", "--val-size",
              "8", "--hard-size", "8", "--train-length", "6", "--hard-length", "8", "--batch-size", "20",
              "--iterations", "3", "--test-iterations", "3", "--epochs", "1", "--cooldown-at", "1",
              "--warmup-epochs", "0", "--quiet"]


def _one_error_line(capsys, needle: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert needle in err[0], err[0]
    return err[0]


def _bad_outputs(tmp_path, unwritable_dir, kind: str):
    """(a location, the words its error must contain) for each way an output path can be wrong."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    cases = [(unwritable_dir / "out", "cannot write in"), (a_file / "out", "is a file, not a directory")]
    if kind == "file":
        cases.append((tmp_path, "is a directory; expected a file name"))
    else:
        cases.append((a_file, "is a file, expected a directory"))
    return cases


def _listing(tmp_path):
    return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("case", range(3))
def test_train_checks_out_before_training(case, tmp_path, unwritable_dir, capsys):
    from stability.cli import main

    path, needle = _bad_outputs(tmp_path, unwritable_dir, "file")[case]
    before = _listing(tmp_path)
    assert main([*TINY_TRAIN, "--out", str(path)]) == 2
    assert _one_error_line(capsys, needle).startswith("stability train: error: --out ")
    assert _listing(tmp_path) == before


def test_train_checks_tensorboard_dir_before_training(tmp_path, capsys):
    from stability.cli import main

    (tmp_path / "f").write_text("x")
    assert main([*TINY_TRAIN, "--out", str(tmp_path / "r.pt"), "--tensorboard", str(tmp_path / "f")]) == 2
    _one_error_line(capsys, "--tensorboard")
    assert not (tmp_path / "r.pt").exists()


def test_a_write_that_fails_during_training_is_one_line_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    """The disk fills up at the first checkpoint: one line naming the file, no checkpoint, no temporary file."""
    from stability.cli import main

    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", full)
    out = tmp_path / "runs" / "r.pt"
    assert main([*TINY_TRAIN, "--out", str(out)]) == 2
    line = _one_error_line(capsys, "No space left on device")
    assert "r.pt" in line
    assert _listing(tmp_path) == []  # not even the runs/ folder it made


@pytest.mark.parametrize("case", range(3))
def test_verify_checks_json_before_running(case, tmp_path, unwritable_dir, capsys):
    from stability.cli import main

    path, needle = _bad_outputs(tmp_path, unwritable_dir, "file")[case]
    assert main(["verify", "--only", "prop3_chain_rule", "--json", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no check ran
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and needle in err[0] and "--json" in err[0]


@pytest.mark.parametrize("case", range(3))
def test_tables_checks_out_before_reading(case, tmp_path, unwritable_dir, capsys):
    from stability.cli import main

    path, needle = _bad_outputs(tmp_path, unwritable_dir, "dir")[case]
    assert main(["tables", str(tmp_path / "no-results"), "--out", str(path)]) == 2
    _one_error_line(capsys, needle)


@pytest.mark.parametrize("case", range(3))
def test_data_make_checks_out_before_building(case, tmp_path, unwritable_dir, capsys):
    from stability.cli import main

    path, needle = _bad_outputs(tmp_path, unwritable_dir, "dir")[case]
    before = _listing(tmp_path)
    assert main(["data", "make", "--task", "sudoku", "--sizes", "2", "2", "2", "--out", str(path), "--quiet"]) == 2
    _one_error_line(capsys, needle)
    assert _listing(tmp_path) == before


def test_data_info_of_a_missing_directory_is_an_error(tmp_path, capsys):
    from stability.cli import main

    assert main(["data", "info", "--dir", str(tmp_path / "nosuchdir")]) == 2
    _one_error_line(capsys, "no such directory")
    (tmp_path / "f").write_text("x")
    assert main(["data", "info", "--dir", str(tmp_path / "f")]) == 2
    _one_error_line(capsys, "is a file")
    assert main(["data", "info", "--dir", str(tmp_path)]) == 0  # an existing, empty cache is fine
    assert "empty" in capsys.readouterr().out


@pytest.mark.parametrize("case", range(3))
def test_demo_checks_out_before_training(case, tmp_path, unwritable_dir, capsys):
    from stability.cli import main

    path, needle = _bad_outputs(tmp_path, unwritable_dir, "dir")[case]
    before = _listing(tmp_path)
    assert main(["demo", "--out", str(path), "--quiet"]) == 2
    _one_error_line(capsys, needle)
    assert _listing(tmp_path) == before


@pytest.mark.parametrize("case", range(3))
def test_figures_checks_out_before_drawing(case, tmp_path, unwritable_dir, capsys):
    from stability.cli import main

    path, needle = _bad_outputs(tmp_path, unwritable_dir, "dir")[case]
    before = _listing(tmp_path)
    assert main(["figures", "--only", "fig2", "--out", str(path)]) == 2
    _one_error_line(capsys, needle)
    assert _listing(tmp_path) == before


def test_a_failed_figures_run_leaves_no_empty_directory(tmp_path, capsys):
    from stability.cli import main

    out = tmp_path / "figs" / "deeper"
    assert main(["figures", "--results", str(tmp_path / "no-such-sweep"), "--only", "results",
                 "--out", str(out)]) == 2
    _one_error_line(capsys, "--results")
    assert _listing(tmp_path) == []


@pytest.mark.parametrize("case", range(3))
def test_halt_checks_json_before_loading(case, tmp_path, unwritable_dir, capsys):
    from stability.cli import main

    path, needle = _bad_outputs(tmp_path, unwritable_dir, "file")[case]
    assert main(["halt", str(tmp_path / "whatever.pt"), "--json", str(path)]) == 2
    _one_error_line(capsys, needle)


# ---- counts past their maximum (issue 33) ----------------------------------------------------------------------
def _config_classes():
    from stability.config import METHOD_CLASSES, SECTIONS, AnalysisOptions, SweepSummary

    return [*SECTIONS.values(), *METHOD_CLASSES.values(), SweepSummary, AnalysisOptions]


def test_every_count_of_the_config_schema_has_a_maximum():
    """Each integer field with a lower bound (a size, a count, an epoch or iteration budget, a seed) has an upper
    one, so a huge value is refused where the schema is read, before anything is allocated."""
    from stability.config import bounds, unwrap

    unbounded = [f"{cls.__name__}.{name}" for cls in _config_classes() for name, info in cls.model_fields.items()
                 if unwrap(info.annotation) is int and bounds(info)[0] is not None and bounds(info)[1] is None]
    assert unbounded == []


HUGE = "99999999999999999999999"


@pytest.mark.parametrize("flag", ["--epochs", "--batch-size", "--width", "--train-size", "--hard-length",
                                  "--iterations", "--test-iterations", "--monitor-samples", "--warmup-epochs"])
def test_a_training_count_past_its_maximum_is_one_line_naming_the_flag_before_any_work(flag, tmp_path):
    import time

    from tests.conftest import run_cli

    t0 = time.perf_counter()
    proc = run_cli("train", flag, HUGE, "--out", tmp_path / "x.pt", check=False, timeout=60)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and f"{flag} {HUGE}: at most" in err[0], proc.stderr
    assert time.perf_counter() - t0 < 10 and os.listdir(tmp_path) == []


@pytest.mark.parametrize("section,key", [("train", "epochs"), ("train", "batch_size"), ("task", "train_size"),
                                         ("task", "train_length"), ("model", "width")])
def test_a_grid_with_a_count_past_its_maximum_fails_its_dry_run(section, key, tmp_path):
    from tests.conftest import run_cli

    grid = tmp_path / "g.toml"
    grid.write_text(f'name = "huge"\n[fixed.{section}]\n{key} = {HUGE}\n')
    proc = run_cli("sweep", grid, "--dry-run", "--results", tmp_path / "r", check=False, timeout=60)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and f"{key}: {HUGE} is outside [" in err[0], proc.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("flag", ["--samples", "--geometry-directions", "--repelling-budget", "--workers"])
def test_an_analysis_count_past_its_maximum_is_one_line_naming_the_flag(flag, tmp_path):
    from tests.conftest import run_cli

    proc = run_cli("analyze", tmp_path / "no.pt", flag, HUGE, "--json", tmp_path / "a.json", check=False)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and f"{flag} {HUGE}: at most" in err[0], proc.stderr


@pytest.mark.parametrize("flag", ["--workers", "--gpus", "--analyze-samples", "--analyze-max-iter"])
def test_a_sweep_count_past_its_maximum_is_one_line_naming_the_flag_before_any_work(flag, tmp_path):
    from tests.conftest import ROOT, run_cli

    proc = run_cli("sweep", ROOT / "experiments" / "smoke.toml", flag, HUGE, "--results", tmp_path / "r",
                   check=False, timeout=60)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and f"{flag} {HUGE}: at most" in err[0], proc.stderr
    assert os.listdir(tmp_path) == []
