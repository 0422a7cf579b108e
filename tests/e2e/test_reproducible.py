"""The reproducible mode and the hardware signature (stability/hardware.py, README "Reproducibility").

The property that matters is checked on one machine by changing what its libraries *believe* about the CPU: ATen's
vector width (``ATEN_CPU_CAPABILITY``), MKL's code path (``MKL_CBWR``), OpenBLAS's kernel family
(``OPENBLAS_CORETYPE``), oneDNN's ISA and numpy's SIMD level. Two such dispatch settings give different bits
unpinned; with ``--reproducible`` the same training and analysis give the same bits under both.
"""

import hashlib
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from stability import hardware
from stability.analysis.options import STAGES
from stability.compare import compare_analyses, format_comparison
from tests.conftest import run_process

TINY_TRAIN = ["train", "--task", "prefix-sums", "--recall", "external", "--norm", "pre", "--width", "16",
              "--heads", "2", "--lr", "1e-3", "--epochs", "2", "--batch-size", "50",
              "--train-size", "200", "--val-size", "20", "--hard-size", "20", "--train-length", "8",
              "--hard-length", "12", "--iterations", "6", "--test-iterations", "8", "--warmup-epochs", "0",
              "--quiet"]


def _dispatch_settings() -> tuple:
    """Two dispatch settings this CPU can run that take different kernels in every pinned library."""
    best = torch.backends.cpu.get_cpu_capability().lower()
    other = "avx512" if best == "avx512" else "default"
    a = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "OPENBLAS_CORETYPE": "Haswell",
         "ONEDNN_MAX_CPU_ISA": "AVX2"}
    b = {"ATEN_CPU_CAPABILITY": other, "MKL_CBWR": "SSE4_2", "OPENBLAS_CORETYPE": "Sandybridge",
         "ONEDNN_MAX_CPU_ISA": "SSE41"}
    return a, b


def _weights_digest(path) -> str:
    state = torch.load(path, weights_only=True)["model"]
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].numpy().tobytes())
    return h.hexdigest()


def _numbers(analysis_json) -> dict:
    """An analysis JSON without what differs between two runs of the same computation (timings, hardware)."""
    obj = json.loads(analysis_json.read_text())
    obj.pop("hardware", None)
    obj.pop("checkpoint", None)
    for split in obj["splits"]:
        obj[split].pop("timings_s", None)
        obj[split].pop("timings", None)
    return json.loads(json.dumps(obj, sort_keys=True))


def _run_and_analyse(tmp_path, name: str, env: dict, pinned: bool) -> tuple:
    """Train the tiny model and analyse two val samples under ``env``; (weights digest, analysis numbers)."""
    out = tmp_path / name
    flag = ["--reproducible"] if pinned else []
    clean = {k: v for k, v in os.environ.items() if k not in hardware.PINNED_ENV}
    base = {**clean, "OMP_NUM_THREADS": "1", **env}
    for args in ([*TINY_TRAIN, "--out", out / "m.pt", *flag],
                 # every stage but geometry (half the analysis' time here; it runs the same solves and spectra,
                 # and the replication record test holds a pinned geometry summary bit for bit)
                 ["analyze", out / "m.pt", "--split", "val", "--samples", "2", "--json", out / "a.json", "--quiet",
                  "--only", ",".join(s for s in STAGES if s != "geometry"), *flag]):
        proc = _subprocess(args, base)
        assert proc.returncode == 0, proc.stderr
    return _weights_digest(out / "m.pt"), _numbers(out / "a.json")


