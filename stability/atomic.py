"""Atomic file writes and output checks.

Every file the toolkit writes goes to a temporary file beside its target, is flushed to disk, and is renamed over
the target, so a killed or failing writer never leaves a half-written file. A write that fails (read-only
location, disk full) raises :class:`~stability.errors.OutputError` — one line, exit status 2 at the command line —
and removes the folders it had created for the file, so a failed command leaves no empty folder behind.

:func:`check_writable` checks an output location *before* the work starts (every command calls it on each of its
output paths), so a mistake in a path costs nothing.

JSON has one policy, here and nowhere else: NaN and ±Inf are written as ``null`` (:func:`clean`; JSON has no NaN,
and a reader must not meet a bare ``NaN`` token), tuples as lists, numpy and torch scalars as numbers.
:func:`json_text` is the one serialiser (files, JSONL lines, JSON printed to stdout), :func:`write_json` the one
JSON file writer.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Literal

from stability.errors import OutputError

__all__ = ["OutputError", "atomic_path", "check_writable", "clean", "json_text", "output_dir", "staged_dir",
           "write_bytes", "write_json", "write_text"]


def clean(obj: Any) -> Any:
    """A copy with NaN/±Inf replaced by None, tuples by lists, numpy/torch scalars by Python numbers."""
    if isinstance(obj, dict):
        return {str(k): clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def json_text(obj, **kwargs) -> str:
    """``obj`` as JSON text under the one policy (:func:`clean`: non-finite numbers as null)."""
    return json.dumps(clean(obj), allow_nan=False, **kwargs)


def _reason(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"{exc.strerror or os.strerror(exc.errno)} (the disk is full)"
    return exc.strerror or str(exc)


def _nearest_existing(path: Path) -> Path:
    p = path
    while not os.path.lexists(p):
        if p.parent == p:
            break
        p = p.parent
    return p


def check_writable(path: Path | str, kind: Literal["file", "dir"] = "file", what: str | None = None) -> Path:
    """Refuse, with one line, an output location that cannot be written; create nothing.

    ``kind="file"``: ``path`` must be a file that exists or can be created (not a directory), in a directory that
    exists or can be created and in which a file can be written. ``kind="dir"``: ``path`` must be a directory that
    exists or can be created (not a file), in which a file can be written. Writability is tested by creating (and
    removing) a temporary file in the nearest existing folder, so a read-only file system or a folder the user may
    not write is caught even where permission bits say otherwise (e.g. for root). ``what`` names the option in the
    message (e.g. ``"--out"``). Returns ``path`` as a :class:`~pathlib.Path`.
    """
    if kind not in ("file", "dir"):
        raise ValueError(f"kind must be 'file' or 'dir', got {kind!r}")
    path = Path(path).expanduser()
    label = f"{what} {path}" if what else str(path)
    if str(path) in ("", "."):
        if kind == "file":
            raise OutputError(f"{label}: expected a file name")
    if os.path.lexists(path):
        if kind == "file" and path.is_dir():
            raise OutputError(f"{label}: is a directory; expected a file name")
        if kind == "dir" and not path.is_dir():
            raise OutputError(f"{label}: is a file, expected a directory")
        if kind == "file" and not path.is_file():
            raise OutputError(f"{label}: is not a regular file")
    probe_in = path if (kind == "dir" and path.is_dir()) else path.parent
    existing = _nearest_existing(probe_in)
    if not existing.is_dir():
        raise OutputError(f"{label}: {existing} is a file, not a directory")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".stability-write-check.", dir=existing)
    except OSError as exc:
        raise OutputError(f"{label}: cannot write in {existing} ({_reason(exc)})") from None
    os.close(fd)
    os.unlink(tmp)
    return path


def _make_parents(directory: Path) -> list[Path]:
    """``mkdir -p directory``; returns the folders it created, outermost first."""
    missing = []
    p = directory
    while not p.exists() and p.parent != p:
        missing.append(p)
        p = p.parent
    directory.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


def _remove_empty(created: list[Path]) -> None:
    for d in reversed(created):
        try:
            d.rmdir()
        except OSError:
            break


@contextlib.contextmanager
def output_dir(path: Path | str, what: str | None = None) -> Iterator[Path]:
    """Check ``path`` with :func:`check_writable` (kind ``dir``), create it, and yield it; if the body fails,
    the folders created here are removed again when they are still empty, so a failed command leaves no empty
    output folder behind."""
    path = check_writable(path, "dir", what)
    try:
        created = _make_parents(path)
    except OSError as exc:
        raise OutputError(f"{what + ' ' if what else ''}{path}: cannot create it ({_reason(exc)})") from None
    try:
        yield path
    except BaseException:
        _remove_empty(created)
        raise


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it is fsynced, given the usual permissions and renamed
    to ``path``; on any error it is removed, ``path`` is left as it was, and the folders created for it are
    removed again. An :class:`OSError` while writing becomes an :class:`OutputError` naming ``path``."""
    path = Path(path)
    created: list[Path] = []
    tmp = None
    ok = False
    try:
        created = _make_parents(path.parent)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        yield Path(tmp)
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600
        os.replace(tmp, path)
        ok = True
    except OutputError:
        raise
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {_reason(exc)}") from exc
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
        if not ok:
            _remove_empty(created)


@contextlib.contextmanager
def staged_dir(path: Path | str) -> Iterator[Path]:
    """A folder of files written all or none: yield a temporary folder beside ``path``; when the body succeeds its
    files are renamed into ``path`` (created as needed; files of the same name replaced: renames, which a full disk
    cannot fail), and when it fails the temporary folder goes and ``path`` is left as it was — no half-written
    set of files (a plot folder with ``residuals.png`` alone) and no empty folder. A failing write becomes one
    :class:`OutputError` naming ``path``."""
    import shutil

    path = Path(path)
    created: list[Path] = []
    stage = None
    ok = False
    try:
        created = _make_parents(path.parent)
        stage = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        yield stage
        if not path.exists():
            os.replace(stage, path)  # one rename: the folder appears whole
        else:
            for f in sorted(stage.iterdir()):
                os.replace(f, path / f.name)
        ok = True
    except OSError as exc:  # an OutputError of a file inside names the temporary folder: name the target
        text = str(exc) if isinstance(exc, OutputError) else f"cannot write {path}: {_reason(exc)}"
        raise OutputError(text.replace(str(stage), str(path)) if stage is not None else text) from exc
    finally:
        if stage is not None and stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
        if not ok:
            _remove_empty(created)


def write_bytes(path: Path | str, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: Path | str, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_json(path: Path | str, obj, **kwargs) -> Path:
    """``obj`` as JSON (non-finite numbers as null, :func:`clean`), indented, with a final newline."""
    kwargs.setdefault("indent", 1)
    return write_text(path, json_text(obj, **kwargs) + "\n")
