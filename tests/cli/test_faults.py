"""What a hostile user found (issue 26), each held: a second run on the same --out, a sweep's records after a
kill, orphans of killed processes (real processes, killed with SIGKILL), the sweep's resume hint, a disk that
fills (an injected ENOSPC), one-line refusals instead of tracebacks, compare's options and one-sided rows, the
import summary, halt's progress, and the README's sample of the demo generated from the code."""

from __future__ import annotations

import copy
import errno
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import ROOT, run_cli

RELEASE = ROOT / "tests" / "fixtures" / "release" / "external_prefix_sums_post_lr0.0001_seed0"

SMALL = ["--task", "prefix-sums", "--width", "16", "--heads", "2", "--train-size", "200", "--val-size", "20",
         "--hard-size", "20", "--train-length", "8", "--hard-length", "12", "--batch-size", "50",
         "--iterations", "6", "--test-iterations", "8", "--warmup-epochs", "0", "--cooldown-at", "1", "--quiet"]
ANALYZE = ["--split", "val", "--samples", "2", "--max-iter", "60", "--iterations", "12", "--probes", "1", "--quiet"]


def _one_line_error(proc, needle: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A one-epoch checkpoint and its (val-only) analysis JSON."""
    d = tmp_path_factory.mktemp("faults")
    ckpt, js = d / "run.pt", d / "run.json"
    run_cli("train", *SMALL, "--epochs", "1", "--out", ckpt)
    run_cli("analyze", ckpt, *ANALYZE, "--json", js)
    return {"dir": d, "ckpt": ckpt, "json": js}


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                out += [int(c) for c in fh.read().split()]
        except OSError:
            pass
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def _gone_after_kill(parent: subprocess.Popen, children: list[int], within: float = 30.0) -> list[int]:
    """SIGKILL ``parent`` alone (not its process group) and return the children still alive ``within`` s later."""
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.time() + within
    while time.time() < deadline and any(_alive(c) for c in children):
        time.sleep(0.05)
    alive = [c for c in children if _alive(c)]
    for c in alive:  # leave nothing behind, whatever the test says
        os.kill(c, signal.SIGKILL)
    return alive


needs_proc = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")


# ---- work lost or records missing ----------------------------------------------------------------------------
@needs_proc
def test_a_second_train_on_the_same_out_is_refused_naming_the_first_runs_pid(tmp_path):
    from stability.train.loop import lock_path, run_lock

    out = tmp_path / "run.pt"
    first = subprocess.Popen([sys.executable, "-m", "stability", "train", *SMALL, "--epochs", "500", "--seed", "0",
                              "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        _wait_for(lambda: lock_path(out).exists() and lock_path(out).read_text().strip() == str(first.pid), 120,
                  "the first run's lock")
        second = run_cli("train", *SMALL, "--epochs", "1", "--seed", "1", "--out", out, check=False)
        line = _one_line_error(second, f"another training run (pid {first.pid}) is writing it")
        assert str(out) in line
        assert first.poll() is None, first.stderr.read()  # the first run goes on
    finally:
        first.kill()
        first.wait()
    with run_lock(out):  # a run killed with SIGKILL holds nothing: the next one takes the lock over
        pass


def test_a_finished_run_leaves_no_lock_file_and_a_refused_run_nothing(tmp_path):
    from stability.train.loop import run_lock

    out = tmp_path / "new" / "run.pt"
    run_cli("train", *SMALL, "--epochs", "1", "--out", out)
    assert sorted(p.name for p in out.parent.iterdir()) == ["run.accuracy.csv", "run.metrics.csv",
                                                           "run.metrics.jsonl", "run.pt"]
    other = tmp_path / "other" / "run.pt"
    from stability.errors import CheckpointError

    with run_lock(other):  # held by this process: a run on it is refused and writes nothing
        with pytest.raises(CheckpointError, match=f"another training run \\(pid {os.getpid()}\\)"):
            from stability.train import train
            from stability.train.loop import lock_path

            train(stability_config(), other, progress=False)
        assert sorted(p.name for p in other.parent.iterdir()) == [lock_path(other).name]
    assert not other.parent.exists()  # the folder made for the lock goes with it


def stability_config():
    from stability.config import ModelConfig, RunConfig, TaskConfig, TrainConfig

    return RunConfig(model=ModelConfig(width=16, heads=2),
                     task=TaskConfig(train_size=40, val_size=8, hard_size=8, train_length=6, hard_length=8),
                     train=TrainConfig(epochs=1, batch_size=20, iterations=3, test_iterations=4, device="cpu"))


def _tiny_grid(path: Path, epochs: int = 1) -> Path:
    path.write_text('name = "tiny"\n[fixed.task]\nname = "prefix-sums"\ntrain_size = 40\nval_size = 8\n'
                    'hard_size = 8\ntrain_length = 6\nhard_length = 8\n[fixed.model]\nwidth = 16\nheads = 2\n'
                    f'[fixed.train]\nepochs = {epochs}\nbatch_size = 20\niterations = 3\ntest_iterations = 4\n'
                    'device = "cpu"\nmonitor_samples = 2\n[axes.train]\nseed = [0]\n')
    return path


def test_a_sweep_with_nothing_left_to_run_still_writes_its_records(tmp_path):
    """A sweep killed after its last cell's record but before the export: the rerun has nothing to run, and still
    writes records.jsonl and records.csv."""
    from stability.sweep import grid as gridlib
    from stability.config import SweepSummary
    from stability.sweep.runner import run_cell

    grid = _tiny_grid(tmp_path / "tiny.toml")
    results = tmp_path / "results"
    (cell,) = gridlib.load(grid).cells
    assert run_cell(cell, results, SweepSummary(summary="monitor"))["status"] == "done"
    assert not (results / "records.jsonl").exists()  # the state a sweep killed before its export leaves
    proc = run_cli("sweep", grid, "--results", results, "--summary", "monitor")
    assert "nothing to run" in proc.stdout
    lines = (results / "records.jsonl").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == [cell.id]
    assert cell.cell_id in (results / "records.csv").read_text()


# ---- orphans --------------------------------------------------------------------------------------------------
@needs_proc
def test_sigkill_to_a_sweep_takes_its_worker_with_it(tmp_path):
    grid = _tiny_grid(tmp_path / "tiny.toml", epochs=2000)
    results = tmp_path / "results"
    sweep = subprocess.Popen([sys.executable, "-m", "stability", "sweep", str(grid), "--results", str(results),
                              "--summary", "monitor"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        workers = _wait_for(lambda: [c for c in _children(sweep.pid) if "stability.sweep.runner" in _cmdline(c)],
                            120, "the sweep's worker")
        # killed once it trains (its first epoch is saved), well past its start-up
        _wait_for(lambda: any((results / "runs").glob("*.pt")), 120, "the worker's training")
    finally:
        alive = _gone_after_kill(sweep, _children(sweep.pid) if sweep.poll() is None else [])
    assert workers and alive == [], f"orphaned worker(s) {alive} left running"
    assert not any((results / "records").glob("*.json"))  # no orphan finished the cell


@needs_proc
def test_sigkill_to_analyze_takes_its_split_process_and_the_resource_tracker_with_it(run):
    cmd = [sys.executable, "-m", "stability", "analyze", str(run["ckpt"]), "--split", "both", "--workers", "2",
           "--samples", "4", "--iterations", "300000", "--quiet"]
    parent = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        def started():  # both children exec'd: the spawned split process and multiprocessing's resource tracker
            kids = _children(parent.pid)
            lines = [_cmdline(k) for k in kids]
            ok = any("multiprocessing.spawn" in c for c in lines) and any("resource_tracker" in c for c in lines)
            return kids if ok else None

        _wait_for(started, 120, "the split process and the resource tracker")
        time.sleep(1.0)  # the split process is analysing by now
    finally:
        alive = _gone_after_kill(parent, _children(parent.pid) if parent.poll() is None else [])
    assert alive == [], f"orphaned {[(_cmdline(a) or a) for a in alive]}"


# ---- the sweep's interrupt hint -------------------------------------------------------------------------------
def test_an_interrupted_sweep_prints_the_exact_command_that_resumes_it(tmp_path, monkeypatch):
    from stability.cli import build_parser
    from stability.sweep import executors

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(executors, "run_local", interrupted)
    grid = _tiny_grid(tmp_path / "tiny.toml")
    results = tmp_path / "elsewhere"
    given = ["sweep", str(grid), "--results", str(results), "--workers", "1", "--where", "train.seed=0",
             "--summary", "monitor", "--analyze-max-iter", "50"]
    proc = run_cli(*given, check=False)
    assert proc.returncode == 130
    hint = re.search(r"resume with `([^`]+)`", proc.stderr)
    assert hint, proc.stderr
    argv = shlex.split(hint.group(1))
    assert argv[0] == "stability"
    resumed, original = build_parser("sweep").parse_args(argv[1:]), build_parser("sweep").parse_args(given)
    for name in ("grid", "results", "workers", "where", "summary", "analyze_max_iter", "executor", "only"):
        assert getattr(resumed, name) == getattr(original, name), name


# ---- a disk that fills ----------------------------------------------------------------------------------------
class _FullDisk:
    """A file whose writes fail as a full disk's do (ENOSPC) after ``room`` bytes."""

    def __init__(self, real, room: int):
        self._real, self._room = real, room

    def write(self, data):
        if len(data) > self._room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= len(data)
        return self._real.write(data)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._real.close()


def test_train_on_a_full_disk_says_so_in_one_line_and_writes_nothing(tmp_path, monkeypatch):
    from stability import stored

    real_open = open
    monkeypatch.setattr(stored, "open", lambda *a, **k: _FullDisk(real_open(*a, **k), room=1000), raising=False)
    out = tmp_path / "new" / "run.pt"
    proc = run_cli("train", *SMALL, "--epochs", "1", "--out", out, check=False)
    line = _one_line_error(proc, "the disk is full")
    assert str(out) in line
    assert os.listdir(tmp_path) == []  # no checkpoint, metrics, lock, temporary file or folder


def test_a_disk_that_fills_while_plots_are_written_leaves_no_plot_folder(run, tmp_path, monkeypatch):
    import matplotlib.figure

    real = matplotlib.figure.Figure.savefig
    calls = {"n": 0}

    def fills(self, *args, **kwargs):  # the first plot fits, the second does not
        calls["n"] += 1
        if calls["n"] > 1:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", fills)
    plots = tmp_path / "plots"
    proc = run_cli("analyze", run["ckpt"], *ANALYZE, "--plots", plots, check=False)
    assert calls["n"] == 2 and os.listdir(tmp_path) == []  # no plot folder (not residuals.png alone), no temporary
    _one_line_error(proc, f"cannot write {plots}")
    assert "the disk is full" in proc.stderr
    (plots).mkdir()
    (plots / "residuals.png").write_bytes(b"an earlier run's plot")
    calls["n"] = 0
    run_cli("analyze", run["ckpt"], *ANALYZE, "--plots", plots, check=False)
    assert (plots / "residuals.png").read_bytes() == b"an earlier run's plot"  # left as it was


# ---- one line, exit 2, nothing written ------------------------------------------------------------------------
@pytest.mark.parametrize("argv,needle", [
    (["--max-iter", "100000000000000000000"], "--max-iter 100000000000000000000: at most 1000000"),
    (["--iterations", "100000000000000000000"], "--iterations 100000000000000000000: at most 1000000"),
    (["--probes", "1000000000"], "--probes 1000000000: at most 1024"),
    (["--only", ""], "--only '': no stage given"),
    (["--only", " , "], "no stage given"),
])
def test_analyze_refuses_what_cannot_finish_and_an_empty_stage_list(run, tmp_path, argv, needle):
    t0 = time.perf_counter()
    proc = run_cli("analyze", run["ckpt"], "--samples", "2", *argv, "--json", tmp_path / "a.json", check=False,
                   timeout=60)  # `--probes 1000000000` used to hang
    _one_line_error(proc, needle)
    assert time.perf_counter() - t0 < 5 and not (tmp_path / "a.json").exists()


def test_halt_refuses_a_budget_it_cannot_allocate(run, tmp_path):
    proc = run_cli("halt", run["ckpt"], "--max-iterations", "100000000000000000000", "--json", tmp_path / "h.json",
                   check=False)
    _one_line_error(proc, "--max-iterations 100000000000000000000: at most 1000000")
    assert not (tmp_path / "h.json").exists()


@pytest.mark.parametrize("option", ["--lr", "--weight-decay", "--adam-eps", "--grad-clip"])
def test_train_refuses_a_number_too_large_for_float32_in_one_line(tmp_path, option):
    proc = run_cli("train", *SMALL, "--epochs", "1", option, "1e300", "--out", tmp_path / "x.pt", check=False)
    _one_line_error(proc, f"{option} 1e+300: too large")
    assert os.listdir(tmp_path) == []


def test_a_diverged_run_exits_3_as_train_help_documents(tmp_path):
    from stability.train.loop import EXIT_DIVERGED

    proc = run_cli("train", *SMALL, "--epochs", "1", "--norm", "none", "--lr", "1e30", "--out", tmp_path / "d.pt",
                   check=False)
    assert proc.returncode == EXIT_DIVERGED == 3
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "non-finite" in proc.stderr
    help_text = " ".join(run_cli("train", "--help").stdout.split())
    assert "3 the run diverged" in help_text and "2 bad usage" in help_text


def test_a_truncated_checkpoint_is_refused_in_whole_sentences(run, tmp_path):
    data = run["ckpt"].read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(data[: int(len(data) * 0.9)])
    line = _one_line_error(run_cli("analyze", cut, check=False), "truncated or corrupt checkpoint")
    reason = re.search(r"\((.*)\)$", line).group(1)
    assert reason.endswith("."), reason  # a whole sentence of torch's reason, never one cut mid-word


class _Executes:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # loading this pickle would run a shell command
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


@pytest.mark.parametrize("which", ["--inputs", "--weights"])
def test_a_code_executing_inputs_or_weights_file_is_refused_as_a_checkpoint_is(tmp_path, which):
    marker = tmp_path / "executed"
    evil = tmp_path / "evil.pt"
    torch.save({"inputs": _Executes(marker)}, evil)
    inputs = tmp_path / "inputs.pt"
    torch.save(torch.zeros(2, 4, 1), inputs)
    (tmp_path / "own_model.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(1, 1)\n")
    files = {"--inputs": evil, "--weights": inputs} if which == "--inputs" else {"--inputs": inputs, "--weights": evil}
    proc = run_cli("analyze", "--model", "own_model:make", "--inputs", files["--inputs"], "--weights",
                   files["--weights"], cwd=tmp_path, check=False)
    line = _one_line_error(proc, f"{which} {evil}: refused: loading it would execute code")
    assert "weights_only" not in proc.stderr and not marker.exists(), line


# ---- compare --------------------------------------------------------------------------------------------------
def test_compare_names_the_analysis_options_that_differ_and_one_sided_rows_as_only_in(run, tmp_path):
    from stability.compare import compare_files, format_comparison

    a = json.loads(run["json"].read_text())
    b = copy.deepcopy(a)
    b["options"]["samples"], b["options"]["tol"] = 8, 1e-6  # analysed with other options, and one more split
    b["splits"] = ["val", "hard"]
    b["hard"] = copy.deepcopy(a["val"])
    a["val"]["prop5"] = {"T": [1, 500], "rel_error": [1.0, 1e-10]}  # Prop. 5 measured in A only
    b["val"]["prop5"] = {"T": [], "rel_error": [], "skipped": "no sample converged"}
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    cmp = compare_files(pa, pb)
    text = format_comparison(cmp)
    assert "options: the same" not in text
    changes = {k: (va, vb) for k, va, vb in cmp.analysis_changes}
    assert changes["samples"] == (2, 8) and changes["tol"] == (1e-5, 1e-6)
    assert changes["splits"] == (["val"], ["val", "hard"])
    assert "  samples: 2 → 8" in text and "None" not in text
    hard = [r for r in cmp.rows if r.split == "hard"]
    assert hard and all(r.only == "B" and not r.changed for r in hard)
    prop5 = next(r for r in cmp.rows if r.label.startswith("Prop. 5"))
    assert prop5.label == "Prop. 5 relative error (T = 500)" and prop5.only == "A"
    both = [r for r in cmp.rows if r.only is None]
    only_a, only_b = sum(r.only == "A" for r in cmp.rows), sum(r.only == "B" for r in cmp.rows)
    changed = sum(r.changed for r in both)
    assert f"{changed} of {len(both)} quantities changed; {only_a} only in A; {only_b} only in B" in text
    row = next(d for d in cmp.to_dict()["rows"] if d["split"] == "hard" and d["quantity"] == "converged share")
    assert row["only_in"] == "B" and row["changed"] is False
    assert sum(line.endswith("  only in B") for line in text.splitlines()) == only_b


def test_compare_of_an_imported_release_checkpoint_treats_it_as_finished(run, tmp_path):
    imported = tmp_path / "imported.pt"
    out = run_cli("import", RELEASE / "model_best.pth", "--out", imported).stdout
    for needle in ("task:", "prefix-sums", "recall external", "norm post", "width 64", "epoch", "semantics",
                   "window_edges shift", "rope_precision float32", f"checkpoint: {imported}"):
        assert needle in out, (needle, out)
    proc = run_cli("compare", imported, run["ckpt"])
    assert "resume" not in proc.stdout + proc.stderr
    assert "imported release checkpoint" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("accuracy at iteration")]
    assert rows and all(line.endswith("only in B") for line in rows)


