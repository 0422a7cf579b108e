"""The benchmark suite: every measurement benchmarks/RESULTS.md states, by one entry point.

    python benchmarks/run.py --list                     # the benchmarks, the section each backs, its command
    python benchmarks/run.py [--quick] [--only NAME ...] [--out DIR] [--dry-run]

Each entry of :data:`SUITE` names the section of RESULTS.md it measures and the command that measures it (a script
of this folder, or a `stability` command timed here). Every command runs as its own process with this checkout's
code first on ``PYTHONPATH``; its output goes to the terminal and to ``DIR/NAME.log``, what it writes to
``DIR`` (default ``benchmarks/out/``, not tracked), and ``DIR/suite.json`` gets each one's wall and CPU seconds
and exit status. A benchmark that fails does not stop the others (exit status 1 at the end).

``--quick`` runs each benchmark's smoke variant (fewer steps, samples or repeats; a benchmark without one is
skipped); its numbers check that the benchmark runs, they do not replace RESULTS.md's. ``--dry-run`` prints the
commands and runs nothing. Speed goals are stated in RESULTS.md, never asserted in the unit tests; the tests run
``--list`` and ``--dry-run`` only (tests/e2e/test_benchmark_suite.py). ``gpu_suite.py`` (every GPU check in one call)
and ``busy_machine.py`` also run on their own.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PY = "{python}"  # replaced by sys.executable
STABILITY = [PY, "-m", "stability"]


@dataclass(frozen=True)
class Benchmark:
    """One measurement: ``section`` is its heading in RESULTS.md (without ``## ``); ``command`` and ``quick`` are
    argument lists with ``{python}``, ``{out}`` (the output folder) and ``{ckpt}`` (the demo checkpoint) filled
    in; ``quick`` None: no smoke variant."""

    name: str
    section: str
    command: tuple
    quick: Optional[tuple]
    what: str


def _script(name: str, *args: str) -> tuple:
    return (PY, f"benchmarks/{name}", *args)


CKPT = "{out}/demo/prefix-sums.pt"

SUITE = (
    Benchmark("train-throughput", "Training throughput (`benchmarks/train_throughput.py`, issue 2)",
              _script("train_throughput.py", "--steps", "4"),
              _script("train_throughput.py", "--steps", "1", "--batch-size", "20", "--width", "32"),
              "samples/s of the paper's training configuration, math against fused attention (bf16 and compile on "
              "CUDA)"),
    Benchmark("demo", "The demo and the test suite (moved from the README, issue 26)",
              (*STABILITY, "demo", "--out", "{out}/demo", "--quiet"),
              (*STABILITY, "demo", "--out", "{out}/demo", "--quiet"),
              "`stability demo` from scratch, timed: wall and CPU seconds (also the checkpoint the analysis "
              "benchmarks read)"),
    Benchmark("test-suite", "The demo and the test suite (moved from the README, issue 26)",
              (PY, "-m", "pytest", "-q", "-p", "no:cacheprovider"), None,
              "the default test command, timed"),
    Benchmark("analysis-core", "Analysis core (`benchmarks/analysis_benchmarks.py`, issue 4)",
              _script("analysis_benchmarks.py", "--out", "{out}/analysis-core.json"),
              _script("analysis_benchmarks.py", "--only", "memory", "--threads", "1", "--out",
                      "{out}/analysis-core.json"),
              "ρ(J*) at sudoku size by every route, Anderson against Picard, implicit against unrolled memory"),
    Benchmark("methods", "Training methods (`benchmarks/methods_benchmark.py`, issue 7)",
              _script("methods_benchmark.py", "--out", "{out}/methods.md"),
              _script("methods_benchmark.py", "--epochs", "1", "--only", "progressive", "--out", "{out}/methods.md"),
              "the training methods side by side on a small prefix-sums model: accuracy, ρ(J*), evaluations, s/epoch"),
    Benchmark("solvers", "Fixed-point solvers (`benchmarks/solver_benchmarks.py`, issue 13)",
              _script("solver_benchmarks.py", "--out", "{out}/solvers.json"),
              _script("solver_benchmarks.py", "--quick", "--only", "1", "--out", "{out}/solvers.json"),
              "Picard, Anderson, Broyden (and torchdeq's, when installed) on four maps: evaluations, time per "
              "evaluation"),
    Benchmark("gpu-suite", "GPU suite (`benchmarks/gpu_suite.py`, issue 13)",
              _script("gpu_suite.py", "--out", "{out}/gpu-suite.json"),
              _script("gpu_suite.py", "--dry-run", "--out", "{out}/gpu-suite.json"),
              "every GPU check under its own time cap (on the CPU: --quick runs its tiny dry run)"),
    Benchmark("analyze-speed", "Analysis speed (`benchmarks/analyze_speed.py`, issue 12)",
              _script("analyze_speed.py", "--checkpoint", CKPT, "--json", "{out}/analyze-speed.json"),
              _script("analyze_speed.py", "--checkpoint", CKPT, "--repeats", "1", "--json",
                      "{out}/analyze-speed.json"),
              "`stability analyze` of the demo checkpoint as a process: --workers 1 on 2 and 1 threads, and the "
              "default"),
    Benchmark("dense-crossover", "Analysis speed (`benchmarks/analyze_speed.py`, issue 12)",
              _script("analyze_speed.py", "--crossover", "--checkpoint", CKPT, "--json",
                      "{out}/dense-crossover.json"), None,
              "the dense ρ/σ_max route against Krylov at n = 128 … 2048 (DENSE_MAX)"),
    Benchmark("reproducible-cost", "Reproducible mode (`benchmarks/reproducible_cost.py`, issue 22)",
              _script("reproducible_cost.py", "--json", "{out}/reproducible-cost.json"),
              _script("reproducible_cost.py", "--repeats", "1", "--cells", "ps-external-pre-lr1e-3-s0", "--json",
                      "{out}/reproducible-cost.json"),
              "whole replication cells unpinned against --reproducible"),
    Benchmark("geometry", "Geometry stage (`stability analyze`'s stage `geometry`, "
              "`benchmarks/geometry_references.py`, issue 24)",
              _script("geometry_references.py", CKPT, "--out", "{out}/geometry.json"),
              _script("geometry_references.py", "--out", "{out}/geometry.json"),
              "the references behind the geometry verdict's thresholds (Figure 5's toy model; trained checkpoints)"),
    Benchmark("analysis-scaling", "Paper-size analysis (issue 25)",
              _script("analysis_scaling.py", "--out", "{out}/analysis-scaling.json", "--figure",
                      "{out}/analysis-scaling.png"),
              _script("analysis_scaling.py", "--only", "prefix-sums-32x40", "--out", "{out}/analysis-scaling.json",
                      "--figure", "{out}/analysis-scaling.png"),
              "every stage of the analysis against the state size, and the fitted exponents"),
    Benchmark("paper-size", "Paper-size analysis (issue 25)",
              _script("paper_size.py", "--out", "{out}/paper-size", "--json", "{out}/paper-size.json"),
              _script("paper_size.py", "--dry-run", "--out", "{out}/paper-size", "--json", "{out}/paper-size.json"),
              "the whole default `stability analyze` of a width-256 sudoku checkpoint (trained briefly, W_x scaled "
              "so Picard converges) as a process: wall, CPU, peak RSS, per-stage timings"),
    Benchmark("launch-bound", "Launch-boundness of the analysis (`benchmarks/launch_bound.py`, issue 35)",
              _script("launch_bound.py", "--samples", "8", "--out", "{out}/launch-bound.json"),
              _script("launch_bound.py", "--samples", "2", "--factor", "2", "--out", "{out}/launch-bound.json"),
              "ops dispatched and host syncs per analysis stage at N and 8N samples (the ratio a batched stage "
              "keeps near 1)"),
    Benchmark("forecast", "Forecast against the time of each stage on the CPU (`benchmarks/launch_bound.py --forecast`, "
                          "issue 35)",
              _script("launch_bound.py", "--forecast", "--samples", "8", "--out", "{out}/forecast.json"),
              _script("launch_bound.py", "--forecast", "--samples", "2", "--out", "{out}/forecast.json"),
              "each stage's forecast (the split's prediction rescaled by this machine's J-product) against its "
              "measured seconds, one analysis of 8 sudoku-shape samples"),
    Benchmark("forecast-fit", "Forecast of each stage after the refit (`benchmarks/forecast_fit.py`, issue 35)",
              _script("forecast_fit.py", "--out", "{out}/forecast-fit.json"),
              _script("forecast_fit.py", "--refit", "benchmarks/results-forecast-fit.json", "--out",
                      "{out}/forecast-fit.json"),
              "the stages' cost models refitted on seven analyses (sudoku and prefix-sums shapes, widths 16-64, "
              "2-8 samples, one thread): each stage's seconds in J-products against the state size"),
    Benchmark("ensemble", "Ensembles (`benchmarks/ensemble_benchmark.py`, issue 37)",
              _script("ensemble_benchmark.py", "--out", "{out}"),
              _script("ensemble_benchmark.py", "--seeds", "2", "--epochs", "1", "--out", "{out}"),
              "a 5-seed ensemble (`stability train --seeds`) against the 5 solo runs in sequence at the demo's size: "
              "speed, loss and accuracy agreement"),
    Benchmark("lm-size", "Looped language models at 100 M parameters (`benchmarks/lm_size.py`, issue 36)",
              _script("lm_size.py", "--threads", "2", "--json", "{out}/lm-size.json"),
              _script("lm_size.py", "--quick", "--threads", "2", "--json", "{out}/lm-size.json"),
              "a Huginn-shaped LM of 101 M parameters (random weights), 4 x 32 tokens: reachability, per-token "
              "ρ and Prop. 5 on 2 threads: wall time and peak RSS against the float32 size"),
    Benchmark("claims-coverage", "Claims: coverage of the intervals with 3–6 configurations "
              "(`benchmarks/claims_coverage.py`, issue 38)",
              _script("claims_coverage.py", "--reps", "2000", "--json", "{out}/results-claims-coverage.json"),
              _script("claims_coverage.py", "--reps", "50", "--json", "{out}/results-claims-coverage.json"),
              "the coverage of the claims' intervals (bootstrap vs t) and the universal rule's false counterexamples, "
              "by simulation"),
    Benchmark("busy-machine", "Busy machine (issue 25)",
              _script("busy_machine.py", "--ckpt", CKPT, "--json", "{out}/busy-machine.json"),
              _script("busy_machine.py", "--quick", "--ckpt", CKPT, "--json", "{out}/busy-machine.json"),
              "`stability analyze` beside a CPU-bound neighbour, under the thread policy and without it"),
)

BY_NAME = {b.name: b for b in SUITE}


def command_template(bench: Benchmark, quick: bool = False) -> Optional[tuple]:
    return bench.quick if quick else bench.command


def command(bench: Benchmark, out: Path, quick: bool = False, python: str = sys.executable) -> Optional[list]:
    """The argument list of ``bench`` (its smoke variant with ``quick``; None if it has none)."""
    args = command_template(bench, quick)
    if args is None:
        return None
    return [a.replace("{python}", python).replace("{out}", str(out)) for a in args]


def _list() -> None:
    width = max(len(b.name) for b in SUITE)
    for b in SUITE:
        quick = "" if b.quick else "  (no --quick variant)"
        print(f"{b.name:<{width}}  {b.what}{quick}\n{'':<{width}}  RESULTS.md: {b.section}\n{'':<{width}}  "
              f"$ {' '.join(command(b, Path('benchmarks/out'), python='python'))}")


def _run(bench: Benchmark, argv: list, out: Path) -> dict:
    """Run one benchmark as a process in the repository root: its output to the terminal and to DIR/NAME.log."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "MPLBACKEND": "Agg"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(out / f"{bench.name}.log", "w", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, encoding="utf-8", errors="backslashreplace")
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        returncode = proc.wait()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"name": bench.name, "command": argv, "returncode": returncode,
            "wall_s": round(time.perf_counter() - start, 2),
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2),
            "load_avg_end": os.getloadavg()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=list(BY_NAME), help="run only these benchmarks")
    ap.add_argument("--quick", action="store_true", help="each benchmark's smoke variant (skips those without one)")
    ap.add_argument("--out", type=Path, default=HERE / "out", help="where the outputs go (benchmarks/out/)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args(argv)
    if args.list:
        _list()
        return 0
    out = args.out.resolve()
    chosen = [BY_NAME[n] for n in dict.fromkeys(args.only)] if args.only else list(SUITE)
    needs_demo = [b for b in chosen if b.name != "demo" and CKPT in (command_template(b, args.quick) or ())]
    if needs_demo and BY_NAME["demo"] not in chosen and not (out / "demo" / "prefix-sums.pt").exists():
        chosen.insert(0, BY_NAME["demo"])  # the checkpoint they read; its timing is recorded like any other
    plan = [(b, command(b, out, args.quick)) for b in chosen]
    for b, cmd in plan:
        print(f"[{b.name}] " + ("skipped: no --quick variant" if cmd is None else "$ " + " ".join(cmd)), flush=True)
    if args.dry_run:
        return 0
    (out / "demo").mkdir(parents=True, exist_ok=True)
    rows = []
    for b, cmd in plan:
        if cmd is None:
            continue
        print(f"\n=== {b.name}: {b.what}", flush=True)
        rows.append(_run(b, cmd, out))
        print(f"=== {b.name}: exit {rows[-1]['returncode']}, {rows[-1]['wall_s']} s wall, {rows[-1]['cpu_s']} CPU s",
              flush=True)
    from stability.atomic import write_json

    write_json(out / "suite.json", {"quick": args.quick, "runs": rows}, indent=1)
    failed = [r["name"] for r in rows if r["returncode"] != 0]
    print(f"\n{len(rows)} benchmarks, {len(failed)} failed{': ' + ', '.join(failed) if failed else ''}; "
          f"outputs in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
