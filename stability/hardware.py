"""What computed a number: the hardware signature every record carries, and the reproducible (pinned-kernel) mode.

On the CPU a run is deterministic *per machine*: the same code, seed and thread count give the same bits. Across
machines the bits move, because several libraries choose their kernels from the CPU they find:

=======================  =================================================  =====================================
library                  what it chooses by the CPU                         pinned by
=======================  =================================================  =====================================
ATen (torch's kernels)   vector width of elementwise ops and reductions     ``ATEN_CPU_CAPABILITY=default``
                         (``default`` / AVX2 / AVX-512 builds, Sleef math)
MKL (torch's BLAS,       code path of GEMM, LAPACK and vector math           ``MKL_CBWR=COMPATIBLE`` (MKL's
LAPACK, vector math)     (Intel and AMD take different ones)                 conditional numerical reproducibility)
oneDNN                   ISA and blocking from the CPU and its caches       off: ``torch.backends.mkldnn.enabled
                                                                            = False`` (and ``ONEDNN_MAX_CPU_ISA``)
OpenBLAS (numpy, scipy:  kernel family (Haswell, SkylakeX, Zen, ...) and   ``OPENBLAS_CORETYPE=Haswell``,
ARPACK, LAPACK)          the cache size it blocks for                       ``OPENBLAS_L2_SIZE=512``
numpy's own loops        SIMD level of its ufuncs (exp, log, ...)           ``NPY_DISABLE_CPU_FEATURES``
glibc's libm             FMA / AVX2 variants of exp, log, log1p, sin, ...    ``GLIBC_TUNABLES`` hwcaps
every thread pool        how sums are split                                 one thread
MKL's vector math (VML)  sqrt, log, exp, tanh, ... of ATen's CPU kernels    not by any setting: routed around
                         (``vmsSqrt``...): sqrt and float64 log differ      (:data:`KERNELS`, below)
                         between Intel and AMD even under ``MKL_CBWR``
=======================  =================================================  =====================================

:data:`PINNED_ENV` holds these settings. They are read when each library loads (glibc's only when the process
starts), so the mode is entered by starting a fresh process with them (:func:`pinned_env`; ``--reproducible`` on
the command line re-executes itself, the sweep hands them to its workers) and :func:`apply_in_process` switches
oneDNN off and sets torch's thread count in every process that imports the toolkit with the mode's marker set.

The pinned paths need x86-64 with AVX2 and FMA (OpenBLAS's Haswell kernels; every x86-64 server CPU since 2013).
**Kernel sets.** One CPU path no setting pins: ATen computes ``sqrt`` (and log, exp, tanh, ...) through MKL's vector
math, which ignores ``MKL_CBWR`` for some functions. Measured with the kernel fingerprint (``stability doctor
--kernels``) against an Intel Xeon (AMX) machine's, all pinned: only AdamW (its ``sqrt`` of the second moment) and
float64 ``log`` differ from an AMD EPYC's; torch's CPU ``sqrt`` is not even correctly rounded (1 ulp off on 1.3 %
of float64 and 17 % of float32 inputs, on every capability). The ``ieee`` kernel set (the default) routes around
it: AdamW is torch's fused kernel (plain IEEE arithmetic with a correctly rounded square root: equal bit for bit
to a numpy reference in the pinned mode) and the toolkit's own square roots go through
:func:`stability.numerics.exact.sqrt`; the toolkit takes no torch ``log`` of a recorded number. ``mkl-vml`` (set
``STABILITY_KERNELS=mkl-vml``) is the set the second edition's records were made with (foreach AdamW, ATen's
sqrt): they reproduce bit for bit only on a CPU of the same model and flags.

What pinning cannot reach is named in docs/replication.md ("What reproduces where"): another torch, MKL, numpy or
OpenBLAS *version* may change a kernel, which is why the signature records the versions and the record test
compares bit for bit only where they agree.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from typing import Optional

from stability.errors import StabilityError

#: the marker of the mode: set in a pinned process, read by :func:`apply_in_process` and :func:`pinned`
MARKER = "STABILITY_REPRODUCIBLE"

#: glibc's libm dispatch: the FMA, FMA4, AVX and AVX2 variants of its functions off (glibc >= 2.33 names)
GLIBC_HWCAPS = "glibc.cpu.hwcaps=-AVX,-AVX2,-FMA,-FMA4"

#: every environment setting of the reproducible mode (see the module's table)
PINNED_ENV = {
    MARKER: "1",
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "OPENBLAS_CORETYPE": "Haswell",
    "NPY_DISABLE_CPU_FEATURES": "X86_V3 X86_V4 AVX512_ICL AVX512_SPR",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OPENBLAS_L2_SIZE": "512",
    "GLIBC_TUNABLES": GLIBC_HWCAPS,
}

#: the kernel set's variable: ``ieee`` (the default) or ``mkl-vml`` (module docstring, "Kernel sets")
KERNELS = "STABILITY_KERNELS"
#: the kernel sets: what each routes where
KERNEL_SETS = {"ieee": "fused AdamW, correctly rounded sqrt: the same bits on any x86-64 CPU when pinned",
               "mkl-vml": "foreach AdamW and ATen's sqrt through MKL's vector math (made before 2026-12-04): "
                          "the same bits only on a CPU of the same model and flags"}
#: what a signature without the kernel set was made with
LEGACY_KERNELS = "mkl-vml"

#: the environment variables that steer kernel dispatch, recorded in every signature whether pinned or not
DISPATCH_ENV = tuple(k for k in PINNED_ENV if k != MARKER) + ("MKL_ENABLE_INSTRUCTIONS",)


def kernels(env: Optional[dict] = None) -> str:
    """The kernel set in force (``STABILITY_KERNELS``; default ``ieee``). An unknown value is one error line."""
    value = (os.environ if env is None else env).get(KERNELS) or "ieee"
    if value not in KERNEL_SETS:
        raise StabilityError(f"{KERNELS}={value!r}: the kernel sets are {', '.join(KERNEL_SETS)}")
    return value


def _merged_tunables(existing: Optional[str]) -> str:
    """``GLIBC_TUNABLES`` with the pinned hwcaps, keeping any other tunable already set."""
    parts = [p for p in (existing or "").split(":") if p and not p.startswith("glibc.cpu.hwcaps=")]
    return ":".join(parts + [GLIBC_HWCAPS])


def pinned_env(base: Optional[dict] = None) -> dict:
    """``base`` (default: this process's environment) with every setting of the reproducible mode."""
    env = dict(os.environ if base is None else base)
    env.update(PINNED_ENV)
    env["GLIBC_TUNABLES"] = _merged_tunables((base if base is not None else os.environ).get("GLIBC_TUNABLES"))
    return env


def env_is_pinned(env: Optional[dict] = None) -> bool:
    """Whether ``env`` (default: this process's) carries every pinned setting."""
    env = os.environ if env is None else env
    for key, value in PINNED_ENV.items():
        if key == "GLIBC_TUNABLES":
            if GLIBC_HWCAPS not in (env.get(key) or "").split(":"):
                return False
        elif env.get(key) != value:
            return False
    return True


def apply_in_process() -> bool:
    """In a process started with the mode's marker: oneDNN off and one torch thread. Returns whether applied."""
    if os.environ.get(MARKER) != "1":
        return False
    import torch

    torch.backends.mkldnn.enabled = False
    torch.set_num_threads(1)
    return True


def pinned() -> bool:
    """Whether this process runs in the reproducible mode: started with :data:`PINNED_ENV`, oneDNN off."""
    if not env_is_pinned():
        return False
    if "torch" in sys.modules:
        import torch

        return not torch.backends.mkldnn.enabled and torch.get_num_threads() == 1
    return True


def run_pinned(argv: list, *, replace: bool) -> int:
    """``python -m stability ARGV`` in a fresh process with the pinned environment: this process replaced by it
    when ``replace`` (the command line), else a child whose exit status is returned (a caller in Python)."""
    cmd = [sys.executable, "-m", "stability", *argv]
    env = pinned_env()
    sys.stdout.flush()
    sys.stderr.flush()
    if replace:
        os.execve(sys.executable, cmd, env)
    return subprocess.call(cmd, env=env)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> list:
    """The instruction-set extensions that change kernel choices (a subset of /proc/cpuinfo's flags)."""
    wanted = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile")
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [f for f in wanted if f in have]
    except OSError:
        pass
    return []


def _torch_blas() -> dict:
    """torch's BLAS/LAPACK vendor and version as its build reports them."""
    import torch

    shown = torch.__config__.show()
    out = {"blas": None, "lapack": None, "mkl": None, "onednn": None}
    for line in shown.splitlines():
        line = line.strip()
        if "Math Kernel Library Version" in line:
            out["mkl"] = line.split("Version", 1)[1].split("-Product")[0].strip()
        elif line.startswith("- Intel(R) MKL-DNN"):
            out["onednn"] = line.split("(Git")[0].replace("- Intel(R) MKL-DNN", "").strip()
        if "BLAS_INFO=" in line:
            out["blas"] = line.split("BLAS_INFO=", 1)[1].split(",")[0]
        if "LAPACK_INFO=" in line:
            out["lapack"] = line.split("LAPACK_INFO=", 1)[1].split(",")[0]
    return out


def _python_blas() -> list:
    """numpy's and scipy's BLAS libraries (vendor, version, kernel family, threads), by threadpoolctl."""
    try:
        import numpy  # noqa: F401 - loads numpy's OpenBLAS
        import scipy.linalg  # noqa: F401 - loads scipy's
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    return sorted(({"library": i.get("prefix"), "version": i.get("version"), "kernels": i.get("architecture"),
                    "threads": i.get("num_threads")} for i in threadpool_info() if i.get("user_api") == "blas"),
                  key=lambda d: (str(d["library"]), str(d["version"])))


def signature() -> dict:
    """What computes this process's numbers: versions, BLAS/LAPACK vendors, torch's CPU capability, the CPU, the
    thread count and the dispatch settings in force (``reproducible``: the pinned mode is on)."""
    import numpy
    import scipy
    import torch

    return {
        "reproducible": pinned(),
        "kernels": kernels(),
        "torch": str(torch.__version__),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_flags": _cpu_flags(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "mkldnn": bool(torch.backends.mkldnn.enabled),
        **_torch_blas(),
        "python_blas": _python_blas(),
        "dispatch_env": {k: os.environ.get(k) for k in DISPATCH_ENV},
    }


#: what must agree for two pinned runs to give the same bits: the libraries' versions (kernels change between
#: releases) and the pins themselves
_PINNED_KEYS = ("torch", "numpy", "scipy", "machine", "mkl", "blas", "lapack", "python_blas_versions", "pins",
                "kernels")
#: what must agree besides, for two pinned runs of the ``mkl-vml`` kernel set: MKL's vector math picks its path by
#: the CPU whatever is pinned (module docstring, "Kernel sets")
_VML_KEYS = ("cpu", "cpu_flags")
#: what must agree for two unpinned runs to have taken the same kernel paths. numpy's and scipy's OpenBLAS thread
#: counts are not among them: they depend on what limited the pools when the signature was taken, and the analysis
#: runs its scipy linear algebra on one thread whatever they are (stability.numerics.spectra.serial_blas); their
#: libraries, versions and kernel families are compared (python_blas_versions)
_UNPINNED_KEYS = _PINNED_KEYS + ("cpu", "cpu_flags", "cpu_capability", "threads", "mkldnn", "dispatch_env")


def _view(sig: dict) -> dict:
    out = dict(sig)
    out["python_blas_versions"] = sorted((str(b.get("library")), str(b.get("version")), str(b.get("kernels")))
                                         for b in sig.get("python_blas") or [])
    out["pins"] = {k: (sig.get("dispatch_env") or {}).get(k) for k in PINNED_ENV if k != MARKER}
    out["kernels"] = sig.get("kernels") or LEGACY_KERNELS
    return out


def same_bits_possible(a: Optional[dict], b: Optional[dict]) -> tuple:
    """(whether two runs with these signatures can give the same bits, the reason in words).

    Both pinned: the versions, pins and kernel set must agree; the CPU may differ with the ``ieee`` kernel set,
    not with ``mkl-vml`` (its vector math picks its path by the CPU). Otherwise every kernel choice must agree:
    the same CPU model and flags, capability, threads, libraries and dispatch settings."""
    if not a or not b:
        return False, "a record without a hardware signature (made before signatures were recorded)"
    a, b = _view(a), _view(b)
    if a.get("reproducible") and b.get("reproducible"):
        keys, mode = _PINNED_KEYS, "both pinned"
        if a["kernels"] == b["kernels"] == "mkl-vml":
            keys, mode = _PINNED_KEYS + _VML_KEYS, "both pinned with the mkl-vml kernel set"
    elif a.get("reproducible") != b.get("reproducible"):
        return False, "one run pinned (--reproducible), the other not"
    else:
        keys, mode = _UNPINNED_KEYS, "both unpinned"
    differ = [k for k in keys if a.get(k) != b.get(k)]
    if differ:
        return False, f"{mode}, but {', '.join(f'{k} {a.get(k)!r} vs {b.get(k)!r}' for k in differ)}"
    return True, f"{mode}, same {'kernel paths' if mode == 'both unpinned' else 'versions and pins'}"


def differences(a: Optional[dict], b: Optional[dict]) -> list:
    """Rows (key, a's value, b's value) where two signatures differ, the reproducibility flag first."""
    a, b = a or {}, b or {}
    keys = ["reproducible"] + sorted((set(a) | set(b)) - {"reproducible"})
    return [(k, a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)]