# ---- halt's progress ------------------------------------------------------------------------------------------
def test_halt_shows_progress_on_stderr_and_quiet_silences_it(run):
    loud = run_cli("halt", run["ckpt"], "--tol", "0.1")
    assert "halt val" in loud.stderr and "/40 " in loud.stderr  # 20 samples × (the fixed budget + 1 τ)
    quiet = run_cli("halt", run["ckpt"], "--tol", "0.1", "--quiet")
    assert quiet.stderr == "" and quiet.stdout == loud.stdout


# ---- the README --------------------------------------------------------------------------------------------
def test_the_readme_sample_is_what_the_code_prints_for_the_stored_demo_run():
    """docs/demo-sample.json is a real demo run; the README's sample must be what the code renders from it today
    (`python docs/readme_sample.py --render` rewrites it; the slow demo test checks a fresh run against it)."""
    from stability.demo import SAMPLE_RECORD, readme_block, readme_sample

    record = json.loads((ROOT / SAMPLE_RECORD).read_text())
    assert readme_block((ROOT / "README.md").read_text(encoding="utf-8")) == readme_sample(record)


def test_every_row_of_the_sample_report_is_explained_in_plain_words():
    from stability.analysis.report import GUIDE, split_table
    from stability.demo import SAMPLE_RECORD

    record = json.loads((ROOT / SAMPLE_RECORD).read_text())
    doc = (ROOT / "docs" / "analysis.md").read_text(encoding="utf-8")
    section = doc.split("### Reading the report in plain words", 1)[1].split("\n### ", 1)[0]
    assert GUIDE.endswith("docs/analysis.md#reading-the-report-in-plain-words")
    for split in record["analysis"]["splits"]:
        for line in split_table(record["analysis"][split]).splitlines()[2:-1]:
            if line.startswith(" "):  # a value or meaning wrapped under its row (the report is 100 columns wide)
                continue
            label = re.split(r"\s{2,}", line)[0]
            names = {label, label.removesuffix(" median")}
            assert any(f"**{n}**" in section for n in names), f"no plain-words line for the row {label!r}"


