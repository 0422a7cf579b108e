"""The dataset cache: generated sudoku/chess datasets in checksummed shards, and cached splits of real files.

Layout under the cache root (``TaskConfig.cache_dir``, else ``$STABILITY_DATA``, else ``~/.cache/stability``)::

    <task>-seed<S>/manifest.json       what was asked, the generator and its options, one entry per shard
    <task>-seed<S>/<split>-<k>.npz     shard k of a split: arrays whose first axis is the row
    real/<task>-<key>.npz (+ .json)    a split read from a real file, keyed by the file's path, size, mtime,
                                       the split options and the split rule (so 3.8M sudoku rows are read once)

A split is a stream of shards; shard k of split s is generated from ``SeedSequence([seed, s, k])`` alone, so the
dataset is deterministic from the seed whatever the number of workers or the order shards finish in, the first
N rows of a split are the same whatever size was asked, and a killed build resumes where it stopped (every shard
and the manifest are written to a temporary file, then renamed). Each shard's sha256 is in the manifest and is
checked when the shard is read.

Val never holds a training input: a generated val split is the first rows of the val stream whose input is not
one of train's (a repeat is dropped when the splits are read, :func:`load_generated`; the shards themselves are
as before); a real file's val is cut so by its reader (:mod:`stability.tasks.splits`).
"""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import math
import os
import sys
import zipfile
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from stability import atomic
from stability.errors import DataError
from stability.tasks.splits import disjoint_val, row_keys

FORMAT = 1
#: the version of how a real file is cut into splits, part of a cached real split's key: 2 = val holds no input
#: of train (issue 27; split caches of rule 1 are ignored, and rebuilt on first use)
REAL_SPLIT_RULE = 2
ENV = "STABILITY_DATA"
SPLITS = ("train", "val", "hard")
SPLIT_INDEX = {"train": 0, "val": 1, "hard": 2}
GENERATORS = {"sudoku": "stability.tasks.sudoku_generate", "chess": "stability.tasks.chess_generate"}
PACKAGE_DATA = Path(__file__).resolve().parent.parent / "data"


