"""Default suite no slower (issue 34's "Done means"): the default test suite at two git revisions, timed in turn.

For each of revisions A and B, a temporary ``git worktree add --detach`` (removed after) holds a clean checkout;
the suite runs there as ``python -m pytest -p no:cacheprovider -q`` (the project's addopts: the default set, the
slow one left out) with ``OMP_NUM_THREADS`` = ``--threads`` (2) and ``PYTHONPATH`` the worktree, so each side
imports its own code. The runs alternate A, B, A, B, ... for ``--repeats`` rounds so that both see the same machine
load; each run's wall seconds, exit status, 1-minute load before it and test counts (passed, failed, errors,
skipped, read from a JUnit XML file: ``-q`` over the addopts' ``-q`` prints no summary line) go to the JSON
(``--out``), and a table gives per side the runs, min and median seconds and the counts, then the ratio B/A of the
medians (below 1: B is faster).

**Shared tests.** Two revisions far apart do not run the same tests, so the whole-suite ratio mixes what the code
costs with what the tests were added. From the JUnit file each run also keeps every test's own seconds (pytest's
``time``: setup, call and teardown) by node id; ``shared`` sums, per side, the median seconds of the tests that
passed in every run of both sides, and its ratio B/A compares the same tests on the two revisions' code (fixtures
shared by several tests are charged to the first that needs them, on both sides alike). Each run also keeps the CPU
seconds (user + system) of its processes, which a busy machine inflates less than the wall time.

    python benchmarks/suite_ab.py A B [--repeats 3] [--out benchmarks/results-suite-ab.json]
                                      [--pytest-args "tests/house -x"] [--threads 2] [--repo .]

A bad revision (or option) is one line on stderr and exit status 2. Run it on a quiet machine: it measures the
machine's load as much as the suite.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("a", "b")
COUNTS = ("passed", "failed", "errors", "skipped")


class BadInput(Exception):
    """Bad input: one line on stderr, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not the usage block
        raise BadInput(message)


def _arguments(argv) -> argparse.Namespace:
    ap = _Parser(prog="suite_ab.py", description=__doc__.splitlines()[0])
    ap.add_argument("a", help="revision A (the baseline: a commit, branch or tag)")
    ap.add_argument("b", help="revision B (the one compared with A)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds of A then B (3)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results-suite-ab.json",
                    help="the JSON written (benchmarks/results-suite-ab.json)")
    ap.add_argument("--pytest-args", default="", help="more arguments of pytest, one string (e.g. a test file)")
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS of each run (2)")
    ap.add_argument("--timeout", type=float, default=7200.0, help="seconds before a run is stopped (7200)")
    ap.add_argument("--repo", type=Path, default=ROOT, help="the git repository (this one)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter that runs pytest (this one)")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        raise BadInput(f"--repeats {args.repeats}: expected at least 1")
    if args.threads < 1:
        raise BadInput(f"--threads {args.threads}: expected at least 1")
    if args.out.is_dir():
        raise BadInput(f"--out {args.out}: a directory; expected a file to write")
    try:
        args.pytest_args = shlex.split(args.pytest_args)
    except ValueError as exc:
        raise BadInput(f"--pytest-args: {exc}") from None
    return args


def resolve(repo: Path, revision: str) -> str:
    """The full commit hash ``revision`` names in ``repo``; BadInput where it names none."""
    if revision.startswith("-"):
        raise BadInput(f"revision {revision!r}: not a commit of {repo}")
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
                             capture_output=True, text=True)
    except OSError as exc:
        raise BadInput(f"git: cannot run it ({exc.strerror})") from None
    if out.returncode != 0 or not out.stdout.strip():
        raise BadInput(f"revision {revision!r}: not a commit of {repo}")
    return out.stdout.strip()


@contextmanager
def worktree(repo: Path, commit: str, where: Path) -> Iterator[Path]:
    """A detached worktree of ``commit`` at ``where``, removed (and pruned) after."""
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(where), commit],
                   check=True, capture_output=True)
    try:
        yield where
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(where)], capture_output=True)
        subprocess.run(["git", "-C", str(repo), "worktree", "prune"], capture_output=True)


