"""``stability sweep GRID --ensemble auto`` (issue 37): the groups, a killed ensemble sweep resumed, each member's
record against the ensemble checkpoint it came from and against solo runs of the same cells, locks, divergence,
reproducible mode, and the solo fallback."""

import argparse
import json
import sys

import pytest
import torch

from stability import checkpoint as ckpt
from stability.commands import sweep as sweep_cmd
from stability.config import RunConfig, SweepSummary, from_dict
from stability.errors import ConfigError
from stability.sweep import grid as gridlib
from stability.sweep import executors, groups
from stability.sweep.executors import write_cell_files
from stability.sweep.runner import cell_file, cell_lock, checkpoint_path, final_metrics, record_path
from stability.train.batchable import solo_reason
from stability.train.ensemble import check_ensemble
from stability.train.loop import train
from tests.conftest import kill_when_ready, run_cli
from tests.sweep.test_sweep import tiny_fixed, write_grid

#: 2 rates × 2 seeds of one architecture: one group of four
RATES_SEEDS = {"train": {"lr": [1e-3, 3e-3], "seed": [0, 1]}}
#: a method axis: progressive (batchable) and deep supervision (solo)
METHODS = '[axes.train.method]\nname = ["progressive", "deep-supervision"]\n'


def cli(*args, check=True, timeout=600):
    return run_cli(*args, check=check, timeout=timeout)


# ---- the groups ----------------------------------------------------------------------------------------------
def test_groups_are_the_cells_that_differ_only_in_seed_rate_and_data_seed(tmp_path):
    path = write_grid(tmp_path / "g.toml", fixed=tiny_fixed(),
                      axes={"model": {"norm": ["pre", "post"]}, "train": {"lr": [1e-3, 3e-3], "seed": [0, 1]}},
                      extra='[tie]\n"task.seed" = "train.seed"\n')
    cells = gridlib.load(path).cells
    plan = groups.plan(cells, cells, "auto")
    assert sorted(len(g) for g in plan.groups.values()) == [4, 4] and not plan.solo
    for members in plan.groups.values():
        assert len({c.config.model.norm for c in members}) == 1
        assert {(c.config.train.lr, c.config.train.seed, c.config.task.seed) for c in members} == \
            {(lr, s, s) for lr in (1e-3, 3e-3) for s in (0, 1)}
    assert sorted(c.id for job in plan.jobs for c in job) == sorted(c.id for c in cells) and len(plan.jobs) == 2
    # a resumed group is the same group: its note counts the finished members, its job only the rest
    todo = [c for c in cells if c.config.train.seed == 1]
    resumed = groups.plan(cells, todo, "auto")
    assert [len(job) for job in resumed.jobs] == [2, 2]
    note = resumed.note(todo[0])
    assert note["size"] == 4 and note["members"][note["index"]] == todo[0].cell_id
    # off: every cell its own job, and no cell file says ensemble
    off = groups.plan(cells, cells, "off")
    assert [[c.id for c in job] for job in off.jobs] == [[c.id] for c in cells]
    write_cell_files(cells, tmp_path / "r", SweepSummary(), "g", {c.id: off.note(c) for c in cells})
    assert all("ensemble" not in json.loads(cell_file(tmp_path / "r", c.id).read_text()) for c in cells)


@pytest.mark.parametrize("sizes, slots, expected", [
    ([5], 2, [3, 2]), ([5], 4, [1, 1, 1, 2]), ([4, 1], 2, [4, 1]), ([4, 1], 3, [2, 2, 1]), ([1, 1], 4, [1, 1]),
    ([2, 2], 1, [2, 2]),
])
def test_fewer_jobs_than_workers_split_the_largest_group_in_contiguous_halves(sizes, slots, expected):
    cells = iter(range(sum(sizes)))
    jobs = [[next(cells) for _ in range(n)] for n in sizes]
    out = groups.fill_workers(jobs, slots)
    assert [len(job) for job in out] == expected
    assert [c for job in out for c in job] == list(range(sum(sizes)))  # every member once, in order


