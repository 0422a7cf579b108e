"""The three CPU benchmarks of the analysis core (issue 4), measured side by side in one run.

1. ρ(J*) for sudoku-size states (81 tokens × 256 wide, n = 20,736), several fixed points: the Krylov–Schur
   iteration on Jᵀ that ``stability analyze`` uses, with float64 products, with float32 products certified in
   float64 (the default), and with float32 products alone at looser tolerances; one at a time and as a batch;
   ARPACK on Jᵀ and on J; against the dense route (build J, LAPACK eigvals), timed where it fits (widths 32 and
   64 of the same model) and extrapolated as n³ to width 256. At width 256 the reference ρ is float64
   Krylov–Schur to a Ritz residual of 1e-10, checked against ARPACK on J (jvp products) on the first sample.
2. Anderson against Picard: evaluations of f to the same tolerance on a trained prefix-sums checkpoint, and the
   distance between the fixed points they reach.
3. Implicit (GMRES on (I − J)ᵀ, one step's graph) against unrolled (backprop through T = 100 iterations)
   input-gradient vᵀ dx/dx0: peak memory, measured in fresh child processes (peak RSS growth) and as bytes of
   tensors autograd saved, plus their agreement.

Usage: python benchmarks/analysis_benchmarks.py [--checkpoint CKPT] [--threads N] [--out results.json]
(without --checkpoint a small prefix-sums model is trained first with `stability train`, about a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the per-sample scipy references


def jacobian_spectral_radius(f, x, x0, *, fast_f=None, **kwargs):
    """ρ(J) at (x, x0) by the package's one entry point (route auto), products in float32 with ``fast_f``."""
    from stability.numerics import Linearisation, spectral_radius

    fast = None if fast_f is None else Linearisation(fast_f, x.float(), None if x0 is None else x0.float())
    return spectral_radius(Linearisation(f, x, x0), fast=fast, **kwargs)


def jacobian_rho(f, x, x0, **kwargs):
    """The same on the Krylov route (what the solvers' repelling check runs)."""
    return jacobian_spectral_radius(f, x, x0, route="krylov", **kwargs)

HERE = Path(__file__).resolve().parent


def sudoku_model(width: int, *, seed: int = 0, recall_scale: float = 0.5):
    """A sudoku-shaped looped transformer (9×9 board, 10 channels, full attention), float64 analysis copy.

    Untrained: its recall weight is scaled by ``recall_scale`` so that plain iteration reaches a fixed point
    (the benchmark measures the analysis, not a training run)."""
    from stability.analysis.fixed_point import analysis_model
    from stability.config import ModelConfig
    from stability.model import build_model

    torch.manual_seed(seed)
    heads = 8 if width >= 64 else 4
    cfg = ModelConfig(recall="external", norm="post", width=width, heads=heads, spatial_ndim=2, in_channels=10,
                      out_channels=10)
    m = build_model(cfg)
    with torch.no_grad():
        m.recall_map.x.weight.mul_(recall_scale)
    return analysis_model(m)