def junit_counts(path: Path) -> Optional[dict]:
    """passed, failed, errors, skipped from a JUnit XML file (its test suites summed); None where it is absent or
    unreadable (pytest stopped before writing it)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    return {"passed": total["tests"] - total["failures"] - total["errors"] - total["skipped"],
            "failed": total["failures"], "errors": total["errors"], "skipped": total["skipped"]}


def junit_times(path: Path) -> dict:
    """Node id (``classname::name``) → seconds of every test that passed, from a JUnit XML file (empty where it is
    absent or unreadable)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {}
    out = {}
    for case in root.iter("testcase"):
        if any(child.tag in ("failure", "error", "skipped") for child in case):
            continue
        out[f"{case.get('classname')}::{case.get('name')}"] = float(case.get("time", 0.0))
    return out


def shared(runs: list[dict]) -> dict:
    """The tests that passed in every run of both sides: their number, each side's sum of their median seconds and
    the ratio B/A of the sums; with the number and summed seconds of the tests passed on one side only."""
    med = {}
    for side in SIDES:
        times = [r.get("times") or {} for r in runs if r["side"] == side]
        ids = set.intersection(*(set(t) for t in times)) if times else set()
        med[side] = {i: statistics.median(t[i] for t in times) for i in ids}
    both = sorted(set(med["a"]) & set(med["b"]))
    out = {"tests": len(both), **{f"{side}_s": sum(med[side][i] for i in both) for side in SIDES}}
    out["ratio_b_over_a"] = out["b_s"] / out["a_s"] if out["a_s"] > 0 else None
    for side in SIDES:
        only = set(med[side]) - set(both)
        out[f"{side}_only"] = {"tests": len(only), "s": sum(med[side][i] for i in only)}
    return out


def _children_cpu() -> float:
    """User + system CPU seconds of this process's waited-for children so far (a run's: the difference)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def compact(runs: list[dict]) -> dict:
    """The runs as the JSON keeps them: each without its per-test seconds, and ``test_seconds``: per side, each
    test's median seconds over the runs it passed in (what :func:`shared` sums)."""
    out: dict = {"runs": [{k: v for k, v in r.items() if k != "times"} for r in runs], "test_seconds": {}}
    for side in SIDES:
        seen: dict = {}
        for r in runs:
            if r["side"] == side:
                for i, t in (r.get("times") or {}).items():
                    seen.setdefault(i, []).append(t)
        out["test_seconds"][side] = {i: statistics.median(ts) for i, ts in sorted(seen.items())}
    return out


def run_suite(tree: Path, args, junit: Path) -> dict:
    """One run of the suite in ``tree``: wall seconds, exit status, whether it timed out, the load before it and
    its counts."""
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(tree)}
    env.setdefault("MPLBACKEND", "Agg")
    cmd = [args.python, "-m", "pytest", "-p", "no:cacheprovider", "-q", f"--junitxml={junit}", *args.pytest_args]
    junit.unlink(missing_ok=True)
    load = os.getloadavg()[0]
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=args.timeout)
        status, timed_out, tail = proc.returncode, False, (proc.stdout + proc.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        status, timed_out, tail = None, True, ""
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "cpu_s": _children_cpu() - cpu0, "exit_status": status, "timed_out": timed_out,
            "load1_before": load,
            "counts": junit_counts(junit), "times": junit_times(junit), "output_tail": tail}


