"""benchmarks/suite_ab.py, the "default suite no slower" measurement of issue 34: a bad revision or option is one
line and exit status 2; its summary and table are the min, median and B/A ratio of the medians of the runs given;
and a real run on a two-commit repository runs each revision's own code in its own worktree, alternately, and
leaves no worktree behind."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, load_benchmark


def _bench():
    return load_benchmark(ROOT / "benchmarks" / "suite_ab.py", "suite_ab")


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def tiny_repo(tmp_path):
    """A repository of two commits: A's mod.VALUE is 1, B's 2; test_value.py asserts it is 1 (so A passes and B
    fails, which only holds when each side imports its own worktree's code); other.py has a test that fails."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.invalid")
    _git(repo, "config", "user.name", "t")
    _git(repo, "config", "commit.gpgsign", "false")
    (repo / "mod.py").write_text("VALUE = 1\n")
    (repo / "test_value.py").write_text("import mod\n\n\ndef test_value():\n    assert mod.VALUE == 1\n\n\n"
                                        "def test_skipped():\n    import pytest\n    pytest.skip('x')\n")
    (repo / "test_other.py").write_text("def test_other():\n    assert False\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "A")
    (repo / "mod.py").write_text("VALUE = 2\n")
    _git(repo, "commit", "-qam", "B")
    return repo


@pytest.mark.parametrize("argv,expected", [
    (["no-such-revision", "HEAD"], "revision 'no-such-revision': not a commit of"),
    (["HEAD", "HEAD~7"], "revision 'HEAD~7': not a commit of"),
    (["HEAD", "HEAD", "--repeats", "0"], "--repeats 0: expected at least 1"),
    (["HEAD"], "the following arguments are required: b"),
    (["HEAD", "HEAD", "--pytest-args", "'unclosed"], "--pytest-args: No closing quotation"),
])
def test_a_bad_revision_or_option_is_one_line_and_exit_status_2(tiny_repo, tmp_path, capsys, argv, expected):
    code = _bench().main([*argv, "--repo", str(tiny_repo), "--out", str(tmp_path / "out.json")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and err.startswith("suite_ab.py: ") and expected in err
    assert not (tmp_path / "out.json").exists()


def _run(side, wall, passed=10, failed=0, status=0):
    return {"side": side, "revision": {"a": "main", "b": "topic"}[side], "commit": side * 40, "wall_s": wall,
            "cpu_s": 2 * wall,
            "exit_status": status, "counts": {"passed": passed, "failed": failed, "errors": 0, "skipped": 1}}


def test_the_summary_is_min_and_median_per_side_and_the_ratio_of_the_medians():
    runs = [_run("a", 10.0), _run("b", 9.0), _run("a", 12.0), _run("b", 20.0), _run("a", 11.0),
            _run("b", 10.0, passed=9, failed=1, status=1)]
    s = _bench().summarise(runs)
    # a: 10, 12, 11 (sorted 10, 11, 12: median 11); b: 9, 20, 10 (sorted 9, 10, 20: median 10)
    assert (s["a"]["min_s"], s["a"]["median_s"], s["a"]["max_s"]) == (10.0, 11.0, 12.0)
    assert (s["b"]["min_s"], s["b"]["median_s"], s["b"]["max_s"]) == (9.0, 10.0, 20.0)
    assert s["ratio_b_over_a"] == pytest.approx(10.0 / 11.0)
    assert s["a"]["runs"] == s["b"]["runs"] == 3
    assert s["a"]["passed"] == 10 and s["a"]["failed"] == 0 and s["a"]["all_passed"] is True
    assert s["b"]["passed"] == [9, 10] and s["b"]["failed"] == [0, 1] and s["b"]["all_passed"] is False
    text = _bench().table(s)
    assert "| A | main | aaaaaaaaaa | 3 | 10.0 | 11.0 | 10 | 0 | 0 | 1 | yes |" in text
    assert "| B | topic | bbbbbbbbbb | 3 | 9.0 | 10.0 | 9–10 | 0–1 | 0 | 1 | no |" in text
    assert "B/A of the medians: 0.909" in text  # 10 / 11
    assert s["cpu_ratio_b_over_a"] == pytest.approx(20.0 / 22.0) and "22.0 → 20.0 s, 0.909" in text


def test_shared_tests_are_those_passed_in_every_run_of_both_sides_summed_by_their_medians():
    t = lambda **kw: {k.replace("__", "::"): v for k, v in kw.items()}  # noqa: E731
    runs = [{**_run("a", 10.0), "times": t(m__x=1.0, m__y=2.0, m__old=5.0)},
            {**_run("a", 11.0), "times": t(m__x=3.0, m__y=2.0, m__old=5.0, m__flaky=1.0)},
            {**_run("a", 12.0), "times": t(m__x=2.0, m__y=4.0, m__old=5.0)},
            {**_run("b", 9.0), "times": t(m__x=1.0, m__y=1.0, m__new=7.0, m__flaky=1.0)},
            {**_run("b", 9.5), "times": t(m__x=1.5, m__y=3.0, m__new=7.0)},
            {**_run("b", 9.9), "times": t(m__x=0.5, m__y=2.0, m__new=7.0)}]
    sh = _bench().summarise(runs)["shared"]
    # shared: x and y (flaky passed in one run of each side only); medians a: x 2, y 2; b: x 1, y 2
    assert sh["tests"] == 2 and sh["a_s"] == 4.0 and sh["b_s"] == 3.0 and sh["ratio_b_over_a"] == 0.75
    assert sh["a_only"] == {"tests": 1, "s": 5.0} and sh["b_only"] == {"tests": 1, "s": 7.0}
    assert "shared tests (passed in every run of both): 2, A 4.0 s, B 3.0 s, B/A 0.750" in _bench().table(
        _bench().summarise(runs))


def test_a_real_run_times_each_revision_in_its_own_worktree_alternately(tiny_repo, tmp_path, capsys):
    out = tmp_path / "ab.json"
    code = _bench().main(["HEAD~1", "HEAD", "--repo", str(tiny_repo), "--repeats", "2", "--out", str(out),
                          "--pytest-args", "test_value.py"])
    assert code == 0
    result = json.loads(out.read_text())
    runs = result["runs"]
    assert [r["side"] for r in runs] == ["a", "b", "a", "b"] and [r["repeat"] for r in runs] == [0, 0, 1, 1]
    assert {r["commit"] for r in runs if r["side"] == "a"} == {_git(tiny_repo, "rev-parse", "HEAD~1")}
    assert {r["commit"] for r in runs if r["side"] == "b"} == {_git(tiny_repo, "rev-parse", "HEAD")}
    # A's code passes its test, B's fails it; test_other.py was not selected; the skip is counted
    for r in runs:
        want = {"passed": 1, "failed": 0} if r["side"] == "a" else {"passed": 0, "failed": 1}
        assert r["counts"] == {**want, "errors": 0, "skipped": 1}, r
        assert r["exit_status"] == (0 if r["side"] == "a" else 1) and r["wall_s"] > 0
        assert 0 < r["cpu_s"] < 10 * r["wall_s"] + 1  # the pytest process's own CPU seconds
        assert "times" not in r  # each passed test's own seconds: per side, their medians (B's test failed: none)
    assert list(result["test_seconds"]["a"]) == ["test_value::test_value"] and result["test_seconds"]["b"] == {}
    s = result["summary"]
    medians = {side: sorted(r["wall_s"] for r in runs if r["side"] == side) for side in "ab"}
    assert s["ratio_b_over_a"] == pytest.approx((sum(medians["b"]) / 2) / (sum(medians["a"]) / 2))
    assert s["shared"]["tests"] == 0 and s["shared"]["a_only"]["tests"] == 1 and s["shared"]["ratio_b_over_a"] is None
    assert "B/A of the medians:" in capsys.readouterr().out
    # the temporary worktrees are gone
    assert _git(tiny_repo, "worktree", "list").count("\n") == 0
