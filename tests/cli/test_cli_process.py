"""The command line as a real process: the entry point, the command list from one place, one-line errors."""

from tests.conftest import run_process

from stability.cli import COMMANDS


def test_python_m_stability_help_lists_every_command_from_one_place():
    proc = run_process("--help")
    assert proc.returncode == 0
    for name in COMMANDS:
        assert name in proc.stdout


def test_a_wrong_flag_is_one_line_and_exit_2_in_a_real_process():
    proc = run_process("train", "--lr", "nan", check=False)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "--lr" in proc.stderr