def _subprocess(args, env):
    import subprocess

    return subprocess.run([sys.executable, "-m", "stability", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)


@pytest.mark.slow
def test_pinned_mode_gives_the_same_bits_under_dispatch_settings_that_differ_unpinned(tmp_path):
    a, b = _dispatch_settings()
    # the four runs are independent single-threaded processes: two at a time on two cores
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = [pool.submit(_run_and_analyse, tmp_path, name, env, pinned)
                for name, env, pinned in (("ua", a, False), ("ub", b, False), ("pa", a, True), ("pb", b, True))]
        unpinned_a, unpinned_b, pinned_a, pinned_b = (run.result() for run in runs)
    assert unpinned_a[0] != unpinned_b[0], "the two dispatch settings should train different weights unpinned"
    assert unpinned_a[1] != unpinned_b[1]
    assert pinned_a[0] == pinned_b[0]
    assert pinned_a[1] == pinned_b[1]
    # and the pinned analysis JSON says it was pinned, with the pins in force
    sig = json.loads((tmp_path / "pb" / "a.json").read_text())["hardware"]
    assert sig["reproducible"] is True and sig["cpu_capability"] == "DEFAULT" and sig["mkldnn"] is False
    assert sig["dispatch_env"]["MKL_CBWR"] == "COMPATIBLE" and sig["threads"] == 1


def test_pinned_environment_overrides_every_dispatch_setting_and_keeps_other_tunables():
    env = hardware.pinned_env({"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX2", "PATH": "/bin",
                               "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.cpu.hwcaps=-AVX512F"})
    assert env["ATEN_CPU_CAPABILITY"] == "default" and env["MKL_CBWR"] == "COMPATIBLE" and env["PATH"] == "/bin"
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:" + hardware.GLIBC_HWCAPS
    assert hardware.env_is_pinned(env)
    assert not hardware.env_is_pinned({**env, "OMP_NUM_THREADS": "2"})
    assert not hardware.env_is_pinned({k: v for k, v in env.items() if k != "GLIBC_TUNABLES"})


def test_a_pinned_process_reports_its_pins_in_its_signature():
    proc = _subprocess_python("import json, stability.hardware as h; print(json.dumps(h.signature()))",
                              hardware.pinned_env())
    sig = json.loads(proc.stdout)
    assert sig["reproducible"] is True
    assert sig["cpu_capability"] == "DEFAULT" and sig["threads"] == 1 and sig["mkldnn"] is False
    assert all(b["threads"] == 1 and b["kernels"] == "Haswell" for b in sig["python_blas"])
    plain = json.loads(_subprocess_python("import json, stability.hardware as h; print(json.dumps(h.signature()))",
                                          {k: v for k, v in os.environ.items() if k != hardware.MARKER}).stdout)
    assert plain["reproducible"] is False


def _subprocess_python(code: str, env: dict):
    import subprocess

    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def _sig(**kw) -> dict:
    base = {"reproducible": True, "kernels": "ieee", "torch": "2.13.0+cpu", "numpy": "2.4.6", "scipy": "1.17.1", "machine": "x86_64",
            "cpu": "AMD EPYC", "cpu_flags": ["avx2", "avx512f"], "cpu_capability": "DEFAULT", "threads": 1,
            "mkldnn": False, "blas": "mkl", "lapack": "mkl", "mkl": "2024.2",
            "python_blas": [{"library": "libscipy_openblas", "version": "0.3.31", "kernels": "Haswell",
                             "threads": 1}],
            "dispatch_env": {k: v for k, v in hardware.PINNED_ENV.items() if k != hardware.MARKER}}
    base.update(kw)
    return base


def test_same_bits_are_possible_across_cpus_only_when_both_runs_are_pinned_with_the_same_versions():
    intel = _sig(cpu="Intel Xeon", cpu_flags=["avx2"])
    assert hardware.same_bits_possible(_sig(), intel)[0]
    # the mkl-vml kernel set (and a signature that predates the kernel sets) needs the same CPU: MKL's vector
    # math picks its path by it whatever is pinned
    legacy = {k: v for k, v in _sig().items() if k != "kernels"}
    ok, why = hardware.same_bits_possible(legacy, {**intel, "kernels": "mkl-vml"})
    assert not ok and "cpu" in why and "mkl-vml" in why
    assert hardware.same_bits_possible(legacy, _sig(kernels="mkl-vml"))[0]
    ok, why = hardware.same_bits_possible(legacy, _sig())
    assert not ok and "kernels" in why
    ok, why = hardware.same_bits_possible(_sig(), _sig(torch="2.14.1+cpu"))
    assert not ok and "torch" in why
    unpinned = dict(cpu_capability="AVX512", threads=2, mkldnn=True, dispatch_env={}, reproducible=False)
    assert not hardware.same_bits_possible(_sig(**unpinned), _sig())[0]
    assert hardware.same_bits_possible(_sig(**unpinned), _sig(**unpinned))[0]  # same machine, same paths
    ok, why = hardware.same_bits_possible(_sig(**unpinned), _sig(**{**unpinned, "cpu": "Intel Xeon"}))
    assert not ok and "cpu" in why
    ok, why = hardware.same_bits_possible(None, _sig())
    assert not ok and "without a hardware signature" in why
    # numpy's OpenBLAS thread count does not decide torch's bits; its version and kernel family do
    blas = _sig()["python_blas"][0]
    more_threads = _sig(**{**unpinned, "python_blas": [{**blas, "threads": 2}]})
    assert hardware.same_bits_possible(_sig(**unpinned), more_threads)[0]
    other_kernels = _sig(**{**unpinned, "python_blas": [{**blas, "kernels": "Zen"}]})
    assert not hardware.same_bits_possible(_sig(**unpinned), other_kernels)[0]


def test_compare_shows_the_hardware_difference_before_the_options():
    block = {"fixed_point": {"converged_fraction": 1.0}}
    a = {"splits": ["val"], "val": block, "config": {}, "hardware": _sig()}
    b = {"splits": ["val"], "val": block, "config": {},
         "hardware": _sig(reproducible=False, cpu_capability="AVX512", threads=2)}
    text = format_comparison(compare_analyses(a, b))
    lines = text.splitlines()
    assert lines[2].startswith("hardware: the bits may differ (one run pinned")
    assert "  reproducible: True → False" in lines
    assert "  cpu_capability: 'DEFAULT' → 'AVX512'" in lines
    assert lines.index("  reproducible: True → False") < min(i for i, ln in enumerate(lines) if "options" in ln)


def test_a_training_checkpoint_and_a_sweep_record_carry_the_signature(tmp_path):
    from stability.cli import main

    grid = tmp_path / "g.toml"
    grid.write_text('name = "g"\n[fixed.task]\nname = "prefix-sums"\ntrain_size = 100\nval_size = 10\n'
                    'hard_size = 10\ntrain_length = 7\nhard_length = 8\n[fixed.model]\nwidth = 16\nheads = 2\n'
                    'mlp_ratio = 2\nrecall = "external"\nnorm = "pre"\n[fixed.train]\nepochs = 1\nbatch_size = 50\n'
                    'iterations = 4\ntest_iterations = 4\nwarmup_epochs = 0\ndevice = "cpu"\n'
                    '[summary]\nsummary = "monitor"\n')
    assert main(["sweep", str(grid), "--results", str(tmp_path / "r"), "--workers", "1"]) == 0
    rec = json.loads(next((tmp_path / "r" / "records").glob("*.json")).read_text())
    sig = rec["environment"]["hardware"]
    assert sig["torch"] == str(torch.__version__) and sig["reproducible"] is False
    assert sig["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    ckpt = torch.load(next((tmp_path / "r" / "runs").glob("*.pt")), weights_only=True)
    assert ckpt["hardware"]["cpu"] == sig["cpu"] and ckpt["hardware"]["threads"] == sig["threads"]


def test_a_grid_reproducible_key_must_be_a_boolean(tmp_path):
    from stability.errors import ConfigError
    from stability.sweep import grid as gridlib

    path = tmp_path / "g.toml"
    path.write_text('name = "g"\n[fixed.task]\nname = "prefix-sums"\n[summary]\nreproducible = "yes"\n')
    with pytest.raises(ConfigError, match="summary.reproducible: expected true or false"):
        gridlib.load(path)
    path.write_text('name = "g"\n[fixed.task]\nname = "prefix-sums"\n[summary]\nreproducible = true\n')
    assert gridlib.load(path).summary["reproducible"] is True


def test_a_cell_that_asks_for_pinned_kernels_refuses_to_run_unpinned(tmp_path, monkeypatch):
    from stability.errors import StabilityError
    from stability.sweep import grid as gridlib
    from stability.config import SweepSummary
    from stability.sweep.runner import run_cell

    monkeypatch.delenv(hardware.MARKER, raising=False)
    path = tmp_path / "g.toml"
    path.write_text('name = "g"\n[fixed.task]\nname = "prefix-sums"\n')
    cell = gridlib.load(path).cells[0]
    with pytest.raises(StabilityError, match="reproducible mode"):
        run_cell(cell, tmp_path / "r", SweepSummary(reproducible=True))
    assert not (tmp_path / "r" / "runs").exists()
    assert SweepSummary.from_record(SweepSummary(reproducible=True).to_record()).reproducible
    assert "reproducible" not in SweepSummary().to_record()  # unpinned grids' records keep their shape


def test_reproducible_training_refuses_what_it_cannot_pin_with_one_line(tmp_path):
    proc = run_process(*TINY_TRAIN, "--out", tmp_path / "m.pt", "--compile", "--reproducible", check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "stability train: error: --reproducible pins the CPU's kernels only: it covers neither CUDA nor --compile "
        "(which generates code for this CPU); use --device cpu without --compile"]
    assert not (tmp_path / "m.pt").exists()
