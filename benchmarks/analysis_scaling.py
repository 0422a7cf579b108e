"""How each stage of `stability analyze` grows with the state size n = positions × width (issue 25).

Each configuration is a task-shaped looped transformer (external recall, post-norm, the paper's architecture):
prefix sums (1-D, local window 5), sudoku (9 × 9, full attention) and chess (8 × 8), at widths 32 … 256. The
models are untrained, with the recall weight W_x scaled by ``--recall-scale`` (0.5) so that plain iteration
reaches a fixed point: the benchmark measures what the analysis costs at a size, not a training run (the
evaluations per solve are recorded, so a trained model's cost can be read off against its own counts).

Every configuration runs in its own child process (one thread unless ``--threads``): the whole analysis as
`stability analyze` runs it (every stage, geometry included) on ``--samples`` inputs, through the public API
(``stability.analyze``). Per stage it records the seconds (the analysis' own ``timings``) and the peak resident
memory of the process while the stage ran (sampled every 5 ms by a thread; the process's peak before the stage
is subtracted to give what the stage added). Then, per stage, a least-squares fit of log time against log n gives
the exponent b in time ∝ n^b, written with the table to ``--out`` (JSON) and drawn log-log to ``--figure``.

    python benchmarks/analysis_scaling.py                      # n from 1,280 to 20,736, 2 samples each
    python benchmarks/analysis_scaling.py --paper              # adds prefix sums at 512 bits × width 256 (n = 131,072)
    python benchmarks/analysis_scaling.py --samples 2 8 --only sudoku-256   # cost against the sample count
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: name -> (task shape, width, positions); task shapes: (spatial_ndim, in_channels, out_channels, window, side)
SHAPES = {"prefix-sums": (1, 1, 2, 5), "sudoku": (2, 10, 10, None), "chess": (2, 12, 2, None)}
CONFIGS = {
    "prefix-sums-32x40": ("prefix-sums", 32, (40,)),
    "sudoku-32": ("sudoku", 32, (9, 9)),
    "sudoku-64": ("sudoku", 64, (9, 9)),
    "sudoku-128": ("sudoku", 128, (9, 9)),
    "chess-256": ("chess", 256, (8, 8)),
    "sudoku-256": ("sudoku", 256, (9, 9)),
}
PAPER = {"prefix-sums-256x512": ("prefix-sums", 256, (512,))}


def build(task: str, width: int, positions: tuple, recall_scale: float, samples: int, seed: int = 0):
    """The configuration's model (float32; the analysis takes its own float64 copy) and random inputs."""
    import torch

    from stability.config import ModelConfig
    from stability.model import build_model

    ndim, cin, cout, window = SHAPES[task]
    torch.manual_seed(seed)
    cfg = ModelConfig(recall="external", norm="post", width=width, heads=8 if width >= 64 else 4,
                      spatial_ndim=ndim, in_channels=cin, out_channels=cout, attention_window=window)
    model = build_model(cfg)
    with torch.no_grad():
        model.recall_map.x.weight.mul_(recall_scale)
    g = torch.Generator().manual_seed(seed + 1)
    if task == "prefix-sums":
        inputs = torch.randint(0, 2, (samples, *positions, 1), generator=g).float() - 0.5
    else:
        inputs = torch.nn.functional.one_hot(torch.randint(0, cin, (samples, *positions), generator=g), cin).float()
    return model, inputs