# ---- paths and files ------------------------------------------------------------------------------------------
def default_root() -> Path:
    """``$STABILITY_DATA`` if set, else ``~/.cache/stability``."""
    env = os.environ.get(ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "stability"


def root_of(cache_dir: Optional[str]) -> Path:
    return Path(cache_dir).expanduser() if cache_dir else default_root()


def dataset_dir(root: Path, task: str, seed: int) -> Path:
    return Path(root) / f"{task}-seed{seed}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def npz_bytes(arrays: dict) -> bytes:
    """A compressed .npz of ``arrays`` whose bytes depend on the arrays only (fixed member order and times), so
    equal data give equal checksums."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.ascontiguousarray(arrays[name]), allow_pickle=False)
    return buf.getvalue()


def save_npz(path: Path, arrays: dict) -> str:
    """Write ``arrays`` compressed to ``path`` atomically; returns the file's sha256."""
    data = npz_bytes(arrays)
    atomic.write_bytes(path, data)
    return hashlib.sha256(data).hexdigest()


def load_npz(path: Path, sha256: Optional[str] = None) -> dict:
    """Read a shard, checking its sha256 when given (a mismatch is a DataError naming the file)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot read cache file {path}: {exc.strerror}") from None
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise DataError(f"cache file {path} does not match its checksum; delete it and rerun `stability data make`")
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def write_json(path: Path, obj) -> None:
    atomic.write_json(path, obj, sort_keys=True)


def read_manifest(directory: Path) -> Optional[dict]:
    path = Path(directory) / "manifest.json"
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        raise DataError(f"{path} is not a readable dataset manifest; delete the folder and rebuild") from None
    if manifest.get("format") != FORMAT:
        raise DataError(f"{path} has format {manifest.get('format')}, this toolkit reads format {FORMAT}")
    return manifest


# ---- building --------------------------------------------------------------------------------------------------
def shard_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The generator of shard ``index`` of ``split``: a function of (seed, split, index) only."""
    return np.random.default_rng(np.random.SeedSequence([seed, SPLIT_INDEX[split], index]))


def _generator(task: str):
    return importlib.import_module(GENERATORS[task])


def _run_shard(task: str, split: str, index: int, rows: int, seed: int, options: dict, progress=None) -> dict:
    """One shard (called in a worker process, or in this one with ``progress(1)`` after each puzzle)."""
    if progress is None:
        return _generator(task).make_shard(split, index, rows, seed, options)
    return _generator(task).make_shard(split, index, rows, seed, options, progress=progress)


def generate_rows(task: str, split: str, rows: int, seed: int, options: dict) -> dict:
    """The first ``rows`` rows of a split's stream, made in this process (the small offline set)."""
    gen = _generator(task)
    per = gen.SHARD_ROWS[split]
    parts = [gen.make_shard(split, k, min(per, rows - k * per), seed, options) for k in range(math.ceil(rows / per))]
    return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def _manifest(gen, task: str, seed: int, directory: Path, options: dict, sizes: dict) -> dict:
    """The dataset's manifest, new or read back (refused where another generator or other options built it),
    with its sizes raised to ``sizes``."""
    manifest = read_manifest(directory)
    signature = {"generator": gen.GENERATOR, "options": gen.signature(options), "shard_rows": gen.SHARD_ROWS}
    if manifest is None:
        manifest = {"format": FORMAT, "task": task, "seed": seed, **signature,
                    "shards": {s: [] for s in SPLITS}, "sizes": {}}
    else:
        old = {k: manifest.get(k) for k in signature}
        if json.loads(json.dumps(old)) != json.loads(json.dumps(signature)):
            raise DataError(f"{directory} was built by {old['generator']} with options {old['options']}, not "
                            f"{signature['generator']} with {signature['options']}; choose another --out or delete it")
    manifest["sizes"] = {s: max(int(sizes[s]), int(manifest["sizes"].get(s, 0))) for s in SPLITS}
    manifest["describe"] = gen.describe_options(options)
    return manifest


def _kept_shards(directory: Path, manifest: dict) -> dict:
    """{split: {index: entry}} of the manifest's shards whose file is there with its checksum."""
    done = {s: {e["index"]: e for e in manifest["shards"][s]} for s in SPLITS}
    for s in SPLITS:  # drop entries whose file vanished or changed
        for k, e in list(done[s].items()):
            path = directory / e["file"]
            if not path.is_file() or sha256_file(path) != e["sha256"]:
                del done[s][k]
    return done


def _todo(gen, manifest: dict, done: dict) -> list:
    """The shards still to generate, (split, index, rows) each."""
    todo = []
    for s in SPLITS:
        per = gen.SHARD_ROWS[s]
        size = manifest["sizes"][s]
        for k in range(math.ceil(size / per)):
            need = min(per, size - k * per)  # the last shard may stop short; a later, larger build redoes it
            if not (k in done[s] and done[s][k]["rows"] >= need):
                todo.append((s, k, need))
    return todo


def build(task: str, root: Path, seed: int, sizes: dict, *, workers: int = 1, options: Optional[dict] = None,
          progress: bool = True) -> dict:
    """Build (or finish building) the dataset ``<root>/<task>-seed<seed>`` up to ``sizes``; returns the manifest.

    Shards already in the manifest with a matching checksum are kept; the rest are generated, ``workers`` at a
    time (separate processes), each written as soon as it is done.
    """
    gen = _generator(task)
    options = gen.resolve_options(options or {})
    directory = dataset_dir(root, task, seed)
    manifest = _manifest(gen, task, seed, directory, options, sizes)
    done = _kept_shards(directory, manifest)
    todo = _todo(gen, manifest, done)

    def record(split: str, index: int, arrays: dict) -> int:
        name = f"{split}-{index:05d}.npz"
        sha = save_npz(directory / name, arrays)
        done[split][index] = {"index": index, "file": name, "rows": int(len(next(iter(arrays.values())))),
                              "sha256": sha}
        for s in SPLITS:
            manifest["shards"][s] = [done[s][k] for k in sorted(done[s])]
        write_json(directory / "manifest.json", manifest)
        return done[split][index]["rows"]

    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "manifest.json", {**manifest, "shards": {s: [done[s][k] for k in sorted(done[s])]
                                                                  for s in SPLITS}})
    from tqdm import tqdm

    # One bar per split, started when its first shard starts: a hard puzzle costs far more than an easy one, so
    # each split's ETA comes from its own rate only; with one worker the bars move after every puzzle.
    todo_rows = {s: sum(per for s2, _, per in todo if s2 == s) for s in SPLITS}
    bars: dict = {}

    def bar_for(split: str):
        if split not in bars:
            size = manifest["sizes"][split]
            bars[split] = tqdm(total=size, initial=size - todo_rows[split], unit="puzzle",
                               desc=f"{task} seed {seed} {split:5s}", disable=not progress, dynamic_ncols=True)
        return bars[split]

    try:
        if workers <= 1:
            for s, k, per in todo:
                record(s, k, _run_shard(task, s, k, per, seed, options, progress=bar_for(s).update))
        else:
            for s in SPLITS:
                if todo_rows[s]:
                    bar_for(s)
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            ctx = multiprocessing.get_context("spawn")  # no fork of a process holding threads (torch, numba)
            pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
            try:
                futures = {pool.submit(_run_shard, task, s, k, per, seed, options): (s, k) for s, k, per in todo}
                for fut in as_completed(futures):
                    s, k = futures[fut]
                    rows = record(s, k, fut.result())
                    bars[s].update(min(rows, bars[s].total - bars[s].n))
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)  # finished shards are saved; rerun to resume
                raise
            pool.shutdown()
    finally:
        for b in bars.values():
            b.close()
    return manifest


