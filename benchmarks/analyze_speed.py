"""Analysis speed on the demo checkpoint (issue 12): the per-sample sensitivity routes against the batched ones,
side by side in one run, with the numbers each prints compared.

    python benchmarks/analyze_speed.py [--checkpoint runs/demo/prefix-sums.pt] [--samples 32] [--full]

Per split (val, hard; the first ``--samples`` samples, as ``stability analyze`` takes them):

* Prop. 5 on the first converged sample (x* polished, T grid up to 500): ``prop5_check`` (scipy GMRES, one
  forward-mode jvp per unrolled step) against ``prop5_check_batched`` (torch GMRES, double-reverse-mode steps);
* App. A.8 ‖dx_T/de‖ on the same sample: ``initial_iterate_sensitivity`` against the batched function, and both
  tangents from ONE shared unroll (``prop5_and_initial_iterate_batched``);
* ‖dx*/dx0‖_F on every converged sample (4 probes): the per-sample loop of ``input_dependence_frobenius`` against
  ``input_dependence_frobenius_batched`` (all samples × probes in one batched GMRES);
* the App. A.8 solves from zeros and noise (the pipeline's, not changed here) for scale.

``--routes`` only times the dense routes of the hard split before and after issue 12's last change (J and Prop. 4's M
by rows against compressed forward-mode columns, ρ by batched Krylov–Schur against ARPACK per matrix, σ_max by
``svdvals`` against Lanczos on JᵀJ; results-dense-routes.json). ``--crossover`` only times the dense ρ/σ_max route against the Krylov one at n = 128 … 2048 (the measurement behind
``DENSE_MAX``; results-dense-crossover.json); ``--dense`` only runs the whole analysis with the dense thresholds at
their old values and at the current ones, per-stage timings and numbers side by side
(results-dense-before-after.json).

``--processes`` times the whole ``stability analyze`` process as a user runs it: the code of ``--before-tree``
against this tree's, one split after the other (``--workers 1``) and with the splits side by side (the default),
alternated, with the numbers compared (results-analyze-processes.json).

``--full`` also runs the whole ``analyze_checkpoint`` (both splits) as the pipeline stands and records its
per-stage ``timings_s``. Results go to benchmarks/results-analyze-speed.json and are printed as markdown
(benchmarks/RESULTS.md, section "Analysis speed"). Read the ratios: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the per-sample scipy references

HERE = Path(__file__).resolve().parent


CPU_TIMES: dict = {}


def _timed(fn, name=None):
    """(result, wall seconds); the process CPU seconds go to CPU_TIMES[name] (on a loaded machine, with one
    thread, the CPU time is the better estimate of the wall time on a free core)."""
    t, c = time.perf_counter(), time.process_time()
    out = fn()
    if name is not None:
        CPU_TIMES[name] = time.process_time() - c
    return out, time.perf_counter() - t


def _rel_diff(a, b) -> float:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.max(np.abs(a - b) / np.maximum(np.abs(b), 1e-300)))


def ensure_checkpoint(path: Path) -> Path:
    """The demo checkpoint: trained here with ``stability demo``'s configuration when absent."""
    if path.exists():
        return path
    from stability.demo import demo_config
    from stability.train.loop import train

    path.parent.mkdir(parents=True, exist_ok=True)
    print(f"training the demo checkpoint into {path} …", flush=True)
    train(demo_config(), path, progress=False)
    return path


