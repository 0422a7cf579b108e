"""The whole default `stability analyze` of a paper-size checkpoint, measured as a process (issue 25).

    python benchmarks/paper_size.py [--out DIR] [--json benchmarks/results-paper-size.json] [--samples N]
                                    [--before-tree DIR] [--repeats R] [--dry-run]
    python benchmarks/paper_size.py --paper-hard [--samples 2] ...

The checkpoint: a width-256 sudoku model (the paper's architecture: external recall, post-norm, n = 81 × 256 =
20,736) trained briefly by ``stability train`` on a small generated set (:data:`TRAIN`), then its recall weight
W_x scaled by the largest factor of :data:`FACTORS` at which plain Picard iteration (the analysis's solver, τ
1e-5, 500 iterations) converges on every analysed val and hard sample, written back with the toolkit's checkpoint
writer (``stability.stored.atomic_save``) so that ``stability analyze CKPT`` reads it like any other. Made once
under DIR and reused (the factor is in ``DIR/…-made.json``).

The measurement: ``python -m stability analyze CKPT --json F --quiet`` (every stage, both splits side by side on
the machine's cores: the default), as a process: wall and CPU seconds of it and its split processes, their peak
RSS, the per-stage ``timings`` of each split from the JSON. ``--before-tree DIR`` alternates another checkout's code
with this one's (``git worktree add /tmp/before e40e69f``) for ratios measured in one run. ``--paper-hard``: a
width-256 prefix-sums model trained briefly on short strings, analysed on a 512-bit hard split (n = 512 × 256 =
131,072) with the default stages on ``--samples`` samples; each stage's cost stated. ``--dry-run``: the same
steps at a toy size (width 16, a few samples), for the tests. benchmarks/RESULTS.md, "Paper-size analysis", states
what this measured; ``python benchmarks/run.py --only paper-size`` runs it as part of the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: recall scales tried, largest first: the first at which Picard converges on every analysed sample is kept
FACTORS = (1.0, 0.75, 0.5, 0.35, 0.25, 0.15, 0.1)

#: the brief training of each checkpoint (``stability train`` flags); ``tiny``: the --dry-run's
TRAIN = {
    "sudoku": ["--task", "sudoku", "--width", "256", "--train-size", "256", "--val-size", "64", "--hard-size", "64",
               "--epochs", "4", "--lr", "1e-3", "--warmup-epochs", "0", "--batch-size", "32",
               "--test-iterations", "30"],
    "prefix-sums": ["--task", "prefix-sums", "--width", "256", "--train-size", "512", "--val-size", "16",
                    "--hard-size", "8", "--train-length", "16", "--hard-length", "512", "--epochs", "4",
                    "--lr", "1e-3", "--warmup-epochs", "0", "--batch-size", "64", "--test-iterations", "10",
                    "--eval-batch-size", "8"],
    "tiny": ["--task", "prefix-sums", "--width", "16", "--heads", "2", "--train-size", "32", "--val-size", "8",
             "--hard-size", "8", "--train-length", "8", "--hard-length", "16", "--epochs", "1", "--batch-size", "16",
             "--iterations", "4", "--test-iterations", "5"],
}


def _env(tree: Path, threads: int | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def measured(cmd: list, env: dict, cwd: Path = ROOT) -> dict:
    """Run ``cmd`` in ``cwd`` (``python -m`` puts it first on the path: the tree whose code runs) in a child process
    of its own that reports its children's resource use: wall and CPU seconds (user + system, every process it
    waited for) and the peak RSS of the largest one."""
    probe = ("import json, resource, subprocess, sys, time\n"
             "t = time.perf_counter(); rc = subprocess.run(sys.argv[1:]).returncode\n"
             "wall = time.perf_counter() - t; r = resource.getrusage(resource.RUSAGE_CHILDREN)\n"
             "print('@@' + json.dumps({'rc': rc, 'wall_s': wall, 'cpu_s': r.ru_utime + r.ru_stime,"
             " 'peak_rss_mib': r.ru_maxrss / 1024}), file=sys.stderr)\n")
    p = subprocess.run([sys.executable, "-c", probe, *cmd], env=env, cwd=cwd, stderr=subprocess.PIPE, text=True)
    lines = p.stderr.splitlines()
    out = json.loads(next(line[2:] for line in reversed(lines) if line.startswith("@@")))
    if out["rc"]:
        sys.stderr.write("\n".join(line for line in lines if not line.startswith("@@")) + "\n")
    return out


def make_checkpoint(kind: str, out: Path, samples: int, splits: tuple, *, tree: Path = ROOT) -> dict:
    """Train ``kind`` (:data:`TRAIN`) into ``out/KIND-trained.pt`` and write ``out/KIND.pt`` with W_x scaled by
    the largest :data:`FACTORS` at which Picard converges on the first ``samples`` of each of ``splits``. Reused
    when ``out/KIND-made.json`` exists."""
    made = out / f"{kind}-made.json"
    if made.exists():
        return json.loads(made.read_text())
    out.mkdir(parents=True, exist_ok=True)
    trained = out / f"{kind}-trained.pt"
    cmd = [sys.executable, "-m", "stability", "train", *TRAIN[kind], "--device", "cpu", "--quiet", "--out",
           str(trained)]
    if trained.exists():  # trained before, by this command (the scaling was interrupted)
        run = {"rc": 0, "reused": str(trained)}
    else:
        print("making:", " ".join(cmd[1:]), flush=True)
        run = measured(cmd, _env(tree, 1), cwd=tree)
        if run["rc"]:
            raise SystemExit(f"training failed ({run['rc']})")
    factor, conv = scale_recall(trained, out / f"{kind}.pt", samples, splits)
    info = {"kind": kind, "checkpoint": str(out / f"{kind}.pt"), "train_flags": TRAIN[kind], "train": run,
            "recall_scale": factor, "picard_converged": conv}
    made.write_text(json.dumps(info, indent=1))
    print(f"made {info['checkpoint']}: trained in {run.get('wall_s', 0):.0f} s, W_x × {factor}", flush=True)
    return info


def scale_recall(trained: Path, dest: Path, samples: int, splits: tuple):
    """Write ``trained`` with ``recall_map.x.weight`` × the first factor of :data:`FACTORS` at which Picard (τ
    1e-5, 500 iterations, the analysis's defaults) converges on the first ``samples`` samples of every split."""
    import torch

    from stability.checkpoint import load, read
    from stability.solvers import solve
    from stability.stored import atomic_save

    obj = read(trained)
    weight = obj["model"]["recall_map.x.weight"].clone()
    conv = {}
    for factor in FACTORS:
        obj["model"]["recall_map.x.weight"] = weight * factor
        atomic_save(obj, dest)
        loaded = load(dest)
        model = loaded.model.double().eval()
        ok = True
        for split in splits:
            inputs, _ = loaded.task.dataset(split)
            with torch.no_grad():
                x0 = model.embed(inputs[:samples].double() if inputs.is_floating_point() else inputs[:samples])
                e = model.initial_state(x0, generator=torch.Generator().manual_seed(0))
                r = solve(model.step, e, x0, method="picard", tol=1e-5, max_iter=500)
            conv[f"{factor}/{split}"] = f"{int(r.converged.sum())}/{r.converged.numel()}"
            ok &= bool(r.converged.all())
        print(f"W_x × {factor}: Picard converged {conv}", flush=True)
        if ok:
            return factor, conv
    raise SystemExit(f"Picard did not converge at any recall scale of {FACTORS}: {conv}")


def analyse(ckpt: str, tree: Path, json_out: Path, extra: list) -> dict:
    """``stability analyze CKPT --json F --quiet`` (plus ``extra``) with ``tree``'s code, measured; the
    per-stage timings and how many samples each stage measured, from the JSON."""
    cmd = [sys.executable, "-m", "stability", "analyze", ckpt, "--json", str(json_out), "--quiet", *extra]
    row = measured(cmd, _env(tree), cwd=tree)
    row["tree"] = str(tree)
    row["commit"] = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                                   text=True).stdout.strip()
    if row["rc"] == 0:
        report = json.loads(json_out.read_text())
        row["timings"] = {s: report[s]["timings"] for s in report["splits"]}
        row["samples"] = {s: report[s]["samples"] for s in report["splits"]}
        row["measured_samples"] = {s: report[s].get("measured_samples") for s in report["splits"]}
        row["rho_median"] = {s: _median(report[s]["jacobian"]["spectral_radius"]) if report[s].get("jacobian")
                             else None for s in report["splits"]}
    return row


