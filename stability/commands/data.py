"""``stability data``: build, inspect and calibrate the sudoku and chess datasets.

* ``make --task sudoku|chess [--out DIR] [--sizes TRAIN VAL HARD] [--workers N] [--seed S] [--engine PATH]``
  builds the generated dataset into the cache with a progress bar; killed, it resumes where it stopped.
* ``info [--dir DIR] [--json]`` shows what the cache holds: sizes, difficulty statistics, checksums.
* ``calibrate --csv FILE [--rows N] [--engine PATH]`` measures the chess difficulty proxy against real ratings.
"""

from __future__ import annotations

import sys
from pathlib import Path

from stability.atomic import check_writable, json_text
from stability.commands._types import nonneg_float
from stability.errors import ConfigError, DataError

HELP = "Build, inspect and calibrate the sudoku and chess datasets (generated offline or read from real files)."
PAPER_SIZES = (40000, 10000, 10000)


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    make = sub.add_parser("make", help="build (or finish building) a generated dataset in the cache",
                          description="Build a generated dataset into the cache; rerun to resume.")
    make.add_argument("--task", required=True, choices=("sudoku", "chess"))
    make.add_argument("--out", metavar="DIR", help="cache folder (default: $STABILITY_DATA or ~/.cache/stability)")
    make.add_argument("--sizes", nargs=3, type=int, metavar=("TRAIN", "VAL", "HARD"), default=list(PAPER_SIZES),
                      help="rows per split (default: the paper's 40000 10000 10000)")
    make.add_argument("--workers", type=int, default=1, metavar="N", help="processes building shards (default 1)")
    make.add_argument("--seed", type=int, default=0, metavar="S", help="dataset seed (default 0)")
    make.add_argument("--engine", metavar="PATH",
                      help="chess: UCI engine (default: stockfish on PATH or /usr/games; \"none\": the fallback)")
    make.add_argument("--cut", type=nonneg_float, metavar="R",
                      help="sudoku: rating cut between easy and hard (default 38)")
    make.add_argument("--quiet", action="store_true", help="no progress bar")

    info = sub.add_parser("info", help="show the cached datasets: sizes, difficulty statistics, checksums",
                          description="Show the cached datasets.")
    info.add_argument("--dir", metavar="DIR", help="cache folder (default: $STABILITY_DATA or ~/.cache/stability)")
    info.add_argument("--json", action="store_true", help="print JSON instead of text")

    cal = sub.add_parser("calibrate", help="fit the chess difficulty proxy to the ratings of a Lichess CSV",
                         description="Measure found-at depth and solution length on real puzzles and fit the proxy.")
    cal.add_argument("--csv", required=True, metavar="FILE", help="Lichess puzzle CSV (with header or FEN,Moves,Rating)")
    cal.add_argument("--rows", type=int, default=400, metavar="N", help="puzzles to measure (default 400)")
    cal.add_argument("--engine", metavar="PATH")
    cal.add_argument("--seed", type=int, default=0)
    cal.add_argument("--quiet", action="store_true")
    parser.set_defaults(_data_parser=parser)


def run(args) -> int:
    if args.action is None:
        args._data_parser.print_help()
        return 2
    return {"make": _make, "info": _info, "calibrate": _calibrate}[args.action](args)


def _make(args) -> int:
    # lazy: numpy; `stability --help` imports this module without it
    from stability.tasks import cache

    if any(n < 1 for n in args.sizes):
        raise ConfigError(f"--sizes: each size must be at least 1, got {' '.join(map(str, args.sizes))}")
    if args.workers < 1:
        raise ConfigError(f"--workers: must be at least 1, got {args.workers}")
    if args.seed < 0:
        raise ConfigError(f"--seed: must be at least 0, got {args.seed}")
    if args.task == "sudoku" and args.engine:
        raise ConfigError("--engine applies to --task chess only")
    if args.task == "chess" and args.cut is not None:
        raise ConfigError("--cut applies to --task sudoku only")
    options = {"engine": args.engine} if args.task == "chess" else {"cut": args.cut}
    root = check_writable(cache.root_of(args.out), "dir", "--out" if args.out else "cache folder")
    sizes = dict(zip(cache.SPLITS, args.sizes))
    manifest = cache.build(args.task, root, args.seed, sizes, workers=args.workers, options=options,
                           progress=not args.quiet)
    directory = cache.dataset_dir(root, args.task, args.seed)
    rows = {s: cache.available_rows(manifest, s) for s in cache.SPLITS}
    print(f"{directory}: " + ", ".join(f"{s} {rows[s]}" for s in cache.SPLITS))
    return 0