def bench_split(model, task, split: str, samples: int, seed: int = 0, max_iter: int = 500, probes: int = 4,
                gmres_tol: float = 1e-10) -> dict:
    from stability.analysis.initial_iterate import (initial_iterate_sensitivity, initial_iterate_sensitivity_batched,
                                                    prop5_and_initial_iterate_batched)
    from reference_numerics import input_dependence_frobenius, prop5_check
    from stability.analysis.input_dependence import input_dependence_frobenius_batched
    from stability.analysis.prop5 import default_T_grid, prop5_check_batched
    from stability.solvers import solve

    f = model.step
    inputs, _ = task.dataset(split)
    N = min(samples, inputs.shape[0])
    with torch.no_grad():
        x0 = model.embed(inputs[:N].double())
        e = model.initial_state(x0, generator=torch.Generator().manual_seed(seed))
    res = solve(f, e, x0, tol=1e-5, max_iter=max_iter)
    conv = res.converged
    idx = conv.nonzero().flatten()
    first = int(idx[0])
    sl = slice(first, first + 1)
    polish = solve(f, res.x_best[sl], x0[sl], tol=1e-13, max_iter=max_iter, max_period=0)
    xp = polish.x_best
    Ts = default_T_grid(max_iter)
    out = {"split": split, "samples": N, "converged": int(conv.sum()), "state_shape": list(x0.shape[1:]),
           "prop5_sample": first}

    old_p5, t_old_p5 = _timed(lambda: prop5_check(f, xp[0], x0[first], e[first], Ts, tol=gmres_tol, seed=seed),
                              "prop5_old")
    new_p5, t_new_p5 = _timed(lambda: prop5_check_batched(f, xp, x0[sl], e[sl], Ts, tol=gmres_tol, seed=seed),
                              "prop5_new")
    old_a8, t_old_a8 = _timed(lambda: initial_iterate_sensitivity(f, e[first], x0[first], Ts, seed=seed),
                              "a8_sensitivity_old")
    new_a8, t_new_a8 = _timed(lambda: initial_iterate_sensitivity_batched(f, e[sl], x0[sl], Ts, seed=seed),
                              "a8_sensitivity_new")
    (sh_p5, sh_a8), t_shared = _timed(
        lambda: prop5_and_initial_iterate_batched(f, xp, x0[sl], e[sl], Ts, tol=gmres_tol, seed=seed),
        "prop5_plus_a8_shared")
    exact_p5, t_exact = _timed(lambda: prop5_check_batched(f, xp, x0[sl], e[sl], Ts, tol=gmres_tol, seed=seed,
                                                           freeze_tol=None), "prop5_new_exact")
    ftol = max(gmres_tol, 1e-8)

    def old_frob():
        return [input_dependence_frobenius(f, res.x_best[b], x0[b], probes=probes, tol=ftol, seed=seed).value
                for b in idx.tolist()]

    old_fr, t_old_fr = _timed(old_frob, "frobenius_old")
    new_fr, t_new_fr = _timed(lambda: input_dependence_frobenius_batched(f, res.x_best[idx], x0[idx], probes=probes,
                                                                         tol=ftol, seed=seed), "frobenius_new")

    def a8_solves():
        gen = torch.Generator().manual_seed(seed)
        noise = torch.randn(e.shape, generator=gen, dtype=torch.float64).to(e)
        for start in (torch.zeros_like(e), noise):
            solve(f, start, x0, tol=1e-5, max_iter=max_iter)

    _, t_a8_solves = _timed(a8_solves, "a8_solves_unchanged")
    p5s, sh = new_p5.sample(0), sh_p5.sample(0)
    cpu = dict(CPU_TIMES)
    cpu["prop5_plus_a8_old"] = cpu["prop5_old"] + cpu["a8_sensitivity_old"]
    out["cpu_s"] = cpu
    out["times_s"] = {
        "prop5_old": t_old_p5, "prop5_new": t_new_p5, "prop5_new_exact": t_exact,
        "a8_sensitivity_old": t_old_a8, "a8_sensitivity_new": t_new_a8,
        "prop5_plus_a8_old": t_old_p5 + t_old_a8, "prop5_plus_a8_shared": t_shared,
        "frobenius_old": t_old_fr, "frobenius_new": t_new_fr, "a8_solves_unchanged": t_a8_solves,
    }
    out["agreement"] = {
        "prop5_rel_error_old": old_p5.rel_error, "prop5_rel_error_new": p5s.rel_error,
        "prop5_rel_error_new_exact": exact_p5.sample(0).rel_error,
        "prop5_rel_error_max_rel_diff": _rel_diff(p5s.rel_error, old_p5.rel_error),
        "prop5_rel_error_exact_vs_old_max_rel_diff": _rel_diff(exact_p5.sample(0).rel_error, old_p5.rel_error),
        "prop5_shared_vs_separate_max_rel_diff": _rel_diff(sh.rel_error, p5s.rel_error),
        "frozen_at": int(new_p5.frozen_at[0]),
        "gmres_residual_old": old_p5.gmres_residual, "gmres_residual_new": p5s.gmres_residual,
        "gmres_iterations_old": old_p5.gmres_iterations, "gmres_iterations_new": p5s.gmres_iterations,
        "a8_norm_max_rel_diff": _rel_diff(new_a8.sample(0)["norm"], old_a8["norm"]),
        "a8_shared_max_rel_diff": _rel_diff(sh_a8.sample(0)["norm"], old_a8["norm"]),
        "frobenius_median_old": float(np.median(old_fr)), "frobenius_median_new": float(np.median(new_fr.value)),
        "frobenius_max_rel_diff": _rel_diff(new_fr.value, old_fr),
        "frobenius_gmres_iterations_max": int(new_fr.gmres_iterations.max()),
        "frobenius_residual_max": float(new_fr.gmres_residual_max.max()),
    }
    return out