def test_the_local_sweep_hands_its_workers_the_split_jobs(tmp_path, monkeypatch):
    """``_execute`` passes :func:`~stability.sweep.groups.fill_workers`' jobs to the pool on CPU workers, the
    plan's jobs with GPUs."""
    seen = []
    monkeypatch.setattr(executors, "run_local", lambda jobs, *a, **kw: seen.append(jobs) or [])
    cells = gridlib.load(write_grid(tmp_path / "g.toml", fixed=tiny_fixed(), axes={"train": {"seed": [0, 1, 2]}})).cells
    for workers, gpus, expected in ((2, 0, [2, 1]), (1, 0, [3]), (None, 2, [3])):
        args = argparse.Namespace(executor="local", workers=workers, gpus=gpus, quiet=True)
        sweep_cmd._execute(args, None, cells, [cells], tmp_path)
        assert [len(job) for job in seen[-1]] == expected


def test_cells_the_batched_step_does_not_cover_stay_solo_with_their_reason(tmp_path):
    path = write_grid(tmp_path / "g.toml", fixed=tiny_fixed(),
                      axes={"train": {"seed": [0, 1]}}, extra=METHODS)
    lone = write_grid(tmp_path / "lone.toml", fixed=tiny_fixed(), axes={"model": {"norm": ["pre", "peri"]}})
    cells = gridlib.load(path).cells + gridlib.load(lone).cells
    plan = groups.plan(cells, cells, "auto")
    assert [sorted(c.config.train.seed for c in g) for g in plan.groups.values()] == [[0, 1]]
    reasons = {reason: sorted(c.cell_id for c in cs) for reason, cs in plan.solo.items()}
    deep = next(r for r in reasons if r.startswith("method deep-supervision"))
    assert len(reasons[deep]) == 2 and len(reasons[groups.ALONE]) == 2
    assert len(plan.jobs) == 1 + 2 + 2


@pytest.mark.parametrize("change", [{}, {"method": {"name": "implicit"}}, {"compile": True}, "noise"])
def test_the_sweeps_solo_reason_is_what_the_ensemble_trainer_refuses(change):
    config = RunConfig()
    if change == "noise":
        config = config.replace(model=config.model.replace(initial_state="noise"))
    elif change:
        config = from_dict(RunConfig, {"train": change}) if "method" in change else \
            config.replace(train=config.train.replace(**change))
    reason = solo_reason(config)
    if reason is None:
        check_ensemble(config)
    else:
        with pytest.raises(ConfigError) as err:
            check_ensemble(config)
        assert reason in str(err.value)