# ---- reading ---------------------------------------------------------------------------------------------------
def available_rows(manifest: dict, split: str) -> int:
    """Rows of ``split`` held by the shards 0, 1, 2, … present without a gap, up to and including the first
    short one (a prefix of the split's stream)."""
    rows, k = 0, 0
    per = manifest["shard_rows"][split]
    by_index = {e["index"]: e for e in manifest["shards"].get(split, [])}
    while k in by_index:
        rows += by_index[k]["rows"]
        if by_index[k]["rows"] < per:
            break
        k += 1
    return rows


def read_split(directory: Path, manifest: dict, split: str, rows: int) -> dict:
    """The first ``rows`` rows of ``split``, checksums checked."""
    by_index = {e["index"]: e for e in manifest["shards"][split]}
    parts, got, k = [], 0, 0
    while got < rows:
        entry = by_index[k]
        parts.append(load_npz(Path(directory) / entry["file"], entry["sha256"]))
        got += entry["rows"]
        k += 1
    return {key: np.concatenate([p[key] for p in parts])[:rows] for key in parts[0]}


def load_generated(task: str, config, sizes: dict) -> tuple[dict, dict]:
    """The splits of a generated dataset, from the first of: the cache holding ``sizes``; the package's small set
    holding them; a small offline set (``min(sizes, SMALL_SIZES)``) from the cache or the package's set; a small
    offline set generated now. Anything but the first is announced in one line on stderr.

    Val is the first rows of the val stream whose input is not a train input (``gen.INPUT_KEY``): a val row
    repeating one of the first ``sizes["train"]`` train rows is dropped and the next one read in its place;
    how many were dropped is ``info["val_repeats_dropped"]`` (absent when none were).

    Returns ({"<split>/<key>": array}, info).
    """
    gen = _generator(task)
    seed = config.seed
    options = gen.options_from_config(config)
    small = {s: min(sizes[s], gen.SMALL_SIZES[s]) for s in SPLITS}
    where = root_of(config.cache_dir)
    build_hint = f"build the full one with `stability data make --task {task} --seed {seed}`"
    places = [(dataset_dir(where, task, seed), False), (dataset_dir(PACKAGE_DATA, task, seed), True)]
    for want in (sizes, small):
        for directory, packaged in places:
            manifest = read_manifest(directory) if directory.is_dir() else None
            if manifest is None or not gen.usable(manifest, options):
                continue
            if all(available_rows(manifest, s) >= want[s] for s in SPLITS):
                arrays, dropped = _disjoint_splits(
                    gen, want, lambda s, rows, d=directory, m=manifest: read_split(d, m, s, rows),
                    available_rows(manifest, "val"))
                if packaged or want is small:
                    what = "the small set shipped with the package" if packaged else f"the partial set in {directory}"
                    print(f"stability: no full {task} dataset of seed {seed} in {where}; using {what} "
                          f"({_sizes_text(want)}); {build_hint}", file=sys.stderr)
                return arrays, {"source": f"generated, {directory}", **manifest.get("describe", {}),
                                **_dropped_info(dropped, arrays, want)}
    print(f"stability: no {task} dataset of seed {seed} in {where}; generating a small offline set "
          f"({_sizes_text(small)}) now; {build_hint}", file=sys.stderr)
    resolved = gen.resolve_options(options)
    arrays, dropped = _disjoint_splits(gen, small, lambda s, rows: generate_rows(task, s, rows, seed, resolved),
                                       10 * small["val"])
    return arrays, {"source": "generated now (small offline set)", **gen.describe_options(resolved),
                    **_dropped_info(dropped, arrays, small)}