def test_the_readme_is_a_newcomers_page_whose_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "pip install torch==2.13.0 -e . && stability demo" in text
    assert "pip install torch==2.13.0 -e '.[test]' && python -m pytest" in text
    for word in ("**YES**", "**PARTLY**", "**NO**", "**NOT MEASURED**"):
        assert f"| {word} |" in text, word
    for heading in ("## Start here", "### What the demo prints", "### How to read the verdict",
                    "### Reproducibility", "## Three ways in", "## The command line", "## Where to read more"):
        assert f"\n{heading}" in text, heading
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        assert (ROOT / target).exists(), target
    # generated output (the demo's sample in a code block, the claims table between its markers) is not prose
    prose = re.sub(r"```.*?```|<!-- stability claims \S+: begin.*?<!-- stability claims: end -->", "", text,
                   flags=re.S)
    assert len(prose.split()) < 1500, len(prose.split())  # read top to bottom in five minutes


def test_a_full_disk_during_analyze_json_plots_says_the_json_was_written_and_the_plots_not(run, tmp_path,
                                                                                           monkeypatch):
    """--json and --plots: the JSON is written whole, then the disk fills during the plots; the one line says
    that the JSON was written completely and the plots were not (and no plot folder is left)."""
    import matplotlib.figure

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    js, plots = tmp_path / "a.json", tmp_path / "plots"
    proc = run_cli("analyze", run["ckpt"], *ANALYZE, "--json", js, "--plots", plots, check=False)
    line = _one_line_error(proc, f"cannot write {plots}")
    assert "the disk is full" in line
    assert f"the JSON {js} was written completely, the plots in {plots} were not" in line
    assert json.loads(js.read_text())["splits"] and sorted(os.listdir(tmp_path)) == ["a.json"]


def test_a_full_disk_at_the_json_of_analyze_json_plots_says_nothing_was_written(run, tmp_path, monkeypatch):
    from stability import atomic

    def full(path):
        raise atomic.OutputError(f"cannot write {path}: the disk is full")

    from stability.analysis.results import Analysis

    monkeypatch.setattr(Analysis, "write_json", lambda self, path: full(path))
    js, plots = tmp_path / "a.json", tmp_path / "plots"
    proc = run_cli("analyze", run["ckpt"], *ANALYZE, "--json", js, "--plots", plots, check=False)
    line = _one_line_error(proc, f"cannot write {js}: the disk is full")
    assert f"nothing was written: neither the JSON {js} nor the plots in {plots}" in line
    assert os.listdir(tmp_path) == []