def test_dry_run_shows_the_groups_and_the_solo_cells_and_bad_values_are_one_line(tmp_path):
    path = write_grid(tmp_path / "g.toml", fixed=tiny_fixed(),
                      axes={"train": {"seed": [0, 1]}}, extra=METHODS)
    out = cli("sweep", path, "--results", tmp_path / "r", "--ensemble", "auto", "--dry-run").stdout
    assert "ensemble auto: 1 group(s) of 2 cells" in out and "2 cell(s) to run solo" in out
    assert "  ensemble of 2: " in out
    assert "solo (method deep-supervision: ensembles train the progressive loss only" in out
    assert not (tmp_path / "r").exists()
    off = cli("sweep", path, "--results", tmp_path / "r", "--dry-run").stdout
    assert "ensemble" not in off
    bad = cli("sweep", path, "--results", tmp_path / "r", "--ensemble", "yes", check=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--ensemble" in bad.stderr
    grid_bad = write_grid(tmp_path / "b.toml", fixed=tiny_fixed(), extra='[summary]\nensemble = "on"\n')
    proc = cli("sweep", grid_bad, "--dry-run", check=False)
    assert proc.returncode == 2 and "summary.ensemble" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# ---- a real ensemble sweep, killed and resumed ---------------------------------------------------------------
def _sweep_cmd(grid, results, *extra):
    return [sys.executable, "-m", "stability", "sweep", str(grid), "--results", str(results), "--summary",
            "monitor", "--ensemble", "auto", *map(str, extra)]


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A 4-cell ensemble sweep (rates 1e-3, 3e-3 × seeds 0, 1: one group) killed with SIGKILL (its process group)
    once the members have a checkpoint, then the same command run again."""
    d = tmp_path_factory.mktemp("ens-sweep")
    grid = write_grid(d / "grid.toml", fixed=tiny_fixed(model__norm="pre", train__epochs=4), axes=RATES_SEEDS)
    results = d / "results"
    kill_when_ready(_sweep_cmd(grid, results), lambda: len(list((results / "runs").glob("*.pt"))) == 4,
                    deadline_s=300, what="checkpoint of every member")
    epochs = {p.stem: int(ckpt.read(p)["epoch"]) for p in (results / "runs").glob("*.pt")}
    records_before = list((results / "records").glob("*.json"))
    second = cli("sweep", grid, "--results", results, "--summary", "monitor", "--ensemble", "auto")
    return {"grid": grid, "results": results, "epochs": epochs, "records_before": records_before,
            "second": second, "dir": d}


@pytest.mark.slow
def test_a_killed_ensemble_sweep_resumes_and_completes_every_members_record(killed):
    results, epochs = killed["results"], killed["epochs"]
    assert not killed["records_before"] and len(epochs) == 4 and all(1 <= e < 4 for e in epochs.values())
    out = killed["second"].stdout
    assert "0 done, 4 partly trained" in out and "1 group(s) of 4 cells" in out
    assert "summary: 4 done" in out.splitlines()[-1]
    for cid, epoch in epochs.items():
        rec = json.loads(record_path(results, cid).read_text())
        assert rec["status"] == "done" and rec["epochs_completed"] == 4
        assert rec["timing"]["resumed_from_epoch"] == epoch
    again = cli("sweep", killed["grid"], "--results", results, "--ensemble", "auto")
    assert "nothing to run" in again.stdout


@pytest.mark.slow
def test_each_members_record_is_the_ensemble_checkpoint_it_came_from(killed):
    results = killed["results"]
    names = None
    for path in sorted((results / "records").glob("*.json")):
        rec = json.loads(path.read_text())
        obj = ckpt.read(checkpoint_path(results, rec["id"]))
        assert rec["final"] == json.loads(json.dumps(final_metrics(obj["final"])))
        assert rec["curves"]["loss"] == [r["loss"] for r in obj["history"]]
        assert rec["config"] == obj["config"] and rec["config"]["train"]["seed"] == rec["axes"]["train.seed"]
        note = rec["ensemble"]
        assert obj["ensemble"] == {**note, "batched": True}
        assert note["size"] == 4 and note["members"][note["index"]] == rec["cell_id"]
        names = names or note["members"]
        assert note["members"] == names  # one group, the same members in every record
        assert rec["options"] == {"summary": "monitor", "analyze_samples": 8, "analyze_splits": ["val"],
                                  "analyze_max_iter": 500}
        assert rec["stability"]["source"] == "monitor" and rec["stability"]["rho_Wx"] > 0


@pytest.mark.slow
def test_members_first_epoch_losses_are_their_solo_runs_within_1e_4_relative(killed, tmp_path):
    """The same cells trained solo (the trainer a sweep without --ensemble runs) for their first epoch: the loss
    each member's record holds for epoch 1 agrees to 1e-4 relative (only the reduction shapes differ)."""
    for path in sorted((killed["results"] / "records").glob("*.json")):
        rec = json.loads(path.read_text())
        config = from_dict(RunConfig, rec["config"])
        first = []

        def stop(model, task, record):
            first.append(record["loss"])
            raise KeyboardInterrupt  # the first epoch is all this test needs

        with pytest.raises(KeyboardInterrupt):
            train(config, tmp_path / f"{rec['id']}.pt", progress=False, callbacks=(stop,))
        ens = rec["curves"]["loss"][0]
        assert abs(ens - first[0]) <= 1e-4 * first[0], (rec["cell_id"], ens, first[0])


# ---- locks, divergence, reproducible mode ------------------------------------------------------------------
@pytest.mark.slow
def test_a_member_another_process_holds_is_busy_and_a_diverging_member_is_a_result(tmp_path):
    """One member's lock held by this process: the sweep leaves it (``busy``, no checkpoint); members whose loss
    goes non-finite (lr 1e6) get ``diverged`` records, and the one left trains on to ``done``."""
    grid = write_grid(tmp_path / "g.toml", fixed=tiny_fixed(model__norm="pre", train__epochs=2),
                      axes={"train": {"lr": [3e-3, 1e6], "seed": [0, 1]}})
    results = tmp_path / "results"
    cells = {(c.config.train.lr, c.config.train.seed): c for c in gridlib.load(grid).cells}
    held = cells[(3e-3, 1)]
    with cell_lock(results, held.id) as mine:
        assert mine
        out = cli("sweep", grid, "--results", results, "--summary", "monitor", "--ensemble", "auto").stdout
    assert f"busy     {held.id}" in out  # a busy cell is named by its full id (it has no record to read)
    assert not checkpoint_path(results, held.id).exists() and not record_path(results, held.id).exists()
    status = {key: json.loads(record_path(results, c.id).read_text())["status"]
              for key, c in cells.items() if c is not held}
    assert status == {(3e-3, 0): "done", (1e6, 0): "diverged", (1e6, 1): "diverged"}
    done = json.loads(record_path(results, cells[(3e-3, 0)].id).read_text())
    assert done["epochs_completed"] == 2 and done["ensemble"]["size"] == 4


@pytest.mark.slow
def test_a_reproducible_ensemble_sweep_writes_the_same_records_twice_the_second_split_over_two_workers(tmp_path):
    """The second sweep has ``--workers 2``: its one group of two is shared out, a member a worker
    (:func:`stability.sweep.groups.fill_workers`), and still writes bitwise the first's records and weights."""
    grid = write_grid(tmp_path / "g.toml", fixed=tiny_fixed(model__norm="pre", train__epochs=2),
                      axes={"train": {"seed": [0, 1]}}, extra="[summary]\nreproducible = true\n")
    for name, workers in (("a", "1"), ("b", "2")):
        cli("sweep", grid, "--results", tmp_path / name, "--summary", "monitor", "--ensemble", "auto",
            "--workers", workers)
    same = ("config", "status", "final", "loss_last", "monitor", "curves", "stability", "ensemble", "options")
    for path in sorted((tmp_path / "a" / "records").glob("*.json")):
        a, b = (json.loads((tmp_path / d / "records" / path.name).read_text()) for d in ("a", "b"))
        assert {k: a[k] for k in same} == {k: b[k] for k in same}
        assert a["options"]["reproducible"] is True and a["environment"]["hardware"]["reproducible"] is True
        p, q = (torch.load(tmp_path / d / a["checkpoint"], weights_only=True)["model"] for d in ("a", "b"))
        assert all(torch.equal(p[k], q[k]) for k in p)


@pytest.mark.slow
def test_on_slurm_a_group_is_one_submitit_job_writing_every_members_record(tmp_path):
    pytest.importorskip("submitit")
    grid = write_grid(tmp_path / "g.toml", fixed=tiny_fixed(model__norm="pre", train__epochs=1),
                      axes={"train": {"seed": [0, 1]}}, extra="[slurm]\ntimeout_min = 20\n")
    results = tmp_path / "results"
    out = cli("sweep", grid, "--results", results, "--executor", "slurm", "--cluster", "local", "--summary", "monitor",
              "--ensemble", "auto").stdout
    assert "summary: 2 done" in out
    assert len(list((results / "submitit").glob("*_log.out"))) == 1  # one job for the group
    notes = [json.loads(p.read_text())["ensemble"] for p in sorted((results / "records").glob("*.json"))]
    assert sorted(n["index"] for n in notes) == [0, 1] and all(n["size"] == 2 for n in notes)
