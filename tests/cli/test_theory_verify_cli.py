"""`stability verify` as a real process: one row per check, JSON records, exit status, one-line errors."""

import json
import subprocess
import sys

from stability.theory.checks import VERIFIERS
from tests.conftest import run_cli


def _verify(*args, cwd=None):
    return run_cli("verify", *args, check=False, cwd=cwd, timeout=300)


def test_verify_prints_one_passing_row_per_check_writes_json_and_exits_zero(tmp_path):
    out = tmp_path / "verify.json"
    proc = _verify("--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert [row.split()[1] for row in rows] == list(VERIFIERS)
    assert all(row.startswith("PASS") for row in rows)
    assert f"{len(VERIFIERS)} checks: {len(VERIFIERS)} passed, 0 failed" in proc.stdout
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["passed"] is True and record["variant"] == "paper"
    assert [c["name"] for c in record["checks"]] == list(VERIFIERS)
    for c in record["checks"]:
        assert c["passed"] and c["statement"] and c["instance"] and c["measured"] is not None


def test_verify_exits_nonzero_when_a_check_fails():
    proc = _verify("--only", "lemma1_telescoping_product", "fprm_neumann_truncation", "--wrong")
    assert proc.returncode == 1
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert len(rows) == 2 and all(row.startswith("FAIL") for row in rows)
    assert "2 wrong variants: 0 passed, 2 failed" in proc.stdout


def test_verify_unknown_check_is_one_line_error_and_exit_2(tmp_path):
    proc = _verify("--only", "no_such_check")
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "unknown check no_such_check" in proc.stderr
    assert "Traceback" not in proc.stderr
    (tmp_path / "a-file").write_text("x")  # --json under a file: its folder can never be made
    proc = _verify("--only", "lemma1_telescoping_product", "--json", str(tmp_path / "a-file" / "v.json"))
    assert proc.returncode == 2 and "is a file, not a directory" in proc.stderr and "Traceback" not in proc.stderr