def bench_dense_crossover(model, lengths=(4, 8, 16, 32, 64), samples=(8, 8, 8, 4, 2), seed: int = 0,
                          tol: float = 1e-6) -> list:
    """ρ(J*) and σ_max per sample, the batched dense route (:func:`batched_dense_jacobian` + LAPACK) against the
    Krylov route the pipeline used before (mixed-precision Krylov–Schur for ρ, Lanczos on JᵀJ for σ_max), on the
    demo model at bit lengths giving n = 32 · L; the crossover sets ``DENSE_MAX`` in spectra.py."""
    import copy

    from stability.numerics import Linearisation, sigma_max, spectral_radius
    from stability.solvers import solve

    fast = copy.deepcopy(model).float()
    rows = []
    with torch.no_grad():  # pay vmap's and LAPACK's one-time set-up before any timing
        w0 = model.embed(torch.zeros(2, 2, 1, dtype=torch.float64))
    spectral_radius(Linearisation(model.step, w0, w0).dense(), route="dense")
    for L, B in zip(lengths, samples):
        gen = torch.Generator().manual_seed(seed)
        bits = (torch.randint(0, 2, (B, L, 1), generator=gen).double() - 0.5)
        with torch.no_grad():
            x0 = model.embed(bits)
            e = model.initial_state(x0, generator=torch.Generator().manual_seed(seed))
        x = solve(model.step, e, x0, tol=1e-5, max_iter=500).x_best
        n = int(np.prod(x.shape[1:]))

        def dense():
            J = Linearisation(model.step, x, x0).dense()
            return J, (spectral_radius(J, route="dense"), sigma_max(J, route="dense"))

        def krylov():
            spec = []
            sig = []
            for b in range(B):  # the pipeline's CPU default: one sample per batch
                xs, xb = x[b:b + 1], x0[b:b + 1]
                lin = Linearisation(model.step, xs, xb)
                spec.append(spectral_radius(lin, route="krylov", fast=Linearisation(fast.step, xs.float(), xb.float()),
                                            k=3, tol=tol, seed=seed).rho)
                sig.append(sigma_max(lin, route="krylov", tol=tol, seed=seed))
            return torch.cat(spec), torch.cat(sig)

        (J, (d_spec, d_sig)), t_d = _timed(dense, f"dense_{n}")
        (k_rho, k_sig), t_k = _timed(krylov, f"krylov_{n}")
        rows.append({"n": n, "L": L, "samples": B, "dense_s_per_sample": t_d / B, "krylov_s_per_sample": t_k / B,
                     "dense_cpu_s_per_sample": CPU_TIMES[f"dense_{n}"] / B,
                     "krylov_cpu_s_per_sample": CPU_TIMES[f"krylov_{n}"] / B,
                     "rho_max_abs_diff": float((d_spec.rho - k_rho).abs().max()),
                     "sigma_max_abs_diff": float((d_sig - k_sig).abs().max())})
        print(rows[-1], flush=True)
    return rows


