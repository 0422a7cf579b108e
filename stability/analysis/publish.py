"""What ``stability analyze`` and ``stability demo`` print and write: the text report, the JSON and the plots of an
analysis, and, when the disk fills between the two outputs, one line saying which was written completely."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from stability.errors import OutputError


def publish(analysis, *, json_path: Optional[Path | str] = None, plots: Optional[Path | str] = None) -> None:
    """What ``stability analyze`` and ``stability demo`` give: the text report on stdout, then the JSON (atomic) and
    the plots (all or none), when given, each path on a line (``json: PATH``, ``plot: PATH``); when one of the two
    cannot be written (a full disk), the one-line error says which was written completely and which was not."""
    print(analysis.summary(), end="")
    done = f"nothing was written: neither the JSON {json_path} nor the plots in {plots}"
    try:
        if json_path is not None:
            analysis.write_json(json_path)
            print(f"json: {json_path}")
            done = f"the JSON {json_path} was written completely, the plots in {plots} were not"
        for path in analysis.plot(plots) if plots is not None else ():
            print(f"plot: {path}")
    except OutputError as exc:
        if json_path is None or plots is None:
            raise
        raise OutputError(f"{exc}; {done}") from None
