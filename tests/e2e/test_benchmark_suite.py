"""benchmarks/run.py is the one entry point of the benchmarks, and it measures what benchmarks/RESULTS.md states:
every section names its benchmark (or says why it has none), every benchmark backs a section, every command's
script and flags exist, and the raw outputs kept beside RESULTS.md are the ones it names. Nothing is timed here
(speed goals live in RESULTS.md, not in unit tests): ``--list`` and ``--dry-run`` run, the suite does not."""

import importlib.util
import re
import subprocess
import sys

from tests.conftest import ROOT

BENCH = ROOT / "benchmarks"


def _suite():
    spec = importlib.util.spec_from_file_location("benchmark_suite", BENCH / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "run.py"), *args], capture_output=True, text=True,
                          encoding="utf-8", cwd=ROOT, timeout=60)


def _sections() -> dict:
    """RESULTS.md's ``## `` headings -> their text."""
    text = (BENCH / "RESULTS.md").read_text(encoding="utf-8")
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_list_and_dry_run_name_every_benchmark_and_run_nothing(tmp_path):
    suite = _suite()
    listed = _run("--list")
    assert listed.returncode == 0, listed.stderr
    for bench in suite.SUITE:
        assert bench.name in listed.stdout and bench.section in listed.stdout
    dry = _run("--dry-run", "--quick", "--out", str(tmp_path))
    assert dry.returncode == 0, dry.stderr
    lines = [ln for ln in dry.stdout.splitlines() if ln.startswith("[")]
    assert [ln.split("]")[0][1:] for ln in lines] == [b.name for b in suite.SUITE]
    assert all(str(tmp_path) in ln for ln in lines if "$ " in ln and "{out}" in " ".join(
        suite.BY_NAME[ln.split("]")[0][1:]].quick or ()))
    assert not any(tmp_path.iterdir())  # a dry run writes nothing
    assert _run("--only", "no-such-benchmark").returncode == 2


def test_every_section_of_results_names_its_benchmark_and_every_benchmark_a_section():
    suite = _suite()
    sections = _sections()
    backed = {b.section for b in suite.SUITE}
    assert backed <= set(sections), backed - set(sections)
    for heading, body in sections.items():
        first = body.strip().splitlines()[0]
        if heading in backed:
            names = [b.name for b in suite.SUITE if b.section == heading]
            assert first.startswith("Suite: ") and all(f"{n}" in first for n in names), (heading, first)
        else:
            assert first.startswith("Not in the suite: "), (heading, first)
        for script in re.findall(r"`benchmarks/(\w+\.py)`", heading):  # a script the heading names is run
            assert any(f"benchmarks/{script}" in b.command for b in suite.SUITE if b.section == heading), script


def test_every_command_runs_a_script_that_exists_with_flags_it_defines():
    suite = _suite()
    for bench in suite.SUITE:
        for args in (bench.command, bench.quick):
            if not args:
                continue
            scripts = [a for a in args if a.startswith("benchmarks/") and a.endswith(".py")]
            if not scripts:  # a `stability` command or pytest, timed by the suite
                continue
            source = (ROOT / scripts[0]).read_text(encoding="utf-8")
            for flag in (a for a in args if a.startswith("--")):
                assert f'"{flag}"' in source, (bench.name, flag)


def test_the_raw_outputs_kept_are_the_ones_results_names():
    text = (BENCH / "RESULTS.md").read_text(encoding="utf-8")
    kept = {p.name for p in BENCH.glob("results-*")} | {p.name for p in BENCH.glob("*.png")}
    for name in kept:
        assert f"`{name}`" in text or f"({name})" in text or f"`{name.rsplit('.', 1)[0]}" in text, name
    named = set(re.findall(r"(?<![:/\w])(results-[\w-]+\.(?:json|md))", text))
    assert named <= kept | {"results-analysis.md"}, named - kept