def _disjoint_splits(gen, want: dict, fetch: Callable[[str, int], dict], val_limit: int) -> tuple[dict, int]:
    """The splits of ``want`` rows from ``fetch(split, rows)`` (the first rows of a split's stream), val being the
    first rows of its stream whose input is not a train input (:func:`stability.tasks.splits.disjoint_val`);
    returns (arrays keyed "<split>/<name>", val rows dropped as repeats of train)."""
    parts = {s: fetch(s, want[s]) for s in ("train", "hard")}
    parts["val"], dropped = disjoint_val(parts["train"][gen.INPUT_KEY], lambda rows: fetch("val", rows),
                                         want["val"], gen.INPUT_KEY, limit=max(val_limit, want["val"]))
    return {f"{s}/{k}": v for s in SPLITS for k, v in parts[s].items()}, dropped


def _dropped_info(dropped: int, arrays: dict, want: dict) -> dict:
    """What :meth:`describe` says of the val rows dropped as repeats of train (nothing when none were), and a
    line on stderr when val came out short."""
    got = len(next(v for k, v in arrays.items() if k.startswith("val/")))
    if got < want["val"]:
        print(f"stability: val holds {got} of {want['val']} rows: {dropped} of the val rows there are repeat a "
              f"training input and are dropped", file=sys.stderr)
    return {"val_repeats_dropped": dropped} if dropped else {}


def _sizes_text(sizes: dict) -> str:
    return ", ".join(f"{s} {sizes[s]}" for s in SPLITS)