class PeakMemory:
    """Resident memory of this process sampled every ``period`` seconds: (time, bytes) pairs."""

    def __init__(self, period: float = 0.005):
        self.period, self.samples, self._stop = period, [], threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _rss(self) -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * self._page

    def _run(self):
        while not self._stop.is_set():
            self.samples.append((time.perf_counter(), self._rss()))
            time.sleep(self.period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def peak(self, t0: float, t1: float) -> int:
        return max((b for t, b in self.samples if t0 <= t <= t1), default=0)


def child(spec: dict) -> dict:
    """One configuration, in this process: the analysis and what each stage cost."""
    import torch

    import stability
    from stability import AnalysisOptions

    torch.set_num_threads(spec["threads"])
    task, width, positions = spec["task"], spec["width"], tuple(spec["positions"])
    model, inputs = build(task, width, positions, spec["recall_scale"], spec["samples"])
    options = AnalysisOptions(samples=spec["samples"], stages=tuple(spec["stages"]))
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        base = mem._rss()
        result = stability.analyze(model, inputs, options=options).to_json()["inputs"]
        t1 = time.perf_counter()
    timings = result["timings"]
    # the stages ran one after the other in this order, starting after the float64 copy and the embedding (≈ t0,
    # a fraction of a second early: a stage's memory window is shifted by that much)
    rows, t = {}, t0
    before = base
    for name in spec["stages"]:
        secs = float(timings.get(name) or 0.0)
        peak = mem.peak(t, t + secs)
        rows[name] = {"seconds": secs, "peak_added_bytes": max(0, peak - before)}
        before = max(before, peak)
        t += secs
    fp = result["fixed_point"]
    return {"name": spec["name"], "task": task, "width": width, "positions": list(positions),
            "n": int(width * int(torch.tensor(positions).prod())), "samples": spec["samples"],
            "threads": spec["threads"], "wall_s": t1 - t0, "stages": rows,
            "converged_fraction": fp["converged_fraction"], "nfe_median": fp["nfe_median"],
            "peak_rss_bytes": max(b for _, b in mem.samples), "base_rss_bytes": base}


def run_child(spec: dict, timeout: float) -> dict:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(spec, fh)
    env = {**os.environ, "OMP_NUM_THREADS": str(spec["threads"])}
    proc = subprocess.run([sys.executable, __file__, "--child", fh.name], capture_output=True, text=True,
                          timeout=timeout, env=env)
    os.unlink(fh.name)
    if proc.returncode != 0:
        raise SystemExit(f"{spec['name']}: the child failed\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fit_exponents(rows: list, stages: list) -> dict:
    """Per stage, b in seconds ∝ n^b by least squares on log-log (rows at one sample count)."""
    import numpy as np

    out = {}
    for s in stages:
        pts = [(r["n"], r["stages"][s]["seconds"]) for r in rows if r["stages"][s]["seconds"] > 0.005]
        if len(pts) >= 3:
            x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
            b, a = np.polyfit(x, y, 1)
            out[s] = {"exponent": float(b), "points": len(pts)}
    return out


def figure(rows: list, stages: list, fits: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.0), layout="constrained")
    for s in stages:
        pts = sorted((r["n"], r["stages"][s]["seconds"]) for r in rows if r["stages"][s]["seconds"] > 0.005)
        if pts:
            b = fits.get(s, {}).get("exponent")
            ax.loglog(*zip(*pts), "o-", label=f"{s}" + (f"  (n^{b:.2f})" if b is not None else ""))
    ax.set(xlabel="state size n = positions × width", ylabel="seconds (stage)",
           title=f"stability analyze, every stage, {rows[0]['samples']} samples, {rows[0]['threads']} thread(s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--samples", type=int, nargs="+", default=[2])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--recall-scale", type=float, default=0.5)
    ap.add_argument("--paper", action="store_true", help="add prefix sums at 512 bits × width 256 (slow)")
    ap.add_argument("--only", nargs="+", help="configuration names")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per configuration")
    ap.add_argument("--out", default=str(HERE / "results-analysis-scaling.json"))
    ap.add_argument("--figure", default=str(HERE / "analysis-scaling.png"))
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(Path(args.child).read_text()))))
        return 0
    from stability.analysis.options import STAGES

    configs = {**CONFIGS, **(PAPER if args.paper else {})}
    names = args.only or list(configs)
    rows = []
    for samples in args.samples:
        for name in names:
            task, width, positions = configs[name]
            spec = {"name": name, "task": task, "width": width, "positions": list(positions), "samples": samples,
                    "threads": args.threads, "recall_scale": args.recall_scale, "stages": list(STAGES)}
            r = run_child(spec, args.timeout)
            rows.append(r)
            per = " ".join(f"{s} {v['seconds']:.1f}" for s, v in r["stages"].items())
            print(f"{name:22s} n={r['n']:7d} S={samples} wall {r['wall_s']:7.1f} s  converged "
                  f"{r['converged_fraction']:.0%} nfe {r['nfe_median']}  peak {r['peak_rss_bytes'] / 2**20:.0f} MiB"
                  f"  | {per}", flush=True)
    first = [r for r in rows if r["samples"] == args.samples[0]]
    fits = fit_exponents(first, list(STAGES))
    out = {"rows": rows, "exponents": fits, "load_average": os.getloadavg(),
           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps(out, indent=1))
    if len(first) >= 2:
        figure(first, list(STAGES), fits, Path(args.figure))
    print("\n| stage | exponent b (seconds ∝ n^b) |\n|---|---|")
    for s, v in fits.items():
        print(f"| {s} | {v['exponent']:.2f} ({v['points']} sizes) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
