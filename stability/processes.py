"""Child processes that end with their parent: a sweep's workers and ``analyze``'s split processes.

A process killed with SIGKILL runs no clean-up, so the children it started would otherwise live on as orphans
(parent pid 1), finishing work nobody waits for and holding files and locks. :func:`die_with_parent`, called
first thing in a child, ties the child to its parent: on Linux the kernel sends the child SIGKILL when the parent
ends (``prctl(PR_SET_PDEATHSIG)``, through ctypes), and on every platform a daemon thread polls the parent pid
and ends the child within ``poll_s`` seconds of it changing (the parent is gone; the child was re-parented). A
parent that ended before the child got this far is caught by comparing the parent pid with the one the parent
passed down.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Optional

__all__ = ["PARENT_ENV", "die_with_parent"]

#: the environment variable through which a parent passes its pid to a child it starts by ``subprocess``
PARENT_ENV = "STABILITY_PARENT_PID"

_PR_SET_PDEATHSIG = 1


def _parent_death_signal(signum: int) -> bool:
    """Ask Linux to send ``signum`` to this process when its parent ends; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch(parent: int, poll_s: float) -> None:
    while True:
        time.sleep(poll_s)
        if os.getppid() != parent:
            os._exit(1)


def die_with_parent(parent: Optional[int] = None, *, poll_s: float = 0.5) -> None:
    """End this process when ``parent`` (default: the pid in :data:`PARENT_ENV`, else the current parent) ends.

    Returns at once; if ``parent`` has already ended (this process has another parent now), the process exits
    here with status 1."""
    if parent is None:
        env = os.environ.pop(PARENT_ENV, "")  # not passed on to this process's own children
        parent = int(env) if env.isdigit() else os.getppid()
    _parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # the parent ended before the signal was armed
        os._exit(1)
    threading.Thread(target=_watch, args=(parent, poll_s), name="die-with-parent", daemon=True).start()