def bench_dense_routes(model, task, samples: int, seed: int = 0, repeats: int = 2) -> dict:
    """The dense routes of the hard split (n = 512 for the demo) side by side, CPU seconds (the best of
    ``repeats``) and the largest difference from the reference route: J by rows (reverse mode, the route before),
    by forward-mode columns, and compressed (positions coloured, certified); Prop. 4's M likewise (rows of the
    linear map's vjp against its columns); ρ by the batched Krylov–Schur on bmm products against ARPACK one
    matrix at a time; σ_max by ``svdvals`` against ``eigvalsh(JᵀJ)`` and Lanczos per matrix."""
    from stability.analysis.recall import RecallMatrixOperator
    from stability.numerics import Linearisation, sigma_max, spectral_radius
    from stability.numerics.eigen import krylov_schur as batched_spectral_radius
    from stability.solvers import solve

    inputs, _ = task.dataset("hard")
    N = min(samples, inputs.shape[0])
    with torch.no_grad():
        x0 = model.embed(inputs[:N].double())
        e = model.initial_state(x0, generator=torch.Generator().manual_seed(seed))
    x = solve(model.step, e, x0, tol=1e-5, max_iter=500).x_best
    n = x[0].numel()

    def best(name, fn):
        times = []
        for _ in range(repeats):
            c = time.process_time()
            out = fn()
            times.append(time.process_time() - c)
        CPU_TIMES[name] = min(times)
        return out

    rows: dict = {"samples": N, "n": n, "cpu_s": CPU_TIMES, "max_abs_diff": {}}
    J_rows = best("J_rows", lambda: Linearisation(model.step, x, x0).dense(route="rows"))
    J_cols = best("J_columns", lambda: Linearisation(model.step, x, x0).dense(route="columns"))
    J = best("J_compressed", lambda: Linearisation(model.step, x, x0).dense())
    rows["max_abs_diff"]["J_columns"] = float((J_cols - J_rows).abs().max())
    rows["max_abs_diff"]["J_compressed"] = float((J - J_rows).abs().max())
    op = RecallMatrixOperator(model, x, x0).linear_map()
    M_rows = best("M_rows", lambda: op.dense(route="rows"))
    M = best("M_compressed", lambda: op.dense())
    rows["max_abs_diff"]["M_compressed"] = float((M - M_rows).abs().max())

    def ks():
        def restrict(idx):
            Ji = J[idx]
            return lambda V: torch.bmm(Ji, V.reshape(Ji.shape[0], n, 1)).reshape(V.shape)
        return batched_spectral_radius(restrict(torch.arange(N)), (N, n), k=6, tol=1e-6, seed=seed,
                                       restrict=restrict, dtype=torch.float64)

    exact = torch.linalg.eigvals(J[:4]).abs().max(dim=1).values  # LAPACK on 4 of them: the reference
    rho_ks = best("rho_batched_krylov_schur", ks).rho
    rho_ar = best("rho_arpack_per_matrix", lambda: spectral_radius(J, route="dense-krylov", k=6, tol=1e-6,
                                                                     seed=seed)).rho
    rows["max_abs_diff"]["rho_batched_krylov_schur_vs_eigvals"] = float((rho_ks[:4] - exact).abs().max())
    rows["max_abs_diff"]["rho_arpack_per_matrix_vs_eigvals"] = float((rho_ar[:4] - exact).abs().max())
    sv = best("sigma_svdvals", lambda: torch.linalg.svdvals(J)[:, 0])
    ev = best("sigma_eigvalsh", lambda: torch.linalg.eigvalsh(J.transpose(1, 2) @ J)[:, -1].sqrt())
    lz = best("sigma_lanczos_per_matrix", lambda: sigma_max(J))
    rows["max_abs_diff"]["sigma_eigvalsh"] = float(((ev - sv).abs() / sv).max())
    rows["max_abs_diff"]["sigma_lanczos_per_matrix"] = float(((lz - sv).abs() / sv).max())
    return rows


def routes_markdown(r: dict) -> str:
    c, d = r["cpu_s"], r["max_abs_diff"]
    lines = [f"hard split, {r['samples']} samples, n = {r['n']}; CPU s (best of 2), one thread", "",
             "| quantity | before | after | CPU s before → after | difference |", "|---|---|---|---|---|",
             f"| dense J | rows (reverse mode) | compressed forward-mode columns | {c['J_rows']:.2f} → "
             f"{c['J_compressed']:.2f} (uncompressed columns {c['J_columns']:.2f}) | {d['J_compressed']:.1e} |",
             f"| dense M (Prop. 4) | rows of the linear map | its columns, compressed | {c['M_rows']:.2f} → "
             f"{c['M_compressed']:.2f} | {d['M_compressed']:.1e} |",
             f"| ρ on dense J | batched Krylov–Schur (bmm) | ARPACK per matrix | {c['rho_batched_krylov_schur']:.2f} → "
             f"{c['rho_arpack_per_matrix']:.2f} | vs eigvals: {d['rho_batched_krylov_schur_vs_eigvals']:.1e} → "
             f"{d['rho_arpack_per_matrix_vs_eigvals']:.1e} |",
             f"| σ_max | svdvals | Lanczos on JᵀJ per matrix | {c['sigma_svdvals']:.2f} → "
             f"{c['sigma_lanczos_per_matrix']:.2f} (eigvalsh {c['sigma_eigvalsh']:.2f}) | "
             f"rel. {d['sigma_lanczos_per_matrix']:.1e} |"]
    return "\n".join(lines)


def crossover_markdown(rows: list) -> str:
    lines = ["| n (L) | samples | dense: s/sample (CPU s) | Krylov: s/sample (CPU s) | |Δρ| max | |Δσ_max| max |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n']} ({r['L']}) | {r['samples']} | {r['dense_s_per_sample']:.3f} "
                     f"({r['dense_cpu_s_per_sample']:.3f}) | {r['krylov_s_per_sample']:.3f} "
                     f"({r['krylov_cpu_s_per_sample']:.3f}) | {r['rho_max_abs_diff']:.1e} | "
                     f"{r['sigma_max_abs_diff']:.1e} |")
    return "\n".join(lines)