# ---- real files ------------------------------------------------------------------------------------------------
def cached_real_split(task: str, path: str, params: dict, build_fn: Callable[[], tuple[dict, dict]],
                      config) -> tuple[dict, dict]:
    """Arrays split from a real file, read once: keyed by the file's absolute path, size, mtime and ``params``.
    ``build_fn`` returns (arrays, meta). If the cache cannot be written the split is still returned."""
    st = os.stat(path)
    key_src = json.dumps({"format": FORMAT, "split_rule": REAL_SPLIT_RULE, "task": task,
                          "path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                          "params": params}, sort_keys=True)
    key = hashlib.sha256(key_src.encode()).hexdigest()[:16]
    directory = root_of(config.cache_dir) / "real"
    npz, meta_path = directory / f"{task}-{key}.npz", directory / f"{task}-{key}.json"
    if npz.is_file() and meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            return load_npz(npz, meta["sha256"]), meta
        except (DataError, ValueError, KeyError, OSError):
            pass  # rebuild below
    arrays, meta = build_fn()
    meta = {**meta, "source": os.path.abspath(path), "params": params, "task": task,
            "sizes": {s: int(len(arrays[f"{s}/{_first_key(arrays, s)}"])) for s in SPLITS}}
    try:
        meta["sha256"] = save_npz(npz, arrays)
        write_json(meta_path, meta)
    except OSError as exc:
        print(f"stability: could not cache the split in {directory} ({exc.strerror}); it will be read again next "
              f"time", file=sys.stderr)
    return arrays, meta


def _first_key(arrays: dict, split: str) -> str:
    return sorted(k.split("/", 1)[1] for k in arrays if k.startswith(split + "/"))[0]


# ---- reporting -------------------------------------------------------------------------------------------------
def summarize(root: Path) -> list[dict]:
    """What the cache root holds: one dict per generated dataset and per cached real split."""
    root = Path(root)
    out = []
    if not root.is_dir():
        return out
    for directory in sorted(p for p in root.iterdir() if p.is_dir() and (p / "manifest.json").is_file()):
        try:
            manifest = read_manifest(directory)
        except DataError as exc:
            out.append({"path": str(directory), "error": str(exc)})
            continue
        entry = {"path": str(directory), "kind": "generated", "task": manifest["task"], "seed": manifest["seed"],
                 "generator": manifest["generator"], "describe": manifest.get("describe", {}), "splits": {}}
        inputs = {}
        key = getattr(_generator(manifest["task"]), "INPUT_KEY", None) if manifest["task"] in GENERATORS else None
        for s in SPLITS:
            shards = manifest["shards"].get(s, [])
            bad = [e["file"] for e in shards if not (directory / e["file"]).is_file()
                   or sha256_file(directory / e["file"]) != e["sha256"]]
            rows = available_rows(manifest, s)
            stats = {}
            if rows and not bad:
                data = read_split(directory, manifest, s, rows)
                if "rating" in data:
                    stats = rating_stats(data["rating"])
                if key in data:
                    inputs[s] = data[key]
            digest = hashlib.sha256("".join(e["sha256"] for e in shards).encode()).hexdigest()
            entry["splits"][s] = {"rows": rows, "asked": manifest["sizes"].get(s, 0), "shards": len(shards),
                                  "sha256": digest, "corrupt": bad, "rating": stats}
        if "train" in inputs and "val" in inputs:  # dropped from val when the splits are read
            train = set(row_keys(inputs["train"]))
            entry["val_repeats_of_train"] = sum(k in train for k in row_keys(inputs["val"]))
        out.append(entry)
    real = root / "real"
    if real.is_dir():
        for meta_path in sorted(real.glob("*.json")):
            try:
                meta = json.loads(meta_path.read_text())
            except (OSError, ValueError):
                continue
            npz = meta_path.with_suffix(".npz")
            ok = npz.is_file() and sha256_file(npz) == meta.get("sha256")
            out.append({"path": str(npz), "kind": "real split", "task": meta.get("task"),
                        "source": meta.get("source"), "sizes": meta.get("sizes"), "sha256": meta.get("sha256"),
                        "corrupt": [] if ok else [npz.name], "malformed": meta.get("malformed", {}),
                        "val_repeats_dropped": meta.get("val_repeats_dropped", 0),
                        "params": meta.get("params")})
    return out


def rating_stats(rating: np.ndarray) -> dict:
    r = np.asarray(rating, dtype=np.float64)
    return {"min": float(r.min()), "median": float(np.median(r)), "mean": float(r.mean()),
            "p80": float(np.percentile(r, 80)), "max": float(r.max())}
