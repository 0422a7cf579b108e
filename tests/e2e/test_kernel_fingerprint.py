"""The kernel fingerprint (``stability doctor --kernels``, stability/fingerprint.py) and the ``ieee`` kernel set
(stability/hardware.py, "Kernel sets"): the toolkit's own routes equal IEEE arithmetic in the pinned mode, so
they give the same bits on every CPU; the probe's rows are the shipped references' rows, so a user's machine is
compared with an Intel Xeon's and an AMD EPYC's."""

import numpy as np
import pytest
import torch

from stability import fingerprint, hardware
from stability.config import TrainConfig
from stability.errors import StabilityError
from stability.numerics import exact
from stability.train.loop import make_optimizer
from tests.conftest import run_cli, run_process


def test_the_toolkits_adamw_and_sqrt_equal_ieee_arithmetic_when_pinned(tmp_path):
    out = tmp_path / "mine.txt"
    proc = run_process("doctor", "--kernels", "--out", out)
    assert "pinned: True; aten capability: DEFAULT" in proc.stdout
    for name in ("adamw fused 3 steps float32", "adamw fused 3 steps float64", "exact.sqrt float32",
                 "exact.sqrt float64"):
        assert f"equal to an IEEE reference: toolkit: {name}" in proc.stdout.splitlines(), proc.stdout
    header, mine = fingerprint.read(out)
    refs = fingerprint.references()
    assert set(refs) == {"amd-epyc-pinned", "intel-xeon-amx-pinned"}
    for _, ref in refs.values():  # every reference row is a row of ours: the comparison is row for row
        assert set(ref) - set(mine) == set()
    # the two reference machines differ in exactly the kernels the toolkit routes around
    amd, intel = refs["amd-epyc-pinned"][1], refs["intel-xeon-amx-pinned"][1]
    apart = [n for n in intel if amd[n] != intel[n]]
    assert apart and all(fingerprint.routed(n) for n in apart), apart


def test_the_toolkits_own_rows_agree_between_the_amd_and_the_intel_reference():
    """Both references were made by `stability doctor --kernels` on the machines (an AMD EPYC, an Intel Xeon with
    AMX): every 'toolkit:' row, the demo model's fused-AdamW training included, has the same digest on both."""
    refs = fingerprint.references()
    amd, intel = refs["amd-epyc-pinned"][1], refs["intel-xeon-amx-pinned"][1]
    ours = [n for n in amd if n.startswith("toolkit:")]
    assert len(ours) == 5 and set(ours) <= set(intel)
    assert [n for n in ours if amd[n] != intel[n]] == []
    assert amd["aten sqrt (MKL vector math) float64"] != intel["aten sqrt (MKL vector math) float64"]


def test_the_reference_adamw_is_torchs_step_by_step_in_numpy():
    """The IEEE reference is AdamW itself: with numpy's square root replaced by nothing else, it equals torch's
    fused step here to rounding (independently of the pinned mode), and torch's single-tensor step to 1e-6."""
    for dt, tol in ((torch.float32, 1e-6), (torch.float64, 1e-14)):
        ref = fingerprint.adamw_ieee_reference(dt)
        assert np.allclose(fingerprint._adamw(dt, foreach=False).numpy(), ref, rtol=0, atol=tol)


def test_exact_sqrt_is_the_correctly_rounded_root_and_keeps_dtype():
    import math

    x = torch.rand(2000, dtype=torch.float64) * 1e3
    got = exact.sqrt(x)
    assert got.dtype == torch.float64 and got.tolist() == [math.sqrt(v) for v in x.tolist()]
    x32 = x.float()
    want = np.sqrt(x32.numpy().astype(np.float64)).astype(np.float32)  # double rounding is exact for √ of floats
    assert exact.sqrt(x32).dtype == torch.float32 and np.array_equal(exact.sqrt(x32).numpy(), want)
    with pytest.raises(ValueError, match="reported numbers"):
        exact.sqrt(x.clone().requires_grad_(True))


def test_the_kernel_set_chooses_the_optimizer_and_an_unknown_one_is_refused(monkeypatch):
    model = torch.nn.Linear(3, 2)
    monkeypatch.delenv(hardware.KERNELS, raising=False)
    assert make_optimizer(model, TrainConfig()).defaults["fused"] is True
    monkeypatch.setenv(hardware.KERNELS, "mkl-vml")
    assert not make_optimizer(model, TrainConfig()).defaults["fused"]
    assert hardware.signature()["kernels"] == "mkl-vml"
    monkeypatch.setenv(hardware.KERNELS, "fast")
    with pytest.raises(StabilityError, match="kernel sets are ieee, mkl-vml"):
        hardware.kernels()


def test_doctor_refuses_bad_input_in_one_line(tmp_path):
    for args, msg in ((("--out", tmp_path / "x.txt"), "go with --kernels"),
                      (("--kernels", "--against", tmp_path / "missing.txt"), "no such file")):
        proc = run_cli("doctor", *args, check=False)
        assert proc.returncode == 2 and msg in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_doctor_names_the_kernel_set_in_force():
    proc = run_cli("doctor", env={hardware.KERNELS: "mkl-vml"})
    assert "kernel set: mkl-vml" in proc.stdout and "cpu:" in proc.stdout