def dense_before_after(ckpt: Path, samples: int) -> dict:
    """The whole ``analyze_checkpoint`` (both splits) with the dense thresholds at their old values (32, no
    mid-size tier: every demo state on the Krylov / ARPACK routes) and at
    :data:`~stability.numerics.spectra.DENSE_MAX` / :data:`~stability.numerics.spectra.DENSE_KRYLOV_MAX`, one after
    the other in this process; per-stage timings and the numbers each prints."""
    import stability.numerics.spectra as spectra
    from stability.analysis.options import AnalysisOptions
    from stability.analysis.pipeline import analyze_checkpoint

    out = {}
    for label, limit, mid in (("before", 32, 0), ("after", spectra.DENSE_MAX, spectra.DENSE_KRYLOV_MAX)):
        saved = spectra.DENSE_MAX, spectra.DENSE_KRYLOV_MAX
        spectra.DENSE_MAX, spectra.DENSE_KRYLOV_MAX = limit, mid
        try:
            rep, wall = _timed(lambda: analyze_checkpoint(ckpt, options=AnalysisOptions(samples=samples)).to_json(),
                               f"full_{label}")
        finally:
            spectra.DENSE_MAX, spectra.DENSE_KRYLOV_MAX = saved
        row = {"dense_max": limit, "dense_krylov_max": mid, "wall_s": wall, "cpu_s": CPU_TIMES[f"full_{label}"]}
        for split in ("val", "hard"):
            b = rep[split]
            row[split] = {"timings": b["timings"], "method": b["jacobian"]["method"],
                          "rho": b["jacobian"]["spectral_radius"], "sigma_max": b["jacobian"]["sigma_max"],
                          "rho_M": b["prop4"]["rho_M"], "prop4_diff": b["prop4"]["max_abs_diff_vs_autograd"],
                          "columns_checked": b["prop4"]["columns_checked"], "verdict": b["verdict"]}
        out[label] = row
        print(label, json.dumps({k: row[k] for k in ("dense_max", "dense_krylov_max", "wall_s", "cpu_s")}),
              {s: {k: round(v, 2) for k, v in row[s]["timings"].items()} for s in ("val", "hard")}, flush=True)
    for split in ("val", "hard"):
        a, b = out["after"][split], out["before"][split]
        out[f"{split}_agreement"] = {
            "rho_max_abs_diff": float(np.nanmax(np.abs(np.array(a["rho"], float) - np.array(b["rho"], float)))),
            "sigma_max_abs_diff": float(np.nanmax(np.abs(np.array(a["sigma_max"], float)
                                                         - np.array(b["sigma_max"], float)))),
            "rho_M_max_abs_diff": float(np.nanmax(np.abs(np.array(a["rho_M"], float) - np.array(b["rho_M"], float)))),
            "same_verdict": a["verdict"]["reachable"] == b["verdict"]["reachable"]
            and a["verdict"]["input_dependent"] == b["verdict"]["input_dependent"]
            and a["verdict"]["independent_of_e"] == b["verdict"]["independent_of_e"]}
        print(split, out[f"{split}_agreement"], flush=True)
    return out


def full_analysis(ckpt: Path, samples: int) -> dict:
    from stability.analysis.options import AnalysisOptions
    from stability.analysis.pipeline import analyze_checkpoint

    rep, wall = _timed(lambda: analyze_checkpoint(ckpt, options=AnalysisOptions(samples=samples)), "full")
    blocks = rep if isinstance(rep, dict) else rep.to_json()
    out = {"wall_s": wall, "cpu_s": CPU_TIMES["full"]}
    for split in ("val", "hard"):
        block = blocks.get(split) or {}
        out[split] = block.get("timings_s") or block.get("timings")
    return out


