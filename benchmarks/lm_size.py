"""A Huginn-shaped looped language model of over 100 M parameters analysed on the CPU: time and peak memory (issue 36).

    python benchmarks/lm_size.py [--threads 2] [--json benchmarks/out/lm-size.json] [--quick] [--token-rho-only]
                                 [--geometry]

The model: :class:`stability.lm.huginn.Huginn` with Huginn-0125's layer counts (prelude 2, recurrent core 4, coda 2;
vocabulary 65,536; 32 recurrences) at a tenth of its width (hidden 528, MLP 1,792, 8 heads): 101.4 M parameters,
random weights (seed 0), drawn in float32 (as a directory stores them) and made the analysis copy in place as
``stability.load(HF_DIR)`` makes it (:func:`stability.lm.storage.mixed_storage`: the loop, prelude and coda in
float64, the embedding and LM head in float32): one copy of the model. ``--quick``: the same steps at a toy size (hidden 64, vocabulary 1,024), for
the suite's smoke run.

The measurement, in this process: :func:`stability.lm.analyze_lm` on 4 random sequences of 32 tokens with the
stages ``reachability`` and ``prop5`` and the per-token ρ (matrix-free route: Krylov–Schur on every token's
diagonal block of J*), on ``--threads`` threads: wall seconds (per stage), and the peak RSS of the process against
the model's float32 size (parameters × 4 bytes), and the peak resident set within each logged phase (a thread
reading VmRSS every 20 ms: ``phase_peak_mib``). The goal (benchmarks/RESULTS.md, "Looped language models at
100 M parameters"): ≤ 10 minutes, peak ≤ 3× the float32 size.

``--token-rho-only``: the same model and sequences, x* reached by Picard (``--max-iter`` steps), then the per-token
ρ alone by both routes side by side (:func:`stability.lm.token_spectra`, matrix-free): the one-pass diagonal
product (:mod:`stability.lm.diagonal`, one forward-mode product per Krylov step, checked on the first) and the
per-position one (T products per step): wall seconds, operator applications, the seconds of one application of
each operator, the peak resident set within each phase, and the largest difference of the two routes' ρ.

``--geometry``: the same model on ``--batch`` sequences (1 by default here), stages ``reachability`` and
``geometry`` (1 direction in all loop parameters, no group directions, 1 sample, bracket hi/lo ≤ 1.5, no
certification: the smallest search), its directions applied in place (a loop parameter set above
``IN_PLACE_BYTES``): wall seconds, the radii, and the peak resident set of each phase against the model's float32
size.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: Huginn-0125's published counts (hidden 5,280, MLP 17,920, 55 heads) at a tenth of the width
FULL = {"vocab_size": 65536, "hidden": 528, "heads": 8, "mlp": 1792, "prelude_layers": 2, "core_layers": 4,
        "coda_layers": 2, "mean_recurrence": 32}
QUICK = {**FULL, "vocab_size": 1024, "hidden": 64, "heads": 4, "mlp": 224}


def peak_rss_mib() -> float:
    """The peak resident set of this process so far (Linux: ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class PhasePeaks:
    """The peak VmRSS (MiB) within each phase, read every 20 ms by a daemon thread; :meth:`enter` names the
    phase from here on."""

    def __init__(self):
        self.phase, self.peaks = "start", {}
        threading.Thread(target=self._watch, daemon=True).start()

    @staticmethod
    def rss() -> float:
        with open("/proc/self/status", encoding="ascii") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS")) / 1024

    def _watch(self):
        while True:
            r, k = self.rss(), self.phase
            self.peaks[k] = max(self.peaks.get(k, 0.0), r)
            time.sleep(0.02)

    def enter(self, phase: str) -> None:
        self.phase = phase


def build(sizes: dict, seed: int = 0):
    """The Huginn of ``sizes`` with seeded random weights, drawn in float32 (as a directory stores them) and made
    the analysis copy in place as ``stability.load(HF_DIR)`` makes it for the analysis
    (:func:`stability.lm.storage.mixed_storage`: the embedding and LM head stay float32, the rest float64)."""
    # lazy: the resident set before the model counts the imports (rss_before_model_mib)
    import torch

    from stability.lm.huginn import Huginn, HuginnConfig
    from stability.lm.storage import mixed_storage

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Huginn(HuginnConfig(**sizes)).eval()
    return mixed_storage(model)


def measure(sizes: dict, batch: int, tokens: int, max_iter: int) -> dict:
    # lazy: the resident set before the model counts the imports (rss_before_model_mib)
    import torch

    from stability.config import AnalysisOptions
    from stability.lm import analyze_lm
    from stability.lm.storage import stored_float32

    rss0 = peak_rss_mib()
    peaks = PhasePeaks()
    peaks.enter("build")
    t0 = time.perf_counter()
    model = build(sizes)
    build_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    f32_mib = params * 4 / 2**20
    rss_model = peak_rss_mib()
    ids = torch.randint(0, sizes["vocab_size"], (batch, tokens), generator=torch.Generator().manual_seed(1))
    options = AnalysisOptions(samples=batch, stages=("reachability", "prop5"), max_iter=max_iter)
    peaks.enter("checks (contract, finite weights, precision audit)")
    t0 = time.perf_counter()

    def log(msg):
        print(f"  [{time.perf_counter() - t0:7.1f} s] {msg}", flush=True)
        peaks.enter(msg.split(",")[0])

    result = analyze_lm(model, ids, options=options, lm_stages=("token_rho",), log=log)
    wall = time.perf_counter() - t0
    split = result.to_json()["inputs"]
    stages = dict(split["timings"]) if "timings" in split else {}
    peak = peak_rss_mib()
    rho = result["lm"]["token_rho"]
    return {"sizes": sizes, "parameters": params, "float32_mib": round(f32_mib, 1), "batch": batch,
            "tokens": tokens, "threads": torch.get_num_threads(), "build_s": round(build_s, 2),
            "analysis_wall_s": round(wall, 1), "stage_s": {k: round(v, 1) for k, v in stages.items()},
            "token_rho_s": round(wall - sum(stages.values()), 1),
            "rss_before_model_mib": round(rss0, 1), "rss_after_model_mib": round(rss_model, 1),
            "peak_rss_mib": round(peak, 1), "peak_over_float32": round(peak / f32_mib, 2),
            "phase_peak_mib": {k: round(v, 1) for k, v in peaks.peaks.items()},
            "stored_float32_parameters": stored_float32(model),
            "converged_fraction": split["fixed_point"]["converged_fraction"],
            "picard_steps": split["fixed_point"]["nfe"],
            "rho_per_sequence": rho["rho"], "bottleneck": rho["bottleneck"], "exact": rho["exact"],
            "prop5_rel_error": split.get("prop5", {}).get("rel_error")}


def _timed_route(model, xs, x0, peaks, one_pass: bool) -> tuple:
    """(TokenSpectra, wall seconds) of the per-token ρ by one route, its phase named for the resident-set peaks."""
    import time as _time

    from stability.lm import token_spectra

    peaks.enter("token ρ " + ("one-pass" if one_pass else "per-position"))
    t0 = _time.perf_counter()
    spec = token_spectra(model, xs, x0, method="krylov", one_pass=one_pass)
    return spec, _time.perf_counter() - t0


def _one_application(model, xs, x0) -> dict:
    """The seconds of one application of each operator (the same random V on every real token; the faster of two
    calls) and the relative difference of their products."""
    import torch

    from stability.lm.tokens import is_causal, one_pass_apply, per_position_apply

    D, real = model.dynamic_channels, model.token_mask(x0)
    V = torch.randn(int(real.sum()), D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ops = {"one_pass": one_pass_apply(model.step, xs, x0, D, real, model.diagonal_tangents),
           "per_position": per_position_apply(model.step, xs, x0, D, real, torch.zeros(xs.shape[0], dtype=xs.dtype),
                                           prefix=is_causal(model, x0))}
    out, ys = {}, {}
    for name, op in ops.items():
        times = []
        for _ in range(2):  # the faster of two: the first call pays one-time costs
            t0 = time.perf_counter()
            ys[name] = op(V)
            times.append(time.perf_counter() - t0)
        out[f"{name}_s"] = round(min(times), 3)
    out["rel_diff"] = float((ys["one_pass"] - ys["per_position"]).norm() / ys["per_position"].norm())
    return out


def measure_token_rho(sizes: dict, batch: int, tokens: int, max_iter: int) -> dict:
    """``--token-rho-only`` (module docstring): x* by Picard, then the per-token ρ by both routes."""
    import torch

    from stability.config import AnalysisOptions
    from stability.protocols import differentiable_attention
    from stability.solvers import solve

    peaks = PhasePeaks()
    peaks.enter("build")
    model = build(sizes)
    params = sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, sizes["vocab_size"], (batch, tokens), generator=torch.Generator().manual_seed(1))
    peaks.enter("reach x*")
    t0 = time.perf_counter()
    with torch.no_grad():
        x0 = model.embed(ids)
        res = solve(model.step, model.initial_state(x0), x0, tol=AnalysisOptions().tol, max_iter=max_iter)
    reach_s, xs = time.perf_counter() - t0, res.x_best.detach()
    with differentiable_attention(), torch.no_grad():
        peaks.enter("one application each")
        once = _one_application(model, xs, x0)
        one, one_s = _timed_route(model, xs, x0, peaks, one_pass=True)
        per, per_s = _timed_route(model, xs, x0, peaks, one_pass=False)
    diff = (one.token_rho - per.token_rho).abs() / per.token_rho.abs()
    return {"sizes": sizes, "parameters": params, "float32_mib": round(params * 4 / 2**20, 1), "batch": batch,
            "tokens": tokens, "threads": torch.get_num_threads(), "reach_s": round(reach_s, 1),
            "picard_steps": int(res.nfe.max()), "one_application": once,
            "one_pass": {"wall_s": round(one_s, 1), **one.route},
            "per_position": {"wall_s": round(per_s, 1), **per.route},
            "token_rho_max_rel_diff": float(torch.nan_to_num(diff, nan=0.0).max()),
            "rho_per_sequence": one.rho.tolist(), "bottleneck": one.bottleneck.tolist(),
            "peak_rss_mib": round(peak_rss_mib(), 1),
            "phase_peak_mib": {k: round(v, 1) for k, v in peaks.peaks.items()}}


def measure_geometry(sizes: dict, batch: int, tokens: int, max_iter: int) -> dict:
    """``--geometry`` (module docstring): the geometry stage of the model, its directions applied in place."""
    import torch

    from stability.config import AnalysisOptions
    from stability.lm import analyze_lm

    peaks = PhasePeaks()
    peaks.enter("build")
    model = build(sizes)
    params = sum(p.numel() for p in model.parameters())
    f32_mib = params * 4 / 2**20
    ids = torch.randint(0, sizes["vocab_size"], (batch, tokens), generator=torch.Generator().manual_seed(1))
    options = AnalysisOptions(samples=batch, stages=("reachability", "geometry"), max_iter=max_iter,
                              geometry_directions=1, geometry_group_directions=0, geometry_samples=1,
                              geometry_accuracy=0.5, geometry_certify=0)
    said = []
    t0 = time.perf_counter()

    def log(msg):
        said.append(msg)
        print(f"  [{time.perf_counter() - t0:7.1f} s] {msg}", flush=True)
        peaks.enter(msg.split(",")[0][:60])

    before = {k: v.detach().clone() for k, v in model.named_parameters() if v.dtype == torch.float64}
    split = analyze_lm(model, ids, options=options, lm_stages=(), log=log).to_json()["inputs"]
    wall = time.perf_counter() - t0
    geo = split["geometry"]
    unchanged = all(torch.equal(v, before[k]) for k, v in model.named_parameters() if k in before)
    peak = peak_rss_mib()
    return {"sizes": sizes, "parameters": params, "float32_mib": round(f32_mib, 1), "batch": batch,
            "tokens": tokens, "threads": torch.get_num_threads(), "analysis_wall_s": round(wall, 1),
            "stage_s": {k: round(v, 1) for k, v in split.get("timings", {}).items()},
            "evaluation": geo["evaluation"], "in_place_line": next((m for m in said if "in place" in m), None),
            "radii": geo["radii"], "reasons": geo["reasons"], "counts": geo["counts"],
            "parameters_unchanged_after": unchanged, "peak_rss_mib": round(peak, 1),
            "peak_over_float32": round(peak / f32_mib, 2),
            "phase_peak_mib": {k: round(v, 1) for k, v in peaks.peaks.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--max-iter", type=int, default=200, help="the solver budget of reachability (Picard)")
    p.add_argument("--quick", action="store_true", help="the toy size (hidden 64): the suite's smoke run")
    p.add_argument("--token-rho-only", action="store_true",
                   help="reach x*, then the per-token ρ alone by both routes (one-pass and per-position)")
    p.add_argument("--geometry", action="store_true",
                   help="the geometry stage alone (its directions applied in place): time and peak memory")
    p.add_argument("--json", type=Path, default=None, help="write the measurement here")
    args = p.parse_args(argv)
    if args.geometry and args.token_rho_only:
        print("lm_size.py: --geometry and --token-rho-only are two measurements: choose one", file=sys.stderr)
        return 2
    if min(args.threads, args.batch, args.tokens, args.max_iter) < 1:
        print("lm_size.py: --threads, --batch, --tokens and --max-iter must be positive", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(args.threads)
    run = measure_token_rho if args.token_rho_only else measure_geometry if args.geometry else measure
    out = run(QUICK if args.quick else FULL, args.batch, args.tokens, args.max_iter)
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