def _median(values):
    v = sorted(x for x in values if x is not None)
    return v[len(v) // 2] if v else None


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(HERE / "out" / "paper-size"), help="where the checkpoints are made")
    ap.add_argument("--json", default=str(HERE / "results-paper-size.json"))
    ap.add_argument("--samples", type=int, default=None, help="--samples of the analysis (default: its own, 32; "
                    "2 with --paper-hard)")
    ap.add_argument("--before-tree", default=None, help="another checkout, alternated with this one")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--paper-hard", action="store_true", help="width-256 prefix sums, 512-bit hard split")
    ap.add_argument("--dry-run", action="store_true", help="the same steps at a toy size (tests)")
    ap.add_argument("--analyze-args", default="", help="more flags for `stability analyze` (one string)")
    args = ap.parse_args(argv)

    kind = "tiny" if args.dry_run else "prefix-sums" if args.paper_hard else "sudoku"
    samples = args.samples or (2 if args.paper_hard or args.dry_run else 32)
    splits = ("hard",) if args.paper_hard else ("val", "hard")
    out = Path(args.out).resolve()
    info = make_checkpoint(kind, out, samples, splits)
    extra = ["--samples", str(samples), *args.analyze_args.split()]
    if args.paper_hard:
        extra += ["--split", "hard"]
    if args.dry_run:
        extra += ["--only", "rho,input,a8", "--iterations", "20"]
    trees = [("after", ROOT)] + ([("before", Path(args.before_tree).resolve())] if args.before_tree else [])
    result = {"what": f"stability analyze {info['checkpoint']} {' '.join(extra)}", "made": info, "runs": [],
              "load_before": _uptime()}
    for rep in range(args.repeats):
        for label, tree in (trees if rep % 2 == 0 else trees[::-1]):
            print(f"[{rep + 1}/{args.repeats}] {label}: analysing … ({_uptime()})", flush=True)
            row = analyse(info["checkpoint"], tree, out / f"{kind}-{label}-{rep}.json", extra)
            row.update(label=label, repeat=rep, load_after=_uptime())
            result["runs"].append(row)
            print(json.dumps({k: row.get(k) for k in ("label", "rc", "wall_s", "cpu_s", "peak_rss_mib",
                                                       "timings")}), flush=True)
    walls = {}
    for row in result["runs"]:
        if row["rc"] == 0:
            walls.setdefault(row["label"], []).append(row["wall_s"])
    result["median_wall_s"] = {k: sorted(v)[len(v) // 2] for k, v in walls.items()}
    if "before" in walls and "after" in walls:
        result["ratio_before_over_after"] = result["median_wall_s"]["before"] / result["median_wall_s"]["after"]
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.json}: median wall {result['median_wall_s']}", flush=True)
    return 0 if all(r["rc"] == 0 for r in result["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