def markdown(results: dict) -> str:
    rows = [("Prop. 5 check, 1 sample, T ≤ 500", "prop5_old", "prop5_new"),
            ("A.8 ‖dx_T/de‖, 1 sample, T ≤ 500", "a8_sensitivity_old", "a8_sensitivity_new"),
            ("Prop. 5 + A.8 from one shared unroll", "prop5_plus_a8_old", "prop5_plus_a8_shared"),
            ("‖dx*/dx0‖_F, converged samples × 4 probes", "frobenius_old", "frobenius_new")]
    lines = ["| stage | split | per-sample: CPU s (wall s) | batched: CPU s (wall s) | speed-up (CPU) |",
             "|---|---|---|---|---|"]
    for label, old, new in rows:
        for s in results["splits"]:
            t, c = s["times_s"], s["cpu_s"]
            lines.append(f"| {label} | {s['split']} | {c[old]:.2f} ({t[old]:.2f}) | {c[new]:.2f} ({t[new]:.2f}) | "
                         f"{c[old] / c[new]:.1f}× |")
    for s in results["splits"]:
        k = "a8_solves_unchanged"
        lines.append(f"| A.8 solves from zeros, noise (unchanged) | {s['split']} | {s['cpu_s'][k]:.2f} "
                     f"({s['times_s'][k]:.2f}) | — | — |")
    lines.append("")
    lines.append("| agreement | split | per-sample | batched |")
    lines.append("|---|---|---|---|")
    for s in results["splits"]:
        a = s["agreement"]
        lines.append(f"| Prop. 5 error T=1 → T=500 | {s['split']} | {a['prop5_rel_error_old'][0]:.4g} → "
                     f"{a['prop5_rel_error_old'][-1]:.4g} | {a['prop5_rel_error_new'][0]:.4g} → "
                     f"{a['prop5_rel_error_new'][-1]:.4g} (max rel. diff over T "
                     f"{a['prop5_rel_error_max_rel_diff']:.1e}; frozen after step {a['frozen_at']}; exact steps: "
                     f"{a['prop5_rel_error_exact_vs_old_max_rel_diff']:.1e}) |")
        lines.append(f"| GMRES residual / products | {s['split']} | {a['gmres_residual_old']:.3g} / "
                     f"{a['gmres_iterations_old']} | {a['gmres_residual_new']:.3g} / {a['gmres_iterations_new']} |")
        lines.append(f"| ‖dx_T/de‖ over T | {s['split']} | — | max rel. diff {a['a8_norm_max_rel_diff']:.1e} "
                     f"(shared unroll {a['a8_shared_max_rel_diff']:.1e}) |")
        lines.append(f"| ‖dx*/dx0‖_F median | {s['split']} | {a['frobenius_median_old']:.6g} | "
                     f"{a['frobenius_median_new']:.6g} (max rel. diff {a['frobenius_max_rel_diff']:.1e}) |")
    full = results.get("full_analysis")
    if full:
        lines += ["", f"Whole `analyze_checkpoint` (both splits, pipeline as it stands): {full['cpu_s']:.1f} CPU s, "
                  f"{full['wall_s']:.1f} s wall; "
                  "per-stage timings_s: " + "; ".join(
                      f"{s}: " + ", ".join(f"{k} {v:.2f}" for k, v in (full.get(s) or {}).items())
                      for s in ("val", "hard"))]
    return "\n".join(lines)


# ---- the whole command, as a user runs it ---------------------------------------------------------------

def _numbers(report: dict) -> dict:
    """An analysis JSON without what may differ between two runs of the same numbers (timings, workers)."""
    out = json.loads(json.dumps(report))
    out["options"].pop("workers", None)
    out.pop("checkpoint", None)
    for split in out["splits"]:
        out[split].pop("timings", None)
    return out


def bench_processes(ckpt: Path, trees: dict, repeats: int = 2) -> dict:
    """``python -m stability analyze CKPT --json F --quiet`` as a whole process, for every (label → (source tree,
    extra flags, OMP threads)) of ``trees``, the labels alternated ``repeats`` times so that the machine's load
    falls on each alike. Wall and CPU seconds of each process (CPU: its children's rusage, spawned split processes
    included), the stage times its JSON reports, and whether every label printed the same numbers as the first."""
    import resource
    import subprocess
    import tempfile

    rows: dict = {label: [] for label in trees}
    reports: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(repeats):
            for label, (tree, flags, threads) in trees.items():
                js = Path(tmp) / f"{label.replace(' ', '_')}-{rep}.json"
                env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=str(threads),
                           MKL_NUM_THREADS=str(threads))
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                t = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "stability", "analyze", str(ckpt), "--json", str(js),
                                       "--quiet", *flags], env=env, capture_output=True, text=True,
                                      cwd=tree)  # `python -m` puts the working directory first on the path
                wall = time.perf_counter() - t
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                if proc.returncode != 0:
                    raise SystemExit(f"{label}: exit {proc.returncode}: {proc.stderr.strip()[-500:]}")
                report = json.loads(js.read_text())
                reports.setdefault(label, report)
                stages = {sp: report[sp]["timings"] for sp in report["splits"]}
                rows[label].append({"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime)
                                    + (after.ru_stime - before.ru_stime), "stages_s": stages,
                                    "load_avg": os.getloadavg()[0]})
                print(f"  {label}: {wall:.1f} s wall, {rows[label][-1]['cpu_s']:.1f} CPU s; stages "
                      + "; ".join(f"{sp} {sum(v.values()):.1f}" for sp, v in stages.items()), flush=True)
    first = next(iter(reports))
    same = {label: _numbers(r) == _numbers(reports[first]) for label, r in reports.items()}
    return {"runs": rows, "same_numbers_as_" + first.replace(" ", "_"): same,
            "differences_from_" + first.replace(" ", "_"): {
                label: _differences(_numbers(reports[first]), _numbers(r)) for label, r in reports.items()},
            "best_wall_s": {label: min(r["wall_s"] for r in v) for label, v in rows.items()}}