def sudoku_inputs(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    digits = torch.randint(0, 10, (n, 9, 9), generator=g)
    return torch.nn.functional.one_hot(digits, 10).double()


def fixed_points(model, n: int, tol: float = 1e-10, max_iter: int = 400):
    from stability.solvers import solve

    x0 = model.embed(sudoku_inputs(n))
    r = solve(model.step, x0, x0, method="anderson", tol=tol, max_iter=max_iter, certify_rho=False)
    return r, x0


def _t(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


# ---- 1. ρ(J*) at sudoku size ---------------------------------------------------------------------------

ROUTES = {
    # name: (products' dtype, Ritz-residual tolerance, certified in float64?)
    "float64": (torch.float64, 1e-6, False),
    "mixed": (torch.float32, 1e-6, True),  # what `stability analyze` uses by default
    "float32, tol 1e-5": (torch.float32, 1e-5, False),
    "float32, tol 3e-4": (torch.float32, 3e-4, False),
}


def _route(name, m64, m32, xs, x0s):
    """ρ of every sample of (xs, x0s) at once by one route of ``ROUTES`` (Krylov–Schur on Jᵀ)."""
    dtype, tol, certified = ROUTES[name]
    if certified:
        return jacobian_spectral_radius(m64.step, xs, x0s, fast_f=m32.step, tol=tol, k=3)
    if dtype == torch.float64:
        return jacobian_spectral_radius(m64.step, xs, x0s, tol=tol, k=3)
    return jacobian_spectral_radius(m32.step, xs.float(), x0s.float(), tol=tol, k=3)


def _dense_small_row(width: int) -> dict:
    """At a small width, one fixed point's ρ by the dense spectrum (the reference, its build and eig timed), by
    every route of ``ROUTES`` and by ARPACK, each with its time, products and |Δρ| (one printed line)."""
    from reference_numerics import JacobianOperator, dense_spectrum
    from reference_numerics import arpack_rho as spectral_radius

    m = sudoku_model(width)
    m32 = sudoku_model(width).float()
    r, x0 = fixed_points(m, 1)
    op = JacobianOperator(m.step, r.x_best[0], x0[0], mode="vjp")
    _route("float64", m, m32, r.x_best, x0)  # warm-up (first use of torch.func and the kernels)
    D, t_build = _t(lambda: op.dense(chunk=512))
    dense, t_eig = _t(lambda: dense_spectrum(D))
    row = {"width": width, "n": op.shape[0], "status": r.status[0], "rho_dense": dense.rho,
           "dense_build_s": t_build, "dense_eig_s": t_eig}
    for name in ROUTES:
        res, t_ = _t(lambda: _route(name, m, m32, r.x_best, x0))
        row[name] = {"rho": float(res.rho[0]), "s": t_, "products": res.matvecs,
                     "abs_diff": abs(dense.rho - float(res.rho[0]))}
    arp, t_arp = _t(lambda: spectral_radius(op, k=3, tol=1e-6, transpose=True))
    row["arpack"] = {"rho": arp.rho, "s": t_arp, "products": arp.matvecs, "abs_diff": abs(dense.rho - arp.rho)}
    print(f"  width {width:3d} (n={op.shape[0]}): ρ dense {dense.rho:.10f} ({t_build:.1f} s build + {t_eig:.1f} s "
          f"eig); " + "; ".join(f"{k} |Δ| {row[k]['abs_diff']:.1e} ({row[k]['s']:.2f} s, {row[k]['products']})"
                               for k in (*ROUTES, "arpack")), flush=True)
    return row


def _per_sample_256(m, m32, r, x0, samples: int) -> tuple[list, dict]:
    """Width 256, sample by sample: the reference ρ (float64 Krylov–Schur to a Ritz residual of 1e-10) and every
    route's time, products, ρ, |Δρ| and Ritz residual (one printed line per sample)."""
    from stability.numerics import Linearisation as BatchedJacobian
    from stability.numerics.eigen import krylov_schur as batched_spectral_radius

    ref, per = [], {name: [] for name in ROUTES}
    for b in range(samples):
        xs, xb = r.x_best[b:b + 1], x0[b:b + 1]
        bj = BatchedJacobian(m.step, xs, xb)
        tight, t_ref = _t(lambda: batched_spectral_radius(bj.JT, tuple(xs.shape), tol=1e-10, k=6, restarts=400))
        ref.append(float(tight.rho[0]))
        line = [f"sample {b}: ρ {ref[-1]:.8f} (reference {t_ref:.1f} s, {tight.matvecs} products)"]
        for name in ROUTES:
            res, t_ = _t(lambda: _route(name, m, m32, xs, xb))
            per[name].append({"s": t_, "products": res.matvecs, "rho": float(res.rho[0]),
                              "abs_diff": abs(float(res.rho[0]) - ref[-1]),
                              "ritz_residual": float(res.ritz_residual[0])})
            line.append(f"{name} {t_:.2f} s / {res.matvecs} / |Δ| {per[name][-1]['abs_diff']:.0e}")
        print("    " + "; ".join(line), flush=True)
    return ref, per


def _route_summary(per: dict) -> dict:
    """Per route: the seconds (median, max, min), the products (median, max), ms per product, the largest |Δρ|
    and the fraction of samples within the 0.5 s goal."""
    out = {}
    for name in ROUTES:
        secs = np.array([p["s"] for p in per[name]])
        prods = np.array([p["products"] for p in per[name]])
        diffs = np.array([p["abs_diff"] for p in per[name]])
        out[name] = {
            "median_s": float(np.median(secs)), "max_s": float(secs.max()), "min_s": float(secs.min()),
            "median_products": float(np.median(prods)), "max_products": int(prods.max()),
            "ms_per_product": float(secs.sum() / prods.sum() * 1e3), "max_abs_diff": float(diffs.max()),
            "fraction_within_goal": float((secs <= 0.5).mean())}
    return out


def _arpack_sample0(m, r, x0, ref: list) -> dict:
    """Independent checks of the reference on sample 0: ARPACK on Jᵀ (reused vjp) and on J (jvp)."""
    from reference_numerics import JacobianOperator
    from reference_numerics import arpack_rho as spectral_radius

    op = JacobianOperator(m.step, r.x_best[0], x0[0], mode="vjp")
    arp, t_arp = _t(lambda: spectral_radius(op, k=3, tol=1e-6, transpose=True))
    op_jvp = JacobianOperator(m.step, r.x_best[0], x0[0], mode="jvp")
    arp_jvp, t_jvp = _t(lambda: spectral_radius(op_jvp, k=3, tol=1e-6))
    return {"rho_transpose": arp.rho, "s_transpose": t_arp, "products_transpose": arp.matvecs,
            "rho_jvp": arp_jvp.rho, "s_jvp": t_jvp, "products_jvp": arp_jvp.matvecs,
            "abs_diff_vs_reference": abs(arp.rho - ref[0]), "abs_diff_transpose_vs_jvp": abs(arp.rho - arp_jvp.rho)}


def _print_256(out: dict, samples: int, n256: int) -> None:
    """The width-256 summary lines: per route, then the mixed batch, ARPACK on sample 0 and the dense estimate."""
    print(f"  width 256 (n={n256}), {samples} samples, seconds per sample median [min, max], products median [max], "
          f"max |Δρ| vs the reference:", flush=True)
    for name, sm in out["width_256"]["summary"].items():
        print(f"    {name:18s} {sm['median_s']:.2f} [{sm['min_s']:.2f}, {sm['max_s']:.2f}] s, {sm['median_products']:.0f} "
              f"[{sm['max_products']}] products ({sm['ms_per_product']:.2f} ms each), |Δρ| ≤ {sm['max_abs_diff']:.1e}, "
              f"{sm['fraction_within_goal']:.0%} of samples ≤ 0.5 s", flush=True)
    mb, a0 = out["width_256"]["mixed_batch"], out["width_256"]["arpack_sample0"]
    print(f"    mixed, one batch of {samples}: {mb['per_sample_s']:.2f} s per sample, |Δρ| ≤ {mb['max_abs_diff']:.1e}; "
          f"ARPACK (sample 0) Jᵀ {a0['s_transpose']:.1f} s ({a0['products_transpose']}), J by jvp {a0['s_jvp']:.1f} s "
          f"({a0['products_jvp']}), |Δρ| vs reference {a0['abs_diff_vs_reference']:.1e}; dense ≈ "
          f"{out['dense_256_estimate_s']:.0f} s (n³ estimate)", flush=True)


def bench_spectral_radius(samples: int = 8) -> dict:
    """ρ(J*) by every route of ``ROUTES``: against the dense spectrum at widths 32 and 64, then at width 256
    against a tight Krylov–Schur reference, sample by sample and as one batch, with ARPACK as a second check."""
    out: dict = {"dense_small": [], "routes": {k: {"dtype": str(v[0]), "tol": v[1], "certified": v[2]}
                                               for k, v in ROUTES.items()},
                 "krylov": 60, "keep": 30}
    for width in (32, 64):
        out["dense_small"].append(_dense_small_row(width))
    small = out["dense_small"][-1]
    n256 = 81 * 256
    out["dense_256_estimate_s"] = (small["dense_eig_s"] * (n256 / small["n"]) ** 3
                                   + small["dense_build_s"] * (n256 / small["n"]) ** 2)

    # width 256: `samples` fixed points; reference ρ by float64 Krylov–Schur to a Ritz residual of 1e-10
    m = sudoku_model(256)
    m32 = sudoku_model(256).float()
    r, x0 = fixed_points(m, samples)
    out["status_256"] = r.status
    _route("mixed", m, m32, r.x_best[:1], x0[:1])  # warm-up
    ref, per = _per_sample_256(m, m32, r, x0, samples)
    out["width_256"] = {"n": n256, "samples": samples, "rho_reference": ref, "per_sample": per,
                        "summary": _route_summary(per)}
    # the same samples as one batch (finished samples leave it), per sample
    many, t_many = _t(lambda: _route("mixed", m, m32, r.x_best, x0))
    out["width_256"]["mixed_batch"] = {"per_sample_s": t_many / samples, "products": many.products.tolist(),
                                       "max_abs_diff": float((many.rho.cpu() - torch.tensor(ref)).abs().max())}
    out["width_256"]["arpack_sample0"] = _arpack_sample0(m, r, x0, ref)
    _print_256(out, samples, n256)
    return out


# ---- 2. Anderson against Picard -------------------------------------------------------------------------

def train_checkpoint(directory: Path) -> Path:
    out = directory / "prefix-sums-w32.pt"
    cmd = [sys.executable, "-m", "stability", "train", "--task", "prefix-sums", "--width", "32", "--heads", "4",
           "--epochs", "5", "--train-size", "1000", "--val-size", "64", "--hard-size", "16", "--hard-length", "64",
           "--lr", "1e-3", "--batch-size", "100", "--test-iterations", "50", "--out", str(out), "--quiet"]
    subprocess.run(cmd, check=True, capture_output=True)
    return out


def bench_anderson(checkpoint: Path, samples: int = 32, tol: float = 1e-8) -> dict:
    import stability
    from stability.analysis.fixed_point import analysis_model
    from stability.analysis.initial_iterate import fixed_point_distance
    from stability.solvers import solve

    loaded = stability.load(checkpoint)
    m = analysis_model(loaded.model)
    inputs, _ = loaded.task.dataset("val")
    x0 = m.embed(inputs[:samples].double())
    e = m.initial_state(x0)
    p, tp = _t(lambda: solve(m.step, e, x0, method="picard", tol=tol, max_iter=3000))
    a, ta = _t(lambda: solve(m.step, e, x0, method="anderson", tol=tol, max_iter=3000, memory=5))
    both = p.converged & a.converged
    dist = fixed_point_distance([p.x_best[both], a.x_best[both]]) if bool(both.any()) else torch.tensor([])
    ratio = (a.nfe[both].double() / p.nfe[both].double())
    res = {"checkpoint": str(checkpoint), "samples": samples, "tol": tol,
           "picard_converged": float(p.converged.double().mean()),
           "anderson_converged": float(a.converged.double().mean()),
           "picard_nfe_median": float(p.nfe.double().median()), "anderson_nfe_median": float(a.nfe.double().median()),
           "nfe_ratio_median": float(ratio.median()) if ratio.numel() else None,
           "nfe_ratio_max": float(ratio.max()) if ratio.numel() else None,
           "nfe_ratio_total": float(a.nfe[both].sum() / p.nfe[both].sum()) if bool(both.any()) else None,
           "fixed_point_distance_max": float(dist.max()) if dist.numel() else None,
           "picard_s": tp, "anderson_s": ta}
    print(f"  Picard median {res['picard_nfe_median']:.0f} evaluations, Anderson {res['anderson_nfe_median']:.0f}: "
          f"ratio {res['nfe_ratio_median']:.3f} (median), {res['nfe_ratio_max']:.3f} (worst); "
          f"same x* to {res['fixed_point_distance_max']:.1e} (relative L∞)", flush=True)
    return res


# ---- 3. implicit against unrolled input-gradient: memory -------------------------------------------------

def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss_bytes() -> int:
    """VmHWM of this process (getrusage's ru_maxrss would carry the parent's peak across fork + exec)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0: write 5 to /proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def memory_child(route: str, state_path: str, T: int) -> dict:
    """Run one route in this (fresh) process; report peak RSS growth and bytes saved for backward."""
    from reference_numerics import implicit_input_vjp, unrolled_input_vjp

    state = torch.load(state_path)
    m = sudoku_model(256)
    x_star, x0, v = state["x_star"], state["x0"], state["v"]
    saved, seen = [0], set()

    def pack(t):  # bytes of distinct storages autograd keeps (weights saved at every step count once)
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in seen:
            seen.add(key)
            saved[0] += storage.nbytes()
        return t

    # warm-up outside the measurement: libraries both routes load (scipy's ARPACK/GMRES, torch.func)
    import scipy.sparse.linalg  # noqa: F401

    # and one step's forward and backward through both autograd front ends (lazy kernel and library set-up,
    # about 75 MiB the first time, is not what either route costs per use)
    out, vjp_fn = torch.func.vjp(lambda a: m.step(a, x0.unsqueeze(0)), x_star.unsqueeze(0))
    vjp_fn(torch.ones_like(out))
    unrolled_input_vjp(m.step, x0, x0, v, 1, e_from_x0=False)
    del out, vjp_fn

    _reset_peak_rss()
    before = _rss_bytes()
    peak_before = _peak_rss_bytes()
    t = time.perf_counter()
    if route == "implicit":
        g, info = implicit_input_vjp(m.step, x_star, x0, v, tol=1e-10)
        extra = {"gmres_residual": info.residual, "gmres_products": info.iterations}
    else:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            g = unrolled_input_vjp(m.step, x0, x0, v, T, e_from_x0=False)
        extra = {}
    elapsed = time.perf_counter() - t
    peak = _peak_rss_bytes()
    if route == "implicit":
        # torch.func's vjp refuses saved-tensor hooks: count what it holds as one step's graph (the same ops,
        # plain autograd) plus GMRES's Krylov basis (restart + 1 vectors of n float64)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            unrolled_input_vjp(m.step, x0, x0, v, 1, e_from_x0=False)
        saved[0] += (60 + 1) * x_star.numel() * 8
    torch.save(g, state_path + f".{route}.grad")
    return {"route": route, "peak_growth_bytes": peak - before, "rss_before": before,
            "peak_before": peak_before, "peak": peak, "saved_tensor_bytes": saved[0], "seconds": elapsed, **extra}


def bench_memory(T: int = 100) -> dict:
    m = sudoku_model(256)
    r, x0 = fixed_points(m, 1)
    g = torch.Generator().manual_seed(1)
    v = torch.randn(r.x_best[0].shape, generator=g, dtype=torch.float64)
    tmp = tempfile.mkdtemp(prefix="analysis-bench-")
    state_path = os.path.join(tmp, "state.pt")
    torch.save({"x_star": r.x_best[0], "x0": x0[0], "v": v}, state_path)
    results = {}
    for route in ("implicit", "unrolled"):
        proc = subprocess.run([sys.executable, __file__, "--child", route, "--state", state_path, "--T", str(T),
                               "--threads", str(torch.get_num_threads())], capture_output=True, text=True, check=True)
        results[route] = json.loads(proc.stdout.strip().splitlines()[-1])
    gi = torch.load(state_path + ".implicit.grad")
    gu = torch.load(state_path + ".unrolled.grad")
    rel = float((gi - gu).norm() / gu.norm())
    out = {"T": T, "fixed_point_status": r.status[0], **results,
           "peak_ratio": results["implicit"]["peak_growth_bytes"] / max(results["unrolled"]["peak_growth_bytes"], 1),
           "saved_ratio": results["implicit"]["saved_tensor_bytes"] / max(results["unrolled"]["saved_tensor_bytes"], 1),
           "relative_difference": rel}
    mb = 1 / 2 ** 20
    print(f"  peak RSS growth: implicit {results['implicit']['peak_growth_bytes'] * mb:.1f} MiB, unrolled "
          f"{results['unrolled']['peak_growth_bytes'] * mb:.1f} MiB (ratio {out['peak_ratio']:.3f}); saved for "
          f"backward: {results['implicit']['saved_tensor_bytes'] * mb:.1f} vs "
          f"{results['unrolled']['saved_tensor_bytes'] * mb:.1f} MiB (ratio {out['saved_ratio']:.3f}); "
          f"gradients agree to {rel:.1e}", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--checkpoint", help="a trained checkpoint for the Anderson/Picard benchmark")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads (2)")
    ap.add_argument("--out", default=str(HERE / "results-analysis.json"), help="where to write the numbers")
    ap.add_argument("--only", choices=["spectral", "anderson", "memory"], action="append",
                    help="run only this benchmark (repeatable)")
    ap.add_argument("--child", choices=["implicit", "unrolled"], help=argparse.SUPPRESS)
    ap.add_argument("--state", help=argparse.SUPPRESS)
    ap.add_argument("--T", type=int, default=100, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.child:
        print(json.dumps(memory_child(args.child, args.state, args.T)))
        return 0
    which = args.only or ["spectral", "anderson", "memory"]
    results = {"threads": args.threads, "torch": torch.__version__, "cpu_count": os.cpu_count()}
    if "spectral" in which:
        print("1. ρ(J*) at sudoku size", flush=True)
        results["spectral_radius"] = bench_spectral_radius()
    if "anderson" in which:
        print("2. Anderson against Picard", flush=True)
        ckpt = Path(args.checkpoint) if args.checkpoint else train_checkpoint(Path(tempfile.mkdtemp()))
        results["anderson"] = bench_anderson(ckpt)
    if "memory" in which:
        print("3. implicit against unrolled input-gradient, T = 100", flush=True)
        results["memory"] = bench_memory()
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(f"numbers: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