def measure(args, commits: dict) -> list[dict]:
    """Every run, A then B in each of ``args.repeats`` rounds, each side in its own temporary worktree."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="suite-ab-") as tmp, ExitStack() as stack:
        trees = {side: stack.enter_context(worktree(args.repo, commits[side], Path(tmp) / side)) for side in SIDES}
        for r in range(args.repeats):
            for side in SIDES:
                run = {"side": side, "revision": getattr(args, side), "commit": commits[side], "repeat": r,
                       **run_suite(trees[side], args, Path(tmp) / f"junit-{side}.xml")}
                runs.append(run)
                print(json.dumps({k: v for k, v in run.items() if k not in ("output_tail", "times")}), flush=True)
    return runs


def _span(values: list) -> object:
    """One value where every run agrees, else ``[min, max]`` (None where a run has none)."""
    if any(v is None for v in values):
        return None
    return values[0] if len(set(values)) == 1 else [min(values), max(values)]


def summarise(runs: list[dict]) -> dict:
    """Per side: its revision and commit, its runs, min / median / max wall seconds, its counts (one value where
    the runs agree, else [min, max]) and whether every run passed (exit status 0); and the ratio B/A of the
    medians."""
    out: dict = {}
    for side in SIDES:
        mine = [r for r in runs if r["side"] == side]
        secs = [r["wall_s"] for r in mine]
        cpu = [r["cpu_s"] for r in mine if r.get("cpu_s") is not None]
        out[side] = {"revision": mine[0]["revision"], "commit": mine[0]["commit"], "runs": len(mine),
                     "min_s": min(secs), "median_s": statistics.median(secs), "max_s": max(secs),
                     "median_cpu_s": statistics.median(cpu) if cpu else None,
                     **{k: _span([(r["counts"] or {}).get(k) for r in mine]) for k in COUNTS},
                     "all_passed": all(r["exit_status"] == 0 for r in mine)}
    out["ratio_b_over_a"] = out["b"]["median_s"] / out["a"]["median_s"]
    a_cpu, b_cpu = out["a"]["median_cpu_s"], out["b"]["median_cpu_s"]
    out["cpu_ratio_b_over_a"] = b_cpu / a_cpu if a_cpu and b_cpu is not None else None
    out["shared"] = shared(runs)
    return out


def _count(value) -> str:
    if value is None:
        return "–"
    return f"{value[0]}–{value[1]}" if isinstance(value, list) else str(value)


def table(summary: dict) -> str:
    """The summary as a markdown table (a row per side) and the line with the ratio B/A of the medians."""
    lines = ["| side | revision | commit | runs | min s | median s | " + " | ".join(COUNTS) + " | all passed |",
             "|---|---|---|---|---|---|" + "---|" * len(COUNTS) + "---|"]
    for side in SIDES:
        s = summary[side]
        lines.append(f"| {side.upper()} | {s['revision']} | {s['commit'][:10]} | {s['runs']} | {s['min_s']:.1f} | "
                     f"{s['median_s']:.1f} | " + " | ".join(_count(s[k]) for k in COUNTS)
                     + f" | {'yes' if s['all_passed'] else 'no'} |")
    lines.append(f"\nB/A of the medians: {summary['ratio_b_over_a']:.3f} (below 1: B is faster)")
    if summary.get("cpu_ratio_b_over_a") is not None:
        lines.append(f"B/A of the median CPU seconds (user + system of the run's processes): "
                     f"{summary['a']['median_cpu_s']:.1f} → {summary['b']['median_cpu_s']:.1f} s, "
                     f"{summary['cpu_ratio_b_over_a']:.3f}")
    sh = summary.get("shared")
    if sh and sh["tests"]:
        lines.append(f"shared tests (passed in every run of both): {sh['tests']}, A {sh['a_s']:.1f} s, B "
                     f"{sh['b_s']:.1f} s, B/A {sh['ratio_b_over_a']:.3f}; A only {sh['a_only']['tests']} "
                     f"({sh['a_only']['s']:.1f} s), B only {sh['b_only']['tests']} ({sh['b_only']['s']:.1f} s)")
    return "\n".join(lines)


def main(argv=None) -> int:
    try:
        args = _arguments(argv)
        commits = {side: resolve(args.repo, getattr(args, side)) for side in SIDES}
    except BadInput as exc:
        print(f"suite_ab.py: {exc}", file=sys.stderr)
        return 2
    started = datetime.datetime.now()
    runs = measure(args, commits)
    summary = summarise(runs)
    result = {"started": started.isoformat(timespec="seconds"),
              "finished": datetime.datetime.now().isoformat(timespec="seconds"),
              "command_line": "python benchmarks/suite_ab.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "machine": {"cpus": os.cpu_count(), "load1_after": os.getloadavg()[0]},
              "threads": args.threads, "pytest_args": args.pytest_args, "repeats": args.repeats,
              "summary": summary, **compact(runs)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print()
    print(table(summary))
    print(f"\nwritten: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