def _differences(a, b) -> dict:
    """Where two analysis JSONs differ: the largest relative difference of a float (and its path), the paths of
    other values that differ, and keys that only one of them has."""
    worst, other, only = [0.0, None], [], []

    def walk(x, y, path):
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                if (k in x) != (k in y):
                    only.append(f"{path}/{k}")
                else:
                    walk(x[k], y[k], f"{path}/{k}")
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for u, v in zip(x, y):
                walk(u, v, path + "[]")
        elif isinstance(x, float) and isinstance(y, float):
            if x != y:
                r = abs(x - y) / max(abs(x), abs(y), 1e-300)
                if r > worst[0]:
                    worst[:] = [r, path]
        elif x != y:
            other.append(path)

    walk(a, b, "")
    return {"max_rel_diff": worst[0], "at": worst[1], "other_values": sorted(set(other)),
            "keys_in_one_only": sorted(set(only))}


def bench_blas_threads(model, task, samples: int, repeats: int) -> dict:
    """ρ (ARPACK per matrix) and σ_max (Lanczos on JᵀJ per matrix) of the hard split's dense J*, as stage rho
    computes them: numpy's and scipy's OpenBLAS at their default thread count against one thread
    (``serial_blas``), and the matrices as the column builder leaves them (strides neither C nor F order, what
    stage rho hands ARPACK) against row-major copies; alternated ``repeats`` times in this process, wall and CPU seconds, numbers compared."""
    from threadpoolctl import threadpool_info

    import stability.numerics.spectra as sp
    from stability.numerics import Linearisation
    from stability.solvers import solve

    inputs, _ = task.dataset("hard")
    N = min(samples, inputs.shape[0])
    with torch.no_grad():
        x0 = model.embed(inputs[:N].double())
    xs = solve(model.step, x0, x0, tol=1e-5, max_iter=500).x_best
    J = Linearisation(model.step, xs, x0).dense()  # strides (n, 1, B·n), as stage rho builds it
    default = max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")

    class _Unlimited:  # serial_blas replaced by a context that leaves OpenBLAS at its default
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def restore_original_limits(self):
            pass

    variants = {f"OpenBLAS default ({default} threads), strided J (before)": (False, False),
                "OpenBLAS default, row-major J": (False, True),
                "one OpenBLAS thread, strided J (after)": (True, False),
                "one OpenBLAS thread, row-major J": (True, True)}
    rows, numbers = {k: [] for k in variants}, {}
    keep = sp.serial_blas
    try:
        for _ in range(repeats):
            for label, (serial, rowmajor) in variants.items():
                sp.serial_blas = keep if serial else _Unlimited
                t, c = time.perf_counter(), time.process_time()
                spec = sp._arpack_dense(J.contiguous() if rowmajor else J, 3, 1e-6, 0)
                sig = sp._dense_sigma_max(J)
                rows[label].append({"wall_s": time.perf_counter() - t, "cpu_s": time.process_time() - c})
                numbers[label] = (spec.rho.tolist(), sig.tolist())
                print(f"  {label}: {rows[label][-1]['wall_s']:.2f} s wall, {rows[label][-1]['cpu_s']:.2f} CPU s",
                      flush=True)
    finally:
        sp.serial_blas = keep
    ref = numbers[next(iter(numbers))]
    return {"samples": N, "n": J.shape[-1], "openblas_default_threads": default, "runs": rows,
            "best_wall_s": {k: min(r["wall_s"] for r in v) for k, v in rows.items()},
            "max_rel_diff_vs_before": {k: max(_rel_diff(v[0], ref[0]), _rel_diff(v[1], ref[1]))
                                       for k, v in numbers.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", default="runs/demo/prefix-sums.pt")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--full", action="store_true", help="also time the whole analyze_checkpoint")
    p.add_argument("--crossover", action="store_true",
                   help="only time the dense ρ/σ_max route against Krylov at n = 128 … 2048 (sets DENSE_MAX)")
    p.add_argument("--dense", action="store_true",
                   help="only the whole analysis with the dense threshold at 32 (before) and at DENSE_MAX (after)")
    p.add_argument("--routes", action="store_true",
                   help="only the dense routes of the hard split side by side (J, M, ρ, σ_max: before and after)")
    p.add_argument("--processes", action="store_true",
                   help="only the whole `stability analyze` process: --before-tree's code (one split after the "
                        "other) against this tree's with --workers 1 and with the default (the splits side by side)")
    p.add_argument("--blas", action="store_true",
                   help="only ρ and σ_max of the hard split's dense J with OpenBLAS at its default thread count "
                        "against one thread, strided against row-major (results-blas-threads.json)")
    p.add_argument("--before-tree", metavar="DIR", help="a checkout of the code before (for --processes)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json", default=str(HERE / "results-analyze-speed.json"))
    args = p.parse_args(argv)
    if args.processes:
        ckpt = ensure_checkpoint(Path(args.checkpoint)).resolve()
        here = HERE.parent
        trees = {}
        if args.before_tree:
            trees["before, 2 threads"] = (Path(args.before_tree).resolve(), [], 2)
        trees.update({"after, --workers 1, 2 threads": (here, ["--workers", "1"], 2),
                      "after, --workers 1, 1 thread": (here, ["--workers", "1"], 1),
                      "after, default (splits side by side)": (here, [], 2)})
        out = {"checkpoint": str(ckpt), "torch": torch.__version__, "cpu_count": os.cpu_count(),
               "load_avg_start": os.getloadavg(), **bench_processes(ckpt, trees, args.repeats),
               "load_avg_end": os.getloadavg()}
        from stability.atomic import write_text

        write_text(str(Path(args.json).with_name("results-analyze-processes.json")), json.dumps(out, indent=1))
        print("best wall: " + "; ".join(f"{k} {v:.1f} s" for k, v in out["best_wall_s"].items()))
        print(f"load average at start / end: {out['load_avg_start']} / {out['load_avg_end']}")
        return 0

    import stability
    from stability.analysis.fixed_point import analysis_model
    from stability.atomic import write_text

    ckpt = ensure_checkpoint(Path(args.checkpoint))
    loaded = stability.load(ckpt)
    model = analysis_model(loaded.model)
    # pay torch.func's one-time imports before any timing
    torch.func.vjp(lambda a: a * 2, torch.ones(1, dtype=torch.float64))
    if args.dense:
        out = {"checkpoint": str(ckpt), "torch": torch.__version__, "threads": torch.get_num_threads(),
               "load_avg_start": os.getloadavg(), **dense_before_after(ckpt, args.samples),
               "load_avg_end": os.getloadavg()}
        write_text(str(Path(args.json).with_name("results-dense-before-after.json")), json.dumps(out, indent=1))
        print(f"load average at start / end: {out['load_avg_start']} / {out['load_avg_end']}")
        return 0
    if args.blas:
        r = bench_blas_threads(model, loaded.task, args.samples, max(args.repeats, 2))
        out = {"checkpoint": str(ckpt), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
               "load_avg": os.getloadavg(), **r}
        write_text(str(Path(args.json).with_name("results-blas-threads.json")), json.dumps(out, indent=1))
        print("best wall: " + "; ".join(f"{k} {v:.2f} s" for k, v in r["best_wall_s"].items()))
        print("max relative difference against before: " + "; ".join(
            f"{k} {v:.1e}" for k, v in r["max_rel_diff_vs_before"].items()))
        print(f"load average at end: {out['load_avg']}")
        return 0
    if args.routes:
        r = bench_dense_routes(model, loaded.task, args.samples)
        out = {"checkpoint": str(ckpt), "torch": torch.__version__, "threads": torch.get_num_threads(),
               "load_avg": os.getloadavg(), **r}
        write_text(str(Path(args.json).with_name("results-dense-routes.json")), json.dumps(out, indent=1))
        print(routes_markdown(r))
        print(f"\nload average at end: {out['load_avg']}")
        return 0
    if args.crossover:
        rows = bench_dense_crossover(model)
        out = {"checkpoint": str(ckpt), "torch": torch.__version__, "threads": torch.get_num_threads(),
               "load_avg": os.getloadavg(), "crossover": rows}
        write_text(str(Path(args.json).with_name("results-dense-crossover.json")), json.dumps(out, indent=1))
        print(crossover_markdown(rows))
        print(f"\nload average at end: {out['load_avg']}")
        return 0
    results = {"checkpoint": str(ckpt), "torch": torch.__version__, "threads": torch.get_num_threads(),
               "machine": f"{platform.machine()}, {os.cpu_count()} CPUs", "load_avg_start": os.getloadavg(),
               "splits": [bench_split(model, loaded.task, s, args.samples) for s in ("val", "hard")]}
    if args.full:
        results["full_analysis"] = full_analysis(ckpt, args.samples)
    results["load_avg_end"] = os.getloadavg()
    write_text(args.json, json.dumps(results, indent=1))
    print(markdown(results))
    print(f"\nload average at start / end: {results['load_avg_start']} / {results['load_avg_end']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