def _fmt_stats(stats: dict) -> str:
    if not stats:
        return ""
    return (f"rating min {stats['min']:.1f} median {stats['median']:.1f} mean {stats['mean']:.1f} "
            f"p80 {stats['p80']:.1f} max {stats['max']:.1f}")


def _info(args) -> int:
    # lazy: numpy; `stability --help` imports this module without it
    from stability.tasks import cache

    root = cache.root_of(args.dir)
    if args.dir is not None and not Path(args.dir).is_dir():
        raise DataError(f"--dir {args.dir}: no such directory" if not Path(args.dir).exists()
                        else f"--dir {args.dir}: is a file, not a cache directory")
    entries = cache.summarize(root)
    if args.json:
        print(json_text({"root": str(root), "datasets": entries}, indent=1))
        return 1 if any(e.get("corrupt") or e.get("error") or any(s.get("corrupt") for s in
                        e.get("splits", {}).values()) for e in entries) else 0
    print(f"cache: {root}")
    if not entries:
        print("  (empty: build with `stability data make --task sudoku|chess`)")
        return 0
    damaged = False
    for e in entries:
        if "error" in e:
            print(f"  {e['path']}: {e['error']}")
            damaged = True
            continue
        if e["kind"] == "generated":
            extra = "; ".join(f"{k} {v}" for k, v in e["describe"].items())
            print(f"  {e['path']}  {e['task']}, seed {e['seed']}, {e['generator']}" + (f" ({extra})" if extra else ""))
            for s, d in e["splits"].items():
                state = "complete" if d["rows"] >= d["asked"] else f"{d['rows']} of {d['asked']}"
                bad = f"  CORRUPT: {', '.join(d['corrupt'])}" if d["corrupt"] else ""
                damaged |= bool(d["corrupt"])
                print(f"    {s:5s} {d['rows']:>6d} rows ({state}, {d['shards']} shards)  {_fmt_stats(d['rating'])}  "
                      f"sha256 {d['sha256'][:16]}{bad}")
            if e.get("val_repeats_of_train"):
                print(f"    val: {e['val_repeats_of_train']} row(s) repeat a train puzzle; they are dropped when the "
                      f"splits are read (val never holds a training input)")
        else:
            sizes = ", ".join(f"{s} {n}" for s, n in (e["sizes"] or {}).items())
            bad = "  CORRUPT" if e["corrupt"] else ""
            damaged |= bool(e["corrupt"])
            malformed = sum((e.get("malformed") or {}).values())
            repeats = e.get("val_repeats_dropped") or 0
            dropped = f"{repeats} val rows repeating a train puzzle dropped; " if repeats else ""
            print(f"  {e['path']}  {e['task']} split of {e['source']}: {sizes}; {malformed} malformed rows skipped; "
                  f"{dropped}sha256 {str(e['sha256'])[:16]}{bad}")
    return 1 if damaged else 0


def _calibrate(args) -> int:
    # lazy: numpy; `stability --help` imports this module without it
    from stability.tasks import chess_generate

    if args.rows < 10:
        raise ConfigError(f"--rows: need at least 10 puzzles, got {args.rows}")
    measured = chess_generate.measure_real(args.csv, args.rows, engine_path=args.engine, seed=args.seed,
                                           progress=not args.quiet)
    result = chess_generate.calibrate(measured, seed=args.seed)
    result["measured"] = len(measured["rating"])
    result["mean_rating_by_length"] = {
        int(k): float(measured["rating"][measured["length"] == k].mean()) for k in sorted(set(measured["length"]))}
    print(json_text(result, indent=1))
    sys.stdout.flush()
    return 0
