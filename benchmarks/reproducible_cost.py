"""The cost of the reproducible mode (``--reproducible``: every CPU kernel choice pinned, stability/hardware.py).

Runs cells of the CPU replication grid as whole processes, ``stability sweep experiments/replication.toml
--only CELL --workers 1``, unpinned (one thread, as the grid is run) and pinned, alternated so that both see the same
machine load, and reports from each record's timing block the training (epochs + evaluation) and analysis seconds,
and the ratio pinned / unpinned per cell (medians over the repeats). With ``--neighbour`` a CPU-bound process runs on
one core during the measurement (a busy machine).

    python benchmarks/reproducible_cost.py [--cells ps-external-pre-lr1e-3-s0,ps-internal-gru-lr1e-3-s0,ps-fixed-pre-lr1e-3-s0]
                                           [--repeats 2] [--neighbour] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "experiments" / "replication.toml"


def _spin() -> None:  # the neighbour: one core busy
    while True:
        pass


def run_cell(cell: str, pinned: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "stability", "sweep", str(GRID), "--only", cell, "--results", tmp,
               "--workers", "1"] + (["--reproducible"] if pinned else [])
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{cell}: {proc.stderr[-500:]}")
        rec = json.loads(next((Path(tmp) / "records").glob("*.json")).read_text())
    t = rec["timing"]
    return {"cell": cell, "pinned": pinned, "process_s": wall, "train_s": t["epoch_seconds"] + t["eval_and_io_seconds"],
            "analysis_s": t["summary_seconds"], "cpu_s": t["cpu_seconds"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="ps-external-pre-lr1e-3-s0,ps-internal-gru-lr1e-3-s0,ps-fixed-pre-lr1e-3-s0")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--neighbour", action="store_true", help="a CPU-bound process on one core while measuring")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    neighbour = None
    if args.neighbour:
        neighbour = mp.Process(target=_spin, daemon=True)
        neighbour.start()
    runs = []
    try:
        for r in range(args.repeats):
            for cell in args.cells.split(","):
                for pinned in ((False, True) if r % 2 == 0 else (True, False)):
                    runs.append(run_cell(cell, pinned))
                    print(json.dumps(runs[-1]), flush=True)
    finally:
        if neighbour is not None:
            neighbour.terminate()
    summary = []
    for cell in args.cells.split(","):
        row = {"cell": cell}
        for key in ("train_s", "analysis_s", "cpu_s", "process_s"):
            un = statistics.median(x[key] for x in runs if x["cell"] == cell and not x["pinned"])
            pi = statistics.median(x[key] for x in runs if x["cell"] == cell and x["pinned"])
            row[key] = {"unpinned": round(un, 2), "pinned": round(pi, 2), "ratio": round(pi / un, 3)}
        summary.append(row)
        print(f"{cell}: " + ", ".join(f"{k[:-2]} {v['unpinned']} → {v['pinned']} s (×{v['ratio']})"
                                     for k, v in row.items() if k != "cell"))
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; neighbour {'on' if args.neighbour else 'off'}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "summary": summary, "neighbour": args.neighbour,
                                         "load": load}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
