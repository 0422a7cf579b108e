"""The files a training run writes beside its checkpoint and the state it saves in it: the JSONL and CSV metrics,
the final accuracy CSV, TensorBoard's scalars, the random state, and the lock a run holds on its ``out``."""

from __future__ import annotations

import csv
import fcntl
import io
import os
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Optional

import torch

from stability.atomic import _make_parents, _remove_empty, json_text, write_text
from stability.errors import CheckpointError, ConfigError


def metrics_path(path: Path) -> Path:
    """The JSONL metrics file beside a checkpoint: run.pt -> run.metrics.jsonl."""
    return path.with_name(path.stem + ".metrics.jsonl")


def csv_path(path: Path) -> Path:
    """The per-epoch CSV beside a checkpoint: run.pt -> run.metrics.csv."""
    return path.with_name(path.stem + ".metrics.csv")


def accuracy_csv_path(path: Path) -> Path:
    """The final accuracy-against-iteration CSV beside a checkpoint: run.pt -> run.accuracy.csv."""
    return path.with_name(path.stem + ".accuracy.csv")


def flatten(record: dict, prefix: str = "") -> dict:
    """Scalars of a nested record as {"eval.val.accuracy_last": ...}; lists (accuracy curves) are left out."""
    out = {}
    for k, v in record.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, (bool, int, float)) or v is None:
            out[key] = v
    return out


def _csv_text(rows: list[dict]) -> str:
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in rows)
    return buf.getvalue()


def _accuracy_rows(final: dict) -> list[dict]:
    splits = [s for s in ("val", "hard") if s in final]
    T = max(len(final[s]["accuracy"]) for s in splits)
    rows = []
    for t in range(T):
        row = {"iteration": t + 1}
        for s in splits:
            acc, pos = final[s]["accuracy"], final[s]["position_accuracy"]
            row[f"{s}_accuracy"] = acc[t] if t < len(acc) else None
            row[f"{s}_position_accuracy"] = pos[t] if t < len(pos) else None
        rows.append(row)
    return rows


def write_metrics(path: Path, history: list, final: Optional[dict]) -> None:
    """JSONL (one record per epoch, then the final evaluation) and the same per-epoch scalars as CSV."""
    lines = [json_text(rec) for rec in history] + ([json_text({"final": final})] if final is not None else [])
    write_text(path, "".join(line + "\n" for line in lines))
    ckpt_path = path.with_name(path.name[: -len(".metrics.jsonl")] + ".pt")
    write_text(csv_path(ckpt_path), _csv_text([flatten(rec) for rec in history]))
    if final is not None:
        write_text(accuracy_csv_path(ckpt_path), _csv_text(_accuracy_rows(final)))


class TensorBoard:
    """Per-epoch scalars (and the final accuracy curves) to TensorBoard; needs the ``tensorboard`` package."""

    def __init__(self, logdir: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("--tensorboard: the tensorboard package is not installed "
                              "(pip install tensorboard), or leave --tensorboard out") from None
        self.writer = SummaryWriter(log_dir=str(logdir))

    def epoch(self, record: dict) -> None:
        for key, value in flatten(record).items():
            if key not in ("epoch", "step") and isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(key.replace(".", "/"), value, global_step=record["epoch"])
        self.writer.flush()

    def final(self, final: dict) -> None:
        for row in _accuracy_rows(final):
            for key, value in row.items():
                if key != "iteration" and value is not None:
                    self.writer.add_scalar(f"final/{key}", value, global_step=row["iteration"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def rng_state(gen: torch.Generator) -> dict:
    """The random state a checkpoint keeps: torch's, CUDA's and the run's data generator's."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "data": gen.get_state(),
    }


def set_rng_state(state: dict, gen: torch.Generator) -> None:
    """Restore :func:`rng_state`'s ``state`` (``gen``: the run's data generator)."""
    torch.set_rng_state(state["torch"])
    if state.get("cuda") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    gen.set_state(state["data"])


def lock_path(out: Path | str) -> Path:
    """The lock file a run holds while it writes ``out``: run.pt -> .run.pt.lock beside it."""
    out = Path(out)
    return out.with_name(f".{out.name}.lock")


def _lock_holder(fh) -> str:
    """The pid written in a lock file another process holds (it writes it just after locking)."""
    for _ in range(20):
        fh.seek(0)
        text = fh.read().strip()
        if text.isdigit():
            return text
        time.sleep(0.05)
    return "unknown"


@contextmanager
def run_lock(out: Path | str):
    """Hold an exclusive lock on the run writing ``out`` (``fcntl.flock`` on :func:`lock_path`, as the sweep locks
    its cells), with this process's pid in the lock file; a second run on the same ``out`` is refused with one line
    naming the first's pid. The lock file is removed when the run ends (a run killed with SIGKILL leaves it, and
    the kernel has released its lock: the next run takes it over)."""
    path = lock_path(out)
    created = _make_parents(path.parent)
    try:
        while True:
            fh = open(path, "a+")
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = _lock_holder(fh)
                fh.close()
                raise CheckpointError(f"--out {out}: another training run (pid {pid}) is writing it; wait for it "
                                      "to end, or choose another --out") from None
            try:
                same = os.stat(path).st_ino == os.fstat(fh.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            fh.close()  # its holder removed the file as we opened it: lock the file that is there now
        try:
            fh.seek(0)
            fh.truncate()
            fh.write(f"{os.getpid()}\n")
            fh.flush()
            yield path
        finally:
            with suppress(OSError):
                os.unlink(path)  # while still holding the lock
            fh.close()
    finally:
        _remove_empty(created)
