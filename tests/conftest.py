import os
import subprocess
import sys

import pytest
import torch

torch.set_num_threads(1)


def run_cli(*args, check=True, timeout=600, env=None, cwd=None):
    """Run ``python -m stability ARGS`` as a real process; returns the CompletedProcess."""
    proc = subprocess.run([sys.executable, "-m", "stability", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, cwd=cwd)
    if check and proc.returncode != 0:
        raise AssertionError(f"stability {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


@pytest.fixture
def cli():
    return run_cli
